"""The restore-on-create runtime on a CRI test node (scripts/env/cri-node.sh), for the integration tests.

- ``CriRuntimeNode``: the snapshot_node role (``_runtime_helpers.Node``: names and paths of the test's own) run with
  the runtime as a runtime handler of one node's containerd -- the docs' variables (docs/restore-on-create.md
  ``roc-containerd-node``, docs/kubernetes.md ``k8s-containerd-node-vars``) with that node's paths, containerd
  restarted by ``cri-node.sh restart`` where the role may restart it.
- ``runtime_class``: the docs' RuntimeClass (``roc-runtimeclass``) for the handler, in the API emulator.
- ``take_snapshot``: a snapshot of a pod's engine taken in test code as the host_checkpoint module takes one of a
  Docker container -- the device backup through the agent (npu_snapshot_backup), ``runc checkpoint
  --leave-running`` under the node's runc root, the world from containerd's OCI config, seal and publish, the engine
  unlocked -- until host_checkpoint itself checkpoints CRI containers.
"""

import json
import shutil
import time
from pathlib import Path

import yaml

import doc_blocks
from _cri_kubelet import CRI_NODE_SCRIPT, api_client, oci_config
from _runtime_helpers import Node
from conftest import run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import utc_now
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.criu_cli import CriuCli, make_work_dir
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.docker_cli import env_dict
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.runc_cli import RuncCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import device, seal, status, world

ROC = "docs/restore-on-create.md"
K8S = "docs/kubernetes.md"
# The files the kubelet and containerd write per pod into a container (the stand-in's pod directory, containerd's
# sandbox directory): never the engine's inputs, never the same twice.
PER_POD = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev/termination-log")


def doc_role_vars():
    """The role's variables as the docs give them for a containerd node: the playbook's, then the group vars'."""
    play = yaml.safe_load(doc_blocks.block(ROC, "roc-containerd-node"))
    found = dict(play[0]["roles"][0]["vars"])
    found.update(yaml.safe_load(doc_blocks.block(K8S, "k8s-containerd-node-vars")))
    return found


class CriRuntimeNode(Node):
    """The snapshot_node role on the CRI node ``node`` (its ``status`` from cri-node.sh), the runtime registered as
    the handler ``self.name`` of its containerd through a drop-in of the test's own name."""

    def __init__(self, base, node, status_):
        super(CriRuntimeNode, self).__init__(base)
        self.node, self.status = node, status_
        self.dropin = Path(status_["conf_d"]) / ("50-%s.toml" % self.name)
        own = dict(self.vars)
        self.vars = dict(doc_role_vars(), **own)   # the docs' settings, the test's own names and paths over them
        self.vars.update({
            "snapshot_node_runc": "/usr/sbin/runc",   # the runc of the node's default handler (cri-node.sh)
            "snapshot_node_containerd_config": status_["config"],
            "snapshot_node_containerd_socket": status_["socket"],
            "snapshot_node_containerd_state": status_["state"],
            "snapshot_node_containerd_dropin": str(self.dropin),
            "snapshot_node_containerd_restart_command": ["bash", str(CRI_NODE_SCRIPT), "restart", node],
        })

    def install(self):
        ok, changed, failed, out = self.run_role()
        assert failed == 0 and changed > 0, out[-5000:]
        assert self.dropin.exists(), out[-3000:]
        return ok, changed, failed

    def remove(self):
        """State absent (forced: a test's pods may not all be gone yet); the drop-in and the files are gone."""
        ok, changed, failed, out = self.run_role(snapshot_node_state="absent", snapshot_node_force_remove=True)
        assert failed == 0, out[-5000:]
        assert not self.dropin.exists() and not self.runtime_path.exists() and not self.lib_dir.exists()
        return ok, changed, failed


def runtime_class(server_url, name, handler):
    """The docs' RuntimeClass, for ``handler`` under ``name``, created in the API emulator."""
    import kubernetes  # pylint: disable=import-outside-toplevel
    manifest = yaml.safe_load(doc_blocks.block(ROC, "roc-runtimeclass"))
    manifest["metadata"]["name"], manifest["handler"] = name, handler
    kubernetes.client.NodeV1Api(api_client(server_url)).create_runtime_class(manifest, _preload_content=False)
    return manifest


def restore_pod(pod, snapshot_dir, runtime_class_name):
    """``pod`` (a manifest) asking for a restore as the docs show: the runtime's RuntimeClass and the annotation."""
    asked = yaml.safe_load(doc_blocks.block(ROC, "roc-containerd-pod"))
    pod["spec"]["runtimeClassName"] = runtime_class_name
    assert asked["spec"]["runtimeClassName"] and layout.ANNOTATION_RESTORE_FROM in asked["metadata"]["annotations"]
    pod["metadata"].setdefault("annotations", {})[layout.ANNOTATION_RESTORE_FROM] = snapshot_dir
    return pod


def container_id(pod):
    return pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]


def take_snapshot(status_, pod, snapshot_dir, identity, npu_root):
    """A sealed, published snapshot of the running pod's engine (see the module's docstring); its manifest."""
    cid = container_id(pod)
    runc_root = status_["runc_root"]
    pid = json.loads((Path(runc_root) / cid / "state.json").read_text())["init_process_pid"]
    staging = layout.staging_dir(snapshot_dir)
    backup = run_module("npu_snapshot_backup", {"pid": pid, "snapshot_dir": snapshot_dir, "lock": True,
                                                "identity": identity})
    assert backup.get("state") == "BACKED_UP", backup
    spec = oci_config(status_, cid)
    runc = RuncCli("/usr/sbin/runc", ["--root", runc_root], criu=shutil.which("criu"))
    criu_version = CriuCli().require()
    started = time.monotonic()
    try:
        runc.checkpoint(cid, str(Path(staging) / layout.IMAGES_DIR), True, 120, work=make_work_dir("dump"))
    finally:
        unlocked = run_module("npu_snapshot_lock", {"pid": pid, "state": "unlocked"})
    assert unlocked.get("actions") == ["restore", "unlock"], unlocked
    process = world.oci_facts(spec)
    # recorded as docker_facts records a process (the manifest's form): the user as "uid:gid", which a restore
    # compares with the new OCI config's numeric uid and gid
    process["user"] = "%s:%s" % (process.pop("uid"), process.pop("gid"))
    excluded = world.excluded_mounts(process["mounts"], env_dict(spec["process"]["env"]))
    excluded.update((m["destination"], "written per pod by the kubelet or containerd") for m in process["mounts"]
                    if m["destination"] in PER_POD)
    facts = world.capture(process, criu_version, runc.version(), excluded=excluded)
    world.add_digests(facts)
    part = device.read_device_part(staging)
    fields = {"identity": identity, "generation": int(time.time() * 1000), "created_at": utc_now(),
              "image": {"id": pod["status"]["containerStatuses"][0]["imageID"],
                        "name": pod["spec"]["containers"][0]["image"]},
              "engine": {"name": "docker", "version": None, "criu_version": criu_version,
                         "oci_runtime_version": runc.version()},
              "runtime": part["runtime"], "devices": part["devices"], "device": part,
              "durations": {"checkpoint": time.monotonic() - started}, "world": facts}
    document, fingerprint, _stats = seal.seal(staging, fields)
    seal.publish(staging, snapshot_dir)
    status.update(snapshot_dir, "completed", checksum=fingerprint, total_bytes=document["total_bytes"])
    assert npu_root  # the pod's NPU snapshot root is a mount of its own: recorded like any other
    return document

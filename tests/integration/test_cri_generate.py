"""Generation on a Kubernetes node as clusters run it: a pod of the workload image on node-a, a containerd 1.6 CRI
node of this machine (scripts/env/cri-node.sh), created through the CRI by the kubelet stand-in
(tests/integration/_cri_kubelet.py) with its simulated NPU given as the device plugin gives it; host_checkpoint with
engine=containerd through ansible.

- host_checkpoint engine=containerd takes the device part and the host snapshot of the pod's container in one task
  (device_backup, resume, the lease), sealed and signed on the controller: the manifest records engine containerd,
  the image the CRI says the container runs, and the world of the OCI config containerd wrote (its args, uid, devices,
  mounts; the kubelet's and containerd's per-pod files left out); snapshot_verify authenticates it; the engine answers
  as before, and a second run keeps it (if_exists=keep);
- check mode and bad input (an unknown container, the pod's sandbox, a socket that is not containerd's) change
  nothing and leave the engine RUNNING, each refused naming the option;
- CRIU killed in the middle of the dump: the task fails, the status record says failed, nothing of the snapshot is
  left, the container is not left frozen, and npu_snapshot_lock (container: containerd://<id>) resumes the engine,
  which answers as before;
- the k8s_snapshot role's generate entry point (playbooks/k8s_generate.yml) against the API emulator, with node-a
  in its inventory: the bare pod is recreated with its snapshot settings, its engine takes its device snapshot, the
  host snapshot is taken through containerd, its canary is asked in the engine's own network namespace (found through
  containerd) and recorded, the pod is annotated completed with the checksum and the service's record ConfigMap says
  so; the engine serves after.
"""

import hashlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from _cri_kubelet import CriKubelet, declare_resources, oci_config, workload_pod
from _k8s_helpers import Api, ApiServer, run_playbook, write_inventory, write_kubeconfig
from conftest import aclsim_ctl, docker, run_module
from test_trust import pem

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import AgentSocketClient
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import task
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import manifest, status
from ansible_collections.inferops.snapshot.plugins.modules import host_checkpoint as host_checkpoint_module

NODE = "node-a"
NAMESPACE = "crigen-" + uuid.uuid4().hex[:6]
PROMPTS = ["what is an NPU?", "snapshot me", "the quick brown fox"]
PER_POD = ["/dev/shm", "/dev/termination-log", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf"]
pytestmark = pytest.mark.timeout(900)


def identity(pod, service="svc", instance="p0"):
    return {"namespace": NAMESPACE, "service": service, "instance": instance, "pod": pod}


def ready(pod):
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


class Pod:
    """One workload pod on node-a, as the kubelet stand-in runs it."""

    def __init__(self, cluster, name, device_dir, npu_root, **kwargs):
        self.cluster, self.name = cluster, name
        self.manifest = workload_pod(name, NAMESPACE, NODE, device_dir, npu_root, **kwargs)

    def create(self, host_mb=None):
        if host_mb:  # a bigger engine: its dump takes long enough to be interrupted
            for item in self.manifest["spec"]["containers"][0]["env"]:
                if item["name"] == "WORKLOAD_HOST_MB":
                    item["value"] = str(host_mb)
        self.cluster["api"].create(self.manifest)
        return self.wait_ready()

    def wait_ready(self, timeout=180):
        api, kubelet = self.cluster["api"], self.cluster["kubelet"]
        return kubelet.wait(lambda: ready(api.pod(self.name)) and api.pod(self.name), "%s Ready" % self.name, timeout)

    @property
    def status(self):
        return self.cluster["api"].pod(self.name)["status"]

    @property
    def container_ref(self):
        return self.status["containerStatuses"][0]["containerID"]

    @property
    def container_id(self):
        return self.container_ref.split("://", 1)[1]

    def answers(self):
        found = []
        for prompt in PROMPTS:
            code, body = self.cluster["kubelet"].get("http://%s:8000/v1/generate?prompt=%s" % (
                self.status["podIP"], prompt.replace(" ", "%20")), timeout=30)
            assert code == 200, (self.name, code, body)
            found.append(json.loads(body)["answer"])
        return found

    def agent(self):
        pid = json.loads(subprocess.run(
            ["runc", "--root", self.cluster["node"]["runc_root"], "state", self.container_id], capture_output=True,
            text=True, check=True).stdout)["pid"]
        return AgentSocketClient.for_pid(pid)

    def engine_state(self):
        return self.agent().request("state", 10)["state"]


def make_device_dir(base):
    path = base / "npu"
    path.mkdir(mode=0o700)
    return path


def remove_device_dir(path):
    if (path / "nodes.json").exists():
        aclsim_ctl(path, "uninstall")
    for memory in path.iterdir():
        if memory.is_file():
            memory.unlink()


@pytest.fixture(scope="module")
def cluster(cri_nodes, tmp_path_factory):
    base = tmp_path_factory.mktemp("crigen")
    server = ApiServer()
    declare_resources(server)
    kubelet = CriKubelet(server.url, NODE, cri_nodes[NODE])
    made = {"server": server, "api": Api(server.url, NAMESPACE), "kubelet": kubelet, "node": cri_nodes[NODE],
            "base": base, "devices": []}
    yield made
    kubelet.stop()
    server.stop()
    for device_dir in made["devices"]:
        remove_device_dir(device_dir)
    assert not kubelet.errors, kubelet.errors


def new_pod(cluster, name, **kwargs):
    base = cluster["base"] / name
    base.mkdir()
    device_dir = make_device_dir(base)
    cluster["devices"].append(device_dir)
    npu_root = base / "npu-snapshots"
    npu_root.mkdir()
    return Pod(cluster, name, device_dir, npu_root, **kwargs), base


@pytest.fixture(scope="module")
def generated(cluster):
    """The engine of pod gen-0 on node-a, warmed up; its snapshot taken by host_checkpoint engine=containerd in one
    task, signed by the controller's key (the action plugin)."""
    pod, base = new_pod(cluster, "gen-0")
    pod.create()
    expected = pod.answers()
    key = Ed25519PrivateKey.generate()
    key_file = base / "keys" / "signing.pem"
    key_file.parent.mkdir(mode=0o700)
    key_file.write_text(pem(key))
    os.chmod(str(key_file), 0o600)
    snap = str(base / "store" / NAMESPACE / "svc" / "p0" / "gen-0")
    args = {"engine": "containerd", "container": pod.container_ref, "containerd_address": cluster["node"]["socket"],
            "snapshot_dir": snap, "identity": identity("gen-0"), "device_backup": True, "resume": True, "lease": 60,
            "timeout": 120, "signing_key": str(key_file)}
    checkpoint = run_module("host_checkpoint", args)
    return dict(pod=pod, base=base, expected=expected, snap=snap, args=args, checkpoint=checkpoint,
                trusted=[pem(key, public=True)])


def test_host_checkpoint_takes_a_signed_snapshot_of_a_pods_container_through_containerd(generated, cluster):
    g, pod = generated, generated["pod"]
    checkpoint = g["checkpoint"]
    assert checkpoint["changed"] and checkpoint["status"] == "completed", checkpoint.get("msg")
    assert checkpoint["signed_by"] and checkpoint["resumed"]["state"] == "RUNNING", checkpoint
    assert checkpoint["device_backup"]["actions"] == ["lock", "backup"], checkpoint["device_backup"]
    assert set(checkpoint["versions"]) >= {"containerd", "criu", "runc"} and "docker" not in checkpoint["versions"]
    recorded = manifest.load_manifest(g["snap"])
    assert recorded["identity"] == identity("gen-0")
    assert recorded["engine"]["name"] == "containerd"
    assert recorded["engine"]["version"] == checkpoint["versions"]["containerd"]
    # the image the CRI says the container runs: its image_ref, the image's config digest -- Docker's image id
    image_id = pod.status["containerStatuses"][0]["imageID"]
    assert recorded["image"] == {"id": image_id, "name": "docker.io/inferops/workload:latest"}, recorded["image"]
    assert docker("image", "inspect", "--format", "{{.Id}}", image_id) == image_id, "the image id Docker gives it"
    # the world of the OCI config containerd wrote for the container
    oci = oci_config(cluster["node"], pod.container_id)
    process = recorded["world"]["process"]
    assert process["args"] == oci["process"]["args"] and process["uid"] == oci["process"]["user"]["uid"]
    assert process["devices"] == sorted(d["path"] for d in oci["linux"]["devices"])
    assert "/dev/davinci0" in process["devices"], process["devices"]
    excluded = recorded["world"]["excluded"]
    assert set(PER_POD) <= set(excluded), excluded
    assert {"/run/inferops-snapshot", "/etc/inferops/metadata"} <= set(excluded), excluded
    assert not set(excluded) & set(recorded["world"]["files"])
    assert recorded["device"]["state"] == "BACKED_UP" and recorded["devices"] == [0]
    assert recorded["total_bytes"] > 24 * 1024 * 1024, "the device memory travels in the host snapshot"
    assert status.read(g["snap"])["status"] == "completed"
    check = run_module("snapshot_verify", {"snapshot_dir": g["snap"], "identity": identity("gen-0"),
                                           "trusted_keys": g["trusted"], "image": image_id})
    assert check["valid"] and check["authenticated"] and check["reasons"] == [], check
    # the engine serves again, with the answers of before
    assert pod.engine_state() == "RUNNING"
    assert pod.answers() == g["expected"]
    # a second run keeps the snapshot of this very container
    again = run_module("host_checkpoint", dict(g["args"], signing_key=None, device_backup=False, resume=False,
                                               require_device_part=True))
    assert again["changed"] is False and again["replaced_because"] == [], again
    assert pod.engine_state() == "RUNNING"


def test_check_mode_and_bad_input_change_nothing_and_name_the_option(generated, cluster):
    g, pod = generated, generated["pod"]
    snap = str(g["base"] / "other" / NAMESPACE / "svc" / "p0" / "gen-0")
    args = dict(g["args"], snapshot_dir=snap, signing_key=None)
    dry = run_module("host_checkpoint", args, check=True)
    assert dry["changed"] and dry["device_backup"]["actions"] == ["lock", "backup"], dry
    assert "containerd" in dry["versions"], dry
    sandbox = cluster["kubelet"].record(NAMESPACE, "gen-0").sandbox_id
    bad = [({"container": "containerd://" + "0" * 64}, "container: containerd on %s has no container %s"
            % (cluster["node"]["socket"], "0" * 64)),
           ({"container": "containerd://" + sandbox}, "container: %s is a pod sandbox" % sandbox),
           ({"container": "docker://" + pod.container_id}, "container: 'docker://"),
           ({"containerd_address": str(g["base"] / "no.sock")}, "containerd_address: %s does not exist"
            % (g["base"] / "no.sock")),
           ({"method": "docker"}, "method: docker is Docker's own checkpoint")]
    for change, message in bad:
        refused = run_module("host_checkpoint", dict(args, **change))
        assert refused["failed"] and refused["msg"].startswith(message), (change, refused["msg"])
    assert not os.path.lexists(str(g["base"] / "other")), "check mode and refusals write nothing"
    assert pod.engine_state() == "RUNNING"
    assert pod.answers() == g["expected"]


def criu_of_checkpoint(runc_root, container_id):
    """Pids of the CRIU that `runc checkpoint` of the container runs: the children of that runc."""
    runc, children = set(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().decode(errors="replace").split("\0")
            parent = int(Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if "checkpoint" in argv and container_id in argv and runc_root in argv:
            runc.add(int(entry))
        children.append((int(entry), parent))
    return [pid for pid, parent in children if parent in runc]


def test_criu_killed_mid_dump_fails_cleanly_and_the_engine_serves_again(cluster):
    pod, base = new_pod(cluster, "gen-kill")
    pod.create(host_mb=384)
    expected = pod.answers()
    snap = str(base / "store" / NAMESPACE / "svc" / "p0" / "gen-kill")
    killed, started = [], threading.Event()

    def killer():
        """Once the checkpoint started: CRIU of runc's checkpoint of this container, killed as soon as it runs."""
        started.wait(120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for pid in criu_of_checkpoint(cluster["node"]["runc_root"], pod.container_id):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.005)

    def log(line):
        if "checkpoint of container" in line:
            started.set()

    params = {name: spec.get("default") for name, spec in host_checkpoint_module.ARGUMENT_SPEC.items()}
    params.update(engine="containerd", container=pod.container_ref, containerd_address=cluster["node"]["socket"],
                  snapshot_dir=snap, identity=identity("gen-kill"), device_backup=True, resume=True, lease=60,
                  timeout=120, hash_during_checkpoint=True)
    thread = threading.Thread(target=killer)
    thread.start()
    try:
        with pytest.raises(SnapshotError) as failure:
            task.host_checkpoint(params, log=log)
    finally:
        started.set()
        thread.join(130)
    assert killed, "CRIU was never seen running: the dump ended before it could be killed"
    result = failure.value.result
    assert result.get("status") == "failed" and result.get("step") == "host snapshot", (failure.value, result)
    record = status.read(snap)
    assert record["status"] == "failed" and record["reason"], record
    assert not os.path.lexists(snap) and not os.path.lexists(os.path.join(os.path.dirname(snap), ".gen-kill.partial"))
    state = json.loads(subprocess.run(["runc", "--root", cluster["node"]["runc_root"], "state", pod.container_id],
                                      capture_output=True, text=True, check=True).stdout)["status"]
    assert state == "running", "the container was left %s" % state
    assert pod.engine_state() == "BACKED_UP", "the task's own backup: the caller resumes it, as the roles do"
    resumed = run_module("npu_snapshot_lock", {"container": pod.container_ref, "state": "unlocked",
                                               "containerd_address": cluster["node"]["socket"]})
    assert resumed["state"] == "RUNNING" and resumed["actions"] == ["restore", "unlock"], resumed
    assert pod.answers() == expected


def test_the_k8s_snapshot_roles_generation_snapshots_a_pod_on_a_containerd_node(cluster):
    pod, base = new_pod(cluster, "rolesvc-p0-0", service="rolesvc", instance="p0")
    npu_root, host_root = base / "npu-snapshots", base / "host-snapshots"  # the pod mounts its NPU snapshot root
    host_root.mkdir(mode=0o700)
    # the engine on all its addresses, as engines usually listen: the canary asks it on its own loopback
    for item in pod.manifest["spec"]["containers"][0]["env"]:
        if item["name"] == "WORKLOAD_HOST":
            item.pop("valueFrom")
            item["value"] = "0.0.0.0"
    pod.create()
    expected = pod.answers()
    inventory = write_inventory(base / "inventory.json", NODE, write_kubeconfig(base / "kubeconfig",
                                                                                cluster["server"].url))
    config = {"enabled": True, "npuSnapshotPath": str(npu_root), "hostSnapshotPath": str(host_root)}
    variables = {"k8s_snapshot_namespace": NAMESPACE, "k8s_snapshot_service": "rolesvc", "k8s_snapshot_config": config,
                 "k8s_snapshot_node_group": "k8s_nodes", "k8s_snapshot_containerd_address": cluster["node"]["socket"]}
    api = cluster["api"]
    # the canary reaches the engine of a containerd pod through that containerd (its pid, its network namespace)
    rc, output = run_playbook("k8s_generate.yml", inventory, dict(variables, k8s_snapshot_canary={
        "url": "http://127.0.0.1:8000/v1/generate?prompt=hi", "compare": "json:answer"}), timeout=600)
    assert rc == 0, output[-4000:]
    host_path = host_root / NAMESPACE / "rolesvc" / "p0" / pod.name
    recorded_canary = json.loads((host_path / layout.CANARY).read_text())
    assert recorded_canary["answer"]["status"] == 200 and recorded_canary["answer"]["field"], recorded_canary
    ann = api.annotations(pod.name)
    assert ann["snapshot.inferops.org/status"] == "completed", ann
    assert ann["snapshot.inferops.org/node"] == NODE and "snapshot.inferops.org/reason" not in ann, ann
    assert api.env(pod.name)["VLLM_NPU_SNAPSHOT_PATH"] == str(npu_root / NAMESPACE / "rolesvc" / "p0" / pod.name)
    recorded = manifest.load_manifest(str(host_path))
    assert recorded["engine"]["name"] == "containerd", recorded["engine"]
    assert recorded["image"]["id"] == pod.status["containerStatuses"][0]["imageID"]
    assert recorded["identity"] == identity(pod.name, service="rolesvc")
    assert ann["snapshot.inferops.org/checksum"] == hashlib.sha256((host_path / "checksum.sha256").read_bytes()).hexdigest()
    record = {key: json.loads(value) for key, value in api.configmap("inferops-snapshot-rolesvc")["data"].items()}
    assert sorted(record) == [pod.name] and record[pod.name]["status"] == "completed", record
    assert record[pod.name]["node"] == NODE and record[pod.name]["checksum"] == ann["snapshot.inferops.org/checksum"]
    # the recreated pod's engine serves again, with the answers of before
    pod.wait_ready()
    assert pod.engine_state() == "RUNNING"
    assert pod.answers() == expected

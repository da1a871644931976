"""The restore-on-create runtime on a CRI test node (scripts/env/cri-node.sh), for the integration tests.

- ``CriRuntimeNode``: the snapshot_node role (``_runtime_helpers.Node``: names and paths of the test's own) run with
  the runtime as a runtime handler of one node's containerd -- the docs' variables (docs/restore-on-create.md
  ``roc-containerd-node``, docs/kubernetes.md ``k8s-containerd-node-vars``) with that node's paths, containerd
  restarted by ``cri-node.sh restart`` where the role may restart it.
- ``runtime_class``: the docs' RuntimeClass (``roc-runtimeclass``) for the handler, in the API emulator.
"""

from pathlib import Path

import yaml

import doc_blocks
from _cri_kubelet import CRI_NODE_SCRIPT, api_client
from _runtime_helpers import Node

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout

ROC = "docs/restore-on-create.md"
K8S = "docs/kubernetes.md"


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

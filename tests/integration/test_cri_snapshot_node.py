"""The snapshot_node role on a Kubernetes node as clusters run it (containerd 1.6 with its CRI plugin, CNI, the kubelet
stand-in; scripts/env/cri-node.sh's node-r, this file's own): the restore-on-create runtime registered as a runtime
handler of the node's containerd, with the docs' variables (docs/restore-on-create.md, docs/kubernetes.md).

- check mode writes nothing; without leave to restart containerd the drop-in is written and the role says containerd
  loads it at its next start -- until then a pod of the handler's RuntimeClass says `no runtime ... is configured`;
  with leave, containerd restarts, the pod that ran before it runs on (the same process), the RuntimeClass's pod runs
  under the runtime, and a third run changes nothing; --diff shows the drop-in;
- a handler whose binary is missing: the pod's status names the binary, nothing of the sandbox is left on the node;
- state=absent refuses while a pod runs with the handler, then removes the drop-in and the files, restarts
  containerd, and the pod that ran all along runs on;
- refusals before anything is written: another configuration than the daemon's, a configuration containerd cannot
  read, a containerd without its CRI plugin (a daemon of this test's own).
"""

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from _cri_kubelet import CriClient, CriKubelet, CriNodes, declare_resources, node_leftovers, pause_pod
from _cri_restore import CriRuntimeNode, runtime_class
from _k8s_helpers import Api, ApiServer

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import wait_for

NODE = "node-r"
NAMESPACE = "crinode-" + uuid.uuid4().hex[:6]
CLASS = "inferops-crinode-" + uuid.uuid4().hex[:4]
pytestmark = pytest.mark.timeout(900)


def ready(pod):
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def sandbox_failure(api, name):
    for condition in ((api.pod(name) or {}).get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodReadyToStartContainers" and condition.get("reason"):
            return condition
    return None


def sandboxes(status, name):
    client = CriClient(status["socket"])
    try:
        items = client.call("runtime", "ListPodSandbox", client.pb.ListPodSandboxRequest()).items
        return [s for s in items if s.metadata.name == name and s.metadata.namespace == NAMESPACE]
    finally:
        client.close()


def init_pid(status, pod):
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    return json.loads((Path(status["runc_root"]) / cid / "state.json").read_text())["init_process_pid"]


@pytest.fixture(scope="module")
def cluster(cri_nodes, tmp_path_factory):
    """node-r with a pod that runs under the node's default handler all along, the API emulator and the stand-in, and
    the role's Node for node-r (names and paths of this file's own; its RuntimeClass in the emulator)."""
    nodes = CriNodes()
    status = nodes.start(NODE)[0][NODE]
    server = ApiServer()
    declare_resources(server)
    api = Api(server.url, NAMESPACE)
    kubelet = CriKubelet(server.url, NODE, status)
    node = CriRuntimeNode(tmp_path_factory.mktemp("crinode"), NODE, status)
    runtime_class(server.url, CLASS, node.name)
    api.create(pause_pod("bystander", NAMESPACE, NODE))
    bystander = kubelet.wait(lambda: ready(api.pod("bystander")) and api.pod("bystander"), "bystander Ready", 90)
    try:
        yield {"status": status, "api": api, "kubelet": kubelet, "node": node, "nodes": nodes, "server": server,
               "bystander": init_pid(status, bystander)}
    finally:  # the pods first: one still running with the handler could not be stopped once its binary is gone
        for pod in api.pods():
            api.delete(pod["metadata"]["name"])
        kubelet.wait(lambda: not kubelet.workers, "the pods removed", 120)
        node.run_role(snapshot_node_state="absent", snapshot_node_force_remove=True,
                      snapshot_node_containerd_restart=True)
        kubelet.stop()
        server.stop()
        for dropin in Path(status["conf_d"]).glob("*.toml"):
            dropin.unlink()
        nodes.down(NODE)
    assert not kubelet.errors, kubelet.errors


def test_the_handler_is_written_loaded_with_leave_to_restart_and_pods_survive_the_restart(cluster):
    node, api, kubelet, status = cluster["node"], cluster["api"], cluster["kubelet"], cluster["status"]
    daemon = cluster["nodes"].status(NODE)[NODE]["pid"]

    ok, changed, failed, out = node.run_role(check=True)
    assert failed == 0, out[-5000:]
    assert not node.dropin.exists() and not node.runtime_path.exists(), "check mode changed the node"

    ok, changed, failed, out = node.run_role(snapshot_node_containerd_restart=False)
    assert failed == 0 and changed > 0, out[-5000:]
    assert node.dropin.exists() and "at its next start" in out, out[-3000:]
    assert cluster["nodes"].status(NODE)[NODE]["pid"] == daemon, "containerd restarted without leave"
    api.create(pause_pod("early", NAMESPACE, NODE, runtime_class=CLASS))
    condition = kubelet.wait(lambda: sandbox_failure(api, "early"), "early's sandbox failure", 60)
    assert 'no runtime for "%s" is configured' % node.name in condition["message"], condition
    api.delete("early")

    ok, changed, failed, out = node.run_role()   # the docs' variables allow the restart
    assert failed == 0 and "Restart containerd (snapshot_node_containerd_restart_command)" in out, out[-5000:]
    after = cluster["nodes"].status(NODE)[NODE]
    assert after["running"] and after["pid"] != daemon, "containerd was not restarted"
    assert os.path.exists("/proc/%d" % cluster["bystander"]), "the running pod did not survive the restart"
    kubelet.wait(lambda: ready(api.pod("bystander")), "bystander still Ready", 30)

    api.create(pause_pod("handled", NAMESPACE, NODE, runtime_class=CLASS))
    handled = kubelet.wait(lambda: ready(api.pod("handled")) and api.pod("handled"), "handled Ready", 90)
    options = json.loads((Path(status["state"]) / "io.containerd.runtime.v2.task" / "k8s.io" /
                          handled["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1] /
                          "options.json").read_text())
    assert options["binary_name"] == str(node.runtime_path), options
    assert kubelet.record(NAMESPACE, "handled").handler == node.name

    ok, changed, failed, out = node.run_role()
    assert failed == 0 and changed == 0, "a third run changed something:\n%s" % out[-5000:]
    assert cluster["nodes"].status(NODE)[NODE]["pid"] == after["pid"]


def test_a_diff_shows_the_dropin_it_would_write(cluster):
    node = cluster["node"]
    ok, changed, failed, out = node.run_role(check=True, diff=True, snapshot_node_containerd_runc_root="/run/elsewhere")
    assert failed == 0 and changed >= 1, out[-3000:]
    assert '+Root = "/run/elsewhere"' in out and '-Root = "%s"' % Path(cluster["status"]["runc_root"]).parent in out, \
        out[-3000:]
    assert 'Root = "/run/elsewhere"' not in node.dropin.read_text()


def test_a_handler_whose_binary_is_missing_is_named_in_the_pods_status(cluster):
    """containerd runs the handler's binary for the pod's sandbox: without it RunPodSandbox fails, and the kubelet's
    status says so with the path; containerd removes what it had made of the sandbox (network namespace, veth)."""
    node, api, kubelet, status = cluster["node"], cluster["api"], cluster["kubelet"], cluster["status"]
    before = node_leftovers(status)
    kept = node.runtime_path.with_name("kept")
    os.rename(node.runtime_path, kept)
    try:
        api.create(pause_pod("nobinary", NAMESPACE, NODE, runtime_class=CLASS))
        condition = kubelet.wait(lambda: sandbox_failure(api, "nobinary"), "nobinary's sandbox failure", 60)
        assert condition["reason"] == "FailedCreatePodSandBox" and str(node.runtime_path) in condition["message"], \
            condition
        assert api.pod("nobinary")["status"]["phase"] == "Pending"
        assert not sandboxes(status, "nobinary"), "a sandbox was left half-made"
        assert node_leftovers(status) == before, "the failed sandbox left something on the node"
        api.delete("nobinary")
        kubelet.wait(lambda: kubelet.record(NAMESPACE, "nobinary") is None, "nobinary removed", 60)
    finally:
        os.rename(kept, node.runtime_path)


@pytest.mark.parametrize("overrides, message", [
    ({"snapshot_node_containerd_config": "/etc/containerd/config.toml"},
     "snapshot_node_containerd_config: the containerd on {socket} (pid {pid}) reads {config}, not "
     "/etc/containerd/config.toml"),
    ({"snapshot_node_containerd_socket": "/run/inferops-cri/nowhere.sock"},
     "snapshot_node_containerd_socket: no process listens on /run/inferops-cri/nowhere.sock"),
    ({"snapshot_node_containerd_dropin": "/etc/inferops-cri/elsewhere/handler.toml"},
     "snapshot_node_containerd_dropin: {config} does not import /etc/inferops-cri/elsewhere/handler.toml"),
])
def test_what_cannot_be_told_is_refused_before_anything_is_written(cluster, overrides, message):
    node = cluster["node"]
    before = node.dropin.read_bytes() if node.dropin.exists() else None
    settings = (node.lib_dir / "runtime.json").read_bytes() if (node.lib_dir / "runtime.json").exists() else None
    ok, changed, failed, out = node.run_role(**overrides)
    status = cluster["nodes"].status(NODE)[NODE]
    assert failed == 1 and message.format(socket=status["socket"], pid=status["pid"], config=status["config"]) in out, \
        out[-3000:]
    assert (node.dropin.read_bytes() if node.dropin.exists() else None) == before
    assert ((node.lib_dir / "runtime.json").read_bytes() if (node.lib_dir / "runtime.json").exists() else None) == \
        settings, "the role wrote before it refused"


def test_a_configuration_containerd_cannot_read_is_refused(cluster):
    node, status = cluster["node"], cluster["status"]
    broken = Path(status["conf_d"]) / "40-broken.toml"
    broken.write_text("version = 2\n[plugins\n")
    try:
        ok, changed, failed, out = node.run_role()
        assert failed == 1 and "containerd cannot read its configuration, so the role cannot tell which one is in " \
                               "force" in out, out[-3000:]
    finally:
        broken.unlink()


@pytest.fixture
def containerd_without_cri(tmp_path):
    """A containerd of this test's own with its CRI plugin disabled (root, state and socket below tmp_path)."""
    config = tmp_path / "config.toml"
    socket = tmp_path / "containerd.sock"
    config.write_text('version = 2\nroot = "%s"\nstate = "%s"\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                      '[grpc]\n  address = "%s"\n[ttrpc]\n  address = "%s.ttrpc"\n[metrics]\n  address = ""\n'
                      '[plugins."io.containerd.internal.v1.opt"]\n  path = "%s"\n'
                      % (tmp_path / "root", tmp_path / "state", socket, socket, tmp_path / "opt"))
    log = open(tmp_path / "containerd.log", "w")
    daemon = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: (socket.exists(), daemon.poll()), 60, what="the CRI-less containerd's socket")
        yield {"config": str(config), "socket": str(socket), "state": str(tmp_path / "state"), "pid": daemon.pid}
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
        log.close()


def test_a_containerd_without_its_cri_plugin_is_refused(cluster, containerd_without_cri, tmp_path):
    node = cluster["node"]
    (tmp_path / "conf.d").mkdir()
    ok, changed, failed, out = node.run_role(
        snapshot_node_containerd_config=containerd_without_cri["config"],
        snapshot_node_containerd_socket=containerd_without_cri["socket"],
        snapshot_node_containerd_state=containerd_without_cri["state"],
        snapshot_node_containerd_dropin=str(tmp_path / "conf.d" / "x.toml"))
    assert failed == 1 and "the containerd on %s runs without its CRI plugin (" % containerd_without_cri["socket"] \
        in out and "check disabled_plugins in %s" % containerd_without_cri["config"] in out, out[-3000:]
    assert not (tmp_path / "conf.d" / "x.toml").exists()


def test_absent_refuses_while_a_pod_runs_with_the_handler_then_removes_it_and_pods_run_on(cluster):
    node, api, kubelet = cluster["node"], cluster["api"], cluster["kubelet"]
    if api.pod("handled") is None:  # this test alone: the handler's pod of the first test
        node.install()
        api.create(pause_pod("handled", NAMESPACE, NODE, runtime_class=CLASS))
    kubelet.wait(lambda: ready(api.pod("handled")), "handled Ready", 90)
    ok, changed, failed, out = node.run_role(snapshot_node_state="absent")
    assert failed == 1 and "pods still run with the runtime handler %s: %s/handled" % (node.name, NAMESPACE) in out, \
        out[-3000:]
    assert node.dropin.exists() and node.runtime_path.exists()

    api.delete("handled")
    kubelet.wait(lambda: kubelet.record(NAMESPACE, "handled") is None, "handled removed", 90)
    daemon = cluster["nodes"].status(NODE)[NODE]["pid"]
    ok, changed, failed, out = node.run_role(snapshot_node_state="absent")
    assert failed == 0 and changed > 0, out[-5000:]
    assert not node.dropin.exists() and not node.runtime_path.exists() and not node.lib_dir.exists()
    assert cluster["nodes"].status(NODE)[NODE]["pid"] != daemon, "containerd still runs with the handler"
    assert os.path.exists("/proc/%d" % cluster["bystander"]), "the running pod did not survive the removal"
    api.create(pause_pod("gone", NAMESPACE, NODE, runtime_class=CLASS))
    condition = kubelet.wait(lambda: sandbox_failure(api, "gone"), "gone's sandbox failure", 60)
    assert 'no runtime for "%s" is configured' % node.name in condition["message"], condition
    api.delete("gone")
    ok, changed, failed, out = node.run_role(snapshot_node_state="absent")
    assert failed == 0 and changed == 0, "removing twice changed something:\n%s" % out[-5000:]

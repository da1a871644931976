"""The Kubernetes nodes of the tests as clusters run them: two containerd 1.6 CRI nodes of
their own on this machine (scripts/env/cri-node.sh) and the kubelet stand-in that drives them through the CRI's gRPC
API (tests/integration/_cri_kubelet.py), against the Kubernetes API emulator.

- the nodes start idempotently, and a second start (another session's fixture) finds them running;
- a pod bound to node-a runs the workload image through the CRI, gets an address from CNI on node-a's bridge,
  answers HTTP on it, is reported Running and Ready with that podIP; containerd's OCI config of its container
  carries the io.kubernetes.cri.* annotations the collection's tenant binding reads; deleting it removes the
  sandbox and leaves no network namespace, veth, mount or cgroup behind;
- a RuntimeClass whose handler the node does not have, a RuntimeClass that does not exist, and an image the node
  does not have each end in a pod status that names the cause (an image is never pulled from outside);
- on a node of this test's own (node-z), broken on purpose: a killed run's leftovers (its containerd killed, the
  stand-in gone) are removed by `cri-node.sh down`, the node starts again, and the next stand-in removes the orphaned
  sandbox; a runtime handler added by a drop-in must carry the CRI plugin's whole section (containerd 1.6
  replaces the section with each import), running pods survive the containerd restart that loads it, and the
  handler's pod_annotations let a pod's annotation reach the OCI config.
"""

import ipaddress
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from _cri_kubelet import (NODES, CriClient, CriKubelet, CriNodes, cri_section, declare_resources, node_leftovers,
                          oci_config, pause_pod, runtime_class, workload_pod)
from _k8s_helpers import Api, ApiServer

NAMESPACE = "cri-" + uuid.uuid4().hex[:6]
SCRATCH_NODE = "node-z"   # broken on purpose by this file alone: node-a and node-b may run other tests' pods
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster(cri_nodes):
    server = ApiServer()
    declare_resources(server)
    kubelets = {node: CriKubelet(server.url, node, cri_nodes[node]) for node in NODES}
    yield {"server": server, "api": Api(server.url, NAMESPACE), "kubelets": kubelets, "nodes": cri_nodes}
    for kubelet in kubelets.values():
        kubelet.stop()
    server.stop()
    for kubelet in kubelets.values():
        assert not kubelet.errors, kubelet.errors


@pytest.fixture(scope="module")
def scratch(cri_nodes):
    """node-z: a node this file may kill, tear down and reconfigure; down again at the end."""
    nodes = CriNodes()
    status = nodes.start(SCRATCH_NODE)[0]
    yield nodes, status[SCRATCH_NODE]
    conf_d = Path(status[SCRATCH_NODE]["conf_d"])
    for dropin in conf_d.glob("*.toml"):
        dropin.unlink()
    nodes.down(SCRATCH_NODE)


def ready(pod):
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def sandboxes(status, uid=None):
    client = CriClient(status["socket"])
    try:
        items = client.call("runtime", "ListPodSandbox", client.pb.ListPodSandboxRequest()).items
        return [s for s in items if uid is None or s.metadata.uid == uid]
    finally:
        client.close()


def test_nodes_start_idempotently(cri_nodes):
    """Both nodes run, each with its own daemon, socket, root and bridge; starting them again (the next session's
    fixture, another pytest worker) finds the same daemons; dockerd's own containerd is not theirs."""
    dockerd_containerd = subprocess.run(["pgrep", "-f", "containerd --config /var/run/docker/containerd"],
                                        capture_output=True, text=True, check=False).stdout.split()
    again, said = CriNodes().start(*NODES)
    for node in NODES:
        assert again[node]["pid"] == cri_nodes[node]["pid"] and again[node]["running"], (node, said)
        assert "%s: running (pid %d" % (node, cri_nodes[node]["pid"]) in said, said
    assert len({cri_nodes[n]["socket"] for n in NODES}) == len({cri_nodes[n]["root"] for n in NODES}) == 2
    assert {cri_nodes[n]["subnet"] for n in NODES} == {"10.247.1.0/24", "10.247.2.0/24"}
    for node in NODES:
        status = cri_nodes[node]
        assert "/var/run/docker" not in Path(status["config"]).read_text()
        config = Path(status["config"]).read_text()
        settings = ('sandbox_image = "docker.io/inferops-cri/pause:local"',
                    'snapshotter = "%s"' % status["snapshotter"], "SystemdCgroup = false",
                    'Root = "%s"' % str(Path(status["runc_root"]).parent),
                    'imports = ["%s/*.toml"]' % status["conf_d"], 'default_runtime_name = "runc"')
        for setting in settings:
            assert setting in config, (node, setting)
        client = CriClient(status["socket"])
        try:
            version = client.call("runtime", "Version", client.pb.VersionRequest(version="v1"))
            assert (version.runtime_name, version.runtime_api_version) == ("containerd", "v1"), version
            conditions = client.call("runtime", "Status", client.pb.StatusRequest()).status.conditions
            assert {c.type: c.status for c in conditions} == {"RuntimeReady": True, "NetworkReady": True}
            image = client.call("images", "ImageStatus", client.pb.ImageStatusRequest(
                image=client.pb.ImageSpec(image="inferops/workload:latest"))).image
            assert image.id and "docker.io/inferops/workload:latest" in image.repo_tags, image
        finally:
            client.close()
        assert Path("/sys/class/net", status["bridge"]).exists()
    assert subprocess.run(["pgrep", "-f", "containerd --config /var/run/docker/containerd"], capture_output=True,
                          text=True, check=False).stdout.split() == dockerd_containerd, "dockerd's containerd changed"


def test_pod_runs_through_cri_with_a_cni_address(cluster, device_dir, tmp_path):
    """A pod bound to node-a: sandbox and container through the CRI, an address on node-a's bridge, the engine
    answering there, Running and Ready with that podIP; the OCI config containerd wrote names the pod's namespace,
    name and container; deleting it removes everything the pod had on the node."""
    api, kubelet, status = cluster["api"], cluster["kubelets"]["node-a"], cluster["nodes"]["node-a"]
    npu_root = tmp_path / "npu-snapshots"
    npu_root.mkdir()
    pod = workload_pod("engine-0", NAMESPACE, "node-a", device_dir, npu_root,
                       annotations={"org.inferops.restore-from": "/nowhere", "team": "a"})
    created = api.create(pod)
    uid = created["metadata"]["uid"]
    started = time.monotonic()
    current = kubelet.wait(lambda: ready(api.pod("engine-0")) and api.pod("engine-0"), "engine-0 Ready", 180)
    print("pod created -> Ready through the CRI: %.1f s" % (time.monotonic() - started))
    pod_ip = current["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(status["subnet"]), pod_ip
    assert current["status"]["phase"] == "Running" and current["status"]["hostIP"] == status["gateway"]
    engine = current["status"]["containerStatuses"][0]
    assert engine["ready"] and engine["containerID"].startswith("containerd://") and "running" in engine["state"]
    assert engine["imageID"].startswith("sha256:")

    code, body = kubelet.get("http://%s:8000/health" % pod_ip)
    assert code == 200, body
    code, body = kubelet.get("http://%s:8000/v1/generate?prompt=hello" % pod_ip, timeout=30)
    assert code == 200 and json.loads(body)["answer"], body

    record = kubelet.record(NAMESPACE, "engine-0")
    container_id = engine["containerID"].split("://", 1)[1]
    client = CriClient(status["socket"])
    try:
        sandbox = client.call("runtime", "PodSandboxStatus", client.pb.PodSandboxStatusRequest(
            pod_sandbox_id=record.sandbox_id)).status
    finally:
        client.close()
    assert sandbox.network.ip == pod_ip and sandbox.runtime_handler == ""
    assert sandbox.labels["io.kubernetes.pod.namespace"] == NAMESPACE and sandbox.labels["app"] == "svc"
    assert sandbox.annotations["org.inferops.restore-from"] == "/nowhere"

    oci = oci_config(status, container_id)
    notes = oci["annotations"]
    assert notes["io.kubernetes.cri.container-type"] == "container", notes
    assert notes["io.kubernetes.cri.sandbox-id"] == record.sandbox_id
    assert notes["io.kubernetes.cri.sandbox-namespace"] == NAMESPACE
    assert notes["io.kubernetes.cri.sandbox-name"] == "engine-0"
    assert notes["io.kubernetes.cri.container-name"] == "engine"
    # the default runtime handler (runc) lets no pod annotation through: the restore marker reaches the runtime
    # only as the env the pod spec takes from it, or through a handler's pod_annotations (test_dropin_handler...)
    assert "org.inferops.restore-from" not in notes
    env = dict(item.split("=", 1) for item in oci["process"]["env"])
    assert env["WORKLOAD_HOST"] == pod_ip and env["INFEROPS_RESTORE_FROM"] == "/nowhere" and env["POD_UID"] == uid
    # the container joins the pod's network namespace through the pause process (/proc/<its pid>/ns/net); the
    # sandbox's own config names the namespace CNI configured, pinned below the node's state dir
    pause_pid = json.loads((Path(status["runc_root"]) / record.sandbox_id / "state.json").read_text())[
        "init_process_pid"]
    netns = [ns["path"] for ns in oci["linux"]["namespaces"] if ns["type"] == "network"]
    assert netns == ["/proc/%d/ns/net" % pause_pid], netns
    pinned = [ns["path"] for ns in oci_config(status, record.sandbox_id)["linux"]["namespaces"]
              if ns["type"] == "network"]
    assert pinned[0].startswith(status["state"] + "/io.containerd.grpc.v1.cri/netns/cni-"), pinned
    assert oci_config(status, record.sandbox_id)["annotations"]["io.kubernetes.cri.container-type"] == "sandbox"
    assert oci["linux"]["cgroupsPath"].startswith(status["cgroup_parent"] + "/kubepods/"), oci["linux"]
    assert (Path(status["runc_root"]) / container_id / "state.json").exists()
    assert any(d["path"] == "/dev/davinci0" for d in oci["linux"]["devices"]), oci["linux"]["devices"]
    assert any(m["destination"] == "/run/inferops-snapshot" and "empty-dir" in m["source"] for m in oci["mounts"])
    assert (kubelet.pod_log_dir(current) / "engine" / "0.log").exists()

    api.delete("engine-0")
    kubelet.wait(lambda: kubelet.record(NAMESPACE, "engine-0") is None, "engine-0 removed from node-a", 120)
    assert not sandboxes(status, uid)
    kubelet.wait(lambda: not any(node_leftovers(status).values()) or None, "node-a clean after the delete", 30)
    assert not Path(status["state"], "io.containerd.runtime.v2.task", "k8s.io", container_id).exists()
    assert [e[1] for e in kubelet.events if e[0] == "engine-0"][-1] == "removed"


def test_pod_status_names_why_it_cannot_start(cluster):
    """A RuntimeClass whose handler node-b lacks, a RuntimeClass that does not exist, an image node-b lacks (with
    and without permission to pull): each pod stays Pending with the cause in its status, and, as the kubelet
    records it, an Event; nothing is left of it on the node."""
    api, kubelet, status = cluster["api"], cluster["kubelets"]["node-b"], cluster["nodes"]["node-b"]
    server = cluster["server"]
    from _cri_kubelet import api_client  # pylint: disable=import-outside-toplevel
    import kubernetes  # pylint: disable=import-outside-toplevel
    nodeapi = kubernetes.client.NodeV1Api(api_client(server.url))
    nodeapi.create_runtime_class(runtime_class("inferops-cri-nohandler", "no-such-handler"), _preload_content=False)
    api.create(pause_pod("nohandler", NAMESPACE, "node-b", runtime_class="inferops-cri-nohandler"))
    api.create(pause_pod("noclass", NAMESPACE, "node-b", runtime_class="inferops-cri-absent"))
    missing = pause_pod("noimage", NAMESPACE, "node-b", image="inferops/absent:1")
    missing["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    api.create(missing)
    api.create(pause_pod("neverpull", NAMESPACE, "node-b", image="inferops/absent:1"))

    def sandbox_reason(name):
        pod = api.pod(name) or {}
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition["type"] == "PodReadyToStartContainers" and condition.get("reason"):
                return condition
        return None

    def waiting(name):
        statuses = ((api.pod(name) or {}).get("status") or {}).get("containerStatuses") or []
        state = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return state if state.get("reason") not in (None, "ContainerCreating") else None

    condition = kubelet.wait(lambda: sandbox_reason("nohandler"), "nohandler's sandbox failure", 60)
    assert condition["reason"] == "FailedCreatePodSandBox", condition
    assert 'no runtime for "no-such-handler" is configured' in condition["message"], condition
    condition = kubelet.wait(lambda: sandbox_reason("noclass"), "noclass's sandbox failure", 60)
    assert condition["message"] == 'Failed to create pod sandbox: RuntimeClass "inferops-cri-absent" not found'
    state = kubelet.wait(lambda: waiting("noimage"), "noimage's image error", 60)
    assert state["reason"] in ("ErrImagePull", "ImagePullBackOff"), state
    # the pull the policy allows went to the refused local port, nowhere else
    assert "127.0.0.1:9" in state["message"] and "connection refused" in state["message"], state
    state = kubelet.wait(lambda: waiting("neverpull"), "neverpull's image error", 60)
    assert state == {"reason": "ErrImageNeverPull", "message": (
        'Container image "inferops/absent:1" is not present with pull policy of Never')}, state
    for name in ("nohandler", "noclass", "noimage", "neverpull"):
        pod = api.pod(name)
        assert pod["status"]["phase"] == "Pending", pod["status"]
        waiting_state = pod["status"]["containerStatuses"][0]["state"]
        assert "waiting" in waiting_state, waiting_state
    events = api.core.list_namespaced_event(NAMESPACE, _preload_content=False)
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in json.loads(events.data)["items"]}
    assert {("nohandler", "FailedCreatePodSandBox"), ("noclass", "FailedCreatePodSandBox"),
            ("noimage", "Failed"), ("neverpull", "Failed")} <= reasons, reasons
    # a failed RunPodSandbox leaves no sandbox; the image errors' sandboxes go with their pods
    for name in ("nohandler", "noclass", "noimage", "neverpull"):
        api.delete(name)
    names = ("nohandler", "noclass", "noimage", "neverpull")
    kubelet.wait(lambda: not any(kubelet.record(NAMESPACE, n) for n in names), "the four pods removed", 60)
    assert not [s for s in sandboxes(status) if s.metadata.namespace == NAMESPACE]
    kubelet.wait(lambda: not any(node_leftovers(status).values()) or None, "node-b clean", 30)


def node_processes(status):
    """Processes of a node: its containerd-shims, and whatever runs in its pod cgroups (zombies are dead: this
    machine's PID 1 does not reap the orphans it inherits from a killed shim)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cgroups = (proc / "cgroup").read_text()
        except (OSError, IndexError):
            continue
        if ("containerd-shim" in cmdline and "-address %s " % status["socket"] in cmdline) or \
                (":%s/" % status["cgroup_parent"]) in cgroups:
            found.add(int(proc.name))
    return found


def test_killed_run_is_cleaned_up(scratch):
    """A run killed with its pods up (containerd SIGKILLed, the stand-in gone without a word): `cri-node.sh down`
    removes processes, mounts, netns, veths and bridge; the node starts again, and the next stand-in removes the
    sandbox the dead one left in containerd's records."""
    nodes, status = scratch
    server = ApiServer()
    declare_resources(server)
    api = Api(server.url, NAMESPACE)
    first = CriKubelet(server.url, SCRATCH_NODE, status)
    try:
        api.create(pause_pod("left-behind", NAMESPACE, SCRATCH_NODE))
        pod = first.wait(lambda: ready(api.pod("left-behind")) and api.pod("left-behind"), "left-behind Ready", 60)
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(status["subnet"])
        first.abandon()
        api.delete("left-behind")   # gone from the API too: the next stand-in must not run it again
        os.kill(nodes.status(SCRATCH_NODE)[SCRATCH_NODE]["pid"], signal.SIGKILL)
        left = node_leftovers(status)
        assert left["netns"] and left["veths"] and left["mounts"], left
        assert node_processes(status), "the killed node's pods run on"

        said = nodes.down(SCRATCH_NODE)
        assert "%s: down" % SCRATCH_NODE in said
        assert not any(node_leftovers(status).values()), node_leftovers(status)
        assert not node_processes(status)
        assert not Path("/sys/class/net", status["bridge"]).exists()
        assert not nodes.status(SCRATCH_NODE)[SCRATCH_NODE]["running"]

        again, said = nodes.start(SCRATCH_NODE)
        assert again[SCRATCH_NODE]["running"] and again[SCRATCH_NODE]["pid"] != status["pid"], said
        second = CriKubelet(server.url, SCRATCH_NODE, again[SCRATCH_NODE])
        try:
            assert not sandboxes(again[SCRATCH_NODE]), "the orphaned sandbox was not collected"
            assert ("left-behind", "orphan removed") in [(e[0], e[1]) for e in second.events]
        finally:
            second.stop()
        assert not second.errors, second.errors
    finally:
        server.stop()


def test_dropin_handler_keeps_pods_and_passes_pod_annotations(scratch):
    """The layout a runtime handler is added to (what the snapshot_node role will do): a drop-in with the handler's
    table alone replaces containerd 1.6's whole CRI section -- the node comes up without its CRI plugin and says so;
    a drop-in carrying the node's CRI section plus the handler works. Pods keep running through the containerd
    restarts. A pod of the handler's RuntimeClass gets the pod annotations its pod_annotations let through in the OCI
    config (and no others); a pod of the default handler gets none."""
    nodes = scratch[0]
    status = nodes.start(SCRATCH_NODE)[0][SCRATCH_NODE]
    conf_d = Path(status["conf_d"])
    server = ApiServer()
    declare_resources(server)
    api = Api(server.url, NAMESPACE)
    import kubernetes  # pylint: disable=import-outside-toplevel
    from _cri_kubelet import api_client  # pylint: disable=import-outside-toplevel
    kubernetes.client.NodeV1Api(api_client(server.url)).create_runtime_class(
        runtime_class("inferops-cri-passthrough", "passthrough"), _preload_content=False)
    kubelet = CriKubelet(server.url, SCRATCH_NODE, status)
    try:
        api.create(pause_pod("survivor", NAMESPACE, SCRATCH_NODE, annotations={"org.inferops.restore-from": "/x"}))
        survivor = kubelet.wait(lambda: ready(api.pod("survivor")) and api.pod("survivor"), "survivor Ready", 60)
        survivor_id = survivor["status"]["containerStatuses"][0]["containerID"].split("://")[1]
        survivor_state = Path(status["runc_root"]) / survivor_id / "state.json"
        survivor_pid = json.loads(survivor_state.read_text())["init_process_pid"]

        handler = ('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.passthrough]\n'
                   '  runtime_type = "io.containerd.runc.v2"\n'
                   '  pod_annotations = ["org.inferops.*"]\n'
                   '  container_annotations = ["org.inferops.*"]\n'
                   '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.passthrough.options]\n'
                   '    BinaryName = "/usr/sbin/runc"\n'
                   '    Root = "%s"\n'
                   '    SystemdCgroup = false\n' % Path(status["runc_root"]).parent)
        (conf_d / "50-passthrough.toml").write_text("version = 2\n\n[plugins]\n" + handler)
        with pytest.raises(AssertionError) as refused:
            nodes.restart(SCRATCH_NODE)
        assert "started without its CRI plugin" in str(refused.value), refused.value
        assert "no corresponding runtime configured" in str(refused.value), refused.value

        (conf_d / "50-passthrough.toml").unlink()
        section = cri_section(status)
        assert 'sandbox_image = "docker.io/inferops-cri/pause:local"' in section and "passthrough" not in section
        (conf_d / "50-passthrough.toml").write_text("version = 2\n\n[plugins]\n" + section + handler)
        nodes.restart(SCRATCH_NODE)
        restarted = nodes.status(SCRATCH_NODE)[SCRATCH_NODE]
        assert restarted["running"] and restarted["pid"] != status["pid"]
        assert os.path.exists("/proc/%d" % survivor_pid), "the pod did not survive the containerd restart"
        kubelet.wait(lambda: ready(api.pod("survivor")), "survivor still Ready after the restart", 30)

        api.create(pause_pod("passthrough", NAMESPACE, SCRATCH_NODE, runtime_class="inferops-cri-passthrough",
                             annotations={"org.inferops.restore-from": "/snapshots/x", "other.example/key": "v"}))
        passthrough = kubelet.wait(lambda: ready(api.pod("passthrough")) and api.pod("passthrough"),
                                   "passthrough Ready", 60)
        notes = oci_config(status, passthrough["status"]["containerStatuses"][0]["containerID"].split("://")[1])[
            "annotations"]
        assert notes["org.inferops.restore-from"] == "/snapshots/x", notes
        assert "other.example/key" not in notes and notes["io.kubernetes.cri.sandbox-namespace"] == NAMESPACE
        assert "org.inferops.restore-from" not in oci_config(status, survivor_id)["annotations"]
        record = kubelet.record(NAMESPACE, "passthrough")
        assert record.handler == "passthrough"
        for name in ("survivor", "passthrough"):
            api.delete(name)
        kubelet.wait(lambda: not kubelet.workers, "both pods removed", 60)
    finally:
        kubelet.stop()
        server.stop()
        for dropin in conf_d.glob("*.toml"):
            dropin.unlink()
    assert not kubelet.errors, kubelet.errors

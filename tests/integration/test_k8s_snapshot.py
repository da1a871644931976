"""Kubernetes mode end to end: the roles k8s_snapshot_generate and k8s_snapshot_restore run through
ansible-playbook against a Kubernetes API emulator over real HTTP (kubernetes client, kubernetes.core),
with the node side on the real dockerd + CRIU and the simulated NPU. The test plays the kubelet
(_k8s_helpers.Kubelet) and, where a controller would recreate a pod, recreates it itself. The node's
container runtime is the real restore-on-create runtime, installed by the snapshot_node role for this test
run (_runtime_helpers): the pods name it as their RuntimeClass, and it restores a recreated pod's container
from its snapshot, or starts it normally, when the kubelet creates the container.

The seed design's test table, Kubernetes rows: config injection (annotations + env), device snapshot
taken by the engine before Ready, host snapshot + checksum -> completed, restore on recreation with the
new environment, the runtime's fallback to a normal start when the snapshot is unusable at creation,
failure -> failed + cleaned + serving, timeout, and the compatibility rows: no config, disabled, first
deployment without a snapshot, another image version.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import yaml

from _k8s_helpers import (Api, ApiServer, Kubelet, playbook_command, run_playbook, workload_pod, write_inventory,
                          write_kubeconfig)
from _runtime_helpers import installed_runtime
from conftest import REPO, docker, free_port, http_get

from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, status

NODE = "node-a"
RUNTIME_CLASS = "inferops-restore"  # the pods' runtimeClassName; its handler is the runtime the role installed
PROMPTS = ["what is an NPU?", "snapshot me", "the quick brown fox"]
pytestmark = pytest.mark.timeout(600)


class Cluster:
    def __init__(self, base, image, runtime):
        self.base, self.image, self.runtime = base, image, runtime
        self.server = ApiServer()
        self.url = self.server.url
        self.kubeconfig = write_kubeconfig(base / "kubeconfig", self.url)
        self.kubelet = Kubelet(self.url, NODE, base / "kubelet", "k8stest-" + uuid.uuid4().hex[:6],
                               runtime_classes={RUNTIME_CLASS: runtime.name})
        self.inventory = write_inventory(base / "inventory.json", NODE, self.kubeconfig)

    def close(self):
        self.kubelet.stop()
        self.server.stop()


class Service:
    """One inference service in its own namespace: its pods, snapshot roots and playbook runs."""

    def __init__(self, cluster, base, namespace, name="qwen"):
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.api = Api(cluster.url, namespace)
        self.base = base
        self.npu_root = base / "npu-snapshots"
        # the host snapshots on the node: below the runtime's snapshot root, the only place it restores from
        self.host_root = cluster.runtime.roots / ("host-" + namespace)
        for root in (self.npu_root, self.host_root):
            root.mkdir(mode=0o700, exist_ok=True)
        self.ports, self.devices = {}, {}

    def config(self, **overrides):
        config = {"enabled": True, "npuSnapshotPath": str(self.npu_root), "hostSnapshotPath": str(self.host_root)}
        config.update(overrides)
        return config

    def manifest(self, pod, instance, **kwargs):
        if pod not in self.ports:
            self.ports[pod] = free_port()
            self.devices[pod] = self.base / ("npu-device-" + pod)
            self.devices[pod].mkdir(mode=0o700)
        kwargs.setdefault("node", None if kwargs.get("gated") else NODE)
        kwargs.setdefault("runtime_class", RUNTIME_CLASS)
        image = kwargs.pop("image", self.cluster.image)
        return workload_pod(pod, self.namespace, self.name, instance, image, self.ports[pod], self.devices[pod],
                            self.npu_root, **kwargs)

    def create(self, pod, instance, **kwargs):
        return self.api.create(self.manifest(pod, instance, **kwargs))

    def play(self, playbook, config, check=False, **extra):
        variables = {"k8s_snapshot_namespace": self.namespace, "k8s_snapshot_service": self.name,
                     "k8s_snapshot_node_group": "k8s_nodes"}
        if config is not None:
            variables["k8s_snapshot_config"] = config
        variables.update(extra)
        return run_playbook(playbook, self.cluster.inventory, variables, check=check)

    def generate(self, config, check=False, **extra):
        return self.play("k8s_generate.yml", config, check=check, **extra)

    def restore(self, config, **extra):
        return self.play("k8s_restore.yml", config, **extra)

    def url(self, pod):
        return "http://127.0.0.1:%d" % self.ports[pod]

    def answers(self, pod):
        result = []
        for prompt in PROMPTS:
            status, body = http_get(self.url(pod) + "/v1/generate?prompt=" + prompt.replace(" ", "%20"), timeout=30)
            assert status == 200, (pod, status, body)
            result.append(body["answer"])
        return result

    def info(self, pod):
        return http_get(self.url(pod) + "/v1/info")[1]

    def wait_ready(self, pod, timeout=90):
        def ready():
            current = self.api.pod(pod)
            conditions = ((current or {}).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        self.api.wait(ready, "pod %s Ready" % pod, timeout)

    def container_id(self, pod):
        return self.api.pod(pod)["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]

    def snapshot_dir(self, instance, pod, root=None):
        return str((root or self.host_root) / self.namespace / self.name / instance / pod)

    def reset_device(self, pod):
        """What deleting the pod does to its NPU: the device memory is gone."""
        subprocess.run([sys.executable, str(REPO / "tests/simulator/aclsim_ctl.py"), "reset", "0"], check=True,
                       capture_output=True, env=dict(os.environ, ACL_SIM_DEVICE_DIR=str(self.devices[pod])))

    def template_env(self, instance):
        """The env a StatefulSet template of the snapshotted instance carries (docs/kubernetes.md)."""
        path = "%s/%s/%s/%s/$(POD_NAME)" % (self.npu_root, self.namespace, self.name, instance)
        return {"VLLM_NPU_SNAPSHOT_PATH": path}

    def recreate(self, pod, instance, extra_env=None, **kwargs):
        """A controller's recreation after an abnormal deletion: the same pod from the instance's template
        (the snapshotted instance p0's carries the NPU snapshot path), held by the restore gate."""
        env = dict(self.template_env(instance) if instance == "p0" else {}, **(extra_env or {}))
        kwargs["extra_env"] = env
        self.api.delete(pod)
        self.cluster.kubelet.wait_removed(self.namespace, pod)
        self.reset_device(pod)
        return self.create(pod, instance, gated=True, **kwargs)


@pytest.fixture(scope="module")
def runtime(docker_env, tmp_path_factory):
    """The node's restore-on-create runtime: installed by the snapshot_node role under a name of this test
    run, removed again (snapshot_node_state=absent) after the cluster's containers are gone."""
    with installed_runtime(tmp_path_factory.mktemp("k8s-node")) as node:
        yield node


@pytest.fixture(scope="module")
def cluster(docker_env, runtime, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("k8s"), docker_env, runtime)
    yield c
    c.close()
    assert c.kubelet.errors == [], "the kubelet simulation failed:\n" + "\n".join(c.kubelet.errors)


def recap_changed(output):
    line = [line for line in output.splitlines() if line.startswith("localhost ")][-1]
    return int(line.split("changed=")[1].split()[0])


def sha256(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture(scope="module")
def generated(cluster, tmp_path_factory):
    """First deployment: service qwen with instances p0 (two pods) and p1 (one pod), created without any
    snapshot settings; the generation role then snapshots p0."""
    svc = Service(cluster, tmp_path_factory.mktemp("gen"), "infer")
    pods = {"qwen-p0-0": "p0", "qwen-p0-1": "p0", "qwen-p1-0": "p1"}
    for pod, instance in pods.items():
        svc.create(pod, instance)
    uids = {pod: svc.api.pod(pod)["metadata"]["uid"] for pod in pods}
    svc.wait_ready("qwen-p1-0")
    expected = svc.answers("qwen-p1-0")
    started = time.monotonic()
    rc, output = svc.generate(svc.config())
    return dict(svc=svc, rc=rc, output=output, uids=uids, expected=expected, seconds=time.monotonic() - started)


def test_generation_injects_the_config_and_snapshots_the_first_instance(generated, cluster):
    svc, api = generated["svc"], generated["svc"].api
    assert generated["rc"] == 0, generated["output"][-4000:]
    for pod in ("qwen-p0-0", "qwen-p0-1"):
        npu_path = svc.snapshot_dir("p0", pod, root=svc.npu_root)
        host_path = svc.snapshot_dir("p0", pod)
        ann = api.annotations(pod)
        # config injection: annotations and env, each path with the pod's own identity
        assert ann["snapshot.inferops.org/identity"] == "infer/qwen/p0/" + pod
        assert ann["snapshot.inferops.org/npu-path"] == npu_path
        assert ann["snapshot.inferops.org/host-path"] == host_path
        assert ann["snapshot.inferops.org/timeout-seconds"] == "300"
        assert api.env(pod)["VLLM_NPU_SNAPSHOT_PATH"] == npu_path
        # a bare pod gets the env by being recreated: same name, new uid, same node
        assert api.pod(pod)["metadata"]["uid"] != generated["uids"][pod]
        assert api.pod(pod)["spec"]["nodeName"] == NODE
        # the engine took the device snapshot itself, at its NPU path, before it reported Ready
        record = json.loads(open(os.path.join(npu_path, "device-snapshot.json")).read())
        assert record["state"] == "BACKED_UP"
        # host snapshot on the node, completed, with the checksum in the annotations
        assert ann["snapshot.inferops.org/status"] == "completed", ann
        assert "snapshot.inferops.org/reason" not in ann
        assert ann["snapshot.inferops.org/checksum"] == sha256(os.path.join(host_path, "checksum.sha256"))
        assert ann["snapshot.inferops.org/node"] == NODE
        assert int(ann["snapshot.inferops.org/total-bytes"]) > 24 * 1024 * 1024  # device memory travels in it
        manifest = json.loads(open(os.path.join(host_path, "manifest.json")).read())
        assert manifest["identity"] == {"namespace": "infer", "service": "qwen", "instance": "p0", "pod": pod}
        proc = subprocess.run(["sha256sum", "--check", "--strict", "--quiet", "checksum.sha256"], cwd=host_path,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # the instance serves again: engine resumed, same answers as an engine never snapshotted
        info = svc.info(pod)
        assert info["snapshot_state"] == "RUNNING" and info["phase"] == "serving", info
        assert svc.answers(pod) == generated["expected"]
    # the other instance is untouched
    assert api.pod("qwen-p1-0")["metadata"]["uid"] == generated["uids"]["qwen-p1-0"]
    assert "VLLM_NPU_SNAPSHOT_PATH" not in api.env("qwen-p1-0")
    assert not any(key.startswith("snapshot.inferops.org/") for key in api.annotations("qwen-p1-0"))
    assert not os.path.exists(svc.snapshot_dir("p1", "qwen-p1-0"))
    # the service's record outlives the pods
    record = {key: json.loads(value) for key, value in api.configmap("inferops-snapshot-qwen")["data"].items()}
    assert sorted(record) == ["qwen-p0-0", "qwen-p0-1"]
    assert record["qwen-p0-0"]["status"] == "completed" and record["qwen-p0-0"]["node"] == NODE
    assert record["qwen-p0-0"]["checksum"] == api.annotations("qwen-p0-0")["snapshot.inferops.org/checksum"]


def test_generation_run_again_changes_nothing(generated):
    svc = generated["svc"]
    before = {pod: svc.api.pod(pod) for pod in ("qwen-p0-0", "qwen-p0-1", "qwen-p1-0")}
    rc, output = svc.generate(svc.config())
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    assert "already has completed snapshots" in output
    assert {pod: svc.api.pod(pod)["metadata"] for pod in before} == {pod: p["metadata"] for pod, p in before.items()}


def test_recreated_pod_is_restored_by_the_runtime_with_its_new_environment(generated, cluster):
    svc, api = generated["svc"], generated["svc"].api
    pod = "qwen-p0-0"
    warmed_since = svc.info(pod)["started_at"]
    deleted_at = time.time()
    svc.recreate(pod, "p0", extra_env={"GENERATION": "2"})
    assert api.pod(pod)["spec"]["schedulingGates"], "held until the restore role decides"
    rc, output = svc.restore(svc.config())
    assert rc == 0, output[-4000:]
    ann = api.annotations(pod)
    snapshot_dir = svc.snapshot_dir("p0", pod)
    assert ann.get("org.inferops.restore-from") == snapshot_dir, (ann.get("snapshot.inferops.org/restore"),
                                                                  ann.get("snapshot.inferops.org/restore-reason"))
    # the pod names the very snapshot the generation published: its manifest checksum, which the runtime compares
    published = hashing.fingerprint(snapshot_dir)
    assert published and ann["org.inferops.restore-checksum"] == published, ann
    assert ann["snapshot.inferops.org/restore"] == "restored", ann
    assert "snapshot.inferops.org/restore-reason" not in ann
    spec = api.pod(pod)["spec"]
    assert not spec.get("schedulingGates") and spec["nodeSelector"] == {"kubernetes.io/hostname": NODE}
    # the runtime restored it, inside the kubelet's `docker run --runtime`: host part and device memory,
    # and recorded that for this very container; the role's annotation comes from that record
    cid = svc.container_id(pod)
    assert docker("inspect", "--format", "{{.HostConfig.Runtime}}", cid) == cluster.runtime.name
    attempt = status.read(snapshot_dir)["last_restore"]
    assert attempt["container"] == cid and attempt["outcome"] == "restored" and attempt["reason"] is None, attempt
    assert attempt["device_actions"] == ["restore", "unlock"], attempt
    record = cluster.runtime.log_records(cid)[-1]
    assert record["outcome"] == "restored" and record["snapshot"] == snapshot_dir, record
    assert record["verify"]["identity_checked"] and record["verify"]["image_checked"], record["verify"]
    # the warmed-up process is back, device memory included (the device was wiped)
    info = svc.info(pod)
    assert info["started_at"] == warmed_since < deleted_at and info["snapshot_state"] == "RUNNING", info
    assert svc.answers(pod) == generated["expected"]
    # it reads its new environment from the metadata file the runtime wrote (its own env is the old pod's)
    metadata = info["metadata"]
    assert metadata["restored"] is True and metadata["container_id"] == cid, metadata
    assert metadata["env"]["GENERATION"] == "2" and metadata["env"]["POD_NAME"] == pod, metadata
    assert metadata["env"]["POD_UID"] == api.pod(pod)["metadata"]["uid"]
    # the role's view of it, in the annotation (projected read-only beside it)
    view = json.loads(ann["snapshot.inferops.org/metadata"])
    assert view["uid"] == api.pod(pod)["metadata"]["uid"] and view["restore_requested"] is True
    assert view["env"]["GENERATION"] == "2"
    # nothing waits any more: a second run changes nothing
    rc, output = svc.restore(svc.config())
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    # the restored pod carries its snapshot's state: the instance is still complete, nothing to generate
    assert ann["snapshot.inferops.org/status"] == "completed"
    assert ann["snapshot.inferops.org/checksum"] == sha256(os.path.join(snapshot_dir, "checksum.sha256"))
    rc, output = svc.generate(svc.config())
    assert rc == 0 and recap_changed(output) == 0 and "already has completed snapshots" in output, output[-3000:]


def flip_pages_byte(snapshot_dir, offset=4096):
    """Flip one bit of the first CRIU pages image (twice = undone); returns the file's name."""
    criu_dir = os.path.join(snapshot_dir, "host", "criu")
    pages = os.path.join(criu_dir, sorted(f for f in os.listdir(criu_dir) if f.startswith("pages-"))[0])
    with open(pages, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x40]))
    return os.path.basename(pages)


def test_runtime_starts_the_pod_normally_when_its_snapshot_breaks_after_verification(generated, cluster):
    """The role verified both snapshots and marked both pods for restore; then, just before the kubelet
    creates their containers, one snapshot gets a corrupted byte and the other disappears. The runtime
    verifies again inside `create`, refuses both and starts the engines normally. The role reads that from
    the runtime's record: cold with the runtime's reason, the engines left alone (they warm up and, with the
    NPU snapshot path of their template, take their device snapshot and wait), and no snapshot state on the
    pods, so that the next generation run snapshots the instance again -- after which they serve."""
    svc, api = generated["svc"], generated["svc"].api
    pods = {"qwen-p0-0": "checksum_mismatch: host/criu/", "qwen-p0-1": "missing: no snapshot at "}
    damaged, undo = [], []

    def break_snapshot(pod):  # the kubelet calls it just before it creates a pod's container
        name, marked = pod["metadata"]["name"], "org.inferops.restore-from" in (pod["metadata"].get("annotations") or {})
        if pod["metadata"]["namespace"] != svc.namespace or name not in pods or name in damaged or not marked:
            return
        damaged.append(name)
        snapshot_dir = svc.snapshot_dir("p0", name)
        if name == "qwen-p0-0":
            pods[name] += flip_pages_byte(snapshot_dir)
            undo.append(lambda: flip_pages_byte(snapshot_dir))
        else:
            aside = os.path.join(os.path.dirname(snapshot_dir), ".%s.aside" % name)
            os.rename(snapshot_dir, aside)
            undo.append(lambda: os.rename(aside, snapshot_dir))

    deleted_at = time.time()
    cluster.kubelet.before_start = break_snapshot
    try:
        for pod in pods:
            svc.recreate(pod, "p0")
        rc, output = svc.restore(svc.config())
    finally:
        cluster.kubelet.before_start = None
        for step in undo:
            step()
    assert rc == 0, output[-4000:]
    assert sorted(damaged) == sorted(pods), "the role did not mark both pods for restore: %s" % output[-3000:]
    for pod, reason in pods.items():
        ann = api.annotations(pod)
        assert ann["snapshot.inferops.org/restore"] == "cold", ann
        assert ann["snapshot.inferops.org/restore-reason"].startswith(
            "the restore-on-create runtime started the container normally: " + reason), ann
        # it does not run from the snapshot: no marker, no snapshot state of its own
        for key in ("org.inferops.restore-from", "snapshot.inferops.org/status", "snapshot.inferops.org/checksum"):
            assert key not in ann, (key, ann)
        cid = svc.container_id(pod)
        attempt = status.read(svc.snapshot_dir("p0", pod))["last_restore"]
        assert attempt["container"] == cid and attempt["outcome"] == "cold", attempt
        assert ann["snapshot.inferops.org/restore-reason"].endswith(attempt["reason"])
        assert cluster.runtime.log_records(cid)[-1]["outcome"] == "cold"
        # a new engine, started normally: it warms up, takes its device snapshot and waits -- the role did
        # not unlock it as if it had been restored
        svc.wait_ready(pod)
        svc.api.wait(lambda: svc.info(pod)["snapshot_state"] == "BACKED_UP", "%s's own device snapshot" % pod)
        info = svc.info(pod)
        assert info["started_at"] > deleted_at and info["phase"] == "device_snapshot_taken", info
    # the generation snapshots the instance again and resumes the engines: they serve the same answers
    rc, output = svc.generate(svc.config())
    assert rc == 0 and "already has completed snapshots" not in output, output[-4000:]
    for pod in pods:
        ann = api.annotations(pod)
        assert ann["snapshot.inferops.org/status"] == "completed", ann
        assert ann["snapshot.inferops.org/checksum"] == sha256(os.path.join(svc.snapshot_dir("p0", pod),
                                                                            "checksum.sha256"))
        assert svc.answers(pod) == generated["expected"]


def test_recreated_pods_without_a_usable_snapshot_start_normally_and_are_snapshotted_again(generated, cluster,
                                                                                           tmp_path):
    """First deployment (no snapshot), another image version, a corrupted snapshot: normal starts; then
    the generation takes the snapshotted instance's snapshots again (the seed's version upgrade row)."""
    svc, api = generated["svc"], generated["svc"].api
    other = "inferops/workload:k8s-other-%s" % uuid.uuid4().hex[:6]
    (tmp_path / "Dockerfile").write_text("FROM %s\nLABEL org.inferops.variant=%s\n" % (cluster.image, other))
    subprocess.run(["docker", "build", "-q", "-t", other, str(tmp_path)], check=True, capture_output=True,
                   env=dict(os.environ, DOCKER_BUILDKIT="0"))
    mark = len(cluster.kubelet.events)
    try:
        svc.recreate("qwen-p0-1", "p0", image=other)  # a new image version: its snapshot does not match
        svc.recreate("qwen-p1-0", "p1")  # never snapshotted: first start
        svc.recreate("qwen-p0-0", "p0")  # its snapshot gets one corrupted byte
        criu_dir = os.path.join(svc.snapshot_dir("p0", "qwen-p0-0"), "host", "criu")
        pages = os.path.join(criu_dir, sorted(f for f in os.listdir(criu_dir) if f.startswith("pages-"))[0])
        with open(pages, "r+b") as handle:
            handle.seek(4096)
            byte = handle.read(1)
            handle.seek(4096)
            handle.write(bytes([byte[0] ^ 0x40]))
        rc, output = svc.restore(svc.config())
        assert rc == 0, output[-4000:]
        corrupted = api.annotations("qwen-p0-0")
        assert corrupted["snapshot.inferops.org/restore"] == "cold"
        assert "checksum_mismatch: host/criu/" + os.path.basename(pages) in corrupted["snapshot.inferops.org/restore-reason"]
        other_version = api.annotations("qwen-p0-1")
        assert other_version["snapshot.inferops.org/restore"] == "cold"
        assert "image_mismatch" in other_version["snapshot.inferops.org/restore-reason"], other_version
        first = api.annotations("qwen-p1-0")
        assert first["snapshot.inferops.org/restore"] == "cold"
        assert first["snapshot.inferops.org/restore-reason"].startswith("no snapshot recorded for infer/qwen/p1/qwen-p1-0")
        for pod in ("qwen-p0-1", "qwen-p1-0", "qwen-p0-0"):
            ann = api.annotations(pod)
            assert "org.inferops.restore-from" not in ann and "snapshot.inferops.org/status" not in ann
            assert not api.pod(pod)["spec"].get("schedulingGates")
            assert not api.pod(pod)["spec"].get("nodeSelector")
            # released: the kubelet starts it normally (cold pods are not waited for by the role)
            api.wait(lambda: any(event[:2] == (pod, "started") for event in cluster.kubelet.events[mark:]),
                     "the kubelet to start " + pod)
        # snapshots are never deleted by a restore decision: the other version's is still valid for its image
        assert os.path.exists(os.path.join(svc.snapshot_dir("p0", "qwen-p0-1"), "manifest.json"))
        assert os.path.exists(pages)
        svc.wait_ready("qwen-p1-0")
        assert svc.answers("qwen-p1-0") == generated["expected"]  # a normal start warms up and serves right
        view = json.loads(api.annotations("qwen-p1-0")["snapshot.inferops.org/metadata"])
        assert view["restore_requested"] is False and view["reason"] == first["snapshot.inferops.org/restore-reason"]
        assert cluster.runtime.log_records(svc.container_id("qwen-p1-0")) == [], "no marker: plain runc"

        # p0's engines started normally with the NPU snapshot path: after warmup they took their device
        # snapshot and wait; the generation snapshots the instance again, for the new image, and resumes them
        rc, output = svc.generate(svc.config())
        assert rc == 0, output[-4000:]
        for pod in ("qwen-p0-0", "qwen-p0-1"):
            ann = api.annotations(pod)
            assert ann["snapshot.inferops.org/status"] == "completed", ann
            assert ann["snapshot.inferops.org/checksum"] == sha256(
                os.path.join(svc.snapshot_dir("p0", pod), "checksum.sha256"))
            assert svc.answers(pod) == generated["expected"]
        manifest = json.loads(open(os.path.join(svc.snapshot_dir("p0", "qwen-p0-1"), "manifest.json")).read())
        assert manifest["image"]["id"] == docker("image", "inspect", "--format", "{{.Id}}", other)
    finally:
        svc.api.delete("qwen-p0-1")
        cluster.kubelet.wait_removed(svc.namespace, "qwen-p0-1")
        docker("rmi", "-f", other, check=False)


def test_no_config_or_disabled_changes_nothing(cluster, tmp_path):
    svc = Service(cluster, tmp_path, "plain")
    svc.create("qwen-p0-0", "p0", node="elsewhere")  # a node this kubelet does not run: no container needed
    before = svc.api.pod("qwen-p0-0")
    for config in (None, {"enabled": False}):
        rc, output = svc.generate(config)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]
        assert "the service runs without snapshots" in output
        assert svc.api.pod("qwen-p0-0") == before
    assert svc.api.configmap("inferops-snapshot-qwen") is None
    assert not list(svc.host_root.iterdir()) and not list(svc.npu_root.iterdir())
    # snapshots off, a pod recreated with the gate: it is only released, and starts normally
    gated = svc.manifest("qwen-p0-1", "p0", gated=True)
    gated["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "elsewhere"}
    svc.api.create(gated)
    rc, output = svc.restore({"enabled": False})
    assert rc == 0, output[-3000:]
    released = svc.api.pod("qwen-p0-1")
    assert not released["spec"].get("schedulingGates")
    assert released["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "elsewhere"}
    assert not any(key.startswith(("snapshot.inferops.org/", "org.inferops.")) for key in svc.api.annotations("qwen-p0-1"))
    # a config that is not valid is refused before anything happens, naming the field
    rc, output = svc.generate({"enabled": True, "npuSnapshotPath": "relative/path", "hostSnapshotPath": "/var/lib/x"})
    assert rc != 0 and "npuSnapshotPath" in output, output[-3000:]
    assert svc.api.pod("qwen-p0-0") == before


@pytest.fixture(scope="module")
def failing(cluster, tmp_path_factory):
    """Instance p0 of service llama: two engines, Ready and snapshotted for each failure test."""
    svc = Service(cluster, tmp_path_factory.mktemp("fail"), "failing", name="llama")
    for pod in ("llama-p0-0", "llama-p0-1"):
        svc.create(pod, "p0")
    return svc


def assert_failed_cleaned_and_serving(svc, reason_part):
    for pod in ("llama-p0-0", "llama-p0-1"):
        ann = svc.api.annotations(pod)
        assert ann["snapshot.inferops.org/status"] == "failed", ann
        assert reason_part in ann["snapshot.inferops.org/reason"], ann
        assert "snapshot.inferops.org/checksum" not in ann
        for root in (svc.host_root, svc.npu_root):
            path = svc.snapshot_dir("p0", pod, root=root)
            assert not os.path.lexists(path), "a failed generation leaves no snapshot: %s" % path
            assert not os.path.lexists(os.path.join(os.path.dirname(path), ".%s.partial" % pod))
        info = svc.info(pod)
        assert info["snapshot_state"] == "RUNNING" and info["phase"] == "serving", info
        assert len(svc.answers(pod)) == len(PROMPTS)
    record = json.loads(svc.api.configmap("inferops-snapshot-llama")["data"]["llama-p0-1"])
    assert record["status"] == "failed" and reason_part in record["reason"]


def test_check_mode_says_what_would_change_and_changes_nothing(failing):
    svc = failing
    before = {pod: svc.api.pod(pod)["metadata"] for pod in ("llama-p0-0", "llama-p0-1")}
    rc, output = svc.generate(svc.config(), check=True)
    assert rc == 0 and recap_changed(output) == 1, output[-3000:]
    assert {pod: svc.api.pod(pod)["metadata"] for pod in before} == before


def test_host_snapshot_failure_cleans_the_instance_and_restores_serving(failing):
    svc = failing
    trap = svc.snapshot_dir("p0", "llama-p0-1")
    os.makedirs(os.path.dirname(trap), mode=0o700)
    os.symlink("/etc", trap)  # the second pod's snapshot path is unusable: its host snapshot fails
    rc, output = svc.generate(svc.config())
    assert rc != 0 and "snapshot generation of instance p0 of llama failed" in output, output[-4000:]
    assert_failed_cleaned_and_serving(svc, "symbolic link")
    assert os.path.exists("/etc/hostname"), "cleaning a path that is a symlink never follows it"


def test_generation_timeout_cleans_the_instance_and_restores_serving(failing):
    svc = failing
    rc, output = svc.generate(svc.config(timeoutSeconds=1))
    assert rc != 0, output[-4000:]
    assert_failed_cleaned_and_serving(svc, "timeout (snapshotConfig.timeoutSeconds=1 s)")


def test_pods_that_never_get_ready_are_started_again_without_the_snapshot_env(failing):
    svc = failing
    svc.create("llama-p9-0", "p9", warmup=60)  # its warmup outlasts the wait
    rc, output = svc.generate(svc.config(), k8s_snapshot_instance="p9", k8s_snapshot_warmup_timeout=3)
    assert rc != 0, output[-4000:]
    ann = svc.api.annotations("llama-p9-0")
    assert ann["snapshot.inferops.org/status"] == "failed"
    assert "pods not ready within 3 s: llama-p9-0" in ann["snapshot.inferops.org/reason"], ann
    # recreated without VLLM_NPU_SNAPSHOT_PATH: after its warmup it serves instead of waiting for a snapshot
    assert "VLLM_NPU_SNAPSHOT_PATH" not in svc.api.env("llama-p9-0")
    assert ann["snapshot.inferops.org/npu-path"] == svc.snapshot_dir("p9", "llama-p9-0", root=svc.npu_root)


def test_the_rbac_in_the_docs_is_exactly_what_the_roles_use(cluster):
    """Every request the roles made (they authenticate with the kubeconfig's token; the test and its
    kubelet do not) is allowed by the Role in docs/kubernetes.md, and every verb it grants was used."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    documents = [doc for block in text.split("```yaml")[1:] for doc in yaml.safe_load_all(block.split("```")[0])]
    role = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "Role"][0]
    granted = {(verb, resource, name) for rule in role["rules"] for resource in rule["resources"]
               for verb in rule["verbs"] for name in rule.get("resourceNames") or [None]}
    token = "Bearer not-checked-by-the-emulator"
    made = [entry[1:] for entry in cluster.server.emulator.seen if entry[0] == token]
    assert made, "the roles made no request with the kubeconfig's token"
    used = set()
    for verb, resource, name in made:
        if resource.startswith("/"):
            assert resource in ("/version", "/api", "/apis") or resource.startswith(("/api/", "/apis/")), resource
            continue
        if (verb, resource, None) in granted:
            used.add((verb, resource, None))
            continue
        # resourceNames: the example Role names service qwen's record; the tests also run service llama
        named = name and (verb, resource, name.replace("llama", "qwen")) in granted
        assert named, "the roles used %s %s %s, which the documented Role does not grant" % (verb, resource, name)
        used.add((verb, resource, name.replace("llama", "qwen")))
    assert used == granted, "the documented Role grants more than the roles use: %s" % sorted(granted - used)


def test_host_only_generation_refuses_a_concurrent_run_and_restores_without_the_device(cluster, tmp_path):
    """K8s_snapshot_device=false (CPU engines, accelerators without a snapshot API): the pod gets no
    VLLM_NPU_SNAPSHOT_PATH, no device part is taken and the engine is never locked; the restore asks the runtime for
    no device restore (org.inferops.restore-device=false). Meanwhile a second generation run of the same pods, started
    while the first waits for the warmup (the test's kubelet holds the pod not Ready until the second run is over),
    is refused naming the first run's generation and writes nothing: none of its requests to the API changes
    anything (it connects with a token of its own), and the pod's annotations, its claim and the node's status record
    are still the first run's."""
    svc, pod = Service(cluster, tmp_path, "hostonly"), "qwen-p0-0"
    cluster.kubelet.held.add((svc.namespace, pod))  # its warmup ends when the test says so
    svc.create(pod, "p0")
    snapshot_dir = svc.snapshot_dir("p0", pod)
    first = {}
    runner = threading.Thread(target=lambda: first.update(zip(("rc", "output"), svc.generate(
        svc.config(), k8s_snapshot_device=False))))
    runner.start()
    try:
        # the first run claimed the pod, then prepared it (pending): it waits for Ready now, and writes nothing
        svc.api.wait(lambda: svc.api.annotations(pod).get("snapshot.inferops.org/status") == "pending",
                     "the first run's claim and preparation of %s" % pod, 120)
        holder = claim.read(snapshot_dir)["id"]
        before = (svc.api.annotations(pod), status.read(snapshot_dir))
        token = "refused-run-%s" % uuid.uuid4().hex[:8]
        rc, output = svc.generate(svc.config(), k8s_snapshot_device=False, k8s_snapshot_force=True,
                                  k8s_snapshot_kubeconfig=write_kubeconfig(tmp_path / "refused.kubeconfig",
                                                                           cluster.url, token=token))
        after = (svc.api.annotations(pod), status.read(snapshot_dir))
        claim_after_refusal = (claim.read(snapshot_dir) or {}).get("id")
    finally:
        cluster.kubelet.held.discard((svc.namespace, pod))
        runner.join(300)
    assert rc != 0 and "another generation of this pod's snapshot is in progress: generation %s" % holder in output, \
        output[-4000:]
    made = [entry[1:] for entry in cluster.server.emulator.seen if entry[0] == "Bearer " + token]
    assert ("list", "pods", None) in made, made  # it did run, and read the pods
    assert [request for request in made if request[0] not in ("get", "list", "watch")] == [], \
        ("the refused run wrote to the cluster", output[-6000:])
    assert after == before and claim_after_refusal == holder, \
        ("the refused run changed the first run's pod", output[-6000:])
    assert first["rc"] == 0, first["output"][-4000:]
    ann = svc.api.annotations(pod)
    snapshot_dir = svc.snapshot_dir("p0", pod)
    assert ann["snapshot.inferops.org/status"] == "completed", ann
    assert ann["snapshot.inferops.org/checksum"] == sha256(os.path.join(snapshot_dir, "checksum.sha256"))
    assert "VLLM_NPU_SNAPSHOT_PATH" not in svc.api.env(pod)
    assert not os.path.exists(os.path.join(snapshot_dir, "device")), "host only: no device part"
    info = svc.info(pod)
    assert info["snapshot_state"] == "RUNNING" and info["phase"] == "serving", info
    expected = svc.answers(pod)

    # recreated (its device keeps its memory: a host-only restore brings back no device state), restored host-only
    svc.api.delete(pod)
    cluster.kubelet.wait_removed(svc.namespace, pod)
    svc.create(pod, "p0", gated=True, warmup=30)
    rc, output = svc.restore(svc.config(), k8s_snapshot_device=False)
    assert rc == 0, output[-4000:]
    ann = svc.api.annotations(pod)
    assert ann["org.inferops.restore-device"] == "false" and ann["snapshot.inferops.org/restore"] == "restored", ann
    record = cluster.runtime.log_records(svc.container_id(pod))[-1]
    assert record["outcome"] == "restored" and not record.get("device_actions"), record
    now = svc.info(pod)
    assert now["started_at"] == info["started_at"] and now["snapshot_state"] == "RUNNING", now
    assert svc.answers(pod) == expected


def test_a_rerun_after_a_generation_killed_with_its_controller_takes_its_claim_over_at_once(cluster, tmp_path):
    """Kubernetes: the controller of a generation is killed (its whole process group and its
    workers, as a cancelled job's) while it waits for the warmup, holding the pod's claim on the node. A rerun right
    after takes that claim over -- its holder, the dead ansible-playbook, is provably gone -- names it, and
    completes, instead of being refused until the claim lapses."""
    from test_lease_kill import controller_groups, killpg
    svc, pod = Service(cluster, tmp_path, "killed"), "qwen-p0-0"
    svc.create(pod, "p0", warmup=30)  # the first run claims the pod, then waits for this warmup
    variables = {"k8s_snapshot_namespace": svc.namespace, "k8s_snapshot_service": svc.name,
                 "k8s_snapshot_node_group": "k8s_nodes", "k8s_snapshot_config": svc.config(),
                 "k8s_snapshot_device": False}
    command, env = playbook_command("k8s_generate.yml", cluster.inventory, variables)
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    snapshot_dir = svc.snapshot_dir("p0", pod)
    try:
        dead = svc.api.wait(lambda: claim.read(snapshot_dir), "the first run's claim on %s" % pod, 90)
    finally:  # as a cancelled job: the playbook and its workers stopped, then killed (runc and CRIU live on)
        groups = controller_groups(first.pid)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pgid in groups | controller_groups(first.pid):
                killpg(pgid, sig)
        first.wait(30)
    assert dead["holder"]["kind"] == "controller", dead
    started = time.monotonic()
    rc, output = svc.generate(svc.config(), k8s_snapshot_device=False, k8s_snapshot_force=True)
    assert rc == 0, output[-4000:]
    assert "took over the claim of generation %s (the run that held it is gone: " % dead["id"] in output, output[-4000:]
    assert time.monotonic() - started < claim.DEFAULT_LEASE
    ann = svc.api.annotations(pod)
    assert ann["snapshot.inferops.org/status"] == "completed", ann
    assert claim.read(snapshot_dir) is None

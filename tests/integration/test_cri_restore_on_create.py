"""Restore on create on a Kubernetes node as clusters run it: containerd 1.6's CRI plugin with CNI pod networking
(scripts/env/cri-node.sh's node-s, this file's own), the kubelet stand-in's CRI calls, the restore-on-create runtime
registered as the node's runtime handler by the snapshot_node role with the docs' variables, real runc, CRIU and the
sample engine on the simulated NPU. The snapshot is taken of the pod's own container (_cri_restore.take_snapshot).

- a deleted pod recreated with the handler's RuntimeClass and the restore annotation is restored inside `create`:
  the warmed-up process answers the same on the pod's new CNI address (its listener was bound to the old one), the
  tenant is the namespace containerd's own annotations name, the image checked is the one the CRI says it runs, and
  the pod's sandbox is no attempt of its own;
- a pod of another namespace asking for it, a pod naming another image than it runs, and a restore that fails inside
  `create` each start cold in their sandbox with the reason, and leave nothing behind when deleted;
- containerd's own record of a pod says which of its org.inferops.* annotations its handler dropped.
"""

import json
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest

from _cri_kubelet import CriKubelet, CriNodes, declare_resources, node_leftovers, oci_config, workload_pod
from _cri_restore import CriRuntimeNode, container_id, restore_pod, runtime_class, take_snapshot
from _k8s_helpers import Api, ApiServer
from _runtime_helpers import PROMPTS
from conftest import reset_device

from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import runtime as rr

NODE = "node-s"
NAMESPACE = "crirest-" + uuid.uuid4().hex[:6]
OTHER = "crithief-" + uuid.uuid4().hex[:6]
CLASS = "inferops-crirest-" + uuid.uuid4().hex[:4]
WARMUP = 4
pytestmark = pytest.mark.timeout(900)


def ready(pod):
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def cluster(cri_nodes, docker_env, tmp_path_factory):
    base = tmp_path_factory.mktemp("crirest")
    nodes = CriNodes()
    status = nodes.start(NODE)[0][NODE]
    nodes.import_image(docker_env, NODE)
    server = ApiServer()
    declare_resources(server)
    kubelet = CriKubelet(server.url, NODE, status)
    node = CriRuntimeNode(base, NODE, status)
    device_dir, npu_root = base / "npu", base / "npu-snapshots"
    device_dir.mkdir(mode=0o700)
    npu_root.mkdir(mode=0o700)
    try:
        node.install()
        runtime_class(server.url, CLASS, node.name)
        yield {"status": status, "server": server, "kubelet": kubelet, "node": node, "device_dir": device_dir,
               "npu_root": npu_root, "api": Api(server.url, NAMESPACE), "other": Api(server.url, OTHER)}
    finally:
        kubelet.stop()
        server.stop()
        node.remove()
        nodes.down(NODE)
    assert not kubelet.errors, kubelet.errors


def engine_pod(cluster, name, namespace, **kwargs):
    return workload_pod(name, namespace, NODE, cluster["device_dir"], cluster["npu_root"], runtime_class=CLASS,
                        warmup=WARMUP, **kwargs)


def answers(kubelet, ip):
    found = []
    for prompt in PROMPTS:
        code, body = kubelet.get("http://%s:8000/v1/generate?prompt=%s" % (ip, urllib.parse.quote(prompt)), timeout=30)
        assert code == 200, body
        found.append(json.loads(body)["answer"])
    return found


def info(kubelet, ip):
    code, body = kubelet.get("http://%s:8000/v1/info" % ip)
    assert code == 200, body
    return json.loads(body)


def run_until_ready(cluster, api, manifest, timeout=180):
    name = manifest["metadata"]["name"]
    api.create(manifest)
    return cluster["kubelet"].wait(lambda: ready(api.pod(name)) and api.pod(name), "%s Ready" % name, timeout)


def delete(cluster, api, name, namespace):
    api.delete(name)
    cluster["kubelet"].wait(lambda: cluster["kubelet"].record(namespace, name) is None, "%s removed" % name, 120)


def records(cluster, container):
    return cluster["node"].log_records(container)


@pytest.fixture(scope="module")
def snapshot(cluster):
    """engine-0 warmed up on node-s, its answers and facts, its snapshot below the node's root; the pod deleted."""
    api, kubelet = cluster["api"], cluster["kubelet"]
    pod = run_until_ready(cluster, api, engine_pod(cluster, "engine-0", NAMESPACE))
    ip = pod["status"]["podIP"]
    found = {"ip": ip, "expected": answers(kubelet, ip), "info": info(kubelet, ip),
             "image": pod["status"]["containerStatuses"][0]["imageID"],
             "snapshot_dir": str(cluster["node"].roots / NAMESPACE / "svc" / "p0" / "engine-0")}
    identity = {"namespace": NAMESPACE, "service": "svc", "instance": "p0", "pod": "engine-0"}
    found["manifest"] = take_snapshot(cluster["status"], pod, found["snapshot_dir"], identity, cluster["npu_root"])
    assert answers(kubelet, ip) == found["expected"], "the engine serves on after its snapshot"
    delete(cluster, api, "engine-0", NAMESPACE)
    reset_device(cluster["device_dir"])
    return found


def test_a_recreated_pod_is_restored_inside_create_and_answers_on_its_new_address(cluster, snapshot):
    api, kubelet = cluster["api"], cluster["kubelet"]
    started = time.monotonic()
    pod = run_until_ready(cluster, api, restore_pod(engine_pod(cluster, "engine-0", NAMESPACE),
                                                    snapshot["snapshot_dir"], CLASS))
    ip = pod["status"]["podIP"]
    assert ip != snapshot["ip"], "the new pod got its old address back: nothing to remap"
    assert answers(kubelet, ip) == snapshot["expected"]
    seconds = time.monotonic() - started
    now = info(kubelet, ip)
    assert now["started_at"] == snapshot["info"]["started_at"], "the engine started again instead of resuming"
    assert now["metadata"]["restored"] is True and now["metadata"]["env"]["WORKLOAD_HOST"] == ip
    print("pod created -> restored engine answering on %s: %.1f s (warmup %d s)" % (ip, seconds, WARMUP))

    cid = container_id(pod)
    [record] = records(cluster, cid)
    assert record["outcome"] == "restored" and record["reason"] is None, record
    assert record["requester"] == {"namespace": NAMESPACE, "pod": "engine-0", "container": "engine", "by": "containerd"}
    assert record["verify"]["image_checked"] and record["name"] == "%s/engine-0/engine" % NAMESPACE
    moved = [r for r in cluster["node"].log_records(cid, event="address")]
    assert moved and moved[-1]["action"] == "sockets bound to %s restored on %s" % (snapshot["ip"], ip), moved
    sandbox = cluster["kubelet"].record(NAMESPACE, "engine-0").sandbox_id
    notes = oci_config(cluster["status"], sandbox)["annotations"]
    assert notes["org.inferops.restore-from"] == snapshot["snapshot_dir"], "the handler passes pod annotations"
    assert not records(cluster, sandbox), "the pod's sandbox was an attempt of its own"
    history = json.loads((Path(snapshot["snapshot_dir"]).parent / ".engine-0.status.json").read_text())["restores"]
    assert [entry["container"] for entry in history] == [cid], history
    delete(cluster, api, "engine-0", NAMESPACE)
    reset_device(cluster["device_dir"])


def assert_cold_in_its_sandbox(cluster, api, manifest, namespace, reason):
    pod = run_until_ready(cluster, api, manifest)
    name = manifest["metadata"]["name"]
    ip = pod["status"]["podIP"]
    engine = info(cluster["kubelet"], ip)
    assert engine["started_at"] + WARMUP <= engine["ready_at"] + 0.5, "a cold start warms up"
    [record] = records(cluster, container_id(pod))
    assert record["outcome"] == "cold" and record["reason"].startswith(reason), record
    # the metadata file is below the pod's emptyDir, which would hide one written into the rootfs: not written
    assert not (engine.get("metadata") or {}).get("restored"), engine
    assert cluster["kubelet"].record(namespace, name).sandbox_attempt == 0, "the sandbox was made again"
    before = node_leftovers(cluster["status"])
    delete(cluster, api, name, namespace)
    reset_device(cluster["device_dir"])
    after = node_leftovers(cluster["status"])
    assert all(len(after[kind]) < len(before[kind]) or not before[kind] for kind in ("netns", "veths")), \
        (before, after)
    return record


def test_a_pod_of_another_namespace_asking_for_it_starts_cold(cluster, snapshot):
    manifest = restore_pod(engine_pod(cluster, "thief", OTHER), snapshot["snapshot_dir"], CLASS)
    record = assert_cold_in_its_sandbox(cluster, cluster["other"], manifest, OTHER, "tenant_mismatch:")
    assert "containerd says this container is of pod thief in namespace %s" % OTHER in record["reason"], record


def test_a_pod_naming_another_image_than_it_runs_starts_cold(cluster, snapshot):
    manifest = restore_pod(engine_pod(cluster, "engine-0", NAMESPACE), snapshot["snapshot_dir"], CLASS)
    manifest["metadata"]["annotations"]["org.inferops.restore-image-id"] = "sha256:" + "f" * 64
    record = assert_cold_in_its_sandbox(cluster, cluster["api"], manifest, NAMESPACE, "image_mismatch:")
    assert "containerd runs %s" % snapshot["image"] in record["reason"], record


def test_a_restore_that_fails_inside_create_starts_cold_in_the_same_sandbox(cluster, snapshot):
    manifest = restore_pod(engine_pod(cluster, "engine-0", NAMESPACE), snapshot["snapshot_dir"], CLASS)
    manifest["metadata"]["annotations"]["org.inferops.restore-timeout"] = "0.001"
    assert_cold_in_its_sandbox(cluster, cluster["api"], manifest, NAMESPACE, "timeout:")


def test_containerd_says_which_pod_annotations_its_handler_dropped(cluster):
    """Under the node's default handler (runc, no pod_annotations) no pod annotation reaches the OCI config: the
    runtime learns from containerd's record of the pod what was asked and did not arrive."""
    api = cluster["api"]
    manifest = engine_pod(cluster, "plain", NAMESPACE, annotations={
        "org.inferops.restore-checksum": "a" * 64, "team": "x"})
    del manifest["spec"]["runtimeClassName"]
    pod = run_until_ready(cluster, api, manifest)
    cid = container_id(pod)
    spec = oci_config(cluster["status"], cid)
    settings = json.loads((cluster["node"].lib_dir / "runtime.json").read_text())
    found = rr.cri_record(rr.load_config(str(cluster["node"].lib_dir / "runtime.json")), cid, spec)
    assert settings["containerd_socket"] == cluster["status"]["socket"] and settings["ctr"].startswith("/")
    assert found["image_id"] == pod["status"]["containerStatuses"][0]["imageID"], found
    assert found["dropped"] == ["org.inferops.restore-checksum"] and found["handler"] == "", found
    delete(cluster, api, "plain", NAMESPACE)

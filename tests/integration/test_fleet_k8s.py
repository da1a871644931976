"""Restore on recreation without a scheduled job, on the Kubernetes API emulator, the simulated
kubelet and the real dockerd + CRIU + the simulated NPU.

The pod template carries its own restore request (``k8s/service.restore_template_env``: INFEROPS_RESTORE_FROM
and INFEROPS_RESTORE_IDENTITY built with the kubelet's $(VAR) expansion from the pod's own name and
namespace) and no scheduling gate. The node's restore-on-create runtime then decides alone, when the kubelet
creates the container: no snapshot there (the first deployment) is a normal start; after a generation, a
deleted and recreated pod comes back from its snapshot with no Ansible run in between. The figure printed is
pod deleted -> first correct answer, the StatefulSet controller's part (wait until the old pod is gone,
create the new one) included."""

import asyncio
import json
import time
import urllib.parse
import uuid

import pytest

from _k8s_helpers import Api, ApiServer, Kubelet, run_playbook, workload_pod, write_inventory, write_kubeconfig
from _runtime_helpers import installed_runtime
from conftest import free_port, http_get, reset_device
from test_fleet_eda import collect, load_plugin

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import engine_http
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import service as svc

NODE = "node-a"
DEVICE_MOUNT = "/var/lib/inferops-npu"   # where a pod of a cloned service sees its NPU, whichever device backs it
RUNTIME_CLASS = "inferops-restore"
PROMPTS = ["what is an NPU?", "no job in the way", "数据"]
REQUEST_ENV = ("POD_NAME", "POD_NAMESPACE", "INFEROPS_RESTORE_FROM", "INFEROPS_RESTORE_CHECKSUM",
               "INFEROPS_RESTORE_IDENTITY", "INFEROPS_RESTORE_DEVICE")
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def runtime(docker_env, tmp_path_factory):
    with installed_runtime(tmp_path_factory.mktemp("fleet-k8s-node")) as node:
        yield node


@pytest.fixture(scope="module")
def cluster(docker_env, runtime, tmp_path_factory):
    base = tmp_path_factory.mktemp("fleet-k8s")
    server = ApiServer()
    kubelet = Kubelet(server.url, NODE, base / "kubelet", "fleetk8s-" + uuid.uuid4().hex[:6],
                      runtime_classes={RUNTIME_CLASS: runtime.name})
    kubeconfig = write_kubeconfig(base / "kubeconfig", server.url)
    namespace = "nojob"
    state = {"base": base, "api": Api(server.url, namespace), "kubelet": kubelet, "namespace": namespace,
             "kubeconfig": kubeconfig, "server_url": server.url,
             "inventory": write_inventory(base / "inventory.json", NODE, kubeconfig), "image": docker_env,
             "npu_root": base / "npu-snapshots", "host_root": runtime.roots / "host-nojob", "ports": {}, "devices": {}}
    for root in (state["npu_root"], state["host_root"]):
        root.mkdir(mode=0o700)
    yield state
    kubelet.stop()
    server.stop()
    assert kubelet.errors == [], "the kubelet simulation failed:\n" + "\n".join(kubelet.errors)


def template(cluster, pod, instance="p0", service="qwen", source=None, port=None, own_network=False, node=None):
    """The pod as its StatefulSet's template makes it: the restore request in its env, no scheduling gate.
    ``source``: the instance a clone restores from (pod k from pod k); ``own_network``: a network namespace of
    its own (then it sees its NPU at DEVICE_MOUNT, as every pod of a cloned service does)."""
    if pod not in cluster["ports"]:
        cluster["ports"][pod] = port or free_port()
        cluster["devices"][pod] = cluster["base"] / ("npu-device-" + pod)
        cluster["devices"][pod].mkdir(mode=0o700)
    manifest = workload_pod(pod, cluster["namespace"], service, instance, cluster["image"], cluster["ports"][pod],
                            cluster["devices"][pod], cluster["npu_root"], runtime_class=RUNTIME_CLASS,
                            host_network=not own_network, device_mount=DEVICE_MOUNT if own_network else None)
    manifest["metadata"]["labels"][layout.K8S_POD_INDEX_LABEL] = pod.rsplit("-", 1)[1]
    if node:
        manifest["spec"]["nodeName"] = node
    container = manifest["spec"]["containers"][0]
    npu_path = "%s/$(POD_NAMESPACE)/%s/%s/$(POD_NAME)" % (cluster["npu_root"], service, instance)
    request = svc.restore_template_env(str(cluster["host_root"]), service, instance, source_instance=source,
                                       source_stem="%s-%s-" % (service, source) if source else None)
    container["env"] = [item for item in container["env"] if item["name"] not in REQUEST_ENV] + request + \
        [{"name": "VLLM_NPU_SNAPSHOT_PATH", "value": npu_path}]
    return manifest


def first_answer(cluster, pod, since, timeout=120):
    """Seconds from ``since`` (monotonic) until the pod's engine serves a correct answer."""
    path = "/v1/generate?prompt=%s" % urllib.parse.quote(PROMPTS[0])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            code, _body = engine_get(cluster, pod, path, timeout=2)
            if code == 200:
                return time.monotonic() - since
        except (OSError, ValueError, engine_http.EngineHttpError):
            pass
        time.sleep(0.02)
    raise AssertionError("pod %s never answered" % pod)


def engine_get(cluster, pod, path, timeout=30):
    """(status, JSON body) of a GET of the pod's engine: on the host's network, or inside the pod's own namespace."""
    url = "http://127.0.0.1:%d%s" % (cluster["ports"][pod], path)
    own = [c["netns_pid"] for c in cluster["kubelet"].containers.values() if c["pod"] == pod and c["netns_pid"]]
    if not own:
        return http_get(url, timeout=timeout)
    code, body = engine_http.request(url, timeout=timeout, netns_pid=own[-1])
    return code, json.loads(body or b"{}")


def answers(cluster, pod):
    return [engine_get(cluster, pod, "/v1/generate?prompt=" + urllib.parse.quote(p))[1]["answer"] for p in PROMPTS]


def info(cluster, pod):
    return engine_get(cluster, pod, "/v1/info")[1]


def container_id(cluster, pod):
    def reported():
        statuses = ((cluster["api"].pod(pod) or {}).get("status") or {}).get("containerStatuses") or [{}]
        return statuses[0].get("containerID")
    return cluster["api"].wait(reported, "the container of %s reported" % pod).split("://", 1)[1]


def wait_ready(cluster, pod, timeout=120):
    def ready():
        conditions = ((cluster["api"].pod(pod) or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    cluster["api"].wait(ready, "pod %s Ready" % pod, timeout)


def test_a_recreated_pod_is_restored_by_the_node_alone_with_no_ansible_run(cluster, runtime):
    api, pod = cluster["api"], "qwen-p0-0"
    snapshot_dir = svc.snapshot_path(str(cluster["host_root"]), {"namespace": cluster["namespace"], "service": "qwen",
                                                                 "instance": "p0", "pod": pod})
    # first deployment: the request names a snapshot that is not there yet -- a normal start, nothing waits
    api.create(template(cluster, pod))
    wait_ready(cluster, pod)
    first = runtime.log_records(container_id(cluster, pod))[-1]
    assert first["outcome"] == "cold" and first["reason"].startswith("missing: "), first
    # (with VLLM_NPU_SNAPSHOT_PATH its engine took its device snapshot after the warmup and waits for the generation)

    rc, output = run_playbook("k8s_generate.yml", cluster["inventory"], {
        "k8s_snapshot_namespace": cluster["namespace"], "k8s_snapshot_service": "qwen",
        "k8s_snapshot_node_group": "k8s_nodes", "k8s_snapshot_config": {
            "enabled": True, "npuSnapshotPath": str(cluster["npu_root"]), "hostSnapshotPath": str(cluster["host_root"])}})
    assert rc == 0, output[-4000:]
    assert status.read(snapshot_dir)["status"] == "completed"
    warmed = info(cluster, pod)
    expected = answers(cluster, pod)

    # the pod is lost; its controller recreates it from the same template -- and nothing else runs
    deleted = time.monotonic()
    api.delete(pod)
    cluster["kubelet"].wait_removed(cluster["namespace"], pod)
    reset_device(cluster["devices"][pod])  # what the deletion does to its NPU
    api.create(template(cluster, pod))
    seconds = first_answer(cluster, pod, deleted)
    cid = container_id(cluster, pod)
    record = runtime.log_records(cid)[-1]
    assert record["outcome"] == "restored" and record["reason"] is None, record
    assert record["verify"]["identity_checked"], record["verify"]
    now = info(cluster, pod)
    assert now["started_at"] == warmed["started_at"] and now["snapshot_state"] == "RUNNING", now
    assert answers(cluster, pod) == expected
    assert now["metadata"]["restored"] is True and now["metadata"]["env"]["POD_UID"] == api.pod(pod)["metadata"]["uid"]
    assert now["metadata"]["identity"]["pod"] == pod
    entry = status.read(snapshot_dir)["last_restore"]
    assert entry["container"] == cid and entry["outcome"] == "restored", entry
    print("\nno-job restore: pod deleted -> first correct answer in %.2f s (runtime stages %s)"
          % (seconds, record["durations"]))

    # the annotations catch up, event-driven: the gated_pods source reports the restored, unannotated pod within
    # seconds and the rulebook's rule runs the restore role, which reads the node's record of this container
    assert "snapshot.inferops.org/restore" not in (api.pod(pod)["metadata"].get("annotations") or {})
    served = time.monotonic()
    events = asyncio.run(collect(load_plugin(), {"namespace": cluster["namespace"], "service": "qwen",
                                                 "kubeconfig": cluster["kubeconfig"], "interval": 0.2},
                                 lambda got: any("inferops_unannotated_pod" in e for e in got)))
    event = [e["inferops_unannotated_pod"] for e in events if "inferops_unannotated_pod" in e][0]
    assert event["name"] == pod and event["uid"] == api.pod(pod)["metadata"]["uid"], event
    print("catch-up event %.2f s after the first answer" % (time.monotonic() - served))
    config = {"enabled": True, "npuSnapshotPath": str(cluster["npu_root"]), "hostSnapshotPath": str(cluster["host_root"])}
    play = {"k8s_snapshot_namespace": cluster["namespace"], "k8s_snapshot_service": "qwen",
            "k8s_snapshot_node_group": "k8s_nodes", "k8s_snapshot_config": config}
    rc, output = run_playbook("k8s_restore.yml", cluster["inventory"], play)
    assert rc == 0, output[-4000:]
    ann = api.pod(pod)["metadata"]["annotations"]
    checksum = status.read(snapshot_dir)["checksum"]
    assert ann["snapshot.inferops.org/restore"] == "restored" and "snapshot.inferops.org/restore-reason" not in ann, ann
    assert ann["snapshot.inferops.org/status"] == "completed" and ann["snapshot.inferops.org/checksum"] == checksum, ann
    assert ann["snapshot.inferops.org/host-path"] == snapshot_dir and ann["snapshot.inferops.org/node"] == NODE, ann
    # ... so the next generation knows the instance runs from its completed snapshot and takes no new one
    rc, output = run_playbook("k8s_generate.yml", cluster["inventory"], play)
    assert rc == 0 and "already has completed snapshots" in output, output[-4000:]
    assert status.read(snapshot_dir)["checksum"] == checksum and container_id(cluster, pod) == cid
    assert info(cluster, pod)["started_at"] == warmed["started_at"]


def test_the_next_generation_catches_up_by_itself_and_takes_no_new_snapshot(cluster, runtime):
    """Recreated again, restored again by the node alone; this time only k8s_generate.yml runs: it reads the node's
    record first, annotates the pod and leaves the instance's completed snapshot as it is."""
    api, pod = cluster["api"], "qwen-p0-0"
    snapshot_dir = svc.snapshot_path(str(cluster["host_root"]), {"namespace": cluster["namespace"], "service": "qwen",
                                                                 "instance": "p0", "pod": pod})
    before = status.read(snapshot_dir)
    assert before and before["status"] == "completed", before
    api.delete(pod)
    cluster["kubelet"].wait_removed(cluster["namespace"], pod)
    reset_device(cluster["devices"][pod])
    api.create(template(cluster, pod))
    first_answer(cluster, pod, time.monotonic())
    cid = container_id(cluster, pod)
    config = {"enabled": True, "npuSnapshotPath": str(cluster["npu_root"]), "hostSnapshotPath": str(cluster["host_root"])}
    rc, output = run_playbook("k8s_generate.yml", cluster["inventory"], {
        "k8s_snapshot_namespace": cluster["namespace"], "k8s_snapshot_service": "qwen",
        "k8s_snapshot_node_group": "k8s_nodes", "k8s_snapshot_config": config})
    assert rc == 0 and "already has completed snapshots" in output, output[-4000:]
    ann = api.pod(pod)["metadata"]["annotations"]
    assert ann["snapshot.inferops.org/restore"] == "restored" and ann["snapshot.inferops.org/status"] == "completed"
    after = status.read(snapshot_dir)
    assert after["checksum"] == before["checksum"] and after["history"] == before["history"], "no new generation"
    assert after["last_restore"]["container"] == cid and container_id(cluster, pod) == cid


def test_a_new_instance_starts_from_the_source_instances_snapshot_while_the_source_serves(cluster, runtime):
    """Scale-out on Kubernetes: pod 0 of instance b, created with a template that names instance a as its source,
    is restored by its node's runtime from pod 0 of instance a -- in a network namespace and on a device of its
    own, with its own identity -- while the source keeps serving; no Ansible run decides it."""
    api, source, clone = cluster["api"], "llm-a-0", "llm-b-0"
    snapshot_dir = svc.snapshot_path(str(cluster["host_root"]), {"namespace": cluster["namespace"], "service": "llm",
                                                                 "instance": "a", "pod": source})
    api.create(template(cluster, source, instance="a", service="llm", own_network=True))
    wait_ready(cluster, source)
    config = {"enabled": True, "npuSnapshotPath": str(cluster["npu_root"]), "hostSnapshotPath": str(cluster["host_root"])}
    rc, output = run_playbook("k8s_generate.yml", cluster["inventory"], {
        "k8s_snapshot_namespace": cluster["namespace"], "k8s_snapshot_service": "llm",
        "k8s_snapshot_node_group": "k8s_nodes", "k8s_snapshot_config": config})
    assert rc == 0, output[-4000:]
    assert status.read(snapshot_dir)["status"] == "completed"
    expected, warmed = answers(cluster, source), info(cluster, source)

    created = time.monotonic()
    api.create(template(cluster, clone, instance="b", service="llm", source="a", port=cluster["ports"][source],
                        own_network=True))
    seconds = first_answer(cluster, clone, created)
    record = runtime.log_records(container_id(cluster, clone))[-1]
    assert record["outcome"] == "restored" and record["reason"] is None, record
    now = info(cluster, clone)
    assert now["started_at"] == warmed["started_at"], "the clone is the source's warmed-up process, restored"
    assert answers(cluster, clone) == expected and answers(cluster, source) == expected, "both serve, alike"
    meta = now["metadata"]
    assert meta["restored"] is True and meta["identity"]["pod"] == clone and meta["identity"]["instance"] == "b", meta
    assert meta["source"]["pod"] == source and meta["env"]["POD_NAME"] == clone, meta
    assert info(cluster, source)["pid"] == warmed["pid"], "the source was never touched"
    print("\nk8s clone: pod created -> first correct answer %.2f s (runtime stages %s)" % (seconds, record["durations"]))


def test_on_shared_storage_a_pod_recreated_on_another_node_is_restored_there(cluster, runtime):
    """Two nodes mount one snapshot store (here: two simulated kubelets on this machine's dockerd, the store one
    directory, as a shared mount would be). A pod generated on node-a and recreated on node-b is restored by
    node-b's runtime from the store, with no Ansible run; the catch-up reads node-b's record and annotates it."""
    api, pod = cluster["api"], "shr-p0-0"
    other = Kubelet(cluster["server_url"], "node-b", cluster["base"] / "kubelet-b", "fleetk8s-b-" + uuid.uuid4().hex[:6],
                    runtime_classes={RUNTIME_CLASS: runtime.name})
    try:
        snapshot_dir = svc.snapshot_path(str(cluster["host_root"]), {"namespace": cluster["namespace"], "service": "shr",
                                                                     "instance": "p0", "pod": pod})
        api.create(template(cluster, pod, service="shr", node=NODE))
        wait_ready(cluster, pod)
        config = {"enabled": True, "npuSnapshotPath": str(cluster["npu_root"]),
                  "hostSnapshotPath": str(cluster["host_root"])}
        play = {"k8s_snapshot_namespace": cluster["namespace"], "k8s_snapshot_service": "shr",
                "k8s_snapshot_node_group": "k8s_nodes", "k8s_snapshot_config": config}
        inventory = write_inventory(cluster["base"] / "inventory-two-nodes.json", NODE, cluster["kubeconfig"],
                                    more_nodes=["node-b"])
        rc, output = run_playbook("k8s_generate.yml", inventory, play)
        assert rc == 0, output[-4000:]
        assert status.read(snapshot_dir)["status"] == "completed"
        warmed, expected = info(cluster, pod), answers(cluster, pod)

        api.delete(pod)                                      # node-a is lost; the pod comes back on node-b
        cluster["kubelet"].wait_removed(cluster["namespace"], pod)
        reset_device(cluster["devices"][pod])
        api.create(template(cluster, pod, service="shr", node="node-b"))
        first_answer(cluster, pod, time.monotonic())
        cid = container_id(cluster, pod)
        assert [c["pod"] for c in other.containers.values()] == [pod], "node-b's kubelet runs it"
        record = runtime.log_records(cid)[-1]
        assert record["outcome"] == "restored" and record["reason"] is None, record
        assert info(cluster, pod)["started_at"] == warmed["started_at"] and answers(cluster, pod) == expected
        rc, output = run_playbook("k8s_restore.yml", inventory, play)
        assert rc == 0, output[-4000:]
        ann = api.pod(pod)["metadata"]["annotations"]
        assert ann["snapshot.inferops.org/restore"] == "restored" and ann["snapshot.inferops.org/node"] == "node-b", ann
        assert status.read(snapshot_dir)["last_restore"]["container"] == cid
    finally:
        if api.pod(pod):
            api.delete(pod)
            other.wait_removed(cluster["namespace"], pod)
        other.stop()
    assert other.errors == [], "node-b's kubelet simulation failed:\n" + "\n".join(other.errors)

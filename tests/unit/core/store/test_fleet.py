"""Fleet: clones of another instance's snapshot, the record of restores beside a snapshot, and what
retention makes of it. Real files, real processes (a `sleep` as the holder of a restore), the node runtime's
real request parsing and verification with a fake runc at the process boundary."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import retention, runtime as rr
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import verify
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import fleet, metadata, seal, status

SOURCE = {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "svc-p0-0"}
CLONE = {"namespace": "ns", "service": "svc", "instance": "p1", "pod": "svc-p1-0"}
CID = "c" * 64


def sealed(root, identity, created_at="2026-12-01T10:00:00Z", completed=True):
    final = Path(layout.snapshot_dir(str(root), identity))
    staging = Path(layout.staging_dir(str(final)))
    (staging / "host").mkdir(parents=True)
    (staging / "host" / "pages-1.img").write_bytes(os.urandom(4096))
    fields = {"identity": identity, "created_at": created_at, "image": {"id": "sha256:" + "ab" * 32, "name": "w:1"},
              "engine": {"name": "docker", "version": "20.10.24", "criu_version": "4.2.1"},
              "runtime": {"name": "ascend-acl", "version": "9.1.0"}, "devices": [0]}
    seal.seal(str(staging), fields)
    seal.publish(str(staging), str(final))
    status.update(str(final), status="completed" if completed else "failed", identity=identity)
    return str(final)


# -- identities ------------------------------------------------------------------------------------
def test_a_clone_of_the_same_service_expects_exactly_its_declared_source():
    assert fleet.clone_reason(CLONE, SOURCE) is None
    assert verify.expectations(CLONE, criu_version="skip", source=SOURCE)["identity"] == SOURCE
    assert verify.expectations(CLONE, criu_version="skip")["identity"] == CLONE


@pytest.mark.parametrize("target, word", [
    (dict(CLONE, service="other"), "service svc"), (dict(CLONE, namespace="prod"), "namespace ns"), (None, "needs")])
def test_a_clone_into_another_service_or_namespace_is_refused(target, word):
    reason = fleet.clone_reason(target, SOURCE)
    assert reason.startswith("clone_refused: ") and word in reason, reason
    with pytest.raises(ParameterError, match="clone_refused"):
        verify.expectations(target, criu_version="skip", source=SOURCE)


@pytest.mark.parametrize("text", ["ns/svc/p0", "ns/svc/p0/pod/x", "ns//p0/pod", "ns/svc/p0/../x", ""])
def test_identities_that_do_not_parse_are_refused_naming_the_field(text):
    with pytest.raises(ValueError, match="restore-source"):
        fleet.parse_identity(text, "restore-source")


def test_pod_k_of_the_clone_maps_to_pod_k_of_the_source():
    assert fleet.source_pod("svc-p1-1", ["svc-p0-0", "svc-p0-1", "svc-p0-10"]) == "svc-p0-1"
    with pytest.raises(ParameterError, match="no pod with ordinal 2"):
        fleet.source_pod("svc-p1-2", ["svc-p0-0", "svc-p0-1"])
    with pytest.raises(ParameterError, match="identity.pod"):
        fleet.source_pod("engine", ["svc-p0-0"])


def test_the_newest_completed_snapshot_of_the_service_is_chosen_never_the_clone_itself(tmp_path):
    older = sealed(tmp_path, SOURCE, "2026-12-01T10:00:00Z")
    newer = sealed(tmp_path, dict(SOURCE, instance="p2", pod="svc-p2-0"), "2026-12-01T11:00:00Z")
    sealed(tmp_path, dict(SOURCE, instance="p3", pod="svc-p3-0"), "2026-12-01T12:00:00Z", completed=False)
    sealed(tmp_path, CLONE, "2026-12-01T13:00:00Z")  # the clone's own (newest) snapshot is not a source
    assert fleet.choose_source(str(tmp_path), CLONE) == (dict(SOURCE, instance="p2", pod="svc-p2-0"), newer)
    assert fleet.choose_source(str(tmp_path), CLONE, "newest") == (dict(SOURCE, instance="p2", pod="svc-p2-0"), newer)
    assert fleet.choose_source(str(tmp_path), CLONE, "p0") == (SOURCE, older)
    with pytest.raises(ParameterError, match="is the pod itself"):
        fleet.choose_source(str(tmp_path), CLONE, "p1")
    with pytest.raises(ParameterError, match="no other instance of ns/other"):
        fleet.choose_source(str(tmp_path), dict(CLONE, service="other"))


def test_every_restore_gets_its_own_nonce_in_the_metadata_document():
    docs = [metadata.document({}, True, "/s", "restore-on-create runtime", identity=CLONE, source=SOURCE,
                              restore_nonce=fleet.new_nonce()) for _index in range(2)]
    assert docs[0]["restore_nonce"] != docs[1]["restore_nonce"] and len(docs[0]["restore_nonce"]) == 32
    assert docs[0]["identity"] == CLONE and docs[0]["source"] == SOURCE


# -- devices -----------------------------------------------------------------------------------------
def test_device_keys_name_the_host_side_of_the_simulated_device_and_device_nodes():
    spec = {"process": {"env": ["ACL_SIM_DEVICE_DIR=/var/lib/npu/dev0", "PATH=/bin"]},
            "mounts": [{"destination": "/var/lib/npu", "type": "bind", "source": "/srv/node/npu-a",
                        "options": ["rbind"]}, {"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"devices": [{"path": "/dev/davinci3", "type": "c", "major": 236, "minor": 3},
                                  {"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]}}
    assert fleet.device_keys(spec) == ["c:236:3", "sim:/srv/node/npu-a/dev0"]
    info = {"Config": {"Env": ["ACL_SIM_DEVICE_DIR=/var/lib/npu/dev0"]},
            "Mounts": [{"Type": "bind", "Source": "/srv/node/npu-b", "Destination": "/var/lib/npu"}]}
    assert fleet.docker_device_keys(info) == ["sim:/srv/node/npu-b/dev0"]


# -- the record of restores ------------------------------------------------------------------------
@pytest.fixture
def holder():
    """A real process standing in for a restored engine."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def test_one_snapshot_is_never_restored_twice_onto_one_device_while_the_first_runs(tmp_path, holder):
    snap = sealed(tmp_path, SOURCE)
    first = fleet.begin(snap, ["sim:/dev-a"], 30, identity=CLONE)
    with pytest.raises(fleet.Busy, match="device_busy: .* sim:/dev-a"):  # a second restore while the first runs
        fleet.begin(snap, ["sim:/dev-a"], 30, identity=dict(CLONE, pod="svc-p1-1"))
    fleet.running(snap, first, holder.pid)
    with pytest.raises(fleet.Busy, match="the process restored as ns/svc/p1/svc-p1-0"):
        fleet.begin(snap, ["sim:/dev-a", "c:236:0"], 30)
    other = fleet.begin(snap, ["sim:/dev-b"], 30)  # another device: fine
    fleet.end(snap, other)
    assert os.stat(layout.restores_path(snap)).st_mode & 0o777 == 0o600
    holder.send_signal(signal.SIGKILL)  # the restored process dies (its pod is deleted): the device is free
    holder.wait()
    again = fleet.begin(snap, ["sim:/dev-a"], 30)
    assert [entry["id"] for entry in fleet.read(snap)] == [again]  # the dead holder's entry is gone


def test_a_killed_restore_does_not_block_and_another_nodes_counts_until_its_deadline(tmp_path):
    snap = sealed(tmp_path, SOURCE)
    killed = subprocess.Popen(["sleep", "600"])
    fleet.begin(snap, ["sim:/dev-a"], 30, pid=killed.pid)
    assert fleet.in_progress(snap)
    killed.kill()
    killed.wait()
    assert fleet.in_progress(snap) == []
    fleet.begin(snap, ["sim:/dev-a"], 30)  # not refused
    remote = fleet.begin(snap, ["sim:/dev-a"], 30, host="node-b", pid=1)  # another node: its own devices
    now = time.time()
    assert remote in [entry["id"] for entry in fleet.in_progress(snap, now)]
    assert remote not in [entry["id"] for entry in fleet.in_progress(snap, now + 30 + fleet.GRACE + 1)]


def test_retention_keeps_a_snapshot_while_any_node_restores_from_it(tmp_path):
    snap = sealed(tmp_path, SOURCE, created_at="2020-01-01T00:00:00Z")
    policy = {"remove": ["stale"], "max_age": 60, "generation_grace": 3600}
    entry = fleet.begin(snap, ["sim:/dev-a"], 60, host="node-b", pid=1)
    removals, kept = retention.decide(retention.scan(str(tmp_path), time.time()), {}, policy, {}, {}, None, time.time())
    assert removals == [] and "being restored" in kept[0]["reason"] and "node-b" in kept[0]["reason"], kept
    fleet.end(snap, entry)
    removals, kept = retention.decide(retention.scan(str(tmp_path), time.time()), {}, policy, {}, {}, None, time.time())
    assert sorted(r["kind"] for r in removals) == ["restores", "snapshot", "status"], removals


# -- the node runtime's request and verification, with a fake runc -----------------------------------
@pytest.fixture
def node(tmp_path):
    runc = tmp_path / "runc"
    runc.write_text("#!/bin/sh\nexit 0\n")
    runc.chmod(0o755)
    roots = tmp_path / "snapshots"
    roots.mkdir(mode=0o700)
    config = dict(rr.DEFAULTS, runc=str(runc), state_dir=str(tmp_path / "state"), log_file=str(tmp_path / "rt.log"),
                  snapshot_roots=[str(roots)], docker_root=str(tmp_path / "docker"))
    record = tmp_path / "docker" / "containers" / CID / "config.v2.json"  # a Docker host's container: dockerd made it
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"Name": "/engine", "Config": {}}))
    return {"config": config, "roots": roots, "tmp": tmp_path, "runc": str(runc)}


class Exec(BaseException):
    pass


def create(node, env):
    b = node["tmp"] / "bundle"
    (b / "rootfs").mkdir(parents=True, exist_ok=True)
    (b / "config.json").write_text(json.dumps({"process": {"env": ["%s=%s" % kv for kv in env.items()], "args": ["x"]},
                                               "root": {"path": "rootfs"}, "mounts": []}))

    def execv(path, args):
        raise Exec(args)
    try:
        rr.Runtime(node["config"], ["create", "--bundle", str(b), CID], execv=execv).main()
    except Exec:
        pass
    record = [json.loads(line) for line in (node["tmp"] / "rt.log").read_text().splitlines()][-1]
    return record, json.loads((b / "rootfs/run/inferops-snapshot/metadata.json").read_text())


def test_the_runtime_parses_the_source_and_refuses_one_that_does_not_parse(node):
    snap = str(node["roots"] / "x")
    request = rr.restore_request({"process": {"env": ["INFEROPS_RESTORE_FROM=" + snap,
                                                      "INFEROPS_RESTORE_SOURCE=ns/svc/p0/svc-p0-0"]}}, node["config"])
    assert request["source"] == SOURCE and request["problems"] == []
    bad = rr.restore_request({"process": {"env": ["INFEROPS_RESTORE_FROM=" + snap, "INFEROPS_RESTORE_SOURCE=svc"]}},
                             node["config"])
    assert bad["problems"] == ["restore-source: 'svc' is not namespace/service/instance/pod"]


@pytest.mark.parametrize("source, target, reason", [
    (None, CLONE, "identity_mismatch: snapshot belongs to ns/svc/p0/svc-p0-0, not ns/svc/p1/svc-p1-0"),
    (SOURCE, dict(CLONE, service="other"), "clone_refused: ns/svc/p0/svc-p0-0 may only be cloned into pods of service"),
    (dict(SOURCE, instance="p7"), CLONE, "identity_mismatch: snapshot belongs to ns/svc/p0/svc-p0-0, not ns/svc/p7/"),
    # the declared source is accepted: verification goes on to the next check (this snapshot has no CRIU images)
    (SOURCE, CLONE, "incomplete: "),
])
def test_the_runtime_accepts_exactly_the_declared_source_of_the_same_service(node, source, target, reason):
    snap = sealed(node["roots"], SOURCE)
    env = {"INFEROPS_RESTORE_FROM": snap, "INFEROPS_RESTORE_IDENTITY": layout.identity_string(target)}
    if source:
        env["INFEROPS_RESTORE_SOURCE"] = layout.identity_string(source)
    record, doc = create(node, env)
    assert record["outcome"] == "cold" and record["reason"].startswith(reason), record
    assert doc["restored"] is False and doc["identity"] == target and "source" not in doc and "restore_nonce" not in doc
    entry = status.read(snap)["last_restore"]
    assert entry["outcome"] == "cold" and entry.get("source") == source, entry
    assert fleet.read(snap) == []  # a cold start leaves nothing in the record of restores


# -- Kubernetes: the template carries the request ---------------------------------------------------
def test_the_template_env_expands_to_the_pods_own_snapshot_and_identity_as_the_kubelet_resolves_it():
    from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import pods, service as svc
    pod = {"metadata": {"name": "qwen-p1-2", "namespace": "inference",
                        "labels": {"apps.kubernetes.io/pod-index": "2"}}, "spec": {}}
    own, _unresolved = pods.resolve_env(pod, {"env": svc.restore_template_env("/mnt/snap/", "qwen", "p1")})
    assert own["INFEROPS_RESTORE_FROM"] == "/mnt/snap/inference/qwen/p1/qwen-p1-2"
    assert own["INFEROPS_RESTORE_IDENTITY"] == "inference/qwen/p1/qwen-p1-2" and "INFEROPS_RESTORE_SOURCE" not in own
    clone, _unresolved = pods.resolve_env(pod, {"env": svc.restore_template_env("/mnt/snap", "qwen", "p1", "p0", "qwen-p0-")})
    assert clone["INFEROPS_RESTORE_FROM"] == "/mnt/snap/inference/qwen/p0/qwen-p0-2"
    assert clone["INFEROPS_RESTORE_SOURCE"] == "inference/qwen/p0/qwen-p0-2"
    assert clone["INFEROPS_RESTORE_IDENTITY"] == "inference/qwen/p1/qwen-p1-2"
    request = rr.restore_request({"process": {"env": ["%s=%s" % kv for kv in clone.items()]}}, dict(rr.DEFAULTS))
    assert request["identity"] == dict(CLONE, namespace="inference", service="qwen", pod="qwen-p1-2")
    assert fleet.clone_reason(request["identity"], request["source"]) is None
    with pytest.raises(ParameterError, match="source_stem"):
        svc.restore_template_env("/mnt/snap", "qwen", "p1", "p0")

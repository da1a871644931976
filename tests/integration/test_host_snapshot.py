"""Host snapshot, verification and restore on the real Docker engine with real CRIU, together
with the device state on the simulated NPU. No mocks: every step runs the collection's modules
through ansible against a real dockerd."""

import filecmp
import json
import os
import shutil
import subprocess
import threading
import time
import uuid

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import AgentSocketClient
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import task
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import containerd_leak
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import manifest
from ansible_collections.inferops.snapshot.plugins.modules import host_checkpoint as host_checkpoint_module
from conftest import WorkloadContainer, docker, free_port, posix_locks, reset_device, run_module

PROMPTS = ["what is an NPU?", "snapshot me", "数据", "the quick brown fox"]
WARMUP = 20.0


def identity(pod):
    return {"namespace": "default", "service": "sample", "instance": "p0", "pod": pod}


def snapshot_path(root, pod):
    return str(root / "default" / "sample" / "p0" / pod)


def generate_snapshot(container, root, pod):
    """The generation sequence the roles run: device snapshot, host snapshot, resume."""
    target = {"container": container.name}
    backup = run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=snapshot_path(root, pod),
                                                    identity=identity(pod)))
    assert backup["changed"] and backup["state"] == "BACKED_UP", backup
    checkpoint = run_module("host_checkpoint", {"container": container.name, "snapshot_dir": snapshot_path(root, pod),
                                                "identity": identity(pod), "timeout": 120})
    assert checkpoint["changed"] and checkpoint["status"] == "completed", (checkpoint.get("msg"), checkpoint.get("criu_log_tail"))
    resumed = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert resumed["actions"] == ["restore", "unlock"], resumed
    return checkpoint


@pytest.fixture(scope="module")
def warm_snapshot(docker_env, tmp_path_factory):
    """One workload warmed up for WARMUP seconds, its snapshot generated while it keeps serving."""
    base = tmp_path_factory.mktemp("host")
    device_dir = base / "npu"
    device_dir.mkdir(mode=0o700)
    root = base / "snapshots"
    pod = "pod-%s" % uuid.uuid4().hex[:6]
    cache = base / "cache"  # read locks held on a bind mount, one on a mapped file, as SQLite's are
    cache.mkdir(mode=0o700)
    container = WorkloadContainer(pod, docker_env, device_dir, free_port(), mounts=[cache],
                                  WORKLOAD_WARMUP_SECONDS=WARMUP, WORKLOAD_LOCK_DIR=cache)
    started = time.monotonic()
    container.run()
    container.wait_ready(timeout=WARMUP + 60)
    expected = [container.generate(p) for p in PROMPTS]
    locks = posix_locks(container.pid)
    assert len(locks) == 2, locks
    cold_seconds = time.monotonic() - started

    # Requests keep flowing during generation: they may wait while the process is locked, never fail.
    failures, served = [], []
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            try:
                served.append(container.generate(PROMPTS[0]) == expected[0])
            except Exception as exc:  # collected and asserted below
                failures.append(repr(exc))

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        checkpoint = generate_snapshot(container, root, pod)
    finally:
        stop.set()
        thread.join(60)
    data = dict(container=container, root=root, pod=pod, device_dir=device_dir, expected=expected, locks=locks,
                cold_seconds=cold_seconds, checkpoint=checkpoint, failures=failures, served=served,
                image=docker_env, base=base)
    yield data
    container.remove()


def test_generation_publishes_a_complete_snapshot_and_keeps_serving(warm_snapshot):
    w = warm_snapshot
    assert w["failures"] == [] and w["served"] and all(w["served"]), (w["failures"], w["served"][:5])
    assert [w["container"].generate(p) for p in PROMPTS] == w["expected"]
    snap = snapshot_path(w["root"], w["pod"])
    listing = sorted(os.listdir(snap))
    assert listing == ["checksum.sha256", "device", "host", "manifest.json"], listing
    assert not os.path.exists(os.path.join(os.path.dirname(snap), ".%s.partial" % w["pod"]))
    assert os.stat(snap).st_mode & 0o777 == 0o700
    proc = subprocess.run(["sha256sum", "--check", "--strict", "--quiet", "checksum.sha256"], cwd=snap,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads(open(os.path.join(snap, "manifest.json")).read())
    assert manifest["identity"] == identity(w["pod"])
    assert manifest["image"]["id"] == docker("image", "inspect", "--format", "{{.Id}}", w["image"])
    assert manifest["engine"]["criu_version"].startswith("4.")
    assert manifest["device"]["state"] == "BACKED_UP" and manifest["devices"] == [0]
    assert manifest["total_bytes"] > 32 * 1024 * 1024  # the device memory travels in the host snapshot
    status = json.loads(open(os.path.join(os.path.dirname(snap), ".%s.status.json" % w["pod"])).read())
    assert status["status"] == "completed" and status["checksum"] == w["checkpoint"]["checksum"]
    for stage in ("preflight", "checkpoint", "seal", "publish", "total"):
        assert stage in w["checkpoint"]["durations"], w["checkpoint"]["durations"]

    again = run_module("host_checkpoint", {"container": w["container"].name, "snapshot_dir": snap,
                                           "identity": identity(w["pod"])})
    assert again["changed"] is False, again
    check = run_module("snapshot_verify", {"snapshot_dir": snap, "identity": identity(w["pod"]), "image": w["image"],
                                           "min_size": 1000000})
    assert check["valid"] is True and check["reasons"] == [], check
    assert check["throughput_mb_s"] > 0 and check["files"] >= 10


def test_resume_serves_again_before_the_snapshot_is_sealed(warm_snapshot, tmp_path):
    """resume: the engine is unlocked once the backup and the checkpoint are taken; hashing, fsync and the publish
    run while it serves, and the snapshot is as complete as without it."""
    w = warm_snapshot
    pod = "resume-%s" % uuid.uuid4().hex[:6]
    snap = snapshot_path(tmp_path, pod)
    backup = run_module("npu_snapshot_backup", {"container": w["container"].name, "lock": True, "snapshot_dir": snap,
                                                "identity": identity(pod)})
    assert backup["state"] == "BACKED_UP", backup
    client = AgentSocketClient.for_pid(int(docker("inspect", "--format", "{{.State.Pid}}", w["container"].name)))
    seen = {}

    def log(line):
        if "sealing" in line:  # the first step after the resume: the engine must serve already
            seen["state"] = client.request("state", 5)["state"]
            seen["answer"] = w["container"].generate(PROMPTS[0])

    params = {name: spec.get("default") for name, spec in host_checkpoint_module.ARGUMENT_SPEC.items()}
    params.update(container=w["container"].name, snapshot_dir=snap, identity=identity(pod), timeout=120, resume=True)
    result = task.host_checkpoint(params, log=log)
    assert result["status"] == "completed" and result["resumed"] == {
        "actions": ["restore", "unlock"], "state": "RUNNING", "error": None}, result
    assert seen == {"state": "RUNNING", "answer": w["expected"][0]}, seen
    durations = result["durations"]
    assert durations["resume"] > 0 and list(durations).index("resume") < list(durations).index("seal"), durations
    check = run_module("snapshot_verify", {"snapshot_dir": snap, "identity": identity(pod), "image": w["image"]})
    assert check["valid"] is True, check
    assert manifest.load_manifest(snap)["device"]["state"] == "BACKED_UP"  # what a restore resumes from
    again = run_module("npu_snapshot_lock", {"container": w["container"].name, "state": "unlocked"})
    assert again["changed"] is False and again["actions"] == [], again


def test_device_backup_locks_only_after_the_checks_and_serves_again_after_the_checkpoint(warm_snapshot, tmp_path):
    """device_backup: one task from the lock to the resume, as the roles run it. Bad input and check mode leave the
    engine RUNNING and nothing on disk; the real run locks after its preflight, under the lease, and the engine serves
    before the seal; the snapshot is as complete as one taken in two tasks."""
    w = warm_snapshot
    pod = "backup-%s" % uuid.uuid4().hex[:6]
    snap = snapshot_path(tmp_path, pod)
    args = {"container": w["container"].name, "snapshot_dir": snap, "identity": identity(pod), "timeout": 120,
            "device_backup": True, "resume": True, "lease": 60, "device_memory": "required_and_optional"}
    client = AgentSocketClient.for_pid(int(docker("inspect", "--format", "{{.State.Pid}}", w["container"].name)))

    refused = run_module("host_checkpoint", dict(args, require_device_part=False))
    assert refused["failed"] and refused["msg"].startswith("device_backup: needs require_device_part"), refused
    bad_lease = run_module("host_checkpoint", dict(args, lease=-1))
    assert bad_lease["failed"] and bad_lease["msg"].startswith("lease:"), bad_lease
    no_backup = run_module("host_checkpoint", dict(args, device_backup=False))
    assert no_backup["failed"] and no_backup["msg"].startswith("device_memory: required_and_optional is what"), \
        no_backup
    dry = run_module("host_checkpoint", args, check=True)
    assert dry["changed"] and dry["device_backup"]["actions"] == ["lock", "backup"], dry
    assert client.request("state", 5)["state"] == "RUNNING"
    assert not os.path.lexists(os.path.dirname(snap)), os.listdir(str(tmp_path))

    seen = {}

    def log(line):
        if "checkpoint of" in line:  # right before CRIU starts: the engine is backed up under the lease
            reply = client.request("state", 5)
            seen["before"] = (reply["state"], (reply.get("lease") or {}).get("seconds"))
        if "sealing" in line:
            seen["sealing"] = client.request("state", 5)["state"]

    params = {name: spec.get("default") for name, spec in host_checkpoint_module.ARGUMENT_SPEC.items()}
    params.update(args)
    result = task.host_checkpoint(params, log=log)
    assert result["status"] == "completed" and result["resumed"]["state"] == "RUNNING", result
    assert result["device_backup"]["actions"] == ["lock", "backup"], result["device_backup"]
    assert result["device_backup"]["previous_state"] == "RUNNING"
    assert seen == {"before": ("BACKED_UP", 60.0), "sealing": "RUNNING"}, seen
    order = list(result["durations"])
    assert order.index("preflight") < order.index("device_backup") < order.index("checkpoint"), order
    recorded = manifest.load_manifest(snap)
    assert recorded["device"]["state"] == "BACKED_UP" and recorded["device"]["identity"] == identity(pod)
    assert recorded["device"]["snapshot_api"]["device_memory"] == "required_and_optional", recorded["device"]
    check = run_module("snapshot_verify", {"snapshot_dir": snap, "identity": identity(pod), "image": w["image"]})
    assert check["valid"] is True, check
    assert [w["container"].generate(p) for p in PROMPTS] == w["expected"]


def test_delete_reset_recreate_restores_identical_answers(warm_snapshot):
    w = warm_snapshot
    snap = snapshot_path(w["root"], w["pod"])
    w["container"].remove()
    reset_device(w["device_dir"])
    containerd_tmp = containerd_leak.temp_dirs()
    copies_before = containerd_leak.list_copies(containerd_tmp)
    result = run_module("snapshot_restore", {
        "method": "docker", "snapshot_dir": snap, "identity": identity(w["pod"]), "container": w["pod"],
        "env": {"POD_IP": "10.1.2.3", "RESTORED_BY": "test"},
        "health_url": w["container"].url + "/health", "health_timeout": 60})
    answers = [w["container"].generate(p) for p in PROMPTS]
    assert result.get("failed") is False and result["restored"] is True, result
    assert result["created"] is True and result["reason"] is None
    assert answers == w["expected"]
    info = w["container"].info()
    assert info["answers_served"] > 0 and info["started_at"] < time.time() - WARMUP  # the same warmed process
    assert info["metadata"]["env"]["POD_IP"] == "10.1.2.3" and info["metadata"]["restored"] is True
    assert "10.1.2.3" not in json.dumps({k: v for k, v in result.items() if k != "invocation"})
    assert "POD_IP" in result["metadata_env_keys"]
    # docker start --checkpoint restores no file lock (Docker does not ask CRIU to): the engine's agent took both back
    assert posix_locks(w["container"].pid) == w["locks"]
    assert result["file_locks"] == {"checkpointed": 2, "taken_back": 2}, result.get("file_locks")
    # containerd copies the images into its temp dir for the restore and never removes them (#10166)
    assert containerd_tmp, "no containerd process found"
    leaked = [path for path in containerd_leak.list_copies(containerd_tmp) - copies_before
              if os.path.exists(os.path.join(path, "inventory.img"))
              and filecmp.cmp(os.path.join(path, "inventory.img"),
                              os.path.join(snap, "host", "criu", "inventory.img"), shallow=False)]
    assert leaked == [], "the restore left containerd's copy of the images behind"
    again = run_module("snapshot_restore", {"snapshot_dir": snap, "identity": identity(w["pod"]),
                                            "container": w["pod"]})
    assert again["changed"] is False, again
    # docker stop / rm behave normally on a restored container
    docker("stop", "--time", "5", w["pod"])
    docker("rm", w["pod"])


def copy_snapshot(w, new_root):
    src = snapshot_path(w["root"], w["pod"])
    dst = snapshot_path(new_root, w["pod"])
    os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def cold_fallback(w, snapshot_dir, pod_identity, containers, image=None):
    """Create the recreated container ourselves (as kubelet/compose would) and restore it."""
    c = containers(w["pod"] + "-" + uuid.uuid4().hex[:4], image or w["image"], w["device_dir"], free_port())
    c.create()
    reset_device(w["device_dir"])
    result = run_module("snapshot_restore", {"method": "docker", "snapshot_dir": snapshot_dir, "identity": pod_identity,
                                             "container": c.name, "health_url": c.url + "/health",
                                             "health_timeout": 120})
    assert result.get("failed") is False and result["restored"] is False, result
    assert [c.generate(p) for p in PROMPTS] == w["expected"]  # a cold start serves correct answers too
    assert c.info()["metadata"]["restored"] is False
    return result


def test_one_corrupted_byte_falls_back_to_a_cold_start(warm_snapshot, containers, tmp_path):
    w = warm_snapshot
    snap = copy_snapshot(w, tmp_path / "corrupt")
    pages = sorted(f for f in os.listdir(os.path.join(snap, "host", "criu")) if f.startswith("pages-"))[0]
    path = os.path.join(snap, "host", "criu", pages)
    with open(path, "r+b") as handle:
        handle.seek(4096)
        byte = handle.read(1)
        handle.seek(4096)
        handle.write(bytes([byte[0] ^ 0x40]))
    check = run_module("snapshot_verify", {"snapshot_dir": snap, "identity": identity(w["pod"])})
    assert check["valid"] is False and check["reasons"] == ["checksum_mismatch: host/criu/%s" % pages], check
    strict = run_module("snapshot_verify", {"snapshot_dir": snap, "fail_on_invalid": True})
    assert strict["failed"] and "checksum_mismatch" in strict["msg"]
    result = cold_fallback(w, snap, identity(w["pod"]), containers)
    assert result["reason"] == "checksum_mismatch: host/criu/%s" % pages
    assert os.path.exists(path), "an invalid snapshot is never deleted silently"


def test_missing_snapshot_falls_back_to_a_cold_start(warm_snapshot, containers, tmp_path):
    w = warm_snapshot
    result = cold_fallback(w, snapshot_path(tmp_path / "empty", w["pod"]), identity(w["pod"]), containers)
    assert result["reason"].startswith("missing:"), result


def test_snapshot_from_another_image_falls_back(warm_snapshot, containers, tmp_path):
    w = warm_snapshot
    other = "inferops/workload:other-%s" % uuid.uuid4().hex[:6]
    build = tmp_path / "ctx"
    build.mkdir()
    (build / "Dockerfile").write_text("FROM %s\nLABEL org.inferops.variant=%s\n" % (w["image"], other))
    subprocess.run(["docker", "build", "-q", "-t", other, str(build)], check=True, capture_output=True,
                   env=dict(os.environ, DOCKER_BUILDKIT="0"))
    try:
        result = cold_fallback(w, snapshot_path(w["root"], w["pod"]), identity(w["pod"]), containers, image=other)
        assert result["reason"].startswith("image_mismatch:"), result
    finally:
        docker("rmi", "-f", other, check=False)


def test_snapshot_of_another_pod_is_refused(warm_snapshot, containers):
    w = warm_snapshot
    result = cold_fallback(w, snapshot_path(w["root"], w["pod"]), identity("some-other-pod"), containers)
    assert result["reason"].startswith("identity_mismatch:"), result


def test_generation_timeout_cleans_up_and_records_failed(docker_env, containers, tmp_path):
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    pod = "late-%s" % uuid.uuid4().hex[:4]
    c = containers(pod, docker_env, device_dir, free_port()).run()
    c.wait_ready()
    expected = c.generate("x")
    snap = snapshot_path(tmp_path / "snapshots", pod)
    staging = os.path.join(os.path.dirname(snap), ".%s.partial" % pod)

    no_device = run_module("host_checkpoint", {"container": pod, "snapshot_dir": snap, "identity": identity(pod)})
    assert no_device["failed"] and "npu_snapshot_backup" in no_device["msg"], no_device

    run_module("npu_snapshot_backup", {"container": pod, "lock": True, "snapshot_dir": snap, "identity": identity(pod)})
    assert os.path.exists(os.path.join(staging, "device", "device.json"))
    late = run_module("host_checkpoint", {"container": pod, "snapshot_dir": snap, "identity": identity(pod),
                                          "timeout": 0.01})
    assert late["failed"] and "timeout" in late["msg"] and late["status"] == "failed", late
    assert not os.path.exists(snap) and not os.path.exists(staging), "a failed generation leaves nothing behind"
    status = json.loads(open(os.path.join(os.path.dirname(snap), ".%s.status.json" % pod)).read())
    assert status["status"] == "failed" and "timeout" in status["reason"]
    assert [h["status"] for h in status["history"]] == ["generating", "failed"]

    resumed = run_module("npu_snapshot_lock", {"container": pod, "state": "unlocked"})  # the service comes back
    assert resumed["state"] == "RUNNING"
    assert c.generate("x") == expected

    gone = run_module("host_checkpoint", {"container": "no-such-%s" % pod, "snapshot_dir": snap,
                                          "identity": identity(pod)})
    assert gone["failed"] and "no container named" in gone["msg"], gone

"""A bare inference process (no container) snapshotted and restored with the real CRIU (engine criu),
together with its device state on the simulated NPU. No mocks: every step runs the collection's
modules through ansible. Every process this file starts (or restores, or has the module cold start)
carries a marker in its environment and is killed by pid in the teardown, and only when the marker
is there, so nothing is left running on a shared machine and nobody else's process is touched."""

import json
import os
import shutil
import signal
import subprocess

import time
import urllib.parse
import uuid

import pytest

from conftest import (WORKLOAD, agent_command, ensure_agent_package, free_port, http_get, install_devices, posix_locks,
                      reset_device, run_module)

from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import criu_images

PROMPTS = ["what is an NPU?", "snapshot me", "数据", "the quick brown fox"]
MARK = "INFEROPS_TEST_MARK"


def identity(pod):
    return {"namespace": "default", "service": "bare", "instance": "p0", "pod": pod}


def snapshot_path(root, pod):
    return str(root / "default" / "bare" / "p0" / pod)


def pid_exists(pid):
    return os.path.exists("/proc/%d" % pid)


def marked(pid, mark):
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            return ("%s=%s" % (MARK, mark)).encode() in handle.read().split(b"\0")
    except OSError:
        return False


def kill_marked(pid, mark, timeout=20):
    """SIGKILL ``pid`` if it is one of ours (our marker in its environment) and wait until its pid is free."""
    if not pid or not marked(pid, mark):
        return
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def generate(url, prompt):
    status, body = http_get(url + "/v1/generate?prompt=" + urllib.parse.quote(prompt), timeout=30)
    assert status == 200, (status, body)
    return body["answer"]


def wait_ready(url, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the workload exited with %s" % proc.returncode
        try:
            if http_get(url + "/health", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("the workload did not serve within %s s" % timeout)


def workload_env(base, simulator_library, port, device_dir, mark):
    socket_dir = base / ("agent-%d" % port)
    socket_dir.mkdir(mode=0o700, exist_ok=True)
    return {
        "INFEROPS_ACL_LIBRARY": str(simulator_library), "ACL_SIM_DEVICE_DIR": str(device_dir),
        "ACL_SIM_DEVICE_NODES": install_devices(device_dir)["nodes"],  # its NPU's device nodes, held as on hardware
        "ACL_SIM_DEVICE_MEM_BYTES": "256M", "INFEROPS_AGENT_SOCKET_DIR": str(socket_dir),
        "INFEROPS_METADATA_FILE": str(base / ("metadata-%d" % port) / "metadata.json"),
        "WORKLOAD_PORT": str(port), "WORKLOAD_WARMUP_SECONDS": "1", "WORKLOAD_DEVICE_MB": "16",
        "WORKLOAD_HOST_MB": "4", "PYTHONUNBUFFERED": "1", MARK: mark, "PYTHONPATH": str(ensure_agent_package()),
    }


@pytest.fixture(scope="module")
def bare(docker_env, simulator_library, tmp_path_factory):
    """A warmed-up workload started as a bare process under the agent, and its snapshot (device + CRIU)."""
    base = tmp_path_factory.mktemp("bare")
    device_dir = base / "npu"
    device_dir.mkdir(mode=0o700)
    mark = uuid.uuid4().hex
    port = free_port()
    env = workload_env(base, simulator_library, port, device_dir, mark)
    (base / "cache").mkdir(mode=0o700)
    env["WORKLOAD_LOCK_DIR"] = str(base / "cache")  # read locks held, one on a mapped file, as SQLite's are
    command = agent_command(WORKLOAD)
    # Its own session, no terminal, no file CRIU would have to find again: what a restorable process needs.
    proc = subprocess.Popen(command, env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    started = []  # pids the module restored or cold started
    data = dict(base=base, device_dir=device_dir, mark=mark, port=port, url="http://127.0.0.1:%d" % port,
                env=env, proc=proc, pid=proc.pid, root=base / "snapshots", pod="bare-%s" % mark[:6],
                command=command, started=started, library=simulator_library)
    data["snapshot_dir"] = snapshot_path(data["root"], data["pod"])
    data["socket_dir"] = env["INFEROPS_AGENT_SOCKET_DIR"]
    try:
        wait_ready(data["url"], proc)
        data["expected"] = [generate(data["url"], p) for p in PROMPTS]
        data["locks"] = posix_locks(proc.pid)
        assert len(data["locks"]) == 2, data["locks"]
        target = {"pid": proc.pid, "agent_socket_dir": data["socket_dir"]}
        backup = run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=data["snapshot_dir"],
                                                        identity=identity(data["pod"])))
        assert backup["changed"] and backup["state"] == "BACKED_UP", backup
        checkpoint = run_module("host_checkpoint", {
            "engine": "criu", "pid": proc.pid, "snapshot_dir": data["snapshot_dir"], "identity": identity(data["pod"]),
            "agent_socket_dir": data["socket_dir"], "timeout": 120})
        assert checkpoint["changed"] and checkpoint["status"] == "completed", \
            (checkpoint.get("msg"), checkpoint.get("criu_log_tail"))
        resumed = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
        assert resumed["actions"] == ["restore", "unlock"], resumed
        data["checkpoint"] = checkpoint
        yield data
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        for pid in started:
            kill_marked(pid, mark)
        leftovers = [pid for pid in [proc.pid] + started if marked(pid, mark)]
        assert not leftovers, "processes left running: %s" % leftovers


def kill_original(b):
    """The process is lost (host reboot, OOM kill...): its pid is free again and the device is wiped."""
    if b["proc"].poll() is None:
        b["proc"].kill()
    b["proc"].wait(30)
    assert not pid_exists(b["pid"])
    reset_device(b["device_dir"])


def restore_args(b, **extra):
    args = {"engine": "criu", "snapshot_dir": b["snapshot_dir"], "identity": identity(b["pod"]),
            "agent_socket_dir": b["socket_dir"], "metadata_path": b["env"]["INFEROPS_METADATA_FILE"],
            "health_url": b["url"] + "/health", "health_timeout": 60, "timeout": 60}
    args.update(extra)
    return args


def test_checkpoint_of_a_bare_process_records_engine_and_pids(bare):
    b = bare
    snap = b["snapshot_dir"]
    manifest = json.loads(open(os.path.join(snap, "manifest.json")).read())
    assert manifest["engine"]["name"] == "criu" and manifest["image"] is None
    assert manifest["device"]["pid"] == b["pid"] and manifest["device"]["state"] == "BACKED_UP"
    assert not os.path.exists(os.path.join(snap, "host", "container.json"))
    tree = criu_images.read_pstree(os.path.join(snap, "host", "criu"))  # the parser against CRIU's own image
    assert tree[0][0] == b["pid"] and b["pid"] in tree[0][1] and len(tree[0][1]) > 1, tree
    # A snapshot of a bare process is no container snapshot: the docker engine says so and does not use it.
    docker_engine = run_module("snapshot_restore", {"snapshot_dir": snap, "identity": identity(b["pod"]),
                                                    "container": "inferops-bare-none-%s" % b["mark"][:8]})
    assert docker_engine["failed"] and "engine_mismatch: snapshot was taken with engine criu" in docker_engine["msg"]
    assert "engine=criu" in docker_engine["msg"]


def test_engine_options_are_checked_naming_the_field(bare):
    b = bare
    missing = run_module("snapshot_restore", {"snapshot_dir": b["snapshot_dir"], "identity": identity(b["pod"])})
    assert missing["failed"] and "container" in missing["msg"] and "engine is docker" in missing["msg"], missing
    extra = run_module("snapshot_restore", restore_args(b, container="x"))
    assert extra["failed"] and extra["msg"].startswith("container: only for engine=docker"), extra
    cold = run_module("snapshot_restore", {"snapshot_dir": b["snapshot_dir"], "identity": identity(b["pod"]),
                                           "container": "x", "cold_start": ["/bin/true"]})
    assert cold["failed"] and cold["msg"].startswith("cold_start: only for engine=criu"), cold


def test_a_taken_pid_is_a_reason_not_a_crash(bare):
    b = bare
    assert b["proc"].poll() is None  # the original still runs, so its pids are taken
    result = run_module("snapshot_restore", restore_args(b))
    assert result["failed"] and result["restored"] is False, result
    assert result["reason"].startswith("pid_in_use:") and "%d (" % b["pid"] in result["reason"], result
    assert result["msg"].startswith("cold_start:") and result["verify"]["valid"] is True
    planned = run_module("snapshot_restore", restore_args(b, cold_start=["/bin/false"]), check=True)
    assert planned["failed"] is False and planned["changed"] and planned["restored"] is False, planned
    assert planned["reason"].startswith("pid_in_use:")
    assert [generate(b["url"], p) for p in PROMPTS] == b["expected"]  # nothing happened to the original


def test_check_mode_changes_nothing(bare):
    b = bare
    kill_original(b)
    record_path = os.path.join(os.path.dirname(b["snapshot_dir"]), ".%s.status.json" % b["pod"])
    before = json.loads(open(record_path).read())
    # the attempt above that could neither restore nor start cold is on record as such
    assert before["last_restore"]["outcome"] == "failed" and before["last_restore"]["reason"].startswith("pid_in_use:")
    result = run_module("snapshot_restore", restore_args(b), check=True)
    assert result["failed"] is False and result["changed"] is True, result
    assert result["restored"] is True and result["reason"] is None and result["verify"]["valid"] is True
    assert not pid_exists(b["pid"])
    assert not os.path.exists(b["env"]["INFEROPS_METADATA_FILE"])
    assert json.loads(open(record_path).read()) == before
    with pytest.raises(OSError):
        http_get(b["url"] + "/health", timeout=2)


def test_restore_brings_back_the_same_process_with_the_same_answers(bare):
    b = bare
    assert not pid_exists(b["pid"])  # after test_check_mode_changes_nothing: killed, device wiped
    started = time.monotonic()
    result = run_module("snapshot_restore", restore_args(b, env={"POD_IP": "10.9.8.7"}))
    if result.get("pid"):
        b["started"].append(result["pid"])
    assert result["failed"] is False and result["restored"] is True, (result.get("msg"), result.get("reason"),
                                                                      result.get("criu_log_tail"))
    assert result["reason"] is None and result["pid"] == b["pid"] and result["device_actions"] == ["restore", "unlock"]
    assert [generate(b["url"], p) for p in PROMPTS] == b["expected"]
    seconds = time.monotonic() - started
    for stage in ("verify", "host_restore", "device_restore", "health", "total"):
        assert stage in result["durations"], result["durations"]
    state = run_module("npu_snapshot_lock", {"pid": b["pid"], "agent_socket_dir": b["socket_dir"],
                                             "state": "unlocked"}, check=True)
    assert state["changed"] is False and state["previous_state"] == "RUNNING", state
    info = http_get(b["url"] + "/v1/info")[1]
    assert info["answers_served"] > len(PROMPTS)  # the warmed-up process, not a new one
    assert info["metadata"]["restored"] is True and info["metadata"]["env"] == {"POD_IP": "10.9.8.7"}
    assert result["metadata_env_keys"] == ["POD_IP"]
    # CRIU gave back the database's lock and dropped the mapped index's; the engine's agent took that one back
    assert posix_locks(b["pid"]) == b["locks"]
    assert result["file_locks"] == {"checkpointed": 2, "taken_back": 1}, result.get("file_locks")
    assert "10.9.8.7" not in json.dumps({k: v for k, v in result.items() if k != "invocation"})

    again = run_module("snapshot_restore", restore_args(b))
    assert again["failed"] is False and again["changed"] is False and again["pid"] == b["pid"], again
    assert again["restored"] is None and "still running" in again["reason"]
    assert seconds < 60


def test_a_corrupted_byte_starts_the_cold_start_command_instead(bare, tmp_path):
    b = bare
    snap = snapshot_path(tmp_path / "corrupt", b["pod"])
    os.makedirs(os.path.dirname(snap), mode=0o700)
    shutil.copytree(b["snapshot_dir"], snap, symlinks=True)
    pages = sorted(f for f in os.listdir(os.path.join(snap, "host", "criu")) if f.startswith("pages-"))[0]
    with open(os.path.join(snap, "host", "criu", pages), "r+b") as handle:
        handle.seek(4096)
        byte = handle.read(1)
        handle.seek(4096)
        handle.write(bytes([byte[0] ^ 0x40]))
    port = free_port()
    device_dir = tmp_path / "npu-cold"
    device_dir.mkdir(mode=0o700)
    env = workload_env(tmp_path, b["library"], port, device_dir, b["mark"])
    url = "http://127.0.0.1:%d" % port
    log = tmp_path / "cold.log"
    # The engine's settings in the command (env(1)), the pod's new environment in `env` (no_log: never shown).
    cold_start = ["/usr/bin/env"] + ["%s=%s" % item for item in sorted(env.items())] + b["command"]
    args = restore_args(b, snapshot_dir=snap, env={"POD_IP": "10.9.8.6"}, cold_start=cold_start, cold_start_log=str(log),
                        metadata_path=env["INFEROPS_METADATA_FILE"], agent_socket_dir=env["INFEROPS_AGENT_SOCKET_DIR"],
                        health_url=url + "/health")
    result = run_module("snapshot_restore", args)
    if result.get("pid"):
        b["started"].append(result["pid"])
    assert result["failed"] is False and result["changed"] and result["restored"] is False, result
    # the page images are hashed while the restore goes on: the pids still in use (the original runs) are named too
    assert result["reason"].split("; ")[0] == "checksum_mismatch: host/criu/%s" % pages, result
    assert result["pid"] != b["pid"]
    assert os.getsid(result["pid"]) == result["pid"]  # detached: its own session
    assert [generate(url, p) for p in PROMPTS] == b["expected"]  # a cold start serves correct answers too
    metadata = http_get(url + "/v1/info")[1]["metadata"]
    assert metadata["restored"] is False and metadata["env"] == {"POD_IP": "10.9.8.6"}
    assert marked(result["pid"], b["mark"]) and b"POD_IP=10.9.8.6" in open("/proc/%d/environ" % result["pid"], "rb").read()
    assert os.stat(log).st_mode & 0o777 == 0o600
    again = run_module("snapshot_restore", args)
    assert again["failed"] is False and again["changed"] is False and again["pid"] == result["pid"], again
    assert [generate(b["url"], p) for p in PROMPTS] == b["expected"]  # the restored one is untouched

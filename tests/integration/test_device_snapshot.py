"""The NPU device-snapshot path end to end: the sample workload on the simulator, driven by the
collection's modules run as Ansible runs them."""

import json
import os
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import Workload, http_get, reset_device, run_module

PROMPTS = ["what is an NPU?", "snapshot me", "", "数据"]


def answers(workload):
    return [workload.generate(p) for p in PROMPTS]


def test_lock_backup_reset_restore_unlock_gives_the_same_answers(workload, simulator_library, device_dir, tmp_path):
    before = answers(workload)
    target = {"pid": workload.pid, "agent_socket_dir": str(workload.socket_dir)}

    locked = run_module("npu_snapshot_lock", dict(target, state="locked"))
    assert locked["changed"] is True, locked
    assert (locked["previous_state"], locked["state"]) == ("RUNNING", "LOCKED")
    assert locked["devices"] == [0]
    again = run_module("npu_snapshot_lock", dict(target, state="locked"))
    assert again["changed"] is False and again["state"] == "LOCKED", again

    snapshot_dir = tmp_path / "snapshots" / "default" / "svc" / "p0" / "pod-a"
    identity = {"namespace": "default", "service": "svc", "instance": "p0", "pod": "pod-a"}
    backup = run_module("npu_snapshot_backup", dict(target, snapshot_dir=str(snapshot_dir), identity=identity))
    assert backup["changed"] is True and backup["state"] == "BACKED_UP", backup
    assert backup["actions"] == ["backup"]
    assert backup["device_memory_bytes"] == 8 * 1024 * 1024
    part_path = backup["device_part"]
    assert part_path == str(tmp_path / "snapshots/default/svc/p0/.pod-a.partial/device/device.json")
    part = json.loads(open(part_path).read())
    assert part["identity"] == identity and part["pid"] == workload.pid and part["devices"] == [0]
    assert stat.S_IMODE(os.stat(part_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(part_path)).st_mode) == 0o700
    assert not snapshot_dir.exists(), "the device part alone must not publish the snapshot"
    second = run_module("npu_snapshot_backup", dict(target, snapshot_dir=str(snapshot_dir), identity=identity))
    assert second["changed"] is False, second

    # The device loses its memory (pod deleted); only the backup in process memory has it now.
    reset_device(device_dir)

    resumed = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert resumed["changed"] is True and resumed["actions"] == ["restore", "unlock"], resumed
    assert resumed["state"] == "RUNNING"
    assert answers(workload) == before


def test_unlock_without_restore_after_a_device_reset_serves_wrong_answers(workload, simulator_library, device_dir):
    """The negative control: proves the answers depend on device memory, so the test above can fail."""
    before = answers(workload)
    target = {"pid": workload.pid, "agent_socket_dir": str(workload.socket_dir)}
    run_module("npu_snapshot_lock", dict(target, state="locked"))
    client = _client(workload)
    client.request("backup", 30)
    reset_device(device_dir)
    result = run_module("npu_snapshot_lock", dict(target, state="unlocked", restore_before_unlock=False))
    assert result["actions"] == ["unlock"], result
    after = answers(workload)
    assert after != before


def _client(workload):
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import AgentSocketClient
    return AgentSocketClient(workload.socket_path)


def test_wrong_state_transitions_get_the_mapped_acl_error(workload):
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import RuntimeRefusedError
    client = _client(workload)
    cases = [("restore", 507909), ("backup", 507908), ("unlock", 507907)]
    for op, code in cases:
        try:
            client.request(op, 10)
        except RuntimeRefusedError as exc:
            assert exc.result["error"]["code"] == code, (op, exc.result)
            assert "SNAPSHOT" in exc.result["error"]["name"], exc.result
            assert exc.result["state"] == "RUNNING"
        else:
            raise AssertionError("%s from RUNNING was accepted" % op)
    client.request("lock", 10)
    try:
        client.request("lock", 10)
    except RuntimeRefusedError as exc:
        assert exc.result["error"]["code"] == 507906
        assert exc.result["state"] == "LOCKED"
    else:
        raise AssertionError("double lock was accepted")
    client.request("unlock", 10)


def test_backup_of_a_running_process_names_the_fix(workload, tmp_path):
    result = run_module("npu_snapshot_backup", {"pid": workload.pid, "agent_socket_dir": str(workload.socket_dir),
                                                "snapshot_dir": str(tmp_path / "snap" / "p")})
    assert result.get("failed"), result
    assert "npu_snapshot_lock" in result["msg"] and "lock=true" in result["msg"]
    assert not (tmp_path / "snap" / ".p.partial").exists()


def test_lock_blocks_resource_calls_in_the_engine_until_unlock(workload):
    expected = workload.generate("blocked?")
    target = {"pid": workload.pid, "agent_socket_dir": str(workload.socket_dir)}
    run_module("npu_snapshot_lock", dict(target, state="locked"))
    done = {}

    def request():
        done["answer"] = workload.generate("blocked?", timeout=60)
        done["at"] = time.monotonic()

    thread = threading.Thread(target=request)
    thread.start()
    time.sleep(1.5)
    assert thread.is_alive(), "a device read went through while the process was locked"
    status, health = http_get(workload.url + "/health")  # queries do not touch the device: not blocked
    assert status == 200
    unlocked_at = time.monotonic()
    run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    thread.join(10)
    assert not thread.is_alive(), "the blocked request never completed after unlock"
    assert done["at"] >= unlocked_at
    assert done["answer"] == expected


def test_lock_times_out_when_a_background_thread_never_parks(workload_factory):
    w = workload_factory(WORKLOAD_STUCK_BACKGROUND_THREAD=1, ACL_SIM_LOCK_TIMEOUT_MS=1000).start()
    w.wait_ready()
    started = time.monotonic()
    result = run_module("npu_snapshot_lock", {"pid": w.pid, "agent_socket_dir": str(w.socket_dir), "state": "locked"})
    assert result.get("failed"), result
    assert "507905" in result["msg"], result["msg"]
    assert result["error"]["code"] == 507905
    assert result["state"] == "RUNNING"
    assert time.monotonic() - started < 30
    assert w.generate("still serving") == w.generate("still serving")


def test_check_mode_reports_without_locking(workload):
    target = {"pid": workload.pid, "agent_socket_dir": str(workload.socket_dir)}
    result = run_module("npu_snapshot_lock", dict(target, state="locked"), check=True)
    assert result["changed"] is True and result["state"] == "LOCKED" and result["actions"] == ["lock"]
    state = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert state["changed"] is False and state["previous_state"] == "RUNNING"


def test_http_endpoint_transport_with_configured_paths(workload_factory):
    workload = workload_factory(WORKLOAD_CONTROL_HTTP="1").start()  # asked for: off by default (below)
    workload.wait_ready()
    endpoint = {"endpoint": workload.url}
    locked = run_module("npu_snapshot_lock", dict(endpoint, state="locked"))
    assert locked["changed"] is True and locked["state"] == "LOCKED", locked
    paths = {"unlock": "/snapshot/unlock"}
    unlocked = run_module("npu_snapshot_lock", dict(endpoint, state="unlocked", endpoint_paths=paths))
    assert unlocked["state"] == "RUNNING"
    wrong = run_module("npu_snapshot_lock", dict(endpoint, state="locked", endpoint_paths={"lock": "/nope/lock"}))
    assert wrong.get("failed") and "/nope/lock" in wrong["msg"], wrong


def test_the_engines_http_control_endpoint_is_off_unless_asked_for(workload):
    """This workload runs on the host's network, as the docs and the demo run engines: its 127.0.0.1 is the node's,
    and anyone on the node -- any user, any host-networked pod -- unlocked it through POST /snapshot/unlock. Off by
    default; the agent's socket, which checks who asks, still works."""
    target = {"pid": workload.pid, "agent_socket_dir": str(workload.socket_dir)}
    locked = run_module("npu_snapshot_lock", dict(target, state="locked"))
    assert locked["changed"] and locked["state"] == "LOCKED", locked
    request = urllib.request.Request(workload.url + "/snapshot/unlock", data=b'{"v": 1, "timeout": 5}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403 and b"HTTP control endpoint is off" in refused.value.read()
    assert run_module("npu_snapshot_lock", dict(target, state="unlocked"))["previous_state"] == "LOCKED", \
        "nothing unlocked it meanwhile"
    result = run_module("npu_snapshot_lock", {"endpoint": workload.url, "state": "locked"})
    assert result.get("failed") and result["msg"].startswith("state refused by the process behind %s/snapshot/state: "
                                                             "this engine's HTTP control endpoint is off" % workload.url), \
        result


def test_missing_library_is_a_clear_error(tmp_path, device_dir):
    engine = tmp_path / "idle_engine.py"
    engine.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    w = Workload(tmp_path, tmp_path / "no" / "libascendcl.so", device_dir)
    w.start(engine=engine)
    try:
        w.wait_socket()
        result = run_module("npu_snapshot_lock", {"pid": w.pid, "agent_socket_dir": str(w.socket_dir),
                                                  "state": "locked"})
        assert result.get("failed"), result
        assert "libascendcl" in result["msg"] and str(tmp_path / "no") in result["msg"], result["msg"]
        assert result["error"]["kind"] == "unavailable"
    finally:
        w.stop()


def test_unknown_pid_and_dead_endpoint_are_clear_errors(tmp_path):
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    result = run_module("npu_snapshot_lock", {"pid": int(dead_pid), "state": "locked"})
    assert result.get("failed") and "process %s does not exist" % dead_pid in result["msg"], result
    sock = tmp_path / "nobody.sock"
    result = run_module("npu_snapshot_lock", {"endpoint": "unix://%s" % sock, "state": "locked"})
    assert result.get("failed") and "cannot reach the snapshot agent" in result["msg"], result
    result = run_module("npu_snapshot_lock", {"endpoint": "http://127.0.0.1:9", "state": "locked"})
    assert result.get("failed") and "cannot reach the engine's control endpoint" in result["msg"], result
    result = run_module("npu_snapshot_lock", {"pid": os.getpid(), "state": "locked"})  # alive, but no agent
    assert result.get("failed") and "cannot reach the snapshot agent" in result["msg"], result

"""The lease through the modules, run as Ansible runs them (AnsiballZ, real argspec), against the sample
workload under the real agent on the simulated NPU: npu_snapshot_lock and npu_snapshot_backup take a
lease, a second state=locked renews it, lease=0 asks for none, the agent's record of an abandoned lock
comes back in the results, and an engine's own HTTP endpoint carries the lease too."""

import time

import pytest

import conftest
from conftest import Workload, run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import AgentSocketClient

PROMPTS = ["what is an NPU?", "lease me", "数据"]


@pytest.fixture
def engine(workload_factory):
    w = workload_factory(WORKLOAD_WARMUP_SECONDS="0.1").start()
    w.wait_ready()
    w.expected = [w.generate(p) for p in PROMPTS]
    w.client = AgentSocketClient(w.socket_path)
    return w


def state(w):
    return w.client.request("state", 5)


def running_again(w, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = state(w)
        if reply["state"] == "RUNNING":
            return reply
        time.sleep(0.05)
    raise AssertionError("the engine is not RUNNING again after %s s" % timeout)


def test_lock_and_backup_modules_take_a_lease_and_a_second_lock_renews_it(engine, tmp_path):
    target = {"pid": engine.pid, "agent_socket_dir": str(engine.socket_dir)}
    locked = run_module("npu_snapshot_lock", dict(target, state="locked", lease=60))
    assert locked["changed"] and locked["lease"]["seconds"] == 60 and locked["abandoned"] is None, locked
    renewed = run_module("npu_snapshot_lock", dict(target, state="locked", lease=90))
    assert renewed["changed"] is False and renewed["actions"] == ["renew"] and renewed["lease"]["seconds"] == 90
    snapshot_dir = tmp_path / "snap" / "t" / "s" / "p0" / "pod-l"
    identity = {"namespace": "t", "service": "s", "instance": "p0", "pod": "pod-l"}
    # Leases long enough that none runs out between two module runs on a loaded machine; the last one is short.
    backup = run_module("npu_snapshot_backup", dict(target, snapshot_dir=str(snapshot_dir), identity=identity, lease=60))
    assert backup["changed"] and backup["state"] == "BACKED_UP" and backup["lease"]["seconds"] == 60, backup
    again = run_module("npu_snapshot_backup", dict(target, snapshot_dir=str(snapshot_dir), identity=identity, lease=90))
    assert again["changed"] is False and again["lease"]["seconds"] == 90 and again["lease"]["remaining_s"] > 60, again
    short = run_module("npu_snapshot_backup", dict(target, snapshot_dir=str(snapshot_dir), identity=identity, lease=1))
    assert short["changed"] is False and short["lease"]["seconds"] == 1, short  # a renewal may shorten the lease
    running_again(engine, 30)  # nobody unlocks: the agent does, when the lease runs out
    info = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert info["changed"] is False and info["abandoned"]["actions"] == ["restore", "unlock"], info
    assert [engine.generate(p) for p in PROMPTS] == engine.expected
    none = run_module("npu_snapshot_lock", dict(target, state="locked", lease=0))
    assert none["changed"] and none["lease"] is None and none["abandoned"]["actions"] == ["restore", "unlock"]
    assert state(engine)["abandoned"] is None, "a lock clears the record"
    unlocked = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert unlocked["changed"] and unlocked["lease"] is None
    bad = run_module("npu_snapshot_lock", dict(target, state="locked", lease=-5))
    assert bad["failed"] and bad["msg"].startswith("lease: must be 0"), bad


def test_a_lease_through_the_engines_own_http_endpoint(workload_factory):
    engine = workload_factory(WORKLOAD_WARMUP_SECONDS="0.1", WORKLOAD_CONTROL_HTTP="1").start()  # off by default
    engine.wait_ready()
    engine.expected = [engine.generate(p) for p in PROMPTS]
    engine.client = AgentSocketClient(engine.socket_path)
    endpoint = {"endpoint": engine.url}
    locked = run_module("npu_snapshot_lock", dict(endpoint, state="locked", lease=30))
    assert locked["changed"] and locked["lease"]["seconds"] == 30, locked
    renewed = run_module("npu_snapshot_lock", dict(endpoint, state="locked", lease=1))  # POST /snapshot/renew
    assert renewed["actions"] == ["renew"] and not renewed["changed"] and renewed["lease"]["seconds"] == 1, renewed
    running_again(engine, 5)


def test_an_agent_that_predates_leases_is_refused_with_the_fix(tmp_path, simulator_library, device_dir, monkeypatch):
    """An image built with an older agent (no lease field): nothing is locked, the message says what to do."""
    old = conftest.old_agent_package(tmp_path)
    monkeypatch.setattr(conftest, "ensure_agent_package", lambda: old)  # the image's copy of the agent
    w = Workload(tmp_path, simulator_library, device_dir).start()
    monkeypatch.undo()
    try:
        w.wait_ready()
        target = {"pid": w.pid, "agent_socket_dir": str(w.socket_dir)}
        result = run_module("npu_snapshot_lock", dict(target, state="locked"))
        assert result["failed"] and "unknown field(s) 'lease'" in result["msg"], result
        assert "this endpoint predates leases" in result["msg"] and "lease: 0" in result["msg"]
        assert AgentSocketClient(w.socket_path).request("state", 5)["state"] == "RUNNING"
        without = run_module("npu_snapshot_lock", dict(target, state="locked", lease=0))
        assert without["changed"] and without["state"] == "LOCKED", without
        run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    finally:
        w.stop()

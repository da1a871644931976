"""The lease on the lock (docs/agent.md#the-lease): the protocol field and op, the agent's watchdog in the
engine's own process (the sample workload under the real agent launcher, on the simulated NPU), the
renewing thread of host_checkpoint, and the modules that take and renew a lease."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import conftest
from conftest import REPO, Workload, ensure_agent_package, renewed_at, reset_device

from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import (ParameterError,
                                                                                         RuntimeRefusedError)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import (AgentSocketClient,
                                                                                             LEASE_MARGIN, LeaseKeeper,
                                                                                             bounded_lease,
                                                                                             lease_seconds)
from ansible_collections.inferops.snapshot.plugins.modules.npu_snapshot_lock import plan

PROMPTS = ["what is an NPU?", "lease me", "数据"]


def wait_until(predicate, timeout, what):
    """(value, seconds waited) once ``predicate()`` is truthy; fails the test after ``timeout``."""
    started = time.monotonic()
    while True:
        value = predicate()
        if value:
            return value, time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError("%s did not happen within %s s" % (what, timeout))
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------- protocol

@pytest.mark.parametrize("message, words", [
    ({"op": "lock", "lease": "10"}, "field 'lease': expected a number"),
    ({"op": "lock", "lease": True}, "field 'lease': expected a number"),
    ({"op": "lock", "lease": 0}, "outside"),
    ({"op": "backup", "lease": -1}, "outside"),
    ({"op": "renew", "lease": protocol.MAX_LEASE + 1}, "outside"),
    ({"op": "unlock", "lease": 5}, "only lock, backup, renew take a lease, not 'unlock'"),
    ({"op": "state", "lease": 5}, "not 'state'"),
])
def test_a_malformed_lease_is_refused_naming_the_field(message, words):
    with pytest.raises(protocol.ProtocolError, match=words):
        protocol.parse_request(message)


def test_the_lease_is_an_optional_field_of_version_1():
    assert protocol.make_request("lock", 5) == {"v": 1, "op": "lock", "timeout": 5.0}  # what an old client sends
    assert protocol.parse_lease(protocol.make_request("lock", 5)) is None
    request = protocol.decode(protocol.encode(protocol.make_request("backup", 5, lease=120)).strip())
    assert request == {"v": 1, "op": "backup", "timeout": 5.0, "lease": 120.0}
    assert protocol.parse_request(request) == ("backup", 5.0) and protocol.parse_lease(request) == 120.0
    assert protocol.parse_request({"op": "renew"}) == ("renew", protocol.DEFAULT_TIMEOUT)


@pytest.mark.parametrize("value, expected", [(0, None), (None, None), (120, 120.0), (0.5, 0.5)])
def test_the_modules_lease_option(value, expected):
    assert lease_seconds(value) == expected


@pytest.mark.parametrize("value", [-1, protocol.MAX_LEASE + 1])
def test_a_bad_lease_option_names_the_field(value):
    with pytest.raises(ParameterError, match="lease: must be 0 \\(no lease\\) or a number of seconds"):
        lease_seconds(value)


@pytest.mark.parametrize("current, lease, ops", [
    ("RUNNING", 120, ["lock"]),
    ("LOCKED", 120, ["renew"]),
    ("BACKED_UP", 120, ["renew"]),
    ("LOCKED", None, []),
])
def test_locked_on_a_locked_process_renews_its_lease(current, lease, ops):
    assert plan(current, "locked", True, lease) == ops
    assert plan(current, "unlocked", True, lease) == plan(current, "unlocked", True)


# ------------------------------------------------------------------ the watchdog, in the engine's process

@pytest.fixture
def engine(workload_factory):
    """The sample workload under the real agent launcher; its answers; a client of its agent socket."""
    w = workload_factory(WORKLOAD_WARMUP_SECONDS="0.1").start()
    w.wait_ready()
    w.expected = [w.generate(p) for p in PROMPTS]
    w.client = AgentSocketClient(w.socket_path)
    return w


def state(w):
    return w.client.request("state", 5)


def state_if(w, check):
    """The agent's state reply when ``check(reply)`` holds, else None."""
    reply = state(w)
    return reply if check(reply) else None


def running_again(w, timeout):
    """(the state reply, seconds waited) once the engine is RUNNING."""
    return wait_until(lambda: state_if(w, lambda r: r["state"] == "RUNNING"), timeout, "the engine RUNNING again")


def test_a_backed_up_engine_whose_lease_runs_out_is_restored_and_unlocked(engine, device_dir):
    engine.client.request("lock", 5, lease=30)
    asked = time.monotonic()  # the lease starts after this: it cannot run out less than 1 s from here
    backed_up = engine.client.request("backup", 5, lease=1.0)
    assert backed_up["lease"]["seconds"] == 1.0 and backed_up["lease"]["by"] == "lock", backed_up["lease"]
    reset_device(device_dir)  # the device memory is gone: only the backup in the process can bring it back
    reply, _waited = running_again(engine, 5)
    assert 1.0 <= time.monotonic() - asked < 3.5, time.monotonic() - asked
    assert reply["lease"] is None
    record = reply["abandoned"]
    assert record["previous_state"] == "BACKED_UP" and record["actions"] == ["restore", "unlock"], record
    assert record["errors"] == [] and record["state"] == "RUNNING" and record["lease_s"] == 1.0
    assert record["lease_by"] == "lock" and record["expired_at"] <= record["at"] and record["overdue_s"] < 1
    assert [engine.generate(p) for p in PROMPTS] == engine.expected, "the restore did not bring the device memory back"
    assert "ran out" in engine.log() and "restore, unlock" in engine.log()


def test_a_locked_engine_whose_lease_runs_out_is_unlocked_and_its_blocked_requests_complete(engine):
    engine.client.request("lock", 5, lease=1.0)
    done = {}
    thread = threading.Thread(target=lambda: done.update(answer=engine.generate(PROMPTS[0], timeout=30)))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive(), "a device read went through while the engine was locked"
    reply = running_again(engine, 5)[0]
    thread.join(10)
    assert done["answer"] == engine.expected[0]
    assert reply["abandoned"]["previous_state"] == "LOCKED" and reply["abandoned"]["actions"] == ["unlock"]


def test_the_record_stays_until_a_later_lock_or_unlock_and_renew_then_says_why_it_is_refused(engine):
    engine.client.request("lock", 5, lease=0.5)
    running_again(engine, 5)
    time.sleep(0.5)
    assert state(engine)["abandoned"]["actions"] == ["unlock"], "the record must stay"
    with pytest.raises(RuntimeRefusedError, match="no lease to renew: the process is RUNNING \\(its lease ran out at "
                                                  ".* and the agent resumed it: unlock\\)") as refused:
        engine.client.request("renew", 5, lease=10)
    assert refused.value.result["error"]["kind"] == "lease" and refused.value.result["abandoned"]["actions"] == ["unlock"]
    locked = engine.client.request("lock", 5, lease=10)
    assert locked["abandoned"] is None and locked["lease"]["seconds"] == 10
    unlocked = engine.client.request("unlock", 5)
    assert unlocked["lease"] is None and unlocked["abandoned"] is None


def test_renewals_keep_the_lease_and_it_runs_out_after_the_last_one(engine):
    engine.client.request("lock", 5, lease=1.0)
    engine.client.request("backup", 5)  # no lease field: the lock's lease is kept
    for renewal in range(6):  # 2.4 s, over twice the lease
        time.sleep(0.4)
        last = time.monotonic()  # the last renewal is granted after this: its lease cannot run out sooner than 1 s
        renewed = engine.client.request("renew", 5)  # no lease field: the current one's length
        assert renewed["ok"] and renewed["changed"] is False and renewed["state"] == "BACKED_UP", renewal
        # what is left when the reply was written: at least the lease less the time since the request was sent
        assert renewed["lease"]["seconds"] == 1.0
        assert renewed["lease"]["remaining_s"] >= 1.0 - (time.monotonic() - last) - 0.001, renewed["lease"]
    reply = running_again(engine, 5)[0]
    assert 1.0 <= time.monotonic() - last < 3.5
    assert reply["abandoned"]["actions"] == ["restore", "unlock"]
    assert [engine.generate(p) for p in PROMPTS] == engine.expected


def test_an_unlock_ends_the_lease_and_without_a_lease_nothing_is_done_for_the_caller(engine):
    engine.client.request("lock", 5, lease=1.0)  # 1 s to unlock in, however loaded the machine
    assert engine.client.request("unlock", 5)["lease"] is None
    time.sleep(1.5)
    assert state(engine)["abandoned"] is None
    # An old client (no lease field) gets the behaviour from before leases: locked until it unlocks.
    locked = engine.client.request("lock", 5)
    assert locked["lease"] is None
    time.sleep(1.5)
    assert state(engine)["state"] == "LOCKED"
    with pytest.raises(RuntimeRefusedError, match="field 'lease': required to renew when no lease is held"):
        engine.client.request("renew", 5)
    assert engine.client.request("renew", 5, lease=0.5)["lease"]["seconds"] == 0.5  # a renew can start one
    reply = running_again(engine, 5)[0]
    assert reply["abandoned"]["actions"] == ["unlock"]


def test_a_lock_that_fails_holds_no_lease(workload_factory):
    w = workload_factory(WORKLOAD_STUCK_BACKGROUND_THREAD=1, ACL_SIM_LOCK_TIMEOUT_MS=500).start()
    w.wait_ready()
    client = AgentSocketClient(w.socket_path)
    with pytest.raises(RuntimeRefusedError, match="507905"):
        client.request("lock", 10, lease=0.3)
    reply = client.request("state", 5)
    assert reply["state"] == "RUNNING" and reply["lease"] is None
    time.sleep(0.6)
    assert client.request("state", 5)["abandoned"] is None


def lease_dropped(client):
    reply = client.request("state", 5)
    return reply if reply["lease"] is None else None


def test_the_watchdog_waits_for_a_call_that_outlived_its_request(workload_factory):
    """A lock still running in the runtime when the lease runs out is acted on once it ends."""
    w = workload_factory(WORKLOAD_STUCK_BACKGROUND_THREAD=1, ACL_SIM_LOCK_TIMEOUT_MS=1500).start()
    w.wait_ready()
    client = AgentSocketClient(w.socket_path)
    with pytest.raises(RuntimeRefusedError, match="did not finish within 0.3 s"):
        client.request("lock", 0.3, lease=0.4)
    time.sleep(0.4)
    during = client.request("state", 5)
    assert during["busy_with"] == "lock" and during["lease"]["expired"] is True, during
    reply = wait_until(lambda: lease_dropped(client), 5, "the lease dropped")[0]
    assert reply["state"] == "RUNNING" and reply["abandoned"] is None  # the lock failed (507905): nothing held


def test_a_restore_that_fails_is_retried_and_never_followed_by_an_unlock(engine, device_dir):
    # A long lease until another process holds the released device, then a short one: a loaded machine may take
    # longer than a short lease to start the holder, and the agent's own restore would then hold the device.
    engine.client.request("lock", 5, lease=60)
    engine.client.request("backup", 5)
    holder = subprocess.Popen([sys.executable, str(REPO / "tests" / "simulator" / "aclsim_ctl.py"),
                               "hold", "0"], env=dict(os.environ, ACL_SIM_DEVICE_DIR=str(device_dir)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        engine.client.request("renew", 5, lease=0.3)
        reply = wait_until(lambda: state_if(engine, lambda r: (r["abandoned"] or {}).get("errors")), 5,
                           "a failed restore in the record")[0]
        assert reply["state"] == "BACKED_UP", "an unlock without the restore would serve released device memory"
        error = reply["abandoned"]["errors"][0]
        assert error["op"] == "restore" and "507909" in error["message"], error
        assert reply["lease"]["expired"] is True and reply["abandoned"]["actions"] == []
        with pytest.raises(RuntimeRefusedError, match="the lease ran out .* s ago; the agent is bringing the engine "
                                                      "back") as refused:
            engine.client.request("renew", 5, lease=10)
        assert refused.value.result["error"]["kind"] == "lease"
    finally:
        holder.stdin.close()
        holder.wait(10)
    reply = running_again(engine, 10)[0]  # the next attempt, LEASE_RETRY_SECONDS later
    assert reply["abandoned"]["actions"] == ["restore", "unlock"] and len(reply["abandoned"]["errors"]) >= 1
    assert [engine.generate(p) for p in PROMPTS] == engine.expected


# ------------------------------------------------------------ a restored copy never acts on a stale lease

SCENARIO = r'''
import json, os, sys, time
sys.path.insert(0, {agent_parent!r})
from inferops_agent import launcher

copy = {{"restored": False}}
def incarnation():
    real = launcher.incarnation()
    return real if not copy["restored"] else (real[0], "restored")

controller = launcher.Controller.load({library!r})
controller._incarnation = incarnation
rt = controller.runtime
rt.init(); rt.set_device(0)
ptr = rt.malloc(1 << 20); rt.memcpy_to_device(ptr, b"x" * (1 << 20))
out = {{}}
out["real"] = list(launcher.incarnation())
out["lock"] = controller.handle({{"op": "lock", "timeout": 5, "lease": 0.4}})["ok"]
out["backup"] = controller.handle({{"op": "backup", "timeout": 5}})["state"]
copy["restored"] = True  # what CRIU's restore of this process's image looks like from inside it
time.sleep(1.0)
reply = controller.handle({{"op": "state"}})
out.update(state=reply["state"], lease=reply["lease"], abandoned=reply["abandoned"])
for op in ("restore", "unlock"):  # the restore path: device.resume_process
    out[op] = controller.handle({{"op": op, "timeout": 5}})["ok"]
out["data"] = rt.memcpy_from_device(ptr, 4).decode()
print(json.dumps(out))
'''


def test_a_restored_copy_drops_the_lease_of_the_process_it_was_checkpointed_from(simulator_library, device_dir, tmp_path):
    script = tmp_path / "restored_copy.py"
    script.write_text(textwrap.dedent(SCENARIO.format(agent_parent=str(ensure_agent_package()),
                                                      library=str(simulator_library))))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False,
                          env=dict(os.environ, ACL_SIM_DEVICE_DIR=str(device_dir)))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    boot_id, start_time = out["real"]
    assert len(boot_id) == 36 and start_time.isdigit(), out["real"]
    assert out["lock"] is True and out["backup"] == "BACKED_UP"
    # the lease of 0.4 s ran out in the copy, which never acted on it: it holds its own restore lease instead
    # (test_lease_restore.py), the default's length
    assert out["state"] == "BACKED_UP" and out["abandoned"] is None, out
    assert out["lease"]["by"] == "restore" and out["lease"]["seconds"] == protocol.DEFAULT_RESTORE_LEASE, out["lease"]
    assert out["restore"] is True and out["unlock"] is True and out["data"] == "xxxx"
    assert "dropped a lease taken before this process was restored" in proc.stderr


# ---------------------------------------------------------------------- the renewing thread (LeaseKeeper)

def test_the_keeper_renews_holds_still_while_quiet_and_reports_a_lost_lease(engine):
    engine.client.request("lock", 5, lease=1.2)
    keeper = LeaseKeeper(engine.client, 1.2).start()  # a renewal every 0.4 s; a tick 0.8 s late still keeps it
    time.sleep(2.5)
    assert keeper.renewals >= 4 and state(engine)["state"] == "LOCKED", keeper.renewals
    keeper.check("sealing")  # nothing lost
    with pytest.raises(RuntimeRefusedError, match="could not be renewed before sealing: renew refused by the process "
                                                  "behind .*: no lease to renew: the process is RUNNING"):
        with keeper.quiet():  # a dump that outlasts the lease
            before = keeper.renewals
            time.sleep(2.0)
            assert keeper.renewals == before, "a renewal while quiet"
        keeper.check("sealing")
    assert keeper.lost is not None
    keeper.stop()
    running_again(engine, 5)


def test_the_keeper_stops_with_one_last_renewal(engine):
    engine.client.request("lock", 5, lease=1.0)
    keeper = LeaseKeeper(engine.client, 3.0).start()  # its first renewal would be 1 s after start
    time.sleep(0.2)
    stopping = time.time()
    keeper.stop()
    lease = state(engine)["lease"]  # renewed by stop() itself, in the agent's clock (this test may be slow to ask)
    assert keeper.renewals == 1 and renewed_at(lease) >= stopping, (lease, stopping)
    time.sleep(1.2)
    assert keeper.renewals == 1, "renewed after stop()"
    engine.client.request("unlock", 5)


def test_an_agent_that_predates_leases_refuses_the_field_and_the_client_says_what_to_do(
        tmp_path, simulator_library, device_dir, monkeypatch):
    """An image built with an older agent (no lease field): nothing is locked, the message names the fix."""
    old = conftest.old_agent_package(tmp_path)
    monkeypatch.setattr(conftest, "ensure_agent_package", lambda: old)  # the image's copy of the agent
    w = Workload(tmp_path, simulator_library, device_dir, WORKLOAD_WARMUP_SECONDS="0.1").start()
    monkeypatch.undo()
    try:
        w.wait_ready()
        client = AgentSocketClient(w.socket_path)
        with pytest.raises(RuntimeRefusedError, match="unknown field\\(s\\) 'lease' -- this endpoint predates leases "
                                                      ".*or set lease: 0 to go without one"):
            client.request("lock", 5, lease=120)
        assert client.request("state", 5)["state"] == "RUNNING"
        assert client.request("lock", 5)["state"] == "LOCKED"
        client.request("unlock", 5)
    finally:
        w.stop()


@pytest.mark.parametrize("lease, remaining, expected", [
    (120.0, 20.0, 20.0 + LEASE_MARGIN), (120.0, 300.0, 120.0), (120.0, -5.0, LEASE_MARGIN), (None, 20.0, None)])
def test_a_generations_lease_never_outlasts_its_timeout_by_more_than_the_margin(lease, remaining, expected):
    assert bounded_lease(lease, remaining) == expected


def test_the_renewals_of_a_generation_are_bounded_by_its_timeout_too():
    asked = []

    class Recording:
        def request(self, op, timeout, lease=None):
            asked.append((op, lease))
            return {"ok": True}

    left = [30.0]
    keeper = LeaseKeeper(Recording(), 120.0, remaining=lambda: left[0])
    with keeper.quiet():
        left[0] = 2.0
    keeper.stop()
    assert asked == [(protocol.OP_RENEW, 30.0 + LEASE_MARGIN), (protocol.OP_RENEW, 2.0 + LEASE_MARGIN),
                     (protocol.OP_RENEW, 2.0 + LEASE_MARGIN)], asked


def test_the_documented_margin_is_the_codes():
    from ansible_collections.inferops.snapshot.plugins.modules import host_checkpoint
    assert "It never ends later than %d s" % LEASE_MARGIN in host_checkpoint.DOCUMENTATION
    assert "(15 s, `core/clients/control.py`)" in (REPO / "docs" / "agent.md").read_text() and LEASE_MARGIN == 15.0

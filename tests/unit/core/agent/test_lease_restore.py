"""The restore lease (docs/agent.md#the-restore-lease): a copy restored from a checkpoint of a backed-up engine, whose
restore path never finishes the restore, is finished by its own agent -- the RESTORE_POST hooks with a nonce of the
agent's own, the POSIX locks of the checkpoint taken back, the device state restored and unlocked -- or, where the
restore path would have started the engine cold, the process exits so that it starts cold. Each scenario runs the
real agent Controller on the simulated NPU in a process of its own, which plays the original engine and then its
restored copy (what a CRIU restore looks like from inside: a new incarnation, the device memory gone, no POSIX lock)."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import REPO, ensure_agent_package

from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import controller, launcher, protocol, restored
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import LEASE_MARGIN
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import reseed
from ansible_collections.inferops.snapshot.plugins.modules import snapshot_restore

SCENARIO = r'''
import fcntl, json, os, subprocess, sys, time
sys.path.insert(0, {agent_parent!r})
from inferops_agent import launcher, restored

config = json.loads(sys.argv[1])
copy = {{"restored": False}}
def incarnation():
    real = launcher.incarnation()
    return real if not copy["restored"] else (real[0], "restored")

controller = launcher.Controller.load({library!r}, environ={{"INFEROPS_AGENT_RESTORE_LEASE": config["restore_lease"]}})
controller._incarnation = incarnation
exited = []
controller._exit = exited.append  # os._exit in an engine: here the scenario goes on to say what happened
hooks = []
def hook(nonce):
    if config.get("hook_fails"):
        raise RuntimeError("the sampler is gone")
    hooks.append(nonce)
controller.register_hook(launcher.RESTORE_POST, hook)
rt = controller.runtime
rt.init(); rt.set_device(0)
ptr = rt.malloc(1 << 20); rt.memcpy_to_device(ptr, b"x" * (1 << 20))
out = {{}}
if config.get("lock_file"):  # a write lock on bytes 100-109, as SQLite holds its own
    held = open(config["lock_file"], "w+")
    fcntl.lockf(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 100)
    out["fd"] = held.fileno()
out["lock"] = controller.handle({{"op": "lock", "timeout": 5, "lease": 30}})["ok"]
out["backup"] = controller.handle({{"op": "backup", "timeout": 5}})["state"]
out["renew"] = controller.handle({{"op": "renew", "timeout": 5}})["ok"]  # host_checkpoint's, right before CRIU
# -- the checkpoint; then what a restore does to the process, seen from inside it
if config.get("lock_file"):
    fcntl.lockf(held.fileno(), fcntl.LOCK_UN, 10, 100)  # docker start --checkpoint restores no POSIX lock
subprocess.run([sys.executable, {aclsim_ctl!r}, "reset", "0"], check=True)  # the device memory is gone
holder = None
if config.get("lock_taken"):  # another process holds the range now
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys\n"
                               "f = open(sys.argv[1], 'r+')\nfcntl.lockf(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB, 10, 100)\n"
                               "print('held', flush=True)\nsys.stdin.read()", config["lock_file"]],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
device_holder = None
if config.get("device_taken"):  # another process holds the device the backup released
    device_holder = subprocess.Popen([sys.executable, {aclsim_ctl!r}, "hold", "0"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
    assert device_holder.stdout.readline().strip() == "held"
copy["restored"] = True
started = time.monotonic()
out["noticed"] = controller.handle({{"op": "state"}})
for step in config.get("restore_path", []):  # what a restore path still alive sends
    out.setdefault("path", []).append(controller.handle(dict(step, timeout=5)))
while time.monotonic() - started < config["wait"] and not exited and controller.state != "RUNNING":
    time.sleep(0.02)
out["after_s"] = time.monotonic() - started
time.sleep(config.get("then", 0))
out["final"] = controller.handle({{"op": "state"}})
out["exited"] = exited
out["hooks"] = hooks
out["locks"] = restored.own_posix_locks()
if controller.state == "RUNNING":
    out["data"] = rt.memcpy_from_device(ptr, 4).decode()
for process in (holder, device_holder):
    if process is not None:
        process.stdin.close(); process.wait(10)
print(json.dumps(out))
'''


def scenario(tmp_path, simulator_library, device_dir, restore_lease="0.6", wait=10, **config):
    """Run the scenario with ``config``; its record (``out``) and the agent's log lines."""
    script = tmp_path / "restored_copy.py"
    script.write_text(textwrap.dedent(SCENARIO.format(
        agent_parent=str(ensure_agent_package()), library=str(simulator_library),
        aclsim_ctl=str(REPO / "tests" / "simulator" / "aclsim_ctl.py"))))
    config.update(restore_lease=restore_lease, wait=wait)
    proc = subprocess.run([sys.executable, str(script), json.dumps(config)], capture_output=True, text=True,
                          timeout=wait + 60, check=False, env=dict(os.environ, ACL_SIM_DEVICE_DIR=str(device_dir)))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["lock"] is True and out["backup"] == "BACKED_UP" and out["renew"] is True, out
    return out, proc.stderr


def test_a_restored_copy_holds_a_restore_lease_and_its_agent_finishes_a_restore_nobody_finished(
        tmp_path, simulator_library, device_dir):
    out, log = scenario(tmp_path, simulator_library, device_dir)
    noticed = out["noticed"]
    assert noticed["state"] == "BACKED_UP" and noticed["lease"]["by"] == "restore", noticed
    assert noticed["lease"]["seconds"] == 0.6, "the lease of the checkpointed process (30 s) is not the copy's"
    assert 0.6 <= out["after_s"] < 5, out["after_s"]
    final = out["final"]
    assert final["state"] == "RUNNING" and final["lease"] is None and out["exited"] == [], final
    record = final["abandoned"]
    assert record["lease_by"] == "restore" and record["actions"] == ["resumed", "restore", "unlock"], record
    assert record["errors"] == [] and record["state"] == "RUNNING"
    assert out["data"] == "xxxx", "the device memory came back from the backup in the process"
    # the hooks were called once, with a nonce of the agent's own (no restore path told one)
    assert len(out["hooks"]) == 1 and len(out["hooks"][0]) == 32 and final["resumed"]["by"] == "lease", final["resumed"]
    assert "dropped a lease taken before this process was restored" in log
    assert "holding a restore lease of 0.6 s" in log


def test_a_restore_path_that_renews_and_finishes_leaves_nothing_for_the_agent_to_do(
        tmp_path, simulator_library, device_dir):
    nonce = "ab" * 16
    path = [{"op": "renew", "lease": 20}, {"op": "resumed", "nonce": nonce}, {"op": "restore"}, {"op": "unlock"}]
    out, _log = scenario(tmp_path, simulator_library, device_dir, restore_lease="0.6", restore_path=path, then=1.0)
    renewed = out["path"][0]
    assert renewed["ok"] and renewed["lease"]["seconds"] == 20 and renewed["lease"]["by"] == "restore", renewed
    assert [reply["ok"] for reply in out["path"]] == [True] * 4, out["path"]
    final = out["final"]
    assert final["state"] == "RUNNING" and final["lease"] is None and final["abandoned"] is None, final
    assert out["hooks"] == [nonce] and final["resumed"]["by"] == "restore" and out["data"] == "xxxx"


def test_a_restore_path_renewal_bounds_the_restore_lease_to_the_restores_deadline(
        tmp_path, simulator_library, device_dir):
    """The restore path, killed after it renewed the lease for its last second: the agent acts a second later,
    not after its own (long) default."""
    path = [{"op": "renew", "lease": 1.0}]
    out, _log = scenario(tmp_path, simulator_library, device_dir, restore_lease="600", restore_path=path)
    assert out["noticed"]["lease"]["seconds"] == 600
    assert 1.0 <= out["after_s"] < 6, out["after_s"]
    assert out["final"]["state"] == "RUNNING" and out["final"]["abandoned"]["lease_s"] == 1.0


def test_the_posix_locks_of_the_last_look_before_the_checkpoint_are_taken_back(tmp_path, simulator_library, device_dir):
    out, log = scenario(tmp_path, simulator_library, device_dir, lock_file=str(tmp_path / "cache.db"))
    assert out["final"]["state"] == "RUNNING", out["final"]
    assert out["final"]["abandoned"]["actions"] == ["resumed", "relock", "restore", "unlock"]
    assert out["locks"] == [[out["fd"], "write", 100, 10]], out["locks"]
    assert "took back 1 POSIX file lock(s)" in log


def test_a_lock_another_process_holds_now_ends_the_process_instead_of_serving_without_it(
        tmp_path, simulator_library, device_dir):
    out, log = scenario(tmp_path, simulator_library, device_dir, lock_file=str(tmp_path / "cache.db"),
                        lock_taken=True)
    assert out["exited"] == [75], out
    final = out["final"]
    assert final["state"] == "BACKED_UP", "never unlocked: the restore path would have started it cold"
    record = final["abandoned"]
    assert record["state"] == "EXITED" and record["actions"] == ["resumed"], record
    assert "cannot be taken back" in record["errors"][-1]["message"] and "held by another process" in log


def test_a_hook_that_fails_ends_the_process(tmp_path, simulator_library, device_dir):
    out, log = scenario(tmp_path, simulator_library, device_dir, hook_fails=True)
    assert out["exited"] == [75] and out["final"]["state"] == "BACKED_UP", out
    assert "the sampler is gone" in out["final"]["abandoned"]["errors"][-1]["message"]
    assert "exiting with status 75 so that the engine starts cold" in log


def test_a_device_restore_that_fails_ends_the_process(tmp_path, simulator_library, device_dir):
    out, _log = scenario(tmp_path, simulator_library, device_dir, device_taken=True)
    assert out["exited"] == [75] and out["final"]["state"] == "BACKED_UP", out
    error = out["final"]["abandoned"]["errors"][-1]
    assert error["op"] == "restore" and "507909" in error["message"], error


def test_no_restore_lease_when_it_is_off_the_copy_waits_for_its_restore_path(tmp_path, simulator_library, device_dir):
    out, _log = scenario(tmp_path, simulator_library, device_dir, restore_lease="0", wait=1.5)
    assert out["noticed"]["lease"] is None and out["final"]["state"] == "BACKED_UP", out
    assert out["final"]["abandoned"] is None and out["exited"] == [] and out["hooks"] == []


@pytest.mark.parametrize("text, seconds, refused", [
    (None, protocol.DEFAULT_RESTORE_LEASE, False), ("", protocol.DEFAULT_RESTORE_LEASE, False), ("0", None, False),
    ("20", 20.0, False), ("2.5", 2.5, False), ("-1", protocol.DEFAULT_RESTORE_LEASE, True),
    ("ten", protocol.DEFAULT_RESTORE_LEASE, True), ("1e9", protocol.DEFAULT_RESTORE_LEASE, True),
])
def test_the_restore_lease_setting(text, seconds, refused):
    got, why = protocol.parse_restore_lease(text)
    assert got == seconds and bool(why) is refused
    if why:
        assert why.startswith(protocol.RESTORE_LEASE_ENV + ": ") and (text not in why), why


def test_the_default_restore_lease_is_the_default_restore_timeout_and_the_margin():
    assert protocol.DEFAULT_RESTORE_LEASE == snapshot_restore.ARGUMENT_SPEC["timeout"]["default"] + LEASE_MARGIN
    assert controller.Controller().restore_lease == protocol.DEFAULT_RESTORE_LEASE


def test_the_locks_an_fdinfo_file_lists_are_the_posix_ones():
    text = ("pos:\t0\nflags:\t0100002\n"
            "lock:\t1: POSIX  ADVISORY  READ 21191 fe:00:2146951 100 100\n"
            "lock:\t2: POSIX  ADVISORY  WRITE 21191 fe:00:2146951 200 EOF\n"
            "lock:\t3: FLOCK  ADVISORY  WRITE 21191 fe:00:2146951 0 EOF\n"
            "lock:\t4: -> POSIX  ADVISORY  WRITE 300 fe:00:2146951 0 EOF\n")
    assert restored.posix_locks(text) == {("read", 100, 1), ("write", 200, 0)}


@pytest.mark.parametrize("state, lease", [(protocol.STATE_BACKED_UP, 7.0 + LEASE_MARGIN), (protocol.STATE_RUNNING, None)])
def test_the_restore_path_bounds_the_restore_lease_by_its_own_deadline_when_it_reaches_the_agent(tmp_path, state, lease):
    """The reseed stage's first words to a restored agent (a real socket): the lease ends with the restore's
    remaining seconds and LEASE_MARGIN, however long the image's setting; an engine that is not locked holds none,
    and the restore goes on."""
    agent = launcher.Controller(runtime=None, runtime_error="no ACL runtime in this test", restore_lease=600)
    agent.state = state
    agent._take_restore_lease()  # what noticing the restore does
    socket_dir = tmp_path / "agent"
    server = launcher.AgentServer(str(socket_dir / ("agent.%d.sock" % os.getpid())), agent)
    server.start()
    try:
        told = reseed.tell(os.getpid(), str(socket_dir), "cd" * 16, 7.0, wait=True)
        now = agent.describe()["lease"]
    finally:
        server.close()
        agent.close()
    assert told["told"] is True, told
    if lease is None:
        assert now is None
    else:
        assert now["seconds"] == lease and now["by"] == "restore" and now["remaining_s"] <= lease, now


def test_a_request_that_finds_the_restore_noticed_finds_the_restore_lease_too():
    """The server's turn notices the restore while the restore path's first request (its renew) comes in: the renew
    extends the restore lease, never starts a lease of its own (the watchdog would then not finish the restore)."""
    incarnation = {"value": ("boot", "1")}
    agent = controller.Controller(runtime=None, runtime_error="no ACL runtime in this test", restore_lease=60,
                                  incarnation=lambda: incarnation["value"])
    agent.state = protocol.STATE_BACKED_UP
    taking, take = threading.Event(), agent._take_restore_lease

    def slow_take():  # the server's notice, held as it takes the lease
        taking.set()
        time.sleep(0.3)
        take()
    agent._take_restore_lease = slow_take
    incarnation["value"] = ("boot", "2")  # restored
    server_turn = threading.Thread(target=agent.notice_restore)
    server_turn.start()
    try:
        assert taking.wait(10)
        reply = agent.handle({"op": "renew", "lease": 30})
    finally:
        server_turn.join(10)
        agent.close()
    assert reply["ok"] and reply["lease"]["by"] == "restore" and reply["lease"]["seconds"] == 30, reply

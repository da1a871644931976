"""The lease and CRIU, with the real CRIU on a bare workload process under the real agent (simulated NPU):

- a lease that runs out while CRIU dumps the process is acted on only after the dump -- the process is
  frozen, its watchdog thread with it -- and the image, taken while the engine was backed up, restores;
- a restored copy of the process carries the lease of the process it was checkpointed from in its memory
  (and CRIU keeps CLOCK_MONOTONIC going in the copy, so the deadline keeps its meaning there), but it never
  acts on it: the copy waits for the restore path, however long after the old deadline, and then comes
  back with the same answers;
- host_checkpoint keeps the lease alive while it works (its renewing thread), and holds still during the dump.

Every process started or restored here carries a marker in its environment and is killed by pid afterwards."""

import os
import shutil
import signal
import subprocess
import time
import uuid

import pytest

import test_bare_process_restore as bare
from conftest import WORKLOAD, agent_command, free_port, renewed_at, reset_device, run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import AgentSocketClient
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.criu_cli import CriuCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import task
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import device
from ansible_collections.inferops.snapshot.plugins.modules import host_checkpoint as host_checkpoint_module

PROMPTS = bare.PROMPTS


@pytest.fixture
def engines(docker_env, simulator_library, tmp_path):
    """Start bare workloads under the agent (own session, no terminal, stdio on /dev/null: restorable)."""
    mark = uuid.uuid4().hex
    pids = []

    def start(**settings):
        port = free_port()
        device_dir = tmp_path / ("npu-%d" % port)
        device_dir.mkdir(mode=0o700)
        env = bare.workload_env(tmp_path, simulator_library, port, device_dir, mark)
        env.update({k: str(v) for k, v in settings.items()})
        proc = subprocess.Popen(agent_command(WORKLOAD), env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        pids.append(proc.pid)
        url = "http://127.0.0.1:%d" % port
        bare.wait_ready(url, proc, timeout=120)
        engine = dict(proc=proc, pid=proc.pid, url=url, device_dir=device_dir, env=env, mark=mark,
                      socket_dir=env["INFEROPS_AGENT_SOCKET_DIR"], expected=[bare.generate(url, p) for p in PROMPTS])
        engine["client"] = AgentSocketClient(os.path.join(engine["socket_dir"], "agent.%d.sock" % proc.pid))
        return engine

    start.pids = pids
    yield start
    for pid in pids:
        bare.kill_marked(pid, mark)
    leftovers = [pid for pid in pids if bare.marked(pid, mark)]
    assert not leftovers, "processes left running: %s" % leftovers


def lose(engine):
    """The original is gone (a node lost, the pod deleted): its pid is free, the device wiped."""
    engine["proc"].send_signal(signal.SIGKILL)
    engine["proc"].wait(30)
    reset_device(engine["device_dir"])


def running(client, timeout):
    deadline = time.monotonic() + timeout
    while True:
        reply = client.request("state", 5)
        if reply["state"] == "RUNNING" or time.monotonic() > deadline:
            return reply
        time.sleep(0.05)


def answers(engine):
    return [bare.generate(engine["url"], p) for p in PROMPTS]


def test_a_lease_that_runs_out_during_a_dump_is_acted_on_after_it_and_the_copy_never_acts_on_it(engines, tmp_path):
    # 768 MB of device memory, backed up into the process: a dump of half a second or more, longer than the lease.
    engine = engines(WORKLOAD_DEVICE_MB=768, ACL_SIM_DEVICE_MEM_BYTES="1G", WORKLOAD_WARMUP_SECONDS=0.1)
    client = engine["client"]
    lease, tries = 0.15, []
    while len(tries) < 4:
        client.request("lock", 10, lease=60)
        client.request("backup", 60, lease=lease)
        images = tmp_path / ("images-%d" % len(tries))
        images.mkdir(mode=0o700)
        started = time.monotonic()
        CriuCli().dump(engine["pid"], str(images), True, 120)  # --leave-running
        dump_s = time.monotonic() - started
        reply = running(client, 10)  # the watchdog restores 768 MB onto the device, then unlocks
        record = reply["abandoned"]
        assert reply["state"] == "RUNNING" and record["actions"] == ["restore", "unlock"], reply
        assert record["errors"] == [] and answers(engine) == engine["expected"]
        tries.append((lease, round(dump_s, 3), record["overdue_s"]))
        # Did the deadline pass while CRIU held the process frozen? Then the watchdog acted late, once it was
        # thawed (by the rest of the dump), never during it. If it fell before the freeze began or after the
        # thaw, the watchdog acted on time: try again with a lease that ends further into the dump.
        if record["overdue_s"] > 0.05:
            break
        shutil.rmtree(str(images))
        lease = max(0.05, min(lease * 2, dump_s / 2)) if record["overdue_s"] < 0.05 else lease
    assert tries[-1][2] > 0.05 and tries[-1][2] < tries[-1][1], "the deadline never fell into a dump: %s" % tries

    lose(engine)
    pid = CriuCli().restore_detached(str(images), 120, name="lease-copy")
    assert pid == engine["pid"]
    copy = AgentSocketClient(os.path.join(engine["socket_dir"], "agent.%d.sock" % pid))
    copy.wait_listening(30)
    # The image was taken BACKED_UP, with the lease long run out in the copy's clock too.
    for look in range(2):
        reply = copy.request("state", 5)
        assert reply["state"] == "BACKED_UP" and holds_only_its_restore_lease(reply) and reply["abandoned"] is None, \
            (look, reply)
        time.sleep(1.0)
    actions = device.resume_process(pid, engine["socket_dir"], 30)  # what every restore path does
    assert actions == ["restore", "unlock"]
    assert answers(engine) == engine["expected"]
    bare.kill_marked(pid, engine["mark"])


def holds_only_its_restore_lease(reply):
    """The generation's lease did not come back with the copy: the copy holds the restore lease its agent took when it
    found itself restored (docs/agent.md), running, which a restore path ends -- the agent acts only when it runs out."""
    lease = reply["lease"]
    return lease is not None and lease["by"] == "restore" and not lease["expired"]


def test_a_restored_copy_waits_for_the_restore_path_long_after_its_old_lease(engines, tmp_path):
    engine = engines(WORKLOAD_WARMUP_SECONDS=0.1)
    target = {"pid": engine["pid"], "agent_socket_dir": engine["socket_dir"]}
    pod = "lease-%s" % engine["mark"][:6]
    snapshot_dir = bare.snapshot_path(tmp_path / "snapshots", pod)
    backup = run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=snapshot_dir,
                                                    identity=bare.identity(pod), lease=10))
    # 10 s, not less: the lease must outlast host_checkpoint's start-up on a loaded machine (it renews it from then)
    assert backup["lease"]["seconds"] == 10, backup
    checkpoint = run_module("host_checkpoint", {"engine": "criu", "pid": engine["pid"], "snapshot_dir": snapshot_dir,
                                                "identity": bare.identity(pod), "agent_socket_dir": engine["socket_dir"],
                                                "timeout": 120})
    assert checkpoint.get("status") == "completed", (checkpoint.get("msg"), checkpoint.get("criu_log_tail"))
    resumed = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert resumed["actions"] == ["restore", "unlock"] and resumed["abandoned"] is None, resumed

    lose(engine)
    restored = run_module("snapshot_restore", {"engine": "criu", "snapshot_dir": snapshot_dir,
                                               "identity": bare.identity(pod), "agent_socket_dir": engine["socket_dir"],
                                               "metadata_path": engine["env"]["INFEROPS_METADATA_FILE"],
                                               "timeout": 60, "device_restore": False})
    assert restored["restored"] is True and restored["pid"] == engine["pid"], (restored.get("msg"), restored.get("reason"))
    engines.pids.append(restored["pid"])
    time.sleep(11.0)  # past the 10 s lease the image holds, in the copy's own clock
    state = AgentSocketClient(os.path.join(engine["socket_dir"], "agent.%d.sock" % engine["pid"])).request("state", 5)
    assert state["state"] == "BACKED_UP" and holds_only_its_restore_lease(state) and state["abandoned"] is None, state
    unlocked = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert unlocked["actions"] == ["restore", "unlock"], unlocked
    assert answers(engine) == engine["expected"]


def checkpoint_params(**overrides):
    """host_checkpoint's parameters as its argument spec makes them, with ``overrides``."""
    params = {name: spec.get("default") for name, spec in host_checkpoint_module.ARGUMENT_SPEC.items()}
    params.update(overrides)
    return params


def test_host_checkpoint_renews_the_lease_while_it_works_and_holds_still_during_the_dump(engines, tmp_path):
    engine = engines(WORKLOAD_WARMUP_SECONDS=0.1)
    pod = "lease-%s" % engine["mark"][:6]
    snapshot_dir = bare.snapshot_path(tmp_path / "snapshots", pod)
    target = {"pid": engine["pid"], "agent_socket_dir": engine["socket_dir"]}
    run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=snapshot_dir, identity=bare.identity(pod),
                                           lease=60))
    client = engine["client"]
    client.request("renew", 5, lease=1.5)
    seen = []
    slept_until = []

    def slow(line):
        """The progress log, slowed down: a long checkpoint of a big engine, three times the lease."""
        seen.append((line, client.request("state", 5)["lease"]) if "checkpoint started" not in line else (line, None))
        if "sealing" in line or "published" in line:
            time.sleep(2.3)
            slept_until.append(time.time())

    params = checkpoint_params(engine="criu", pid=engine["pid"], snapshot_dir=snapshot_dir,
                               identity=bare.identity(pod), agent_socket_dir=engine["socket_dir"], timeout=120)
    result = task.host_checkpoint(params, log=slow)
    assert result["status"] == "completed", result
    reply = client.request("state", 5)
    assert reply["state"] == "BACKED_UP" and reply["abandoned"] is None, reply
    assert reply["lease"]["seconds"] == 1.5 and reply["lease"]["by"] == "lock", reply["lease"]
    # host_checkpoint ends with a renewal: after its last slow step, not merely some time during it (the agent's
    # clock, not how soon this test gets to ask: a loaded machine may take a second to get here)
    assert renewed_at(reply["lease"]) >= slept_until[-1], (reply["lease"], slept_until)
    assert all(lease["remaining_s"] > 0 for _line, lease in seen if lease), seen
    client.request("restore", 10)
    client.request("unlock", 10)
    assert answers(engine) == engine["expected"]

"""A restore killed mid-way, on record and recognised by the next run (core/restore/interrupted.py): the entry a run
writes before its host restore, replaced by its outcome; a run that is gone told from one in progress; what a
half-restored engine's agent says of it; the drivers making way for a restore from the start -- the Docker path's
container stopped (dockerd stubbed: the process boundary), a bare process tree killed (real processes) -- and the
task leaving an engine alone while another run restores it. Real status records, real /proc, a real agent socket."""

import os
import signal
import subprocess
import sys
import time

import pytest

from unit.core.generate.test_claim import dead_process
from unit.core.restore import test_pipeline
from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import launcher, protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import proc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import bare, interrupted, task
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.checkpoint import DockerCheckpoint
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status

no_locks = test_pipeline.no_locks  # the fixture: the 'restored process' is this test, which holds no locks


class Recording(test_pipeline.Broken):
    """The pipeline test's driver, recording itself before its host restore as the Docker and bare paths do; what
    the status record said while the host restore ran."""

    def host_restore(self, attempt):
        interrupted.started(self, attempt, pid=4242)
        self.during = status.read(attempt.snapshot_dir)["last_restore"]
        return super(Recording, self).host_restore(attempt)


def test_a_run_records_itself_restoring_before_its_host_restore_and_its_outcome_replaces_that_entry(tmp_path, no_locks):
    snap = test_pipeline.snapshot(tmp_path)
    driver = Recording()
    attempt = test_pipeline.run(snap, driver)
    assert attempt.restored, attempt.reason
    during = driver.during
    assert during["outcome"] == "restoring" and during["pid"] == 4242 and during["until"] > during["at"], during
    assert during["runner"] == proc.identity(os.getpid()), during["runner"]
    record = status.read(snap)
    assert [entry["outcome"] for entry in record["restores"]] == ["restored"], record["restores"]
    assert record["last_restore"]["runner"] == during["runner"]


def test_a_run_that_fails_before_its_host_restore_writes_no_restoring_entry(tmp_path, no_locks):
    snap = test_pipeline.snapshot(tmp_path)
    attempt = test_pipeline.run(snap, Recording(fail="check", error=test_pipeline.Fallback))
    assert not attempt.restored
    entry = status.read(snap)["last_restore"]
    assert entry["outcome"] == "cold" and "runner" not in entry, entry


def restoring(snap, runner, until="2999-01-01T00:00:00.000000Z", **fields):
    entry = status.restore_entry(fields.pop("path", "docker"), interrupted.RESTORING, runner=runner, **fields)
    entry["until"] = until
    status.update(snap, restore=entry)
    return entry


def test_a_run_that_is_gone_is_told_from_one_that_may_still_run(tmp_path):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    assert interrupted.find(snap, "docker") is None
    restoring(snap, proc.identity(os.getpid()), container="c1")
    found = interrupted.find(snap, "docker", lambda entry: entry["container"] == "c1")
    assert found and found.gone is None, "this process is alive: a restore in progress"
    assert "is still running: another restore of this snapshot is in progress" in interrupted.in_progress(found)
    assert interrupted.find(snap, "docker", lambda entry: entry["container"] == "c2") is None
    assert interrupted.find(snap, "criu") is None
    restoring(snap, dead_process(), container="c2")
    found = interrupted.find(snap, "docker", lambda entry: entry["container"] == "c2")
    assert found.gone and "is gone" in found.gone, found
    # a runner this host cannot see (another pid namespace) is over once its deadline passed
    unseen = dict(proc.identity(os.getpid()), pidns="pid:[1]")
    restoring(snap, unseen, container="c3", until="2000-01-01T00:00:00.000000Z")
    assert "its deadline passed" in interrupted.find(snap, "docker", lambda entry: entry["container"] == "c3").gone
    restoring(snap, unseen, container="c4")
    assert interrupted.find(snap, "docker", lambda entry: entry["container"] == "c4").gone is None


def test_another_nodes_entry_and_an_entry_with_an_outcome_are_not_this_nodes_to_take_over(tmp_path):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    entry = restoring(snap, dead_process(), container="c1")
    status.update(snap, restore=dict(entry, node="another-node", runner=dict(entry["runner"], pid=1)))
    entry_done = dict(entry, outcome="restored")
    status.update(snap, restore=entry_done)  # the run's outcome replaced its own entry
    assert [e["outcome"] for e in status.read(snap)["restores"]] == ["restoring", "restored"]
    assert interrupted.find(snap, "docker") is None


def test_the_interrupted_runs_entry_says_so_with_what_the_next_run_found(tmp_path):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    restoring(snap, dead_process(), container="c1")
    found = interrupted.find(snap, "docker")
    reason = interrupted.close(snap, found, "container c1: its engine BACKED_UP; this run stopped it")
    started_by = (found.entry["at"], found.entry["runner"]["pid"])
    assert reason.startswith("interrupted: the restore started at %s by pid %d" % started_by)
    assert "ended without an outcome (its process" in reason and reason.endswith("this run stopped it")
    record = status.read(snap)
    assert [e["outcome"] for e in record["restores"]] == ["interrupted"] and record["last_restore"]["reason"] == reason
    assert interrupted.find(snap, "docker") is None


@pytest.fixture
def agent(tmp_path):
    """An agent serving this process's socket, its state as a test sets it."""
    controller = launcher.Controller(runtime=None, runtime_error="no ACL runtime in this test", restore_lease=60)
    socket_dir = tmp_path / "agent"
    server = launcher.AgentServer(str(socket_dir / ("agent.%d.sock" % os.getpid())), controller)
    server.start()
    controller.socket_dir = str(socket_dir)
    yield controller
    server.close()
    controller.close()


def test_what_the_half_restored_engines_agent_says_in_words(agent, tmp_path):
    agent.state = protocol.STATE_BACKED_UP
    agent._take_restore_lease()
    engine = interrupted.engine_now(os.getpid(), agent.socket_dir)
    assert engine["state"] == "BACKED_UP" and engine["lease"]["by"] == "restore" and engine["abandoned"] is None
    assert interrupted.summary(engine).startswith("its engine BACKED_UP, waiting for a restore path (restore lease, ")
    finished = dict(engine, state="RUNNING", lease=None,
                    abandoned={"lease_by": "restore", "actions": ["resumed", "restore", "unlock"], "state": "RUNNING"})
    assert interrupted.summary(finished) == ("its engine RUNNING after its agent finished the restore itself "
                                             "(resumed, restore, unlock)")
    nobody = interrupted.engine_now(os.getpid(), str(tmp_path / "no-agent"))
    assert nobody["agent"].startswith("no answer (") and interrupted.summary(nobody).startswith("its engine's agent gave")


class Docker:
    """dockerd as DockerCheckpoint asks it (the process boundary): one container, running or not."""

    def __init__(self, running, pid=None):
        self.running, self.pid, self.stopped = running, pid, []

    def container_id(self, name):
        return "c" * 64

    def is_running(self, name):
        return self.running

    def running_pid(self, name):
        return self.pid

    def inspect_container(self, name):
        return {"State": {"Status": "running" if self.running else "exited", "ExitCode": 0 if self.running else 75}}

    def stop(self, container, grace=10):
        self.stopped.append(container)
        self.running = False


def test_the_docker_path_stops_a_half_restored_container_to_restore_it_from_the_start(agent, tmp_path):
    agent.state = protocol.STATE_BACKED_UP
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    docker = Docker(running=True, pid=os.getpid())
    driver = DockerCheckpoint(docker, "engine-0", agent_socket_dir=agent.socket_dir)
    restoring(snap, dead_process(), container="c" * 64)
    found = driver.interrupted_run(snap)
    assert found and found.gone
    engine, done = driver.take_over(found, check_mode=True)
    assert engine["state"] == "BACKED_UP" and done.startswith("would stop") and docker.stopped == []
    engine, done = driver.take_over(found, check_mode=False)
    assert docker.stopped == ["c" * 64] and done == "stopped the container and restores it from the start"
    engine, done = driver.take_over(found, check_mode=False)  # an engine whose agent exited: its container too
    assert engine == {"container": "exited, exit code 75"} and len(docker.stopped) == 1
    assert DockerCheckpoint(Docker(running=False), "engine-0").interrupted_run(str(tmp_path / "other")) is None


def test_a_rerun_leaves_a_container_alone_while_another_run_restores_it_and_says_so(tmp_path):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    restoring(snap, proc.identity(os.getpid()), container="c" * 64)
    docker = Docker(running=True, pid=os.getpid())
    driver = DockerCheckpoint(docker, "engine-0")
    result = task._container({"container": "engine-0"}, snap, driver, False, lambda text: None, None)
    assert result["changed"] is False and result["restored"] is None and docker.stopped == [], result
    assert "another restore of this snapshot is in progress" in result["reason"]


def detached():
    """A process that is not this test's child, as CRIU's --restore-detached leaves a restored tree: init reaps it."""
    out = subprocess.run(["sh", "-c", "%s -c 'import time; time.sleep(60)' >/dev/null 2>&1 & echo $!" % sys.executable],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def test_the_bare_path_kills_a_half_restored_tree_it_can_tell_is_that_runs(agent, tmp_path):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    driver = bare.BareProcess(["true"], agent_socket_dir=agent.socket_dir)
    runner = dead_process()  # started before the 'restored' process below, on this boot
    pid = detached()
    try:
        restoring(snap, runner, path="criu", pid=pid)
        found = interrupted.find(snap, "criu")
        engine, done = driver.take_over(found, check_mode=True)
        assert "no answer" in engine["agent"] and done.startswith("would kill pid %d" % pid)
        assert proc.alive(pid)
        os.kill(pid, signal.SIGSTOP)  # what CRIU's leave-stopped leaves when the verdict never comes
        wait_state(pid, "T")
        engine, done = driver.take_over(found, check_mode=False)
        assert "stopped: CRIU left it stopped" in engine["process"] and done.startswith("killed pid %d" % pid)
        assert not proc.exists(pid), "CRIU restores the tree with this very pid: it must be free"
    finally:
        if proc.alive(pid):
            os.kill(pid, signal.SIGKILL)
    # a process that started before the run, or another boot's run: never touched
    restoring(snap, dict(runner, start=proc.start_time(os.getpid()) + 10 ** 9), path="criu", pid=os.getpid())
    engine, _done = driver.take_over(interrupted.find(snap, "criu"), check_mode=False)
    assert "runs nothing that run restored" in engine["process"]


def wait_state(pid, state, timeout=10):
    deadline = time.monotonic() + timeout
    while (proc.stat_fields(pid) or ["?"])[0] != state:
        assert time.monotonic() < deadline, "pid %d never reached state %s" % (pid, state)
        time.sleep(0.01)


def test_a_restoring_entry_is_no_process_still_running_from_the_snapshot(tmp_path):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    entry = status.restore_entry("criu", "restored", pid=os.getpid(), pid_start_time=proc.start_time(os.getpid()))
    status.update(snap, restore=entry)
    assert bare.running_from_snapshot(snap)["pid"] == os.getpid()
    for outcome in (interrupted.RESTORING, interrupted.INTERRUPTED):
        status.update(snap, restore=dict(entry, outcome=outcome))
        assert bare.running_from_snapshot(snap) is None, outcome

"""One generation of a pod at a time: the claim refuses a second one, names the holder, lapses when its
holder is gone, is taken over at once when its run is provably over (cleaning what that run left), and protects
what the holder wrote from another run's cleanup."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import criu_cli as criu
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim, leftovers
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import proc

IDENTITY = {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "pod-a"}


def pod(tmp_path):
    return str(tmp_path / "ns" / "svc" / "p0" / "pod-a")


def test_a_second_generation_is_refused_naming_the_first_until_its_claim_lapses(tmp_path):
    snap = pod(tmp_path)
    first = claim.take(snap, "run-a", lease=30, now=1000.0)
    assert first["holder"]["task_pid"] == os.getpid() and oct(os.stat(layout.claim_path(snap)).st_mode & 0o777) == "0o600"
    with pytest.raises(ParameterError, match="generation run-a on .* since .* runs until") as info:
        claim.take(snap, "run-b", lease=30, now=1010.0)
    assert info.value.result["generation_in_progress"]["id"] == "run-a"
    renewed = claim.take(snap, "run-a", lease=30, now=1020.0)  # the holder renews, keeping its start
    assert renewed["started_at"] == first["started_at"] and renewed["expires_at"] == 1050.0
    taken = claim.take(snap, "run-b", lease=30, now=1051.0)  # the holder was killed: its claim lapsed
    assert taken["id"] == "run-b"
    assert claim.release(snap, "run-a") is False and claim.read(snap)["id"] == "run-b"
    assert claim.release(snap, "run-b") is True and claim.read(snap) is None


def test_a_task_outside_any_generation_may_not_slip_in(tmp_path):
    snap = pod(tmp_path)
    claim.take(snap, "run-a", lease=60)
    with pytest.raises(ParameterError, match="give this task its generation_id"):
        claim.join(snap, None)
    assert claim.join(snap, "run-a")["id"] == "run-a"


def test_another_runs_cleanup_removes_nothing_of_the_holders(tmp_path):
    snap = pod(tmp_path)
    staging = layout.staging_dir(snap)
    os.makedirs(os.path.join(staging, "device"))
    claim.take(snap, "run-a", lease=300)
    cleanup = run_module("snapshot_status", {"snapshot_dir": snap, "identity": IDENTITY, "status": "failed",
                                             "reason": "run-b failed", "generation_id": "run-b"})
    assert cleanup["changed"] is False and cleanup["generation_in_progress"]["id"] == "run-a", cleanup
    assert os.path.isdir(staging)
    refused = run_module("snapshot_status", {"snapshot_dir": snap, "identity": IDENTITY, "status": "generating",
                                             "generation_id": "run-b"})
    assert refused["failed"] and "another generation of this pod's snapshot is in progress" in refused["msg"]
    own = run_module("snapshot_status", {"snapshot_dir": snap, "identity": IDENTITY, "status": "failed",
                                         "reason": "run-a failed", "generation_id": "run-a"})
    assert own["changed"] is True and staging in own["removed"] and not os.path.exists(staging)


def test_a_long_task_keeps_its_short_claim_alive_and_learns_when_it_lost_it(tmp_path):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    # a 1 s lease, renewed every 1/3 s: a loaded 2-core CI machine stalls a thread or an fsync for a few tenths
    # of a second (0.3 s leases failed on this VM once), which must not lapse the claim in this test
    claim.take(snap, "gen-1", lease=1.0)
    keeper = claim.Keeper(snap, "gen-1", lease=1.0).start()
    try:
        time.sleep(2.5)  # past two leases: alive only because it was renewed
        assert claim.live_other(snap, "gen-2")["id"] == "gen-1"
        keeper.check()
    finally:
        keeper.stop()
    time.sleep(1.3)
    claim.take(snap, "gen-2", lease=60)  # lapsed once nobody renews it: another generation may take the pod
    lost = claim.Keeper(snap, "gen-1", lease=1.0).start()
    time.sleep(1.5)  # its first renewal, at 1/3 s, is refused
    lost.stop()
    with pytest.raises(ParameterError, match="lost its claim on the pod.*gen-2"):
        lost.check()
    assert claim.DEFAULT_LEASE <= 180, "a killed controller blocks the next generation for minutes at most"


def dead_process():
    """The identity a process had, taken while it lived; it is gone now."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = proc.identity(child.pid)
    finally:
        child.kill()
        child.wait()
    return identity


def planted(snap, holder, claim_id="run-a", lease=300.0):
    """A claim as another run wrote it (its holder as given), live by its lease."""
    os.makedirs(os.path.dirname(snap), exist_ok=True)
    document = {"id": claim_id, "lease": lease, "expires_at": time.time() + lease, "started_at": "2026-12-04T10:00:00Z",
                "holder": dict(holder, host=holder.get("host", socket.gethostname()), task_pid=1), "work": None}
    with open(layout.claim_path(snap), "w") as handle:
        json.dump(document, handle)
    return document


def test_a_claim_whose_controller_is_gone_is_taken_over_at_once_and_what_its_run_left_is_removed(tmp_path):
    snap = pod(tmp_path)
    planted(snap, dict(dead_process(), kind="controller"))
    staging = layout.staging_dir(snap)
    os.makedirs(os.path.join(staging, "host", "criu"))
    taken = claim.take(snap, "run-b", lease=60)
    assert taken["id"] == "run-b" and claim.read(snap)["id"] == "run-b"
    over = taken["took_over"]
    assert over["id"] == "run-a" and over["why"].startswith("the run that held it is gone: its process (pid "), over
    assert "removed its staging dir %s" % staging in over["cleaned"] and not os.path.exists(staging)


def test_a_reused_pid_is_not_its_holder(tmp_path):
    snap = pod(tmp_path)
    mine = proc.identity(os.getpid())
    planted(snap, dict(mine, start=mine["start"] - 1, kind="controller"))  # this pid, but another process's start
    assert "is another process now" in claim.take(snap, "run-b")["took_over"]["why"]


def test_a_holder_that_lives_or_on_another_host_or_behind_a_connection_of_one_task_is_never_overridden(tmp_path):
    snap = pod(tmp_path)
    planted(snap, dict(proc.identity(os.getpid()), kind="controller"))
    with pytest.raises(ParameterError, match="generation run-a on .*, run by pid %d .*which is still running"
                                             % os.getpid()):
        claim.take(snap, "run-b")
    planted(snap, dict(dead_process(), kind="controller", host="another-node"))
    with pytest.raises(ParameterError, match="on another-node \\(another host: whether that run lives cannot be seen"):
        claim.take(snap, "run-b")
    # an SSH connection made for one task ends with it while its run goes on: proof of nothing, the lease decides
    planted(snap, dict(dead_process(), kind="connection", kept=False))
    with pytest.raises(ParameterError, match="a connection that ended with its task"):
        claim.take(snap, "run-b")
    planted(snap, dict(dead_process(), kind="connection", kept=True))  # it had outlived a task: its end is the run's
    assert claim.take(snap, "run-b")["took_over"]["id"] == "run-a"


def test_an_anchor_seen_by_two_tasks_of_a_run_is_kept(tmp_path):
    snap = pod(tmp_path)
    first = claim.take(snap, "run-a")
    assert first["holder"]["kept"] is False  # this task's first claim
    document = claim.read(snap)
    document["holder"]["task_pid"] = 1  # as an earlier task of the run wrote it, through the same anchor
    with open(layout.claim_path(snap), "w") as handle:
        json.dump(document, handle)
    assert claim.take(snap, "run-a")["holder"]["kept"] is True


def test_a_dump_the_dead_run_left_running_gets_its_grace_then_is_stopped(tmp_path, monkeypatch):
    snap = pod(tmp_path)
    staging = layout.staging_dir(snap)
    os.makedirs(os.path.join(staging, "host", "criu"))
    maker = dead_process()  # the killed module that made the work dir
    work = os.path.join(str(tmp_path), "inferops-dump-%d-%d-abcd1234" % (maker["pid"], maker["start"]))
    os.mkdir(work, 0o700)
    # stand-ins for runc/CRIU, started (like them) in a session of their own, naming the dirs on their command line
    ending = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.3)", "--work-path", work],
                              start_new_session=True)
    stuck = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(60)",
                              "--image-path=" + os.path.join(staging, "host", "criu")], start_new_session=True)
    try:
        previous = planted(snap, dict(dead_process(), kind="controller"))
        previous["work"] = {"dirs": [work], "container_id": None}
        cleaned = leftovers.clean_after(snap, previous, grace=2.0)
    finally:
        stuck.kill()
        ending.kill()
        stuck.wait()
        ending.wait()
    assert any(line.startswith("stopped the processes it left running after 2 s: ") and str(stuck.pid) in line
               for line in cleaned), cleaned
    assert stuck.returncode == -9 and ending.returncode == 0, "the one that ended by itself was never killed"
    assert "removed its CRIU work dir %s" % work in cleaned and not os.path.exists(work)
    assert "removed its staging dir %s" % staging in cleaned


def test_a_forged_claim_in_the_store_makes_the_next_run_kill_and_remove_nothing_of_what_it_names(tmp_path):
    """A writer of the store plants a lapsed claim whose work names a directory and the processes below it: the
    run that takes it over removes the pod's staging dir, and nothing it names (not ours by name, a live maker's,
    another host's)."""
    snap = pod(tmp_path)
    victim = tmp_path / "kubelet"
    victim.mkdir()
    live_work = criu.make_work_dir("dump", parent=str(tmp_path))  # a live dump's (its maker: this process)
    maker = dead_process()
    forged_name = os.path.join(str(tmp_path), "inferops-dump-%d-%d-abcd1234" % (maker["pid"], maker["start"]))
    os.symlink(str(victim), forged_name)  # ours by name, but a link to elsewhere
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=str(victim),
                                 start_new_session=True)
    try:
        for host in (socket.gethostname(), "another-node"):
            os.makedirs(snap, exist_ok=True)
            with open(layout.claim_path(snap), "w") as handle:
                json.dump({"id": "x", "expires_at": 0, "holder": {"host": host},
                           "work": {"dirs": [str(victim), live_work, forged_name],
                                    "container_id": "ab" * 32, "runc_root": str(victim / "nowhere")}}, handle)
            taken = claim.take(snap, "run-b", lease=60)
            cleaned = taken["took_over"]["cleaned"]
            assert bystander.poll() is None, cleaned
            assert victim.is_dir() and os.path.isdir(live_work) and os.path.islink(forged_name), cleaned
            assert not any(line.startswith(("removed its CRIU work dir", "stopped")) for line in cleaned), cleaned
            assert any(line.startswith("ignored") for line in cleaned), cleaned
            claim.release(snap, "run-b")
    finally:
        bystander.kill()
        bystander.wait()


def test_work_dirs_are_swept_once_their_maker_is_gone_and_nothing_uses_them(tmp_path):
    parent = str(tmp_path)
    mine = criu.make_work_dir("dump", parent=parent)  # this process lives: kept
    maker = dead_process()
    orphan = os.path.join(parent, "inferops-dump-%d-%d-abcd1234" % (maker["pid"], maker["start"]))
    busy = os.path.join(parent, "inferops-restore-%d-%d-efgh5678" % (maker["pid"], maker["start"]))
    for path in (orphan, busy):
        os.mkdir(path, 0o700)
    # a CRIU still writing its log there
    writer = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'w'); print('ok', "
                               "flush=True); time.sleep(60)", os.path.join(busy, "restore.log")], stdout=subprocess.PIPE)
    try:
        assert writer.stdout.readline().strip() == b"ok"
        assert leftovers.sweep_work_dirs([parent], remove=False) == [orphan] and os.path.isdir(orphan)
        assert leftovers.sweep_work_dirs([parent]) == [orphan]
    finally:
        writer.kill()
        writer.wait()
    assert not os.path.exists(orphan) and os.path.isdir(busy) and os.path.isdir(mine)
    assert leftovers.sweep_work_dirs([parent]) == [busy]


def test_snapshot_info_tells_a_dead_runs_generating_record_from_a_live_generation(tmp_path):
    """A run killed outside the engine's lock window leaves its record at generating (audit F6): snapshot_info says
    whether a live claim backs it."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status
    snap = pod(tmp_path)
    status.update(snap, "generating", generation_id="run-a")
    args = {"snapshot_dir": snap, "identity": IDENTITY, "device_state": False}
    nothing = run_module("snapshot_info", args)
    assert nothing["generation"] == {"claim": None, "live": False, "why_ended": None, "stale": True}, nothing
    planted(snap, dict(dead_process(), kind="controller"))
    dead = run_module("snapshot_info", args)["generation"]
    assert dead["claim"]["id"] == "run-a" and not dead["live"] and dead["stale"], dead
    assert dead["why_ended"].startswith("the run that held it is gone: "), dead
    planted(snap, dict(proc.identity(os.getpid()), kind="controller"))
    live = run_module("snapshot_info", args)["generation"]
    assert live["live"] and not live["stale"] and live["why_ended"] is None, live

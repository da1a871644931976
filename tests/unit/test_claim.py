"""One generation of a pod at a time: the claim refuses a second one, names the holder, lapses when its
holder is gone, and protects what the holder wrote from another run's cleanup."""

import os
import time

import pytest

from conftest import run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core import claim, layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import ParameterError

IDENTITY = {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "pod-a"}


def pod(tmp_path):
    return str(tmp_path / "ns" / "svc" / "p0" / "pod-a")


def test_a_second_generation_is_refused_naming_the_first_until_its_claim_lapses(tmp_path):
    snap = pod(tmp_path)
    first = claim.take(snap, "run-a", lease=30, now=1000.0)
    assert first["holder"]["pid"] == os.getpid() and oct(os.stat(layout.claim_path(snap)).st_mode & 0o777) == "0o600"
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

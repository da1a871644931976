"""The failure cleanup of a generation removes only what that generation wrote (audit F5): its staging dir always,
the published snapshot only when the record says this very generation completed it. A complete snapshot published
by an earlier run -- or by one killed between its publish and its completed record, which leaves the record at
generating -- is kept."""

import os

from conftest import run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status
from ansible_collections.inferops.snapshot.plugins.modules import snapshot_status

IDENTITY = {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "pod-a"}


def test_only_the_generation_that_recorded_it_completed_published_it():
    completed = {"status": "completed", "generation_id": "run-a"}
    assert status.published_by(completed, "run-a")
    assert not status.published_by(completed, "run-b") and not status.published_by(completed, None)
    assert not status.published_by({"status": "generating", "generation_id": "run-a"}, "run-a")  # maybe the old one
    assert not status.published_by({"status": "completed", "generation_id": None}, None)
    assert not status.published_by(None, "run-a")


def pod_with_snapshot(tmp_path, record_status, generation_id):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    os.makedirs(os.path.join(snap, "host"))
    os.makedirs(layout.staging_dir(snap))
    status.update(snap, record_status, generation_id=generation_id)
    return snap


def test_a_failed_generation_removes_the_published_snapshot_only_when_it_completed_it(tmp_path):
    snap = pod_with_snapshot(tmp_path, "generating", "run-killed-after-publish")
    record = status.read(snap)
    for generation_id in ("run-b", None):  # failed.yml of the next run; abandoned.yml, which names none
        assert snapshot_status.removable(snap, IDENTITY, [], record, generation_id) == [layout.staging_dir(snap)]
    status.update(snap, "completed", generation_id="run-b")  # run-b published, then its verify failed
    assert snapshot_status.removable(snap, IDENTITY, [], status.read(snap), "run-b") == [snap, layout.staging_dir(snap)]


def test_the_failure_record_of_the_next_run_keeps_a_snapshot_it_never_wrote(tmp_path):
    """The exact call of roles/snapshot_generate/tasks/failed.yml, after a run killed between its publish and its
    completed record: the record says failed, the staging dir is gone, the snapshot stays."""
    snap = pod_with_snapshot(tmp_path, "generating", "run-a")
    done = run_module("snapshot_status", {"snapshot_dir": snap, "identity": IDENTITY, "status": "failed",
                                          "reason": "warmup: pod-a did not become ready", "generation_id": "run-b"})
    assert done["changed"] and done["removed"] == [layout.staging_dir(snap)], done
    assert os.path.isdir(snap) and not os.path.exists(layout.staging_dir(snap)) and status.read(snap)["status"] == "failed"

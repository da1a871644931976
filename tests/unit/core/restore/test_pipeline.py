"""The one restore pipeline (core/restore/pipeline.py) with a driver that fails where it is told to: every stage's
failure is a cold start with that stage's reason, what was started is undone, the outcome is written once, and
nothing is left behind (no half-restored process, no plaintext, no held staged copy)."""

import json
import os
import subprocess
import sys

import pytest

from unit.core.restore.test_cache import IDENTITY, PAGES, fields, make
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import clock, layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError, SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import (cache, file_locks, held, pipeline,
                                                                                     stages)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.attempt import Attempt, Fallback
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.driver import Driver
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import (canary, encryption, manifest, seal,
                                                                                   status)

# driver method -> the stage the pipeline runs it in
STAGES = {"locate": "verify", "check": "check", "prepare": "prepare", "host_restore": "host_restore",
          "release": "verify_pages", "after_host_restore": "metadata", "device_resume": "device_restore",
          "pages_in": "pages_in", "complete": "complete"}
KEY = b"k" * 32


class Broken(Driver):
    """Every step recorded; ``fail``: the step that raises ``error``. Resources: what is live on the 'host'."""

    path = "criu"
    engine = "docker"
    verification = manifest.OVERLAPPED

    def __init__(self, fail=None, error=RuntimeError):
        super(Broken, self).__init__(identity=IDENTITY, criu_version="skip")
        self.world_now = None  # the fake manifests record no world
        self.fail, self.error = fail, error
        self.calls = []
        self.live = set()
        self.images_seen = None

    def _step(self, name):
        self.calls.append(name)
        if name == self.fail:
            raise self.error("%s broke" % name) if self.error is not Fallback else \
                Fallback("injected: %s broke" % name)

    def locate(self, attempt):
        self._step("locate")
        return super(Broken, self).locate(attempt)

    def check(self, attempt):
        self._step("check")

    def prepare(self, attempt):
        self._step("prepare")
        self.live.add("container")

    def host_restore(self, attempt):
        self.images_seen = sorted(os.listdir(attempt.images_dir))
        self.left_stopped = attempt.leave_stopped
        self.live.add("restored process")
        self._step("host_restore")
        return os.getpid()

    def release(self, attempt):
        self._step("release")

    def after_host_restore(self, attempt):
        self._step("after_host_restore")

    def device_resume(self, attempt):
        self._step("device_resume")
        return ["restore", "unlock"]

    def pages_in(self, attempt):
        self._step("pages_in")

    def complete(self, attempt):
        self._step("complete")

    def undo(self, attempt):
        self.calls.append("undo")
        self.live.discard("restored process")

    def cold_start(self, attempt):
        self.calls.append("cold_start")
        self.live.add("cold process")


@pytest.fixture
def no_locks(monkeypatch):
    """The fake 'process' is this test: it has no agent to take locks back, and the images record none."""
    monkeypatch.setattr(file_locks, "hold_again", lambda *args, **kwargs: None)


DEVICE = {"schema_version": 1, "pid": 1, "state": "BACKED_UP", "devices": [0],
          "runtime": {"name": "ascend-acl", "version": "9.1.0"}, "created_at": "2026-11-29T12:00:00Z"}


def snapshot(tmp_path, encrypted=False, npu_image=None, device="DEVICE"):
    """A published snapshot with a device part (``device``: DEVICE unless given; None: none), so that the device stage
    runs; ``npu_image``: the bytes of the NPU plugin's image among the CRIU images (as they are in the store: ciphertext
    of an encrypted snapshot)."""
    device = DEVICE if device == "DEVICE" else device
    snap = make(tmp_path, encryption_key=KEY if encrypted else None)
    staging = layout.staging_dir(snap)
    os.rename(snap, staging)
    for name in (layout.MANIFEST, layout.CHECKSUMS):
        os.unlink(os.path.join(staging, name))
    if npu_image is not None:
        with open(os.path.join(staging, layout.IMAGES_DIR, layout.NPU_PLUGIN_IMAGE), "wb") as handle:
            handle.write(npu_image)
    if device is not None:  # None: a host-only snapshot
        os.mkdir(os.path.join(staging, layout.DEVICE_DIR))
        with open(os.path.join(staging, layout.DEVICE_PART), "w") as handle:
            json.dump(device, handle)
    extra = {"encryption": encryption.describe(KEY, [PAGES, "host/criu/inventory.img"])} if encrypted else {}
    extra.update({"device": device} if device is not None else {})
    seal.seal(staging, dict(fields(), **extra))
    seal.publish(staging, snap)
    return snap


def run(snap, driver, **kwargs):
    kwargs.setdefault("decrypt_dir", os.path.join(os.path.dirname(snap), "..", "..", "..", "..", "shm"))
    os.makedirs(kwargs["decrypt_dir"], exist_ok=True)
    attempt = Attempt(snap, 30, keys={encryption.key_id(KEY): KEY}, **kwargs)
    return pipeline.run(driver, attempt)


def test_a_restore_that_nothing_breaks_runs_every_stage_in_order_and_says_restored(tmp_path, no_locks):
    snap = snapshot(tmp_path)
    driver = Broken()
    attempt = run(snap, driver)
    assert attempt.restored and attempt.reason is None and attempt.outcome == "restored"
    assert driver.calls == ["locate", "check", "prepare", "host_restore", "release", "after_host_restore",
                            "device_resume", "pages_in", "complete"]
    assert list(attempt.watch.durations)[:2] == ["verify", "check"] and "complete" in attempt.watch.durations
    record = status.read(snap)
    assert record["last_restore"]["outcome"] == "restored" and len(record["restores"]) == 1


@pytest.mark.parametrize("error", [RuntimeError, SnapshotError, Fallback])
@pytest.mark.parametrize("step", sorted(STAGES))
def test_a_failure_at_any_stage_is_a_cold_start_with_that_stages_reason_and_nothing_left(tmp_path, no_locks, step,
                                                                                         error):
    snap = snapshot(tmp_path)
    driver = Broken(fail=step, error=error)
    attempt = run(snap, driver)
    stage_name = STAGES[step]
    expected = {RuntimeError: "internal_error: %s failed with RuntimeError: %s broke" % (stage_name, step),
                SnapshotError: "%s_failed: %s broke" % (stage_name, step),
                Fallback: "injected: %s broke" % step}[error]
    assert not attempt.restored and attempt.reason.startswith(expected), attempt.reason
    assert driver.calls[-1] == "cold_start" and driver.calls.count("cold_start") == 1
    # undone exactly when the host restore had begun (everything after prepare)
    assert ("undo" in driver.calls) is (step not in ("locate", "check", "prepare")), driver.calls
    assert "restored process" not in driver.live, "a half-restored process is undone before the cold start"
    assert "cold process" in driver.live
    record = status.read(snap)
    if step == "locate":  # a path that was not validated is never written to
        assert record is None
        return
    assert record["last_restore"]["outcome"] == "cold" and record["last_restore"]["reason"] == attempt.reason
    assert len(record["restores"]) == 1, "the outcome is written once"


@pytest.mark.parametrize("step", ["check", "host_restore", "device_resume", "complete"])
def test_an_encrypted_snapshots_plaintext_is_gone_whatever_failed(tmp_path, no_locks, step):
    snap = snapshot(tmp_path, encrypted=True)
    shm = str(tmp_path / "shm")
    driver = Broken(fail=step)
    attempt = run(snap, driver, decrypt_dir=shm)
    assert not attempt.restored and driver.calls[-1] == "cold_start"
    if step != "check":
        assert driver.images_seen == ["inventory.img", "pages-1.img"], "CRIU read the decrypted images"
    assert os.listdir(shm) == [], "no plaintext is left in the decrypt dir"


def test_a_cached_copy_is_released_whatever_failed(tmp_path, no_locks):
    snap = snapshot(tmp_path)
    stage_dir = str(tmp_path / "stage")
    cache.stage(snap, stage_dir)
    attempt = run(snap, Broken(fail="host_restore"), stage_dir=stage_dir)
    assert not attempt.restored and attempt.verdict["checksums"] == "staged"
    assert cache.drop_entry(stage_dir, attempt.verdict["fingerprint"]) is True, "not held after the restore"


def test_the_canary_stage_refuses_an_engine_that_does_not_answer_as_recorded(tmp_path, no_locks):
    snap = make(tmp_path / "c")
    staging = layout.staging_dir(snap)
    os.rename(snap, staging)
    for name in (layout.MANIFEST, layout.CHECKSUMS):
        os.unlink(os.path.join(staging, name))
    canary.write(staging, canary.check_spec({"url": "http://127.0.0.1:9/never"}), {"status": 200})
    seal.seal(staging, fields())
    seal.publish(staging, snap)
    driver = Broken()
    attempt = run(snap, driver)
    assert not attempt.restored and attempt.reason.startswith("canary_failed:"), attempt.reason
    assert driver.calls[-2:] == ["undo", "cold_start"] and "complete" not in driver.calls


def test_a_snapshot_that_does_not_verify_starts_nothing_but_the_cold_start(tmp_path, no_locks):
    snap = snapshot(tmp_path)
    with open(os.path.join(snap, PAGES), "r+b") as handle:
        handle.write(b"X")
    driver = Broken()
    attempt = run(snap, driver)
    assert attempt.reason.startswith("checksum_mismatch: " + PAGES), attempt.reason
    # the page images are hashed while the host restore leaves the tasks stopped: they never run
    assert "release" not in driver.calls and driver.calls[-2:] == ["undo", "cold_start"]
    assert attempt.verdict["overlapped"]["released"] is False


def test_check_mode_verifies_and_checks_only_and_writes_nothing(tmp_path, no_locks):
    snap = snapshot(tmp_path)
    driver = Broken()
    attempt = run(snap, driver, check_mode=True)
    assert attempt.restored and driver.calls == ["locate", "check"] and status.read(snap) is None


class Unrecreatable(Broken):
    """A container that is gone, whose cold start refuses (docker_container.recreate_or_refuse)."""

    def refuses_cold_start(self, attempt):
        self.calls.append("refuses_cold_start")
        raise ParameterError("container: gone, and no valid snapshot to recreate it from")

    def cold_start(self, attempt):
        self.refuses_cold_start(attempt)


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
def test_check_mode_fails_where_the_run_fails_its_cold_start(tmp_path, no_locks, check_mode):
    snap = snapshot(tmp_path)
    driver = Unrecreatable(fail="check", error=Fallback)
    with pytest.raises(ParameterError, match="no valid snapshot to recreate it from"):
        run(snap, driver, check_mode=check_mode)
    assert driver.calls[-1] == "refuses_cold_start" and "cold_start" not in driver.calls


def test_check_mode_predicts_a_cold_start_and_starts_nothing(tmp_path, no_locks):
    snap = snapshot(tmp_path)
    driver = Broken(fail="check", error=Fallback)
    attempt = run(snap, driver, check_mode=True)
    assert attempt.reason == "injected: check broke" and not attempt.restored
    assert "cold_start" not in driver.calls and status.read(snap) is None


class Delegating(Broken):
    """A driver whose host restore is another run of the pipeline (the hand-over to the node runtime)."""
    stages = stages.HANDOVER  # as Handover: nothing is deferred to a page check that never comes, no image read
    verification = manifest.DOCUMENTS_ONLY
    images_from = ()


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_a_delegated_restore_hashes_only_what_it_acts_on_and_runs_no_stage_of_its_delegate(tmp_path, no_locks,
                                                                                           monkeypatch, chunked):
    if chunked:  # the page image gets per-chunk digests in the chunk index, as every image above 64 MiB does
        monkeypatch.setattr(manifest, "CHUNK_BYTES", 256)
    snap = snapshot(tmp_path)
    assert os.path.exists(os.path.join(snap, layout.CHUNK_INDEX)) is chunked
    driver = Delegating()
    attempt = run(snap, driver)
    assert attempt.restored
    assert driver.calls == ["locate", "check", "prepare", "host_restore", "complete"]
    assert attempt.verdict["checksums"].startswith("verified but"), attempt.verdict["checksums"]
    images = sum(os.lstat(os.path.join(snap, layout.IMAGES_DIR, name)).st_size
                 for name in os.listdir(os.path.join(snap, layout.IMAGES_DIR)))
    assert attempt.verdict["hashed_bytes"] < images, "the images are the delegate's to hash"
    assert attempt.verdict["hashed_bytes"] == sum(len(data) for data in attempt.documents.values()), \
        "only the documents are read, chunk-planned images included"
    assert layout.MANIFEST in attempt.documents and layout.DEVICE_PART in attempt.documents


def test_the_device_check_is_the_delegates_where_the_images_are_unverified_or_still_ciphertext(tmp_path, no_locks):
    """The hand-over verifies no image (its delegate does) and does not decrypt: reading the NPU plugin's image here
    read bytes nobody hashed -- ciphertext of an encrypted snapshot, which made every encrypted restore through
    snapshot_restore method=runtime a cold start (npu_image_unreadable). Where CRIU runs, the check stands."""
    garbage = b"\xaa\x01 ciphertext, or anything but the plugin's image\n"
    attempt = run(snapshot(tmp_path / "handover", npu_image=garbage), Delegating())
    assert attempt.restored, attempt.reason
    driver = Broken()
    attempt = run(snapshot(tmp_path / "criu", npu_image=garbage), driver)
    assert not attempt.restored and attempt.reason.startswith("npu_image_unreadable:"), attempt.reason
    assert "host_restore" not in driver.calls, "refused before CRIU runs"


def test_the_device_check_is_given_the_device_part_for_the_chips_a_manager_reached(tmp_path, no_locks, monkeypatch):
    """The HAL reaches a chip through the manager, with no descriptor on its node: the check learns the chips from the
    device part's devices, so a process that held only the manager is refused when its chip is not on this node."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / layout.NPU_PLUGIN_FILE).write_bytes(b"")
    monkeypatch.setenv("CRIU_LIBS_DIR", str(plugins))  # where CRIU and the check look first
    manager = str(tmp_path / "node" / layout.NPU_MANAGER)
    image = ("inferops-npu-plugin v1\nfd 27 109002 c 1 3 %s\n" % manager).encode()
    driver = Broken()
    attempt = run(snapshot(tmp_path / "snap", npu_image=image), driver)
    chip = os.path.join(os.path.dirname(manager), "davinci0")
    assert not attempt.restored and attempt.reason.startswith("device_missing: the checkpointed process held %s, "
                                                              % chip), attempt.reason
    assert "host_restore" not in driver.calls, "refused before CRIU runs"


def swap(path, data):
    """What a writer of the store does to replace a file without writing into the one being read: a new file, renamed
    over it."""
    with open(path + ".new", "wb") as handle:
        handle.write(data)
    os.rename(path + ".new", path)


def test_documents_are_used_as_verified_not_read_again(tmp_path, no_locks):
    snap = snapshot(tmp_path)

    class Swapping(Broken):
        def check(self, attempt):  # a writer swaps the device part after the verification
            swap(os.path.join(attempt.snapshot_dir, layout.DEVICE_PART), b'{"forged": true}')
            self.seen = attempt.document(layout.DEVICE_PART)

    driver = Swapping()
    attempt = run(snap, driver)
    assert attempt.restored and b"forged" not in driver.seen and b"BACKED_UP" in driver.seen


class ReadsPages(Broken):
    """A host restore that reads the page image as CRIU would, from the directory the pipeline gives it."""

    def host_restore(self, attempt):
        self.swap_now(attempt)
        with open(os.path.join(attempt.images_dir, "pages-1.img"), "rb") as handle:
            self.restored_bytes = handle.read()
        return super(ReadsPages, self).host_restore(attempt)

    def swap_now(self, attempt):
        pass


def test_a_page_image_swapped_by_rename_after_the_verification_is_not_what_the_restore_reads(tmp_path, no_locks):
    snap = snapshot(tmp_path)
    original = open(os.path.join(snap, PAGES), "rb").read()

    class Swapping(ReadsPages):
        def swap_now(self, attempt):
            swap(os.path.join(attempt.snapshot_dir, PAGES), b"forged" + original[6:])

    driver = Swapping()
    attempt = run(snap, driver)
    assert attempt.restored and driver.restored_bytes == original, "the inode verified is the inode restored"
    assert attempt.verdict["held"]["mode"] == "leased" and attempt.verdict["held"]["linked"] is True
    assert not [n for n in os.listdir(os.path.dirname(snap)) if n.startswith(".inferops-view-")], "the view is gone"


def test_a_page_image_opened_for_writing_while_the_restore_reads_it_is_a_cold_start_before_anything_runs(
        tmp_path, no_locks):
    snap = snapshot(tmp_path)
    writer = []

    class Writing(ReadsPages):
        def swap_now(self, attempt):  # another process opens it to write: the kernel holds it off and breaks the lease
            writer.append(subprocess.Popen([sys.executable, "-c", "import os, sys; os.open(sys.argv[1], os.O_WRONLY)",
                                            os.path.join(attempt.snapshot_dir, PAGES)]))
            clock.wait_for(lambda: (bool(attempt.held.broken()), attempt.held.broken()), 30, 0.01,
                           what="the lease to break")

    driver = Writing()
    attempt = run(snap, driver)
    assert not attempt.restored and attempt.reason.startswith("swapped: " + PAGES), attempt.reason
    assert "release" not in driver.calls and driver.calls[-2:] == ["undo", "cold_start"]
    assert writer[0].wait(timeout=30) == 0, "the writer goes on once the restore let go"


def test_where_no_lease_can_be_taken_the_restore_reads_a_copy_made_by_the_read_that_verified_it(
        tmp_path, no_locks, monkeypatch):
    monkeypatch.setattr(held, "F_SETLEASE", -1)  # as on NFS: fcntl refuses the lease
    snap = snapshot(tmp_path)
    shm = str(tmp_path / "shm")
    original = open(os.path.join(snap, PAGES), "rb").read()

    class Swapping(ReadsPages):
        def swap_now(self, attempt):
            with open(os.path.join(attempt.snapshot_dir, PAGES), "r+b") as handle:  # in place: no lease to break
                handle.write(b"forged")
            assert attempt.held.mode == "copied" and os.path.realpath(attempt.images_dir).startswith(shm)

    driver = Swapping()
    attempt = run(snap, driver, decrypt_dir=shm)
    assert attempt.restored and driver.restored_bytes == original, attempt.reason
    files = sum(len(names) for _dir, _sub, names in os.walk(snap))
    assert attempt.verdict["held"] == {"mode": "copied", "files": files, "linked": False, "watched": False,
                                       "why_copied": attempt.verdict["held"]["why_copied"]}
    assert attempt.verdict["held"]["why_copied"].endswith(": Invalid argument")
    assert os.listdir(shm) == [], "the copy is gone with the restore"


def test_a_path_that_cannot_wait_for_the_leases_verifies_a_private_copy_and_says_so(tmp_path, no_locks):
    """docker start --checkpoint resumes the restored tasks itself, before anything could ask whether a lease broke,
    and a lease holds a writer off only for a while: such a path declares a copy made by the verifying read. A write
    into the store after the verification reaches nothing the restore reads."""
    snap = snapshot(tmp_path)
    shm = str(tmp_path / "shm")
    original = open(os.path.join(snap, PAGES), "rb").read()

    class Copying(ReadsPages):
        verification = manifest.FULL
        images_from = (stages.COPY,)
        copy_because = "the tasks resume by themselves"

        def swap_now(self, attempt):
            with open(os.path.join(attempt.snapshot_dir, PAGES), "r+b") as handle:  # no lease holds it off
                handle.write(b"forged")

    driver = Copying()
    attempt = run(snap, driver, decrypt_dir=shm)
    assert attempt.restored and driver.restored_bytes == original, attempt.reason
    assert attempt.verdict["held"]["mode"] == "copied" and attempt.verdict["held"]["why_copied"] == \
        "the tasks resume by themselves"
    assert driver.left_stopped is False and "release" not in driver.calls
    assert open(os.path.join(snap, PAGES), "rb").read().startswith(b"forged"), "the write landed, in the store"
    assert os.listdir(shm) == [], "the copy is gone with the restore"


def test_a_leased_restore_leaves_the_tasks_stopped_until_the_leases_are_asked_even_with_nothing_left_to_hash(
        tmp_path, no_locks):
    """An unbound encrypted snapshot's page images are authenticated by their decryption: nothing is hashed after
    CRIU. A lease still holds a writer off only for a while: the tasks wait for verify_pages to ask it, and a lease
    broken by then is a cold start before they ever ran."""
    driver = Broken()
    attempt = run(snapshot(tmp_path / "quiet", encrypted=True), driver)
    assert attempt.restored and attempt.pages is None, attempt.reason
    assert driver.left_stopped is True and "release" in driver.calls
    writer = []

    class Writing(ReadsPages):
        def swap_now(self, attempt):
            writer.append(subprocess.Popen([sys.executable, "-c", "import os, sys; os.open(sys.argv[1], os.O_WRONLY)",
                                            os.path.join(attempt.snapshot_dir, PAGES)]))
            clock.wait_for(lambda: (bool(attempt.held.broken()), attempt.held.broken()), 30, 0.01,
                           what="the lease to break")

    driver = Writing()
    attempt = run(snapshot(tmp_path / "written", encrypted=True), driver)
    assert not attempt.restored and attempt.reason.startswith("swapped: " + PAGES), attempt.reason
    assert driver.left_stopped is True and "release" not in driver.calls
    assert writer[0].wait(timeout=30) == 0


def test_a_rename_into_the_view_after_its_seal_is_a_cold_start_before_the_tasks_run(tmp_path, no_locks):
    snap = snapshot(tmp_path)

    class Renaming(ReadsPages):
        def swap_now(self, attempt):  # a writer of the store renames its own core image into the sealed view
            view = attempt.held.view_path
            swap(os.path.join(view, PAGES), open(os.path.join(view, PAGES), "rb").read())

    driver = Renaming()
    attempt = run(snap, driver)
    assert not attempt.restored, "the same bytes, another inode: still not what was verified"
    assert attempt.reason.startswith("swapped: the view's folder host/criu (pages-1.img.new created") and \
        "; pages-1.img renamed in) was written to while the restore read it" in attempt.reason, attempt.reason
    assert "release" not in driver.calls and driver.calls[-2:] == ["undo", "cold_start"]

"""The node's cache of verified snapshots (core/restore/cache.py): a copy verified once, whose verdict holds only while
every file is the one hashed -- and the restore pipeline reading it without hashing again.

Real files, real sealing and verification, real Ed25519 keys; the only fake is the restore driver (no CRIU)."""

import json
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import flip_byte_keeping_mtime
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError, SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import cache, pipeline
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.attempt import Attempt
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.driver import Driver
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import (encryption, hashing, manifest, seal,
                                                                                   signature)

IDENTITY = {"namespace": "default", "service": "svc", "instance": "p0", "pod": "pod-a"}
PAGES = "host/criu/pages-1.img"


def fields():
    return {"identity": IDENTITY, "created_at": "2026-11-29T12:00:00Z", "image": {"id": "sha256:" + "ab" * 32},
            "engine": {"name": "docker", "criu_version": "4.2.1"}, "runtime": {"name": "ascend-acl", "version": None},
            "devices": [0]}


def make(root, pod="pod-a", size=200000, key=None, marker=b"weights", encryption_key=None):
    """A sealed, published snapshot; encrypted as host_checkpoint does it when ``encryption_key`` is given."""
    final = root / "store" / "default" / "svc" / "p0" / pod
    staging = final.parent / (".%s.partial" % pod)
    plain = root / ("plain-" + pod) if encryption_key else staging
    (plain / "host" / "criu").mkdir(parents=True)
    (plain / PAGES).write_bytes(marker + os.urandom(size))
    (plain / "host" / "criu" / "inventory.img").write_bytes(b"inv")
    extra = {}
    if encryption_key:
        relpaths = [PAGES, "host/criu/inventory.img"]
        encryption.encrypt_tree(encryption_key, str(plain), str(staging), relpaths,
                                encryption.Binding(dict(IDENTITY, pod=pod), None))  # no generation: 0
        extra["encryption"] = encryption.describe(encryption_key, relpaths)
    seal.seal(str(staging), dict(fields(), identity=dict(IDENTITY, pod=pod), **extra), signing_key=key)
    seal.publish(str(staging), str(final))
    return str(final)


@pytest.fixture
def stage_dir(tmp_path):
    return str(tmp_path / "stage")


def entry_dir(stage_dir, snapshot):
    return layout.stage_entry(stage_dir, hashing.fingerprint(snapshot))


def test_staging_copies_verifies_and_binds_every_file_of_the_copy(tmp_path, stage_dir):
    snap = make(tmp_path)
    result = cache.stage(snap, stage_dir)
    assert result["changed"] and result["fingerprint"] == hashing.fingerprint(snap)
    entry = entry_dir(stage_dir, snap)
    copy = layout.stage_content(entry)
    assert result["staged"]["dir"] == copy and set(result["durations"]) >= {"copy", "verify", "total"}
    assert result["hashing"]["bytes"] >= 200000, "the copy was hashed in full"
    verdict = json.loads(open(layout.stage_verdict(entry)).read())
    assert verdict["fingerprint"] == result["fingerprint"] and verdict["source"] == snap
    bound = dict((item["path"], item) for item in verdict["files"])
    assert set(bound) == set(manifest.list_files(snap))
    st = os.lstat(os.path.join(copy, PAGES))
    assert bound[PAGES]["ino"] == st.st_ino and bound[PAGES]["ctime_ns"] == st.st_ctime_ns
    assert open(os.path.join(copy, PAGES), "rb").read() == open(os.path.join(snap, PAGES), "rb").read()
    for directory, dirs, files in os.walk(stage_dir):
        assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700, directory
        for name in files:
            assert stat.S_IMODE(os.lstat(os.path.join(directory, name)).st_mode) == 0o600, name
    assert not [n for n in os.listdir(stage_dir) if n.startswith(".")], "no partial copy is left"


def test_staging_twice_changes_nothing_and_lookup_finds_the_copy_held(tmp_path, stage_dir):
    snap = make(tmp_path)
    cache.stage(snap, stage_dir)
    again = cache.stage(snap, stage_dir)
    assert again["changed"] is False and "already staged" in again["reason"]
    found = cache.lookup(stage_dir, snap)
    assert found is not None and found.dir == layout.stage_content(entry_dir(stage_dir, snap))
    assert cache.drop_entry(stage_dir, found.fingerprint) is False, "an entry in use is never removed"
    found.release()
    assert cache.lookup(stage_dir, fingerprint=hashing.fingerprint(snap)) is not None


def test_check_mode_creates_nothing(tmp_path, stage_dir):
    snap = make(tmp_path)
    result = cache.stage(snap, stage_dir, check_mode=True)
    assert result["changed"] and result["staged"] is None and not os.path.exists(stage_dir)


def tamper_keeping_mtime(path):
    flip_byte_keeping_mtime(path, 3)


def test_a_byte_changed_with_its_mtime_put_back_is_caught_by_ctime_and_the_entry_dropped(tmp_path, stage_dir):
    snap = make(tmp_path)
    cache.stage(snap, stage_dir)
    tamper_keeping_mtime(os.path.join(layout.stage_content(entry_dir(stage_dir, snap)), PAGES))
    found, why = cache.find(stage_dir, snap)
    assert found is None and "ctime_ns" in why and PAGES in why, why
    assert not os.path.exists(entry_dir(stage_dir, snap)), "a stale entry is dropped"
    assert cache.stage(snap, stage_dir)["changed"], "and staged again from the snapshot"


@pytest.mark.parametrize("damage, expected", [
    (lambda copy: open(os.path.join(copy, "extra"), "wb").close(), "listing"),
    (lambda copy: os.unlink(os.path.join(copy, PAGES)), "listing"),
    (lambda copy: os.chmod(os.path.join(copy, PAGES), 0o644), "mode 644"),
    (lambda copy: os.chmod(os.path.join(copy, "host"), 0o755), "mode 755"),
    (lambda copy: (os.unlink(os.path.join(copy, PAGES)), os.symlink("/etc/passwd", os.path.join(copy, PAGES))),
     "not a regular file"),
    (lambda copy: os.truncate(os.path.join(copy, PAGES), 10), "size"),
    (lambda copy: os.utime(os.path.join(copy, PAGES), ns=(0, 0)), "mtime_ns"),
])
def test_anything_but_the_verified_copy_is_not_used(tmp_path, stage_dir, damage, expected):
    snap = make(tmp_path)
    cache.stage(snap, stage_dir)
    damage(layout.stage_content(entry_dir(stage_dir, snap)))
    found, why = cache.find(stage_dir, snap, drop=False)
    assert found is None and expected in why, why
    assert os.path.exists(entry_dir(stage_dir, snap)), "drop=False leaves it for inspection"


def test_a_verdict_made_by_hand_or_of_another_snapshot_is_refused(tmp_path, stage_dir):
    snap = make(tmp_path)
    cache.stage(snap, stage_dir)
    entry = entry_dir(stage_dir, snap)
    verdict = json.loads(open(layout.stage_verdict(entry)).read())
    os.chmod(layout.stage_verdict(entry), 0o644)
    assert "mode 644" in cache.find(stage_dir, snap, drop=False)[1]
    os.chmod(layout.stage_verdict(entry), 0o600)
    verdict["fingerprint"] = "0" * 64
    with open(layout.stage_verdict(entry), "w") as handle:
        json.dump(verdict, handle)
    assert "not a verdict on snapshot" in cache.find(stage_dir, snap)[1]


def test_a_regenerated_source_has_another_fingerprint_and_its_old_copy_is_superseded(tmp_path, stage_dir):
    snap = make(tmp_path)
    old = cache.stage(snap, stage_dir)["fingerprint"]
    new_snap = make(tmp_path / "again")
    os.rename(snap, snap + ".gone")
    os.rename(new_snap, snap)  # the same pod's path, another snapshot
    assert cache.lookup(stage_dir, snap) is None, "the old copy is not the snapshot asked for"
    result = cache.stage(snap, stage_dir)
    assert result["fingerprint"] != old and result["retention"]["dropped"] == [old]


def test_retention_keeps_count_and_bytes_oldest_first_and_never_one_in_use(tmp_path, stage_dir):
    snaps = [make(tmp_path, pod="pod-%d" % i, size=100000) for i in range(4)]
    fps = [cache.stage(s, stage_dir, keep=10)["fingerprint"] for s in snaps[:3]]
    held = cache.lookup(stage_dir, snaps[0])
    result = cache.stage(snaps[3], stage_dir, keep=2)
    assert result["retention"]["dropped"] == [fps[1], fps[2]] and result["retention"]["in_use"] == [fps[0]], result
    held.release()
    assert cache.prune(stage_dir, keep=2)["dropped"] == [], "within its bounds again"
    assert cache.prune(stage_dir, keep=1)["dropped"] == [fps[0]], "released: the oldest goes"
    left = [item["fingerprint"] for item in cache.entries(stage_dir)]
    assert left == [result["fingerprint"]]
    big = cache.prune(stage_dir, keep=5, max_bytes=1000)
    assert big["dropped"] == left and big["entries"] == 0


def test_an_abandoned_partial_copy_is_removed_a_live_one_kept(tmp_path, stage_dir):
    snap = make(tmp_path)
    cache.stage(snap, stage_dir)
    abandoned = layout.stage_partial(stage_dir, "1" * 64, 999999)
    os.mkdir(abandoned, 0o700)
    cache.prune(stage_dir)
    assert not os.path.exists(abandoned)


@pytest.mark.parametrize("kwargs, field", [
    ({"stage_dir": "relative/stage"}, "stage_dir"),
    ({"stage_dir": ""}, "stage_dir"),
    ({"keep": 0}, "keep"),
    ({"max_bytes": 0}, "max_bytes"),
    ({"max_bytes": 10}, "max_bytes"),
])
def test_bad_input_names_the_field_before_anything_is_created(tmp_path, stage_dir, kwargs, field):
    snap = make(tmp_path)
    args = dict({"stage_dir": stage_dir}, **kwargs)
    with pytest.raises(SnapshotError) as error:
        cache.stage(snap, **args)
    assert error.value.msg.startswith(field + ":"), error.value.msg
    assert not os.path.exists(stage_dir)


def test_a_cache_inside_the_snapshot_or_writable_by_others_is_refused(tmp_path):
    snap = make(tmp_path)
    with pytest.raises(ParameterError):
        cache.stage(snap, os.path.join(snap, "cache"))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(str(shared), 0o777)
    with pytest.raises(SnapshotError) as error:
        cache.stage(snap, str(shared / "stage"))
    assert "writable by group or others" in error.value.msg


def test_an_existing_cache_keeps_its_mode_and_one_others_can_write_is_refused_unchanged(tmp_path):
    """stage_dir: /var/cache (0755) was made 0700. The cache's entries are 0700 themselves; the directory that holds
    them is the operator's, used as it is -- or refused, naming stage_dir, when others could write it."""
    snap = make(tmp_path)
    shared = tmp_path / "cache755"
    shared.mkdir()
    os.chmod(str(shared), 0o755)
    (shared / "other.txt").write_text("keep me")
    result = cache.stage(snap, str(shared))
    assert result["changed"] and os.path.isdir(result["staged"]["dir"])
    assert stat.S_IMODE(os.stat(str(shared)).st_mode) == 0o755 and (shared / "other.txt").read_text() == "keep me"
    assert stat.S_IMODE(os.stat(entry_dir(str(shared), snap)).st_mode) == 0o700
    group = tmp_path / "cache775"
    group.mkdir()
    os.chmod(str(group), 0o775)
    with pytest.raises(SnapshotError) as error:
        cache.stage(snap, str(group))
    assert error.value.msg.startswith("stage_dir: %r is writable by group or others (mode 775); chmod 0700 it"
                                      % str(group)), error.value.msg
    assert stat.S_IMODE(os.stat(str(group)).st_mode) == 0o775 and os.listdir(str(group)) == []


def test_a_file_removed_by_a_writer_of_the_store_right_after_the_listing_is_unreadable_not_an_error(
        tmp_path, stage_dir, monkeypatch):
    snap = make(tmp_path)
    listed = manifest.list_files

    def listing_then_a_writer_removes_the_pages(root):
        relpaths = listed(root)  # the real listing, then the race it cannot see
        os.unlink(os.path.join(root, PAGES))
        return relpaths

    monkeypatch.setattr(cache.manifest, "list_files", listing_then_a_writer_removes_the_pages)
    with pytest.raises(SnapshotError) as error:
        cache.stage(snap, stage_dir)
    assert error.value.msg.startswith("unreadable: "), error.value.msg
    assert not os.path.exists(stage_dir)


def test_a_copy_that_does_not_verify_is_not_staged(tmp_path, stage_dir):
    snap = make(tmp_path)
    tamper_keeping_mtime(os.path.join(snap, PAGES))
    with pytest.raises(SnapshotError) as error:
        cache.stage(snap, stage_dir)
    assert "checksum_mismatch: %s" % PAGES in error.value.msg
    assert os.listdir(stage_dir) == []


def keys(tmp_path):
    key = Ed25519PrivateKey.generate()
    public = tmp_path / "trusted.pem"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    os.chmod(str(public), 0o600)
    return key, signature.load_public_keys([str(public)])


def test_a_signed_snapshot_is_staged_authenticated_and_an_unsigned_one_refused_with_trusted_keys(tmp_path, stage_dir):
    private, trusted = keys(tmp_path)
    signed = make(tmp_path, key=private)
    result = cache.stage(signed, stage_dir, trusted=trusted)
    assert result["authenticated"] is True and result["key_id"] in trusted
    assert layout.SIGNATURE in [item["path"] for item in
                                json.load(open(layout.stage_verdict(entry_dir(stage_dir, signed))))["files"]]
    unsigned = make(tmp_path, pod="pod-b")
    with pytest.raises(SnapshotError) as error:
        cache.stage(unsigned, stage_dir, trusted=trusted)
    assert "unsigned" in error.value.msg


# -- the restore pipeline with a stage_dir ------------------------------------------------------------

class Fake(Driver):
    """Everything of a restore but CRIU: the 'process' is the page image the host restore read."""

    path = "criu"
    engine = "docker"

    def __init__(self):
        super(Fake, self).__init__(identity=IDENTITY, criu_version="skip")
        self.world_now = None  # the fake manifests record no world
        self.read_from = None
        self.cold = False

    def host_restore(self, attempt):
        self.read_from = attempt.images_dir
        self.read_inode = os.stat(os.path.join(attempt.images_dir, os.path.basename(PAGES))).st_ino
        return os.getpid()

    def cold_start(self, attempt):
        self.cold = True


def restore(snap, stage_dir, **kwargs):
    driver = Fake()
    attempt = Attempt(snap, 30, device_restore=False, stage_dir=stage_dir, **kwargs)
    return driver, pipeline.run(driver, attempt)


def test_a_restore_from_a_staged_copy_hashes_no_content_and_reads_the_copy(tmp_path, stage_dir):
    snap = make(tmp_path, size=2000000)
    cache.stage(snap, stage_dir)
    driver, attempt = restore(snap, stage_dir)
    assert attempt.restored and not driver.cold, attempt.reason
    copy = layout.stage_content(entry_dir(stage_dir, snap))
    assert driver.read_from == layout.images_dir(copy)
    verdict = attempt.verdict
    assert verdict["checksums"] == "staged" and verdict["staged"]["dir"] == copy
    assert verdict["hashed_bytes"] == os.lstat(os.path.join(snap, layout.MANIFEST)).st_size, "only the manifest"
    assert cache.drop_entry(stage_dir, hashing.fingerprint(snap)) is True, "released at the end of the restore"


def test_a_tampered_copy_falls_back_to_the_full_verification_of_the_snapshot(tmp_path, stage_dir):
    snap = make(tmp_path)
    cache.stage(snap, stage_dir)
    tamper_keeping_mtime(os.path.join(layout.stage_content(entry_dir(stage_dir, snap)), PAGES))
    driver, attempt = restore(snap, stage_dir)
    assert attempt.restored and driver.read_inode == os.stat(os.path.join(snap, PAGES)).st_ino, \
        "restored from the snapshot itself (the very files the verification held)"
    assert driver.read_from != layout.images_dir(layout.stage_content(entry_dir(stage_dir, snap)))
    assert attempt.verdict["checksums"] == "verified" and attempt.verdict["staged"] is None
    assert "ctime_ns" in attempt.verdict["staged_miss"]
    assert attempt.verdict["hashed_bytes"] > 200000


def test_the_snapshot_itself_still_decides_signature_identity_and_fingerprint(tmp_path, stage_dir):
    private, trusted = keys(tmp_path)
    snap = make(tmp_path, key=private)
    cache.stage(snap, stage_dir, trusted=trusted)
    os.unlink(os.path.join(snap, layout.SIGNATURE))  # the snapshot asked for is unsigned now
    driver, attempt = restore(snap, stage_dir, trusted=trusted)
    assert not attempt.restored and driver.cold and attempt.reason.startswith("unsigned"), attempt.reason
    driver, attempt = restore(snap, stage_dir, checksum="f" * 64)
    assert not attempt.restored and "checksum_mismatch" in attempt.reason

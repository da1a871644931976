"""Chunk index: big files are verified chunk by chunk on all cores, every byte read once, and any
damage is still found (the index is itself covered by checksum.sha256 and the manifest)."""

import hashlib
import json
import os
import subprocess
import threading
import time

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import manifest as manifest_utils, seal
from unit.core.agent.test_lease import wait_until

IDENTITY = {"namespace": "default", "service": "svc", "instance": "p0", "pod": "pod-a"}
CHUNK = 64 * 1024
BIG = "host/criu/pages-1.img"


def fields():
    return {"identity": IDENTITY, "created_at": "2026-11-29T12:00:00Z", "image": {"id": "sha256:" + "ab" * 32, "name": "w:1"},
            "engine": {"name": "docker", "version": "20.10.24", "criu_version": "4.2.1"},
            "runtime": {"name": "ascend-acl", "version": "9.1.0"}, "devices": [0]}


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(manifest_utils, "CHUNK_BYTES", CHUNK)


def sealed(root, big=5 * CHUNK + 123, host=True):
    staging = root / "default" / "svc" / "p0" / ".pod-a.partial"
    final = root / "default" / "svc" / "p0" / "pod-a"
    (staging / "device").mkdir(parents=True)
    (staging / "device" / "device.json").write_text("{}")
    target = staging / (BIG if host else "device/pages-1.img")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(os.urandom(big))
    (target.parent / "inventory.img").write_bytes(b"x" * 100)
    manifest, _digest, stats = seal.seal(str(staging), fields())
    seal.publish(str(staging), str(final))
    return final, manifest, stats


def test_big_files_get_a_chunk_index_that_checksum_and_manifest_cover(tmp_path, small_chunks):
    final, manifest, _stats = sealed(tmp_path)
    index = json.loads((final / manifest_utils.CHUNK_INDEX).read_text())
    data = (final / BIG).read_bytes()
    assert index["chunk_bytes"] == CHUNK and list(index["files"]) == [BIG]
    entry = index["files"][BIG]
    assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert entry["chunks"] == [hashlib.sha256(data[o:o + CHUNK]).hexdigest() for o in range(0, len(data), CHUNK)]
    assert manifest_utils.CHUNK_INDEX in [f["path"] for f in manifest["files"]]
    proc = subprocess.run(["sha256sum", "-c", "--strict", "checksum.sha256"], cwd=final, capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and manifest_utils.CHUNK_INDEX in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("workers", [None, 1, 3])
def test_verify_checks_big_files_by_chunks_reading_every_byte_once(tmp_path, small_chunks, workers):
    final = sealed(tmp_path)[0]
    valid, reasons, details = manifest_utils.verify(str(final), expect={"identity": IDENTITY}, workers=workers)
    assert (valid, reasons) == (True, [])
    stats = details["hashing"]
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(final) for f in fs
                  if f != "checksum.sha256")
    assert stats["chunked_files"] == 1 and stats["chunks"] == 6
    # the documents (manifest, chunk index, ...) are read once apart, and kept: every byte is read once in all
    assert manifest_utils.CHUNK_INDEX in details["documents"] and manifest_utils.MANIFEST in details["documents"]
    assert stats["bytes"] == on_disk
    assert details["bytes"] == on_disk


def test_a_snapshot_sealed_with_other_chunks_verifies_by_its_own_index(tmp_path, monkeypatch):
    # Sealed by a release with 4x larger chunks (64 MiB before 16 MiB): the index says its size, the check uses it.
    monkeypatch.setattr(manifest_utils, "CHUNK_BYTES", 4 * CHUNK)
    final = sealed(tmp_path, big=9 * CHUNK + 5)[0]
    monkeypatch.setattr(manifest_utils, "CHUNK_BYTES", CHUNK)
    valid, reasons, details = manifest_utils.verify(str(final), expect={"identity": IDENTITY})
    assert (valid, reasons) == (True, [])
    assert details["hashing"]["chunked_files"] == 1 and details["hashing"]["chunks"] == 3
    data = bytearray((final / BIG).read_bytes())
    data[8 * CHUNK] ^= 1  # in the third of its own chunks
    (final / BIG).write_bytes(bytes(data))
    valid, reasons, _details = manifest_utils.verify(str(final), expect={"identity": IDENTITY})
    assert not valid and any(BIG in reason for reason in reasons), reasons


@pytest.mark.parametrize("offset", [0, CHUNK - 1, 3 * CHUNK + 7, 5 * CHUNK + 122])
def test_one_flipped_byte_in_any_chunk_is_found(tmp_path, small_chunks, offset):
    final = sealed(tmp_path)[0]
    with open(final / BIG, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))
    valid, reasons = manifest_utils.verify(str(final))[:2]
    assert not valid and reasons == ["checksum_mismatch: %s" % BIG]


@pytest.mark.parametrize("size", [5 * CHUNK, 5 * CHUNK + 124, 0])
def test_truncated_or_grown_big_file_is_found(tmp_path, small_chunks, size):
    final = sealed(tmp_path)[0]
    with open(final / BIG, "r+b") as handle:
        handle.truncate(size)
    valid, reasons = manifest_utils.verify(str(final))[:2]
    assert not valid and reasons[0] == "checksum_mismatch: %s" % BIG, reasons


def test_tampered_index_is_reported_and_the_data_still_checked_whole(tmp_path, small_chunks):
    final = sealed(tmp_path)[0]
    path = final / manifest_utils.CHUNK_INDEX
    index = json.loads(path.read_text())
    index["files"][BIG]["chunks"][2] = "0" * 64
    path.write_text(json.dumps(index))
    valid, reasons, details = manifest_utils.verify(str(final))
    assert not valid and reasons == ["checksum_mismatch: %s" % manifest_utils.CHUNK_INDEX]
    assert details["hashing"]["chunked_files"] == 0  # an index that does not match its checksum is not used


def test_index_and_its_checksum_line_rewritten_still_fail(tmp_path, small_chunks):
    """Someone rewrites the index to claim other chunk digests and fixes its checksum line: the manifest,
    which records the index's digest, disagrees, and the data is checked whole against checksum.sha256."""
    final = sealed(tmp_path)[0]
    path = final / manifest_utils.CHUNK_INDEX
    index = json.loads(path.read_text())
    index["files"][BIG]["sha256"] = "1" * 64
    path.write_text(json.dumps(index))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sums = [("%s  %s" % (digest, manifest_utils.CHUNK_INDEX)) if line.endswith(manifest_utils.CHUNK_INDEX) else line
            for line in (final / "checksum.sha256").read_text().splitlines()]
    (final / "checksum.sha256").write_text("\n".join(sums) + "\n")
    valid, reasons, details = manifest_utils.verify(str(final))
    assert not valid and reasons == ["manifest_mismatch: %s differs from the manifest's record" % manifest_utils.CHUNK_INDEX]
    assert details["hashing"]["chunked_files"] == 0


def test_no_host_part_means_no_index_and_whole_file_verification(tmp_path, small_chunks):
    final = sealed(tmp_path, host=False)[0]
    assert not (final / manifest_utils.CHUNK_INDEX).exists()
    valid, reasons, details = manifest_utils.verify(str(final))
    assert (valid, reasons) == (True, []) and details["hashing"]["chunked_files"] == 0


def test_resealing_without_big_files_drops_a_stale_index(tmp_path, small_chunks):
    staging = tmp_path / "s" / ".pod-a.partial"
    (staging / "host" / "criu").mkdir(parents=True)
    (staging / BIG).write_bytes(os.urandom(3 * CHUNK))
    seal.seal(str(staging), fields())
    assert (staging / manifest_utils.CHUNK_INDEX).exists()
    (staging / BIG).write_bytes(b"small now")
    seal.seal(str(staging), fields())
    assert not (staging / manifest_utils.CHUNK_INDEX).exists()
    final = tmp_path / "s" / "pod-a"
    seal.publish(str(staging), str(final))
    assert manifest_utils.verify(str(final))[:2] == (True, [])


def test_file_exactly_one_chunk_is_hashed_whole(tmp_path, small_chunks):
    final = sealed(tmp_path, big=CHUNK)[0]
    assert not (final / manifest_utils.CHUNK_INDEX).exists()
    assert manifest_utils.verify(str(final))[:2] == (True, [])


def write_slowly(path, data, step, pause=0.002):
    with open(path, "wb") as handle:
        for offset in range(0, len(data), step):
            handle.write(data[offset:offset + step])
            handle.flush()
            time.sleep(pause)


def test_follower_hashes_files_while_they_are_written(tmp_path, small_chunks):
    images = tmp_path / "host" / "criu"
    images.mkdir(parents=True)
    big = os.urandom(7 * CHUNK + 999)
    other = os.urandom(2 * CHUNK)
    follower = seal.Follower(str(images), prefix="host/criu", min_size=CHUNK // 2).start()
    writers = [threading.Thread(target=write_slowly, args=(str(images / "pages-1.img"), big, 4096)),
               threading.Thread(target=write_slowly, args=(str(images / "pages-2.img"), other, 8192))]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    (images / "inventory.img").write_bytes(b"small")  # below min_size: left to the seal
    known = follower.finish()
    assert sorted(known) == ["host/criu/pages-1.img", "host/criu/pages-2.img"]
    size, digest, chunks = known["host/criu/pages-1.img"]
    assert (size, digest) == (len(big), hashlib.sha256(big).hexdigest())
    assert chunks == [hashlib.sha256(big[o:o + CHUNK]).hexdigest() for o in range(0, len(big), CHUNK)]
    assert known["host/criu/pages-2.img"][2] == [hashlib.sha256(other[o:o + CHUNK]).hexdigest() for o in (0, CHUNK)]

    before = seal.seal(str(tmp_path), fields(), known=known)
    again = seal.seal(str(tmp_path), fields())
    assert before[2]["followed_files"] == 2 and before[2]["followed_bytes"] == len(big) + len(other)
    assert again[2]["followed_files"] == 0
    assert (tmp_path / "checksum.sha256").read_text()  # same digests either way
    assert before[0]["files"] == again[0]["files"]


def test_follower_leaves_out_a_file_that_shrank_and_seal_rehashes_stale_digests(tmp_path, small_chunks):
    images = tmp_path / "host" / "criu"
    images.mkdir(parents=True)
    follower = seal.Follower(str(images), prefix="host/criu", min_size=CHUNK // 2).start()
    (images / "pages-1.img").write_bytes(os.urandom(3 * CHUNK))
    deadline = time.monotonic() + 60  # the follower runs at nice 19 while the writer runs: on a loaded machine, late
    while follower.hashed_bytes("pages-1.img") < 3 * CHUNK:  # it has hashed past where the file is cut to
        assert time.monotonic() < deadline, "the follower never read the file"
        time.sleep(0.01)
    with open(images / "pages-1.img", "r+b") as handle:
        handle.truncate(CHUNK)
    known = follower.finish()
    assert known == {}
    stale = {"host/criu/pages-1.img": (CHUNK, "0" * 64, ["0" * 64])}
    manifest, _digest, stats = seal.seal(str(tmp_path), fields(), known=stale)
    assert stats["followed_files"] == 1  # same size: taken as hashed during the checkpoint...
    stale = {"host/criu/pages-1.img": (CHUNK + 1, "0" * 64, ["0" * 64])}
    manifest, _digest, stats = seal.seal(str(tmp_path), fields(), known=stale)
    assert stats["followed_files"] == 0  # ...a different size is hashed again
    assert manifest["files"][0]["sha256"] == hashlib.sha256((images / "pages-1.img").read_bytes()).hexdigest()


def test_follower_abort_stops_everything(tmp_path):
    images = tmp_path / "criu"
    images.mkdir()
    follower = seal.Follower(str(images), min_size=16).start()
    (images / "pages-1.img").write_bytes(b"x" * 100)
    time.sleep(0.1)
    follower.abort()
    assert not any(t.name.startswith("inferops-follow") for t in threading.enumerate())


def test_follower_yields_the_cpu_to_the_writer_and_catches_up_at_its_own_priority(tmp_path, small_chunks, monkeypatch):
    """While CRIU writes, the hashing threads run at nice 19 (on a 2-core node they would take a core from CRIU and
    lengthen the engine's lock window) and nothing is flushed (writeback beside CRIU's writes made the dump 2-3x
    slower); finish() puts them back at the process's priority, and flush() -- once the writer is done -- writes the
    followed files out while their hashing catches up."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink("/proc/self/fd/%d" % fd)) or real(fd))
    images = tmp_path / "criu"
    images.mkdir()
    follower = seal.Follower(str(images), min_size=CHUNK // 2, poll=0.01).start()
    own = os.getpriority(os.PRIO_PROCESS, 0)
    path = images / "pages-1.img"
    with open(path, "wb") as handle:
        handle.write(os.urandom(2 * CHUNK))
        handle.flush()
        lowered, _waited = wait_until(lambda: list(follower.threads), 30, "the hashing threads")  # niced
        assert all(os.getpriority(os.PRIO_PROCESS, thread) == 19 for thread in lowered)
        live = list(follower.threads)
        follower._catch_up()  # what finish() does first, observed while the threads still run
        restored = own if os.geteuid() == 0 else 19  # raising a priority back needs CAP_SYS_NICE
        assert all(os.getpriority(os.PRIO_PROCESS, thread) == restored for thread in live)
        assert follower.threads == []
        handle.write(b"tail")
    assert synced == [], "nothing is flushed while the writer runs"
    follower.flush()
    known = follower.finish()
    assert synced == [str(path)], "the followed file is flushed once the writer is done"
    data = path.read_bytes()
    assert known["pages-1.img"][:2] == (len(data), hashlib.sha256(data).hexdigest())
    assert os.getpriority(os.PRIO_PROCESS, 0) == own  # the caller's own thread never changed

import hashlib
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import (manifest as manifest_utils, seal,
                                                                                   status)

IDENTITY = {"namespace": "default", "service": "svc", "instance": "p0", "pod": "pod-a"}
IMAGE = "sha256:" + "ab" * 32


def fields(**over):
    base = {"identity": IDENTITY, "created_at": "2026-11-29T12:00:00Z", "image": {"id": IMAGE, "name": "w:1"},
            "engine": {"name": "docker", "version": "20.10.24", "criu_version": "4.2.1"},
            "runtime": {"name": "ascend-acl", "version": "9.1.0"}, "devices": [0]}
    base.update(over)
    return base


def make_snapshot(root, sizes=(3000, 70000, 0)):
    return sealed_snapshot(root, sizes)[0]


def sealed_snapshot(root, sizes=(3000, 70000, 0)):
    final = root / "default" / "svc" / "p0" / "pod-a"
    staging = root / "default" / "svc" / "p0" / ".pod-a.partial"
    (staging / "host").mkdir(parents=True)
    (staging / "device").mkdir()
    for index, size in enumerate(sizes):
        (staging / "host" / ("pages-%d.img" % index)).write_bytes(os.urandom(size))
    (staging / "device" / "device.json").write_text("{}")
    manifest, digest, stats = seal.seal(str(staging), fields())
    seal.publish(str(staging), str(final))
    return final, manifest, digest


def test_sealed_snapshot_verifies_and_sha256sum_agrees(tmp_path):
    final, manifest, digest = sealed_snapshot(tmp_path)
    assert not (tmp_path / "default/svc/p0/.pod-a.partial").exists()
    valid, reasons, details = manifest_utils.verify(str(final), min_size=1000, expect={"identity": IDENTITY})
    assert (valid, reasons) == (True, [])
    assert details["files"] == 5  # 3 host files, device.json, manifest.json
    assert manifest["total_bytes"] == 3000 + 70000 + 0 + 2
    proc = subprocess.run(["sha256sum", "-c", "--strict", "checksum.sha256"], cwd=final, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert digest == hashlib.sha256((final / "checksum.sha256").read_bytes()).hexdigest()


def test_one_corrupted_byte_is_found(tmp_path):
    final = make_snapshot(tmp_path)
    target = final / "host" / "pages-1.img"
    data = bytearray(target.read_bytes())
    data[12345] ^= 0x01
    target.write_bytes(bytes(data))
    valid, reasons = manifest_utils.verify(str(final))[:2]
    assert not valid and reasons == ["checksum_mismatch: host/pages-1.img"]


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: (d / "host" / "pages-0.img").unlink(), "file_missing: host/pages-0.img"),
    (lambda d: (d / "host" / "extra.img").write_bytes(b"x"), "file_unlisted: host/extra.img"),
    (lambda d: (d / "checksum.sha256").unlink(), "incomplete: checksum.sha256 is missing"),
    (lambda d: (d / "manifest.json").unlink(), "incomplete: manifest.json is missing"),
    (lambda d: (d / "checksum.sha256").write_text("garbage\n"), "checksum_unreadable"),
    (lambda d: (d / "host" / "link").symlink_to("/etc/passwd"), "unsafe_file"),
])
def test_tampering_is_reported(tmp_path, mutate, expected):
    final = make_snapshot(tmp_path)
    mutate(final)
    valid, reasons = manifest_utils.verify(str(final))[:2]
    assert not valid
    assert any(reason.startswith(expected) for reason in reasons), reasons


def test_manifest_rewritten_with_fixed_checksums_still_fails_schema(tmp_path):
    final = make_snapshot(tmp_path)
    manifest = json.loads((final / "manifest.json").read_text())
    del manifest["identity"]
    (final / "manifest.json").write_text(json.dumps(manifest))
    sums = (final / "checksum.sha256").read_text().splitlines()
    digest = hashlib.sha256((final / "manifest.json").read_bytes()).hexdigest()
    sums = [("%s  manifest.json" % digest) if line.endswith("manifest.json") else line for line in sums]
    (final / "checksum.sha256").write_text("\n".join(sums) + "\n")
    valid, reasons = manifest_utils.verify(str(final))[:2]
    assert not valid and reasons[0].startswith("manifest_invalid:"), reasons


@pytest.mark.parametrize("expect, expected", [
    ({"identity": dict(IDENTITY, pod="pod-b")}, "identity_mismatch"),
    ({"image_id": "sha256:" + "cd" * 32}, "image_mismatch"),
    ({"criu_version": "3.17.1"}, "criu_mismatch"),
    ({"runtime_version": "9.2.0"}, "runtime_mismatch"),
])
def test_stale_or_foreign_snapshots_are_invalid(tmp_path, expect, expected):
    final = make_snapshot(tmp_path)
    valid, reasons = manifest_utils.verify(str(final), expect=expect)[:2]
    assert not valid and reasons[0].startswith(expected), reasons


def test_same_criu_major_is_compatible(tmp_path):
    final = make_snapshot(tmp_path)
    assert manifest_utils.verify(str(final), expect={"criu_version": "4.3.0"})[0]


def test_too_small_and_missing(tmp_path):
    final = make_snapshot(tmp_path, sizes=(10,))
    valid, reasons = manifest_utils.verify(str(final), min_size=10 ** 6)[:2]
    assert not valid and reasons[0].startswith("too_small")
    valid, reasons = manifest_utils.verify(str(tmp_path / "nope"))[:2]
    assert not valid and reasons[0].startswith("missing")


def test_publish_replaces_an_older_snapshot_without_leftovers(tmp_path):
    final = make_snapshot(tmp_path)
    final2, second = sealed_snapshot(tmp_path, sizes=(5,))[:2]
    assert final == final2 and second["total_bytes"] == 7
    assert sorted(os.listdir(final.parent)) == ["pod-a"]


def test_status_record_keeps_history(tmp_path):
    target = str(tmp_path / "s" / "pod-a")
    status.update(target, "generating")
    record = status.update(target, "failed", reason="host snapshot failed")
    assert record["status"] == "failed" and record["reason"] == "host snapshot failed"
    assert [h["status"] for h in record["history"]] == ["generating", "failed"]
    assert status.read(target)["status"] == "failed"
    assert oct(os.stat(layout.status_path(target)).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("line", ["%s  /etc/passwd" % ("a" * 64), "%s  ../x" % ("a" * 64), "abc  x"])
def test_checksum_parser_rejects_unsafe_lines(line):
    with pytest.raises(manifest_utils.ChecksumFormatError):
        manifest_utils.parse_checksums(line + "\n")


def test_concurrent_status_writers_lose_nothing(tmp_path):
    """A restore recorded by the node runtime while a module rewrites the status: both changes survive."""
    target = str(tmp_path / "ns" / "snap")
    status.update(target, "completed")
    script = ("import sys; sys.path[:0] = %r\n"
              "from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status as s\n"
              "s.KEEP_RESTORES = s.KEEP_HISTORY = 100\n"
              "for i in range(40):\n"
              "    if sys.argv[1] == 'restore':\n"
              "        s.update(%r, restore=s.restore_entry('runtime', 'restored', pid=i + 1))\n"
              "    else:\n"
              "        s.update(%r, 'completed', reason='r%%d' %% i)\n") % (sys.path, target, target)
    writers = [subprocess.Popen([sys.executable, "-c", script, kind]) for kind in ("restore", "status")]
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    record = status.read(target)
    assert [r["pid"] for r in record["restores"]] == list(range(1, 41))
    assert [h["reason"] for h in record["history"][1:]] == ["r%d" % i for i in range(40)]


def test_sizes_only_verification_leaves_content_to_the_next_reader(tmp_path):
    """SIZES_ONLY (a verified copy, snapshot_info verify=false): all but
    the content is checked, and the result says the content was not."""
    final = make_snapshot(tmp_path)
    pages = final / "host" / "pages-1.img"
    pages.write_bytes(b"y" * 70000)  # same size, other content
    valid, reasons, details = manifest_utils.verify(str(final), expect={"identity": IDENTITY}, plan=manifest_utils.SIZES_ONLY)
    assert valid and details["checksums"] == "sizes only", reasons
    valid, reasons, details = manifest_utils.verify(str(final))
    assert not valid and reasons == ["checksum_mismatch: host/pages-1.img"] and details["checksums"] == "verified"
    pages.write_bytes(b"y" * 69999)  # a size change is caught either way
    valid, reasons, _details = manifest_utils.verify(str(final), plan=manifest_utils.SIZES_ONLY)
    assert not valid and any(r.startswith("manifest_mismatch: host/pages-1.img") for r in reasons), reasons
    other = dict(IDENTITY, pod="pod-b")
    valid, reasons, _details = manifest_utils.verify(str(make_snapshot(tmp_path / "again")), expect={"identity": other},
                                                     plan=manifest_utils.SIZES_ONLY)
    assert not valid and reasons[0].startswith("identity_mismatch"), reasons


def images_snapshot(root):
    """A snapshot whose CRIU images are a page image (deferred by OVERLAPPED) and a core image (hashed at once)."""
    final = root / "default" / "svc" / "p0" / "pod-a"
    staging = root / "default" / "svc" / "p0" / ".pod-a.partial"
    (staging / "host" / "criu").mkdir(parents=True)
    (staging / "host" / "criu" / "pages-1.img").write_bytes(os.urandom(70000))
    (staging / "host" / "criu" / "core-1.img").write_bytes(os.urandom(3000))
    seal.seal(str(staging), fields())
    seal.publish(str(staging), str(final))
    return final


@pytest.mark.parametrize("damage, found_now, found_later", [
    (None, [], []),
    ("flip pages", [], ["checksum_mismatch: host/criu/pages-1.img"]),  # content: only the deferred check sees it
    ("truncate pages", ["manifest_mismatch: host/criu/pages-1.img differs from the manifest's record"], None),  # a size
    ("flip other", ["checksum_mismatch: host/criu/core-1.img"], None),  # not deferred: checked at once
])
def test_deferred_files_are_sized_now_and_hashed_later(tmp_path, damage, found_now, found_later):
    final = images_snapshot(tmp_path)
    pages = final / "host" / "criu" / "pages-1.img"
    if damage == "flip pages" or damage == "flip other":
        target = pages if damage == "flip pages" else final / "host" / "criu" / "core-1.img"
        data = bytearray(target.read_bytes())
        data[100] ^= 0x01
        target.write_bytes(bytes(data))
    elif damage == "truncate pages":
        pages.write_bytes(pages.read_bytes()[:-1])
    valid, reasons, details = manifest_utils.verify(str(final), plan=manifest_utils.OVERLAPPED)
    assert reasons == found_now and valid is (not found_now)
    if found_later is None:
        return
    assert sorted(details["deferred"]["listed"]) == ["host/criu/pages-1.img"]
    assert details["hashing"]["bytes"] < 70000, "the deferred file was not read now"
    later, stats = manifest_utils.verify_deferred(str(final), details["deferred"])
    assert later == found_later and stats["bytes"] == 70000


def test_is_page_image_names_only_crius_page_images():
    assert layout.is_page_image("host/criu/pages-1.img")
    assert not layout.is_page_image("host/criu/pagemap-1.img")
    assert not layout.is_page_image("host/criu/sub/pages-1.img")
    assert not layout.is_page_image("device/pages-1.img")


def test_a_snapshot_records_its_format_and_a_restore_reads_only_its_own(tmp_path):
    """The compatibility rule compares the snapshot's own format version, not the release of the collection that
    wrote it: a manifest of another format (or none: before 0.4.0, format 1) is format_mismatch, whichever release."""
    final, recorded, _digest = sealed_snapshot(tmp_path)
    assert recorded["format_version"] == layout.SNAPSHOT_FORMAT and manifest_utils.format_reason(recorded) is None
    older = dict(recorded)
    del older["format_version"]
    assert manifest_utils.format_reason(older).startswith(
        "format_mismatch: the snapshot is of format 1 (made by inferops.snapshot before 0.4.0), this collection "
        "restores format %d" % layout.SNAPSHOT_FORMAT)
    newer = dict(recorded, format_version=layout.SNAPSHOT_FORMAT + 1)
    assert manifest_utils.format_reason(newer).startswith("format_mismatch: the snapshot is of format %d"
                                                          % (layout.SNAPSHOT_FORMAT + 1))

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Manifest, checksums and verification of published snapshots. PRIVATE to inferops.snapshot.

A published snapshot directory holds ``manifest.json`` (schemas/manifest.schema.json),
``checksum.sha256`` (``sha256sum -c`` format, one line per file, the manifest included) and the
device and host parts. Verification reads every file exactly once, hashing files in parallel.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import re
import stat
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.inferops.snapshot.plugins.module_utils import _schema as schema

MANIFEST = "manifest.json"
CHECKSUMS = "checksum.sha256"
CHUNK = 1024 * 1024
_CHECKSUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


class ChecksumFormatError(ValueError):
    pass


def list_files(root):
    """Relative paths of the regular files below ``root``, sorted; symlinks and specials refused."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in dirs + files:
            full = os.path.join(directory, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ValueError("%s is not a regular file or directory; a snapshot holds only plain files"
                                 % os.path.relpath(full, root))
        for name in sorted(files):
            found.append(os.path.relpath(os.path.join(directory, name), root))
    return found


def _hash_one(path):
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb", buffering=0) as handle:
        size = 0
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            n = handle.readinto(buf)
            if not n:
                break
            digest.update(view[:n])  # hashlib releases the GIL: files hash in parallel threads
            size += n
    return size, digest.hexdigest()


def hash_files(root, relpaths, workers=None, progress=None):
    """{relpath: (size, sha256)} hashing files in parallel, each read once.

    ``progress(done_bytes, done_files)`` is called as files complete. Returns (hashes, stats).
    """
    workers = workers or max(1, min(len(relpaths), os.cpu_count() or 1))
    started = time.monotonic()
    results = {}
    done_bytes = 0
    # Largest first so one big file does not start last and hold up the end.
    order = sorted(relpaths, key=lambda rel: -os.lstat(os.path.join(root, rel)).st_size)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {rel: pool.submit(_hash_one, os.path.join(root, rel)) for rel in order}
        for rel in order:
            results[rel] = futures[rel].result()
            done_bytes += results[rel][0]
            if progress:
                progress(done_bytes, len(results))
    elapsed = time.monotonic() - started
    stats = {"bytes": done_bytes, "files": len(results), "seconds": round(elapsed, 6), "workers": workers,
             "throughput_mb_s": round(done_bytes / 1e6 / elapsed, 1) if elapsed > 0 else None}
    return results, stats


def format_checksums(hashes):
    return "".join("%s  %s\n" % (hashes[rel][1], rel) for rel in sorted(hashes))


def parse_checksums(text):
    """{relpath: sha256} from ``sha256sum`` output; malformed or unsafe lines raise ChecksumFormatError."""
    entries = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _CHECKSUM_LINE.match(line)
        if not match:
            raise ChecksumFormatError("line %d is not '<sha256>  <path>'" % number)
        digest, rel = match.groups()
        if rel.startswith("/") or ".." in rel.split("/") or rel in entries:
            raise ChecksumFormatError("line %d names an absolute, parent or repeated path %r" % (number, rel))
        entries[rel] = digest
    return entries


def manifest_files(hashes, exclude=(MANIFEST, CHECKSUMS)):
    files = [{"path": rel, "size": hashes[rel][0], "sha256": hashes[rel][1]} for rel in sorted(hashes)
             if rel not in exclude]
    return files, sum(item["size"] for item in files)


def load_manifest(directory):
    with open(os.path.join(directory, MANIFEST)) as handle:
        return json.load(handle)


def criu_major(version):
    match = re.match(r"\s*(\d+)", version or "")
    return int(match.group(1)) if match else None


def verify(directory, min_size=0, expect=None, workers=None, progress=None):
    """Check a published snapshot. Returns (valid, reasons, details); never raises for bad snapshots.

    ``expect`` may hold ``identity``, ``image_id``, ``criu_version``, ``runtime_version``: what
    the restore would run with. A key whose value is None is not checked.
    """
    expect = expect or {}
    reasons = []
    details = {"path": directory, "bytes": 0, "files": 0, "hashing": None, "manifest": None}
    if not os.path.isdir(directory):
        return False, ["missing: no snapshot at %s" % directory], details
    for name in (MANIFEST, CHECKSUMS):
        if not os.path.isfile(os.path.join(directory, name)):
            reasons.append("incomplete: %s is missing" % name)
    if reasons:
        return False, reasons, details

    try:
        with open(os.path.join(directory, CHECKSUMS)) as handle:
            listed = parse_checksums(handle.read())
    except (ChecksumFormatError, UnicodeDecodeError) as exc:
        return False, ["checksum_unreadable: %s: %s" % (CHECKSUMS, exc)], details
    try:
        present = set(list_files(directory)) - {CHECKSUMS}
    except ValueError as exc:
        return False, ["unsafe_file: %s" % exc], details
    for rel in sorted(set(listed) - present):
        reasons.append("file_missing: %s is listed in %s but absent" % (rel, CHECKSUMS))
    for rel in sorted(present - set(listed)):
        reasons.append("file_unlisted: %s is not covered by %s" % (rel, CHECKSUMS))

    to_hash = sorted(set(listed) & present)
    hashes, stats = hash_files(directory, to_hash, workers=workers, progress=progress)
    details["hashing"] = stats
    details["files"] = len(hashes)
    details["bytes"] = stats["bytes"]
    corrupted = set(rel for rel in to_hash if hashes[rel][1] != listed[rel])
    reasons.extend("checksum_mismatch: %s" % rel for rel in sorted(corrupted))

    manifest = None
    if MANIFEST in hashes:
        try:
            manifest = load_manifest(directory)
        except ValueError as exc:
            reasons.append("manifest_invalid: %s is not JSON: %s" % (MANIFEST, exc))
    if manifest is not None:
        problems = schema.errors("manifest", manifest)
        reasons.extend("manifest_invalid: %s" % problem for problem in problems[:5])
        if not problems:
            details["manifest"] = manifest
            reasons.extend(_compare(manifest, hashes, expect, corrupted))
    if stats["bytes"] < min_size:
        reasons.append("too_small: %d bytes in total, below the minimum of %d" % (stats["bytes"], min_size))
    return not reasons, reasons, details


def _compare(manifest, hashes, expect, already_reported):
    reasons = []
    for item in manifest["files"]:
        got = hashes.get(item["path"])
        if got is not None and item["path"] not in already_reported and (got[0] != item["size"] or got[1] != item["sha256"]):
            reasons.append("manifest_mismatch: %s differs from the manifest's record" % item["path"])
    if expect.get("identity") is not None and manifest["identity"] != expect["identity"]:
        reasons.append("identity_mismatch: snapshot belongs to %s, not %s"
                       % (_identity_str(manifest["identity"]), _identity_str(expect["identity"])))
    image = (manifest.get("image") or {}).get("id")
    if expect.get("image_id") is not None and image != expect["image_id"]:
        reasons.append("image_mismatch: snapshot was taken from image %s, the container would run %s"
                       % (image, expect["image_id"]))
    wanted_criu = criu_major(expect.get("criu_version"))
    taken_criu = criu_major(manifest["engine"].get("criu_version"))
    if wanted_criu is not None and taken_criu != wanted_criu:
        reasons.append("criu_mismatch: snapshot was taken with CRIU %s, this host has %s"
                       % (manifest["engine"].get("criu_version"), expect["criu_version"]))
    if expect.get("runtime_version") is not None and manifest["runtime"]["version"] != expect["runtime_version"]:
        reasons.append("runtime_mismatch: snapshot was taken with ACL runtime %s, the engine would load %s"
                       % (manifest["runtime"]["version"], expect["runtime_version"]))
    return reasons


def _identity_str(identity):
    return "/".join(identity[key] for key in ("namespace", "service", "instance", "pod"))

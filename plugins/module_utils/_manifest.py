# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Manifest, checksums and verification of published snapshots. PRIVATE to inferops.snapshot.

A published snapshot directory holds ``manifest.json`` (schemas/manifest.schema.json),
``checksum.sha256`` (``sha256sum -c`` format, one line per file, the manifest included) and the
device and host parts. Files larger than CHUNK_BYTES also get per-chunk digests in the chunk index
``host/chunks.json`` (itself listed in ``checksum.sha256``), so verification hashes a multi-GB page
image on all cores at once. Verification reads every byte exactly once.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import re
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.inferops.snapshot.plugins.module_utils import _paths as paths
from ansible_collections.inferops.snapshot.plugins.module_utils import _schema as schema

MANIFEST = "manifest.json"
CHECKSUMS = "checksum.sha256"
# Per-chunk SHA-256 digests of the big files (the CRIU page images), so that verification hashes one
# big file on all cores; it lives in the host part and is listed in checksum.sha256 like any file.
CHUNK_INDEX = "host/chunks.json"
CHUNK_BYTES = 64 * 1024 * 1024
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


def _hash_range(path, offset=0, length=None):
    """(bytes read, sha256) of ``length`` bytes of ``path`` from ``offset`` (to the end when None)."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, offset, length or 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead when cold
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        done = 0
        while length is None or done < length:
            want = CHUNK if length is None else min(CHUNK, length - done)
            n = os.preadv(fd, [view[:want]], offset + done)
            if not n:
                break
            digest.update(view[:n])  # hashlib releases the GIL: files and chunks hash in parallel threads
            done += n
    finally:
        os.close(fd)
    return done, digest.hexdigest()


def _hash_one(path):
    return _hash_range(path)


def hash_tree(root, whole, chunked=None, workers=None, progress=None):
    """Hash files in parallel threads: ``whole`` relpaths as one stream each, ``chunked`` ({relpath:
    chunk_bytes}) chunk by chunk, so that one big file is hashed on every core at once.

    Returns (results {relpath: (size, sha256)} for ``whole``, chunks {relpath: [(length, sha256), ...]}
    for ``chunked``, stats). ``progress(done_bytes, done_jobs)`` is called as jobs complete. A file in
    both is read twice (sealing does that, from the page cache the checkpoint just filled); verification
    reads every byte once.
    """
    chunked = chunked or {}
    jobs = []
    for rel in whole:
        size = os.lstat(os.path.join(root, rel)).st_size
        jobs.append((rel, None, 0, None, (1 if rel in chunked else 0, size)))
    for rel, chunk_bytes in chunked.items():
        size = os.lstat(os.path.join(root, rel)).st_size
        for index, offset in enumerate(range(0, max(size, 1), chunk_bytes)):
            length = min(chunk_bytes, size - offset)
            jobs.append((rel, index, offset, length, (0, length)))
    # Longest first (a whole-file digest of a chunked file is the one serial job): nothing long starts last.
    jobs.sort(key=lambda job: job[4], reverse=True)
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    started = time.monotonic()
    results, chunks, done_bytes = {}, {}, 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [(job, pool.submit(_hash_range, os.path.join(root, job[0]), job[2], job[3])) for job in jobs]
        for count, (job, future) in enumerate(futures, 1):
            got = future.result()
            if job[1] is None:
                results[job[0]] = got
            else:
                chunks.setdefault(job[0], {})[job[1]] = got
            done_bytes += got[0]
            if progress:
                progress(done_bytes, count)
    chunks = dict((rel, [parts[i] for i in sorted(parts)]) for rel, parts in chunks.items())
    elapsed = time.monotonic() - started
    stats = {"bytes": done_bytes, "files": len(set(results) | set(chunks)), "chunks": sum(len(c) for c in chunks.values()),
             "seconds": round(elapsed, 6), "workers": workers,
             "throughput_mb_s": round(done_bytes / 1e6 / elapsed, 1) if elapsed > 0 else None}
    return results, chunks, stats


def hash_files(root, relpaths, workers=None, progress=None):
    """{relpath: (size, sha256)} hashing whole files in parallel, each read once. Returns (hashes, stats)."""
    results, _chunks, stats = hash_tree(root, relpaths, None, workers, progress)
    return results, stats


def seal_hashes(root, relpaths, workers=None, progress=None, chunk_bytes=None, known=None):
    """Hashes for sealing a snapshot: every file whole (for checksum.sha256), and, when the snapshot has a
    host part, per-chunk digests of every file larger than ``chunk_bytes``, written to the chunk index
    (CHUNK_INDEX), which is itself hashed and returned with the rest. Returns (hashes, stats).

    ``known`` ({relpath: (size, sha256, chunk digests)}, from a Follower with the same chunk size) are
    taken as they are when the file still has that size; only the other files are read.
    """
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    index_path = os.path.join(root, CHUNK_INDEX)
    if os.path.lexists(index_path):
        os.unlink(index_path)  # a leftover of an earlier seal: rebuilt from the files as they are now
    relpaths = [rel for rel in relpaths if rel != CHUNK_INDEX]
    chunked = {}
    if os.path.isdir(os.path.dirname(index_path)):
        chunked = dict((rel, chunk_bytes) for rel in relpaths if os.lstat(os.path.join(root, rel)).st_size > chunk_bytes)
    known = dict((rel, item) for rel, item in (known or {}).items()
                 if rel in relpaths and os.lstat(os.path.join(root, rel)).st_size == item[0]
                 and (rel not in chunked or len(item[2]) == (item[0] + chunk_bytes - 1) // chunk_bytes))
    results, chunks, stats = hash_tree(root, [rel for rel in relpaths if rel not in known],
                                       dict((rel, c) for rel, c in chunked.items() if rel not in known), workers, progress)
    for rel, (size, digest, parts) in known.items():
        results[rel] = (size, digest)
        if rel in chunked:
            chunks[rel] = [(min(chunk_bytes, size - i * chunk_bytes), d) for i, d in enumerate(parts)]
    stats["followed_files"] = len(known)
    stats["followed_bytes"] = sum(item[0] for item in known.values())
    if chunked:
        files = {}
        for rel in sorted(chunked):
            size, digest = results[rel]
            if sum(length for length, _d in chunks[rel]) != size:
                raise ValueError("%s changed while it was being hashed" % rel)
            files[rel] = {"size": size, "sha256": digest, "chunks": [d for _length, d in chunks[rel]]}
        data = (json.dumps({"version": 1, "chunk_bytes": chunk_bytes, "files": files}, indent=1, sort_keys=True) + "\n").encode()
        paths.write_file_atomic(index_path, data)
        results[CHUNK_INDEX] = (len(data), hashlib.sha256(data).hexdigest())
    return results, stats


class Follower(object):
    """Hashes the big files of a directory while another process writes them, so that sealing does not
    read them again (the checkpoint's page images, read from the page cache while they are still there).

    CRIU and tar write their image files front to back and never go back; that is the assumption.
    A file is followed once it reaches ``min_size``: one thread reads it as it grows and keeps the
    whole-file digest, and each chunk, once written, is hashed by a pool thread. Call ``finish()``
    after the writer has exited: the followers read on to the end of each file and the results are
    returned as {relpath: (size, sha256, [chunk sha256, ...])}. Anything that went wrong with a file
    (it shrank, vanished, could not be read) just leaves it out: sealing then hashes it as usual.
    """

    def __init__(self, root, prefix="", min_size=None, chunk_bytes=None, workers=None, poll=0.02):
        self.root, self.prefix, self.poll = root, prefix, poll
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self.min_size = min_size or 4 * CHUNK
        self.done = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=workers or max(1, (os.cpu_count() or 1) - 1))
        self.files = {}
        self.lock = threading.Lock()
        self.scanner = threading.Thread(target=self._scan, name="inferops-follow-scan")
        self.scanner.daemon = True

    def start(self):
        self.scanner.start()
        return self

    def _scan(self):
        while True:
            finished = self.done.is_set()
            for directory, _dirs, names in os.walk(self.root):
                for name in names:
                    path = os.path.join(directory, name)
                    if path in self.files:
                        continue
                    try:
                        st = os.lstat(path)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode) and st.st_size >= self.min_size:
                        thread = threading.Thread(target=self._follow, args=(path,), name="inferops-follow")
                        thread.daemon = True
                        with self.lock:
                            self.files[path] = {"thread": thread}
                        thread.start()
            if finished:
                return
            self.done.wait(self.poll)

    def _follow(self, path):
        entry = self.files[path]
        try:
            digest = hashlib.sha256()
            chunks = []
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            pos = 0
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                while True:
                    writer_done = self.done.is_set()  # read before the size: then EOF below is final
                    size = os.fstat(fd).st_size
                    if size < pos:
                        raise ValueError("shrank while being written")
                    start = pos
                    while pos < size:
                        want = min(CHUNK, size - pos, self.chunk_bytes - pos % self.chunk_bytes)  # never across a chunk
                        n = os.preadv(fd, [view[:want]], pos)
                        if not n:
                            break
                        digest.update(view[:n])
                        pos += n
                        if pos % self.chunk_bytes == 0:
                            chunks.append(self.pool.submit(_hash_range, path, pos - self.chunk_bytes, self.chunk_bytes))
                    if writer_done and pos >= os.fstat(fd).st_size:
                        break
                    if pos == start and not writer_done:
                        self.done.wait(self.poll)  # nothing new yet
            finally:
                os.close(fd)
            if pos % self.chunk_bytes:
                chunks.append(self.pool.submit(_hash_range, path, pos - pos % self.chunk_bytes, pos % self.chunk_bytes))
            entry["result"] = (pos, digest.hexdigest(), chunks)
        except (OSError, ValueError) as exc:
            entry["error"] = str(exc)

    def finish(self, timeout=None):
        """The writer has exited: finish every followed file and return their digests."""
        self.done.set()
        self.scanner.join(timeout)
        results = {}
        with self.lock:
            followed = list(self.files.items())
        for path, entry in followed:
            entry["thread"].join(timeout)
            if "result" not in entry:
                continue
            size, digest, futures = entry["result"]
            try:
                parts = [future.result() for future in futures]
            except OSError:
                continue  # a chunk could not be read back: sealing hashes the file itself
            if sum(length for length, _d in parts) != size:
                continue
            rel = os.path.join(self.prefix, os.path.relpath(path, self.root))
            results[rel] = (size, digest, [d for _length, d in parts])
        self.pool.shutdown(wait=True)
        return results

    def abort(self):
        """The writer failed: stop following, discard everything."""
        self.done.set()
        self.scanner.join()
        for entry in list(self.files.values()):
            entry["thread"].join()
        self.pool.shutdown(wait=True)


def _chunk_plan(index_data, listed):
    """{relpath: entry} of the files the (already verified) chunk index lets us check chunk by chunk.

    A file is checked by chunks only when the index agrees with checksum.sha256 about its digest and
    the chunk list covers its recorded size; any other file is hashed whole, as without an index.
    """
    try:
        index = json.loads(index_data.decode("utf-8"))
        chunk_bytes = int(index["chunk_bytes"])
        entries = index["files"]
        if chunk_bytes <= 0 or not isinstance(entries, dict):
            return {}, None
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, None
    plan = {}
    for rel, entry in entries.items():
        try:
            size, chunks = int(entry["size"]), list(entry["chunks"])
        except (ValueError, KeyError, TypeError):
            continue
        if rel in listed and entry.get("sha256") == listed[rel] and size > 0 and len(chunks) == (size + chunk_bytes - 1) // chunk_bytes:
            plan[rel] = dict(size=size, chunks=chunks)
    return plan, chunk_bytes


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


def verify(directory, min_size=0, expect=None, workers=None, progress=None, hash_files=True):
    """Check a published snapshot. Returns (valid, reasons, details); never raises for bad snapshots.

    ``expect`` may hold ``identity``, ``image_id``, ``criu_version``, ``runtime_version``: what
    the restore would run with. A key whose value is None is not checked.

    ``hash_files=False`` checks everything but the content of the files other than the manifest
    (listing, sizes, manifest, identity, versions): for a caller whose next step hands the
    snapshot to a component that hashes every file right before it uses them, so that no file is
    read twice. ``details["checksums"]`` says which was done.
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
    hashes, plan, chunk_bytes = {}, {}, None
    details["checksums"] = "verified" if hash_files else "sizes only"
    if not hash_files:
        # Taken as listed; a file whose size differs from the manifest's record is still caught below.
        hashes.update((rel, (os.lstat(os.path.join(directory, rel)).st_size, listed[rel]))
                      for rel in to_hash if rel != MANIFEST)
    if CHUNK_INDEX in to_hash and hash_files:
        # Read once: hash these bytes and, if they are the listed ones, plan the chunked checks from them.
        with open(os.path.join(directory, CHUNK_INDEX), "rb") as handle:
            index_data = handle.read()
        hashes[CHUNK_INDEX] = (len(index_data), hashlib.sha256(index_data).hexdigest())
        if hashes[CHUNK_INDEX][1] == listed[CHUNK_INDEX]:
            plan, chunk_bytes = _chunk_plan(index_data, listed)
    chunked = {}
    for rel, entry in plan.items():
        if rel not in to_hash:
            continue
        size = os.lstat(os.path.join(directory, rel)).st_size
        if size != entry["size"]:
            hashes[rel] = (size, None)  # truncated or grown: no need to read it to know
        else:
            chunked[rel] = chunk_bytes
    whole = [rel for rel in to_hash if rel not in hashes and rel not in chunked]
    whole_hashes, chunk_hashes, stats = hash_tree(directory, whole, chunked, workers=workers, progress=progress)
    hashes.update(whole_hashes)
    for rel in chunked:
        good = [digest for _length, digest in chunk_hashes[rel]] == plan[rel]["chunks"]
        hashes[rel] = (plan[rel]["size"], listed[rel] if good else None)
    stats["chunked_files"] = len(chunked)
    details["hashing"] = stats
    details["files"] = len(hashes)
    details["bytes"] = sum(size for size, _digest in hashes.values())
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
    if details["bytes"] < min_size:
        reasons.append("too_small: %d bytes in total, below the minimum of %d" % (details["bytes"], min_size))
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

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading and hashing a snapshot's files: SHA-256 of whole files and of chunks, on every core, by path (mappings
of the page cache in a child, mapped.py) or through the descriptors a restore holds. PRIVATE to the inferops.snapshot
collection.

Verification reads every byte exactly once; the small documents a restore acts on are read whole, bounded, never
through a link (``read_document``), and used from those bytes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

from ..base import layout
from ..linux import fs
from . import mapped


CHUNK = 1024 * 1024


def _hash_range(path, offset=0, length=None, fd=None, sink=None):
    """(bytes read, sha256) of ``length`` bytes of ``path`` from ``offset`` (to the end when None). ``fd``: read
    through this descriptor (held.Held) instead of opening ``path``; ``sink``: write what was read there too, at
    the same offsets (a copy made by the read that verifies it)."""
    digest = hashlib.sha256()
    own = fd is None
    if own:
        fd = fs.open_regular(path)
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
            if sink is not None:
                _write_at(sink, view[:n], offset + done)
            done += n
    finally:
        if own:
            os.close(fd)
    return done, digest.hexdigest()


def hash_file(path):
    """(size, sha256) of a whole file."""
    return _hash_range(path)


def hash_range(path, offset, length):
    return _hash_range(path, offset, length)


def fingerprint(directory):
    """The snapshot's fingerprint: SHA-256 of its checksum.sha256 (what status records and annotations hold)."""
    try:
        return hash_file(os.path.join(directory, layout.CHECKSUMS))[1]
    except (IOError, OSError):
        return None


def hash_tree(root, whole, chunked=None, workers=None, progress=None, files=None):
    """Hash files in parallel threads: ``whole`` relpaths as one stream each, ``chunked`` ({relpath:
    chunk_bytes}) chunk by chunk, so that one big file is hashed on every core at once.

    Returns (results {relpath: (size, sha256)} for ``whole``, chunks {relpath: [(length, sha256), ...]}
    for ``chunked``, stats). ``progress(done_bytes, done_jobs)`` is called as jobs complete. A file in
    both is read twice (sealing does that, from the page cache the checkpoint just filled); verification
    reads every byte once. ``files``: a held.Held the files are read through (and copied into), instead of paths.
    """
    chunked = chunked or {}
    size_of = files.size if files is not None else (lambda rel: os.lstat(os.path.join(root, rel)).st_size)
    jobs = []
    for rel in whole:
        size = size_of(rel)
        jobs.append((rel, None, 0, None, (1 if rel in chunked else 0, size)))
    for rel, chunk_bytes in chunked.items():
        size = size_of(rel)
        for index, offset in enumerate(range(0, max(size, 1), chunk_bytes)):
            length = min(chunk_bytes, size - offset)
            jobs.append((rel, index, offset, length, (0, length)))
    # Longest first (a whole-file digest of a chunked file is the one serial job): nothing long starts last.
    jobs.sort(key=lambda job: job[4], reverse=True)
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    started = time.monotonic()
    results, chunks, done = {}, {}, [0, 0]

    def record(index, got):
        job = jobs[index]
        if job[1] is None:
            results[job[0]] = got
        else:
            chunks.setdefault(job[0], {})[job[1]] = got
        done[0] += got[0]
        done[1] += 1
        if progress:
            progress(done[0], done[1])

    # A check by path hashes mappings of the page cache in a child (mapped.py: no copy, and a file truncated
    # under it fails the check instead of killing this process); the bytes a restore uses are read through
    # ``files``, and a process with other threads does not fork.
    mapped_jobs = [(os.path.join(root, job[0]), job[2], job[3]) for job in jobs] if files is None else []
    reader = None  # nothing to hash
    if jobs:
        reader = "mapped" if mapped_jobs and mapped.hash_jobs(mapped_jobs, workers, record) is not None else "read"
    if reader == "read":
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_hash_range, os.path.join(root, job[0]), job[2], job[3],
                                   *((files.fd(job[0]), files.sink(job[0])) if files is not None else ()))
                       for job in jobs]
            for index, future in enumerate(futures):
                record(index, future.result())
    chunks = dict((rel, [parts[i] for i in sorted(parts)]) for rel, parts in chunks.items())
    elapsed = time.monotonic() - started
    done_bytes = done[0]
    stats = {"bytes": done_bytes, "files": len(set(results) | set(chunks)), "chunks": sum(len(c) for c in chunks.values()),
             "seconds": round(elapsed, 6), "workers": workers, "reader": reader,
             "throughput_mb_s": round(done_bytes / 1e6 / elapsed, 1) if elapsed > 0 else None}
    return results, chunks, stats


def hash_files(root, relpaths, workers=None, progress=None):
    """{relpath: (size, sha256)} hashing whole files in parallel, each read once. Returns (hashes, stats)."""
    results, _chunks, stats = hash_tree(root, relpaths, None, workers, progress)
    return results, stats


DOCUMENT_LIMIT = 16 * 1024 * 1024


def read_document(path, limit=DOCUMENT_LIMIT, fd=None, sink=None):
    """The bytes of a small regular file, never through a link; a larger one is an error, not a partial read.
    ``fd``: read through this descriptor (held.Held) instead of opening ``path``; ``sink``: also write them there."""
    own = fd is None
    if own:
        fd = fs.open_regular(path)  # a held descriptor was checked when it was opened
    try:
        return fs.read_limited(fd, limit, path, each=None if sink is None else
                               lambda data, offset: _write_at(sink, data, offset))
    finally:
        if own:
            os.close(fd)


def _write_at(fd, data, offset):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n

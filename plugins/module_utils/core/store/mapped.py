# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hashing files from mappings of the page cache, in a child process that may die. PRIVATE.

Reading a file into a buffer copies every byte out of the page cache before SHA-256 sees it; on a
small node that copy costs 10-25 % of the hashing rate (docs/benchmarks.md, 2026-12-05). Hashing a
mapping of the file skips it, but a writer of the store that truncates a mapped file turns the next
access into SIGBUS, which no Python code can catch: it would kill the verifying process instead of
failing the check. So the mappings are hashed in a forked child: when it dies, the parent reports
that the files changed while they were hashed, and the caller refuses the snapshot (fail closed).

Only for checks whose verdict is all that is used (snapshot_verify, a staged copy's verification):
a restore hashes the bytes it then uses through held.Held, never through a mapping. The child is
forked only from a process with one thread (forking a threaded process can copy a lock some other
thread held); elsewhere ``hash_jobs`` returns None and the caller reads as before.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import hashlib
import json
import mmap
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

from ..linux import fs

# Each mapping is hashed in slices of this size: hashlib drops the GIL for each, and the kernel maps
# the pages in as they are touched (MADV_SEQUENTIAL: read ahead, drop behind).
SLICE = 8 * 1024 * 1024
PR_SET_PDEATHSIG = 1


def available():
    """Whether this process may fork a hashing child now: Linux-like, one thread."""
    return hasattr(os, "fork") and hasattr(mmap, "MADV_SEQUENTIAL") and threading.active_count() == 1


def hash_jobs(jobs, workers, progress=None, after_map=None):
    """Hash ``jobs`` [(path, offset, length or None), ...] in a child process, ``workers`` threads.

    Returns [(bytes hashed, sha256), ...] in the order of ``jobs`` -- what hashing._hash_range returns for
    the same range -- or None when this process may not fork (``available``). ``progress(job index,
    result)`` is called in this process as each job completes. Raises OSError when the child could not
    hash a job or died (a file truncated while mapped: SIGBUS). ``after_map(path)``: called in the
    child between mapping a range and hashing it (tests: a writer truncating the file there).
    """
    if not available():
        return None
    read_end, write_end = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        status = 1
        try:
            _die_with(parent)
            _child(jobs, workers, write_end, after_map)
            status = 0
        finally:
            os._exit(status)  # pylint: disable=protected-access  # no atexit, no flush of the parent's buffers
    os.close(write_end)
    results, error = [None] * len(jobs), None
    try:
        with os.fdopen(read_end, "r") as lines:
            for line in lines:
                record = json.loads(line)
                if "error" in record:
                    error = error or record["error"]
                    continue
                results[record["job"]] = (record["bytes"], record["sha256"])
                if progress is not None:
                    progress(record["job"], results[record["job"]])
    except BaseException:  # the caller's progress failed, or this process is being stopped: no orphan, no zombie
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    _pid, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise OSError("the hashing process died of %s: a file changed while it was hashed (truncated by a writer "
                      "of the store?)" % _signal_name(os.WTERMSIG(status)))
    if error is not None:
        raise OSError(error)
    if os.WEXITSTATUS(status) != 0 or any(result is None for result in results):
        raise OSError("the hashing process ended (status %d) before it had hashed every file"
                      % os.WEXITSTATUS(status))
    return results


def _child(jobs, workers, write_end, after_map):
    lock = threading.Lock()
    with os.fdopen(write_end, "w") as out:

        def report(record):
            with lock:
                out.write(json.dumps(record) + "\n")
                out.flush()

        def one(index):
            try:
                path, offset, length = jobs[index]
                size, digest = hash_range(path, offset, length, after_map)
                report({"job": index, "bytes": size, "sha256": digest})
            except (OSError, ValueError) as exc:
                report({"error": "%s: %s" % (jobs[index][0], exc)})

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for _done in pool.map(one, range(len(jobs))):
                pass


def hash_range(path, offset=0, length=None, after_map=None):
    """(bytes hashed, sha256) of ``length`` bytes of ``path`` from ``offset`` (to the end when None), from a
    mapping (from the page boundary at or below ``offset``: a mapping starts on one)."""
    digest = hashlib.sha256()
    fd = fs.open_regular(path)
    try:
        size = os.fstat(fd).st_size
        end = size if length is None else min(size, offset + length)
        if end <= offset:
            return 0, digest.hexdigest()
        skip = offset % mmap.ALLOCATIONGRANULARITY
        area = mmap.mmap(fd, end - offset + skip, mmap.MAP_SHARED, mmap.PROT_READ, offset=offset - skip)
        try:
            area.madvise(mmap.MADV_SEQUENTIAL)
            if after_map is not None:
                after_map(path)
            view = memoryview(area)
            try:
                for start in range(skip, len(view), SLICE):
                    digest.update(view[start:start + SLICE])
            finally:
                view.release()
        finally:
            area.close()
    finally:
        os.close(fd)
    return end - offset, digest.hexdigest()


def _die_with(parent):
    """Best effort: the child is killed when its parent dies (a verification killed mid-way does not leave its
    hashing running); where prctl is missing it ends at its next report, on the closed pipe."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (AttributeError, OSError):
        return
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)  # pylint: disable=protected-access


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except (AttributeError, ValueError):
        return "signal %d" % number

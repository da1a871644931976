# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sealing and publishing a snapshot: everything that writes its manifest and checksums. PRIVATE.

A snapshot is assembled in the hidden sibling ``.<pod>.partial`` (layout.staging_dir). Sealing makes
every file 0600 and every directory 0700 (CRIU writes its images 0644), hashes every file -- the big
ones while CRIU still writes them (``Follower``), from the page cache -- writes the chunk index, the
manifest and checksum.sha256, and flushes everything to stable storage, overlapped with the hashing,
so that a snapshot is durable before anyone is told it is complete. Publishing renames the whole
directory into place (or swaps it with the old one): a reader sees the old snapshot, none, or the complete new one.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import hashlib
import json
import os
import queue
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..base import layout, schema
from ..linux import fs, proc, syscalls
from . import hashing, manifest, signature, status
from .hashing import CHUNK, hash_tree
from .manifest import CHUNK_INDEX


def chunked_files(root, relpaths, chunk_bytes):
    """{relpath: chunk_bytes} of the files that get per-chunk digests: those larger than one chunk."""
    return dict((rel, chunk_bytes) for rel in relpaths if os.lstat(os.path.join(root, rel)).st_size > chunk_bytes)


def seal_hashes(root, relpaths, workers=None, progress=None, chunk_bytes=None, known=None):
    """Hashes for sealing a snapshot: every file whole (for checksum.sha256), and, when the snapshot has a
    host part, per-chunk digests of every file larger than ``chunk_bytes``, written to the chunk index
    (CHUNK_INDEX), which is itself hashed and returned with the rest. Returns (hashes, stats).

    ``known`` ({relpath: (size, sha256, chunk digests)}, from a Follower with the same chunk size) are
    taken as they are when the file still has that size; only the other files are read.
    """
    chunk_bytes = chunk_bytes or manifest.CHUNK_BYTES
    index_path = os.path.join(root, CHUNK_INDEX)
    if os.path.lexists(index_path):
        os.unlink(index_path)  # a leftover of an earlier seal: rebuilt from the files as they are now
    relpaths = [rel for rel in relpaths if rel != CHUNK_INDEX]
    chunked = {}
    if os.path.isdir(os.path.dirname(index_path)):
        chunked = chunked_files(root, relpaths, chunk_bytes)
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
        fs.write_file_atomic(index_path, data)
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

    While the writer runs, the hashing threads run at the lowest CPU priority: on a small node they
    would otherwise take cores from CRIU and lengthen the engine's lock window; ``finish()`` puts them
    back at the process's priority to catch up. ``flush()``, once the writer is done, starts writing the
    followed files out to the disk while their hashing catches up -- never while the writer runs: writeback
    beside CRIU's own writes made the dump 2-3x slower on ext4 (docs/benchmarks.md, 2026-12-05).
    """

    def __init__(self, root, prefix="", min_size=None, chunk_bytes=None, workers=None, poll=0.02):
        self.root, self.prefix, self.poll = root, prefix, poll
        self.flusher = None
        self.chunk_bytes = chunk_bytes or manifest.CHUNK_BYTES
        self.min_size = min_size or 4 * CHUNK
        self.done = threading.Event()
        self.threads = []   # native ids of the hashing threads, lowered while the writer runs
        self.priority = _priority(0)
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers or max(1, (os.cpu_count() or 1) - 1),
                                       initializer=self._yield_to_writer)
        self.files = {}
        self.scanner = threading.Thread(target=self._scan, name="inferops-follow-scan")
        self.scanner.daemon = True

    def start(self):
        self.scanner.start()
        return self

    def _yield_to_writer(self):
        """Run this thread at the lowest priority until finish(); returns its native id (None: left as it is). A
        thread started once the writer is done runs at the process's priority (a new thread inherits its maker's)."""
        native = getattr(threading, "get_native_id", None)
        if native is None or self.priority is None:
            return None
        thread = native()
        with self.lock:
            if self.done.is_set():
                _set_priority(thread, self.priority)
                return None
            self.threads.append(thread)
            _set_priority(thread, 19)
        return thread

    def _forget(self, thread):
        """A thread that ends leaves the list: its id may name another thread of the system later."""
        with self.lock:
            if thread in self.threads:
                self.threads.remove(thread)

    def _catch_up(self):
        with self.lock:
            for thread in self.threads:
                _set_priority(thread, self.priority)
            del self.threads[:]

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
        thread = self._yield_to_writer()
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
                        entry["hashed"] = pos
                        if pos % self.chunk_bytes == 0:
                            chunks.append(self.pool.submit(hashing.hash_range, path, pos - self.chunk_bytes, self.chunk_bytes))
                    if writer_done and pos >= os.fstat(fd).st_size:
                        break
                    if pos == start and not writer_done:
                        self.done.wait(self.poll)  # nothing new yet
            finally:
                os.close(fd)
            if pos % self.chunk_bytes:
                chunks.append(self.pool.submit(hashing.hash_range, path, pos - pos % self.chunk_bytes, pos % self.chunk_bytes))
            entry["result"] = (pos, digest.hexdigest(), chunks)
        except (OSError, ValueError) as exc:
            entry["error"] = str(exc)
        finally:
            self._forget(thread)

    def hashed_bytes(self, relpath):
        """How far the file at ``relpath`` (below the followed folder) has been read and hashed so far."""
        return self.files.get(os.path.join(self.root, relpath), {}).get("hashed", 0)

    def flush(self):
        """The writer has exited: fsync the followed files in the background (the seal's Flusher then waits only
        for what is still in flight); finish() waits for it."""
        with self.lock:
            relpaths = [os.path.relpath(path, self.root) for path in self.files]
        self.flusher = Flusher(self.root, relpaths)
        self.flusher.start()

    def finish(self, timeout=None):
        """The writer has exited: finish every followed file and return their digests."""
        with self.lock:
            self.done.set()
        self._catch_up()
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
        if self.flusher is not None:
            self.flusher.join(timeout)  # an error is the seal's to report: its Flusher fsyncs every file again
        return results

    def abort(self):
        """The writer failed: stop following, discard everything."""
        with self.lock:
            self.done.set()
        self._catch_up()
        self.scanner.join()
        if self.flusher is not None:
            self.flusher.join()
        for entry in list(self.files.values()):
            entry["thread"].join()
        self.pool.shutdown(wait=True)


def _priority(thread):
    """The nice value of a thread (0: this one), or None where it cannot be read."""
    try:
        return os.getpriority(os.PRIO_PROCESS, thread)
    except (AttributeError, OSError):
        return None


def _set_priority(thread, value):
    """Best effort: without the right to raise a priority back, the thread only catches up more slowly."""
    try:
        os.setpriority(os.PRIO_PROCESS, thread, value)
    except (AttributeError, OSError):
        pass


class WrittenDigest(object):
    """The digests a Follower takes, taken from the writer's own buffers as it writes them: nothing is read
    back. For a writer in this process (encryption writes the ciphertext); CRIU, a process of its own, is
    followed instead.

    ``feed(view, done)`` in file order; the whole-file digest (one serial stream) and the chunk digests
    each run in a thread of their own, at most ``depth`` buffers behind the writer (``feed`` waits beyond
    that, so memory stays bounded), and ``done()`` is called once both have hashed ``view``: the writer
    may reuse the buffer. ``finish()`` returns (size, sha256, [chunk sha256, ...]) as Follower does.
    """

    def __init__(self, chunk_bytes=None, depth=8):
        self.chunk_bytes = chunk_bytes or manifest.CHUNK_BYTES
        self.size, self.whole, self.chunks = 0, hashlib.sha256(), []
        self._chunk, self._in_chunk, self._error = hashlib.sha256(), 0, None
        self._queues = [queue.Queue(depth), queue.Queue(depth)]
        self._threads = [threading.Thread(target=self._drain, args=(q, hash_view), name="inferops-digest")
                         for q, hash_view in zip(self._queues, (self.whole.update, self._hash_chunks))]
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    def feed(self, view, done):
        pending, lock = [len(self._queues)], threading.Lock()

        def hashed():
            with lock:
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                done()
        self.size += len(view)
        for waiting in self._queues:
            waiting.put((view, hashed))

    def _hash_chunks(self, view):
        while len(view):
            take = min(len(view), self.chunk_bytes - self._in_chunk)
            self._chunk.update(view[:take])
            self._in_chunk += take
            view = view[take:]
            if self._in_chunk == self.chunk_bytes:
                self.chunks.append(self._chunk.hexdigest())
                self._chunk, self._in_chunk = hashlib.sha256(), 0

    def _drain(self, waiting, hash_view):
        while True:
            item = waiting.get()
            if item is None:
                return
            view, hashed = item
            try:
                if self._error is None:  # after a failure or abort() only hand the buffers back
                    hash_view(view)
            except Exception as exc:  # pylint: disable=broad-except  # reported by finish()
                self._error = exc
            finally:
                hashed()

    def _stop(self):
        for waiting in self._queues:
            waiting.put(None)
        for thread in self._threads:
            thread.join()

    def finish(self):
        self._stop()
        if self._error is not None:
            raise self._error
        if self._in_chunk:
            self.chunks.append(self._chunk.hexdigest())
        return self.size, self.whole.hexdigest(), self.chunks

    def abort(self):
        """The writer failed: let the threads end (every buffer fed is still handed back, unhashed)."""
        self._error = self._error or RuntimeError("aborted")
        self._stop()


def secure_modes(root):
    """Every directory 0700 and every file 0600 below ``root`` (CRIU and tar write 0644): a copy, a backup
    or an export that keeps file modes must not expose the engine's memory."""
    os.chmod(root, fs.DIR_MODE)
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(directory, name), fs.DIR_MODE, follow_symlinks=False)
        for name in files:
            os.chmod(os.path.join(directory, name), fs.FILE_MODE, follow_symlinks=False)


class Flusher(threading.Thread):
    """fsync every file of the staging directory in the background, while sealing hashes them: the page
    images are what CRIU just wrote, and a snapshot is durable before its status says completed."""

    def __init__(self, root, relpaths):
        super(Flusher, self).__init__(name="inferops-fsync")
        self.daemon = True
        self.root, self.relpaths, self.error, self.seconds = root, relpaths, None, None

    def run(self):
        started = time.monotonic()
        try:
            for rel in sorted(self.relpaths, key=lambda r: -os.lstat(os.path.join(self.root, r)).st_size):
                fd = os.open(os.path.join(self.root, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            self.error = exc
        self.seconds = round(time.monotonic() - started, 6)

    def finish(self):
        self.join()
        if self.error is not None:
            raise self.error
        return self.seconds


def seal(staging_dir, fields, workers=None, progress=None, known=None, durable=True, signing_key=None):
    """Write the chunk index, manifest.json and checksum.sha256 into ``staging_dir``, with every file 0600,
    and (``durable``) every file on stable storage; sign it with ``signing_key`` (signature.py) when given.
    Return (manifest, fingerprint, stats).

    ``fields`` supplies everything but ``files`` and ``total_bytes``, which come from hashing.
    ``known``: digests of files hashed while they were written (a ``Follower``); not read again.
    """
    for stale in (manifest.MANIFEST, manifest.CHECKSUMS, CHUNK_INDEX, layout.SIGNATURE):  # leftovers of an earlier seal
        if os.path.lexists(os.path.join(staging_dir, stale)):
            os.unlink(os.path.join(staging_dir, stale))
    secure_modes(staging_dir)
    relpaths = manifest.list_files(staging_dir)
    flusher = Flusher(staging_dir, relpaths) if durable else None
    if flusher is not None:
        flusher.start()
    hashes, stats = seal_hashes(staging_dir, relpaths, workers=workers, progress=progress, known=known)
    stats["fsync_seconds"] = flusher.finish() if flusher is not None else None
    files, total = manifest.manifest_files(hashes)
    document = dict(fields, schema_version=1, format_version=layout.SNAPSHOT_FORMAT, files=files, total_bytes=total)
    schema.validate("manifest", document, "manifest")
    data = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")
    fs.write_file_atomic(os.path.join(staging_dir, manifest.MANIFEST), data)
    hashes[manifest.MANIFEST] = (len(data), hashlib.sha256(data).hexdigest())
    checksums = manifest.format_checksums(hashes).encode("utf-8")
    fs.write_file_atomic(os.path.join(staging_dir, manifest.CHECKSUMS), checksums)
    if signing_key is not None:
        stats["key_id"] = signature.sign(staging_dir, signing_key)["key_id"]
    return document, hashlib.sha256(checksums).hexdigest(), stats


def publish(staging_dir, snapshot_dir):
    """Atomically put the sealed staging directory at ``snapshot_dir``, replacing an older snapshot: at every instant
    ``snapshot_dir`` holds the old snapshot or the new one, a kill or a reboot anywhere included.

    A replacement is one renameat2(RENAME_EXCHANGE): the old snapshot ends up under the staging name and is removed
    once the swap is on disk. Where the filesystem cannot exchange (NFS), the old one is renamed aside to
    ``.<pod>.old.<pid>`` first and put back if the second rename fails; a kill between the two leaves it there, and
    ``put_back`` returns it. Both happen under the pod's lock, so that ``put_back`` never takes a publish in progress
    for a leftover.
    """
    fs.fsync_dir(staging_dir)
    with status.locked(snapshot_dir):
        replaced = None
        if not os.path.lexists(snapshot_dir):
            os.rename(staging_dir, snapshot_dir)
        else:
            try:
                syscalls.exchange(staging_dir, snapshot_dir)
                replaced = staging_dir
            except OSError as exc:
                if exc.errno not in syscalls.EXCHANGE_UNSUPPORTED:
                    raise
                replaced = layout.old_dir(snapshot_dir, os.getpid())
                fs.remove_tree(replaced)  # one a killed process of the same pid left: the published one is newer
                os.rename(snapshot_dir, replaced)
                try:
                    os.rename(staging_dir, snapshot_dir)
                except OSError:
                    os.rename(replaced, snapshot_dir)  # put the previous snapshot back: never lose it
                    raise
        fs.fsync_dir(os.path.dirname(snapshot_dir.rstrip("/")))
    if replaced:
        fs.remove_tree(replaced)


def replaced_leftover(snapshot_dir):
    """The last published snapshot, left at ``.<pod>.old.<pid>`` by a publish killed between its two renames, when
    nothing is published now: a real directory whose pid is no live process here (or is this one's), complete by
    its manifest and sizes (not one half removed); the newest of several. None otherwise. Call under the pod's lock."""
    parent, name = os.path.split(snapshot_dir.rstrip("/"))
    if os.path.lexists(snapshot_dir) or not os.path.isdir(parent):
        return None
    found = []
    for entry in os.listdir(parent):
        kind, pod = layout.sibling(entry) or (None, None)
        pid = int(entry.rpartition(layout.OLD_INFIX)[2]) if kind == "old" and pod == name else None
        path = os.path.join(parent, entry)
        if pid is None or (pid != os.getpid() and proc.alive(pid)) or not stat.S_ISDIR(os.lstat(path).st_mode):
            continue
        if manifest.verify(path, plan=manifest.SIZES_ONLY)[0]:
            found.append((os.lstat(path).st_ctime, path))  # the rename aside set its ctime
    return max(found)[1] if found else None


def put_back(snapshot_dir, locked=True):
    """Put ``replaced_leftover`` back at ``snapshot_dir``, under the pod's lock (``locked=False``: the caller holds
    it); returns the path it was at, or None."""
    if not os.path.isdir(os.path.dirname(snapshot_dir.rstrip("/"))):
        return None
    with status.locked(snapshot_dir) if locked else contextlib.nullcontext():
        leftover = replaced_leftover(snapshot_dir)
        if leftover:
            os.rename(leftover, snapshot_dir)
            fs.fsync_dir(os.path.dirname(leftover))
    return leftover


def discard(staging_dir):
    """Remove a staging directory after a failure; returns whether there was one."""
    existed = os.path.lexists(staging_dir)
    fs.remove_tree(staging_dir)
    return existed

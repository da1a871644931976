# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""CRIU's page images encrypted as CRIU writes them, through named pipes. PRIVATE.

An encrypted checkpoint used to have CRIU write the process's memory to private tmpfs, then read it back,
encrypt and hash it: every byte written to fresh memory twice, and all of it after the checkpoint. Here
the page images CRIU is about to create (``pages-<n>.img``, numbered from 1 in the order CRIU opens them)
are named pipes in the private image directory: CRIU opens them as it would the files (``O_WRONLY|O_CREAT|
O_TRUNC``, then ``splice`` front to back) and each is encrypted into the snapshot's staging directory while
the checkpoint runs, hashed from the cipher's buffers (seal.StreamHasher). The plaintext of the memory
never lands anywhere. A pipe CRIU did not open is removed afterwards; page images beyond the pipes made
are ordinary files, encrypted after the checkpoint as before.

CRIU blocks in ``splice`` while a pipe is full, with the process frozen: every reader drains its pipe to
the end whatever goes wrong (an error is kept and raised by ``finish``), so a failure can never hang it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fcntl
import os
import select
import threading
from concurrent.futures import ThreadPoolExecutor

from . import encryption, paths
from .errors import SnapshotError

PIPES = 8           # a container's processes (init, the engine, its helpers): one page image each
PIPE_BYTES = 1024 * 1024  # fs.pipe-max-size's default: fewer wake-ups of CRIU and of the reader


class PagePipes(object):
    """Named pipes ``pages-1.img`` ... in ``plain_images`` (the private directory CRIU dumps into), each
    encrypted to the same name in ``target_images`` as CRIU writes it. ``prefix``: the images' path in
    the snapshot (what the ciphertext's associated data and the hasher name)."""

    def __init__(self, key, plain_images, target_images, prefix, hasher=None, workers=None, count=PIPES):
        self.key, self.plain_images, self.target_images, self.prefix = key, plain_images, target_images, prefix
        self.hasher, self.count = hasher, count
        self.pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1)
        self.wake_read, self.wake_write = os.pipe()
        self.threads, self.done, self.errors = [], [], []
        self.lock = threading.Lock()

    def start(self):
        paths.ensure_dir(self.target_images)
        try:
            for number in range(1, self.count + 1):
                name = "pages-%d.img" % number
                path = os.path.join(self.plain_images, name)
                os.mkfifo(path, paths.FILE_MODE)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # CRIU's open does not wait for us
                try:
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
                except (AttributeError, OSError):
                    pass  # the default size works, with more wake-ups
                thread = threading.Thread(target=self._follow, args=(name, fd), name="inferops-page-pipe")
                thread.daemon = True
                self.threads.append(thread)
                thread.start()
        except BaseException:
            self.abort()
            raise
        return self

    def _follow(self, name, fd):
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.register(self.wake_read, select.POLLIN)
            events = dict(poller.poll())
            if fd not in events:  # the checkpoint ended and CRIU never opened this one
                return
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            self._encrypt(name, fd)
        finally:
            os.close(fd)

    def _encrypt(self, name, fd):
        rel = "%s/%s" % (self.prefix, name)
        try:
            encryption.encrypt_stream(self.key, lambda view: encryption.read_full(fd, view),
                                      os.path.join(self.target_images, name), rel, pool=self.pool,
                                      hasher=self.hasher)
            with self.lock:
                self.done.append(rel)
        except Exception as exc:  # pylint: disable=broad-except  # raised by finish(); CRIU must not block
            with self.lock:
                self.errors.append("%s: %s" % (name, exc))
            buf = bytearray(PIPE_BYTES)
            while encryption.read_full(fd, memoryview(buf)):
                pass

    def finish(self, timeout=None):
        """CRIU has exited: the relpaths encrypted (every pipe it opened, read to its end), the pipes removed."""
        self._stop(timeout)
        if any(thread.is_alive() for thread in self.threads):
            raise SnapshotError("the page images were still being encrypted %s s after CRIU ended" % timeout)
        if self.errors:
            raise SnapshotError("encrypting the page images as CRIU wrote them failed: %s" % "; ".join(self.errors))
        return sorted(self.done)

    def abort(self):
        """CRIU failed: stop, remove the pipes (what was encrypted goes with the staging directory)."""
        self._stop(None)

    def _stop(self, timeout):
        if self.wake_write is not None:
            os.write(self.wake_write, b"x")  # level-triggered: every reader still waiting sees it
        for thread in self.threads:
            thread.join(timeout)
        self.pool.shutdown(wait=True)
        for number in range(1, self.count + 1):
            path = os.path.join(self.plain_images, "pages-%d.img" % number)
            if os.path.lexists(path) and not os.path.isfile(path):
                os.unlink(path)
        for fd in (self.wake_read, self.wake_write):
            if fd is not None:
                os.close(fd)
        self.wake_read = self.wake_write = None

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Following files while another process writes them. PRIVATE to the inferops.snapshot collection.

CRIU (and tar) write their image files front to back and never go back: what is below a file's size is
final. So the work a file needs (its hash: seal.Follower; its encryption: encryption.Follower) can run while
it is written, instead of reading it again afterwards. This is the one scanner and the one wait of both.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat
import threading


class Follower(object):
    """Finds the files of ``root`` that reach ``min_size`` and runs ``follow(path, entry)`` for each in a thread of
    its own. ``done`` is set once the writer has exited (``stop()``): a ``follow`` that reads ``writer_done()``
    before a file's size then knows that size is final. An OSError or ValueError of ``follow`` is kept in the
    file's entry (``error``) and ends only that file: ``given_up(path, entry)`` may undo what it wrote."""

    def __init__(self, root, min_size, poll=0.02):
        self.root, self.min_size, self.poll = root, min_size, poll
        self.done = threading.Event()
        self.aborted = False
        self.files = {}
        self.lock = threading.Lock()
        self.scanner = threading.Thread(target=self._scan, name="inferops-follow-scan")
        self.scanner.daemon = True

    def start(self):
        self.scanner.start()
        return self

    def follow(self, path, entry):
        raise NotImplementedError

    def given_up(self, path, entry):
        """``follow`` failed for ``path``: nothing to undo by default."""

    def writer_done(self):
        return self.done.is_set()

    def pause(self):
        """Nothing new in a file yet: wait a little, or until the writer is done."""
        self.done.wait(self.poll)

    def relpath(self, path):
        return os.path.relpath(path, self.root)

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
                        thread = threading.Thread(target=self._run, args=(path,), name="inferops-follow")
                        thread.daemon = True
                        with self.lock:
                            self.files[path] = {"thread": thread}
                        thread.start()
            if finished or self.aborted:
                return
            self.pause()

    def _run(self, path):
        entry = self.files[path]
        try:
            self.follow(path, entry)
        except (OSError, ValueError) as exc:
            entry["error"] = str(exc)
            self.given_up(path, entry)

    def stop(self, timeout=None, abort=False):
        """The writer has exited (or failed: ``abort``): let every follow end; returns the files' entries."""
        self.aborted = self.aborted or abort
        self.done.set()
        self.scanner.join(timeout)
        with self.lock:
            followed = list(self.files.items())
        for _path, entry in followed:
            entry["thread"].join(timeout)
        return followed

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Progress of a long step, as lines a module returns and logs. PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from .clock import Stopwatch


class Progress:
    """Progress of a long step, as lines (returned as ``progress``, shown by the roles at -v) and to ``log``."""

    def __init__(self, what, log=None, every_seconds=2.0, watch=None):
        self.what, self.log, self.every = what, log, every_seconds
        self.watch = watch or Stopwatch()
        self.lines = []
        self._last = None

    def note(self, text, force=False):
        now = self.watch.elapsed()
        if force or self._last is None or now - self._last >= self.every:
            self._last = now
            self._add("%s: %s (%.1f s)" % (self.what, text, now))

    def final(self, text):
        self._add("%s: %s (%.1f s)" % (self.what, text, self.watch.elapsed()))

    def bytes_done(self, done_bytes, done_files):
        self.note("%d files, %.1f MiB hashed" % (done_files, done_bytes / 1048576.0))

    def _add(self, line):
        self.lines.append(line)
        if self.log:
            self.log(line)

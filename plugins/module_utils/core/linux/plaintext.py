# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where an encrypted snapshot's plaintext lives while CRIU writes or reads it. PRIVATE.

A ``PrivateDir`` is a directory of its own (0700) below the work directory (``/dev/shm``, a tmpfs, by
default), removed after use, also on failure. A run that is killed (SIGKILL, the OOM killer) cannot
remove it, and plaintext on a tmpfs stays until a reboot: so the owner holds an ``flock`` on its
directory as long as it lives, and the next ``PrivateDir`` in the same work directory removes every
plaintext directory whose lock is free (its owner is gone, in whatever PID namespace it ran) and that is
older than a minute (made and not yet locked, otherwise).

A tmpfs of its own with 2 MiB pages was tried here (docs/benchmarks.md): CRIU reads it faster, but on
this VM the first writes into fresh 2 MiB pages cost more than that gains (the lock window grew).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat
import tempfile
import time

from . import fs

PREFIX = "inferops-plain-"
STALE_AFTER = 60.0


def sweep(parent, now=None, prefix=PREFIX):
    """Remove the private directories (named ``prefix``...) killed runs left below ``parent``; returns their paths."""
    removed = []
    now = time.time() if now is None else now
    try:
        names = [name for name in os.listdir(parent) if name.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)  # a link, or someone else's directory, is not ours to remove
            if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()) or now - st.st_mtime < STALE_AFTER:
                continue
            fd = fs.locked_fd(path, wait=False)  # held by a live owner: raises, and the directory stays
        except (IOError, OSError):
            continue
        try:
            fs.remove_tree(path)
            removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


class PrivateDir(object):
    """A private directory for plaintext below ``parent`` (see the module's docstring); ``remove()`` it after
    use, also on failure. ``swept``: what killed runs had left there."""

    def __init__(self, parent, prefix=PREFIX):
        self.swept = sweep(parent, prefix=prefix)
        self.path = tempfile.mkdtemp(prefix=prefix, dir=parent)  # 0700
        try:
            self._fd = fs.locked_fd(self.path, wait=False)
        except OSError:
            fs.remove_tree(self.path)
            raise

    def remove(self, expect=None):
        """Remove the directory; with ``expect`` ((st_dev, st_ino) of the directory its owner made and emptied through
        descriptors), only where its path still leads to it: one that someone moved is left where it went."""
        if self.path is None:
            return
        try:
            if expect is None:
                fs.remove_tree(self.path)
            else:
                st = os.lstat(self.path)
                if (st.st_dev, st.st_ino) == tuple(expect):
                    os.rmdir(self.path)
        except OSError:
            if expect is None:
                raise
        finally:
            os.close(self._fd)
            self.path = None

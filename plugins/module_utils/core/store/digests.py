# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A file's identity and its content digest, cached per identity on the node. PRIVATE to inferops.snapshot.

The identity of a regular file is (device, inode, size, ctime) -- plus mtime, for the record. Any write changes
its ctime, and so does a rename over it (another inode), chmod, chown, a hard link or ``utime`` setting mtime
back; no user can set ctime back. So a file whose identity is the recorded one has the recorded content. When it
is not (another node, a file copied again, touched), only the content can tell: its SHA-256, read in full.

Those digests are kept in a node-local cache (layout.DIGEST_CACHE_DIR, root's, 0700; one 0600 entry per
identity), so that a multi-GB model is read once per node and identity, not at every restore or generation.
An entry is trusted only for the identity it was made for, which nobody can give another content; the cache is
used only when it is root's (or this user's) and private -- otherwise the file is hashed, as without one.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os

from ..base import layout
from ..base.errors import SnapshotError
from ..linux import fs, paths

READ_BYTES = 4 * 1024 * 1024
MAX_ENTRIES = 10000              # the oldest tenth goes when there are more
IDENTITY_KEYS = ("dev", "ino", "size", "ctime_ns", "mtime_ns")
cache_dir = layout.DIGEST_CACHE_DIR  # a test or the benchmark points it elsewhere


class Changed(ValueError):
    """The file is not (any more) the one expected: it changed before or while it was read."""


def _identity_of(st):
    return {"size": st.st_size, "dev": st.st_dev, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns,
            "mtime_ns": st.st_mtime_ns}


def _open(path):
    fd = fs.open_regular(path)
    st = os.fstat(fd)
    return fd, st


def identity(path):
    """{size, dev, ino, ctime_ns, mtime_ns} of a regular file (never through a symbolic link); ValueError for
    anything else, OSError when it cannot be opened."""
    fd, st = _open(path)
    os.close(fd)
    return _identity_of(st)


def same(was, now):
    """Whether two identities name one file with one content: same device, inode, size and ctime."""
    return all(was.get(key) == now.get(key) for key in ("dev", "ino", "size", "ctime_ns")) and \
        was.get("ctime_ns") is not None


def digest(path, expected=None, use_cache=True):
    """(sha256, identity, whether it came from the cache) of the file at ``path``, hashed from the one descriptor
    whose identity is checked before and after the read. ``expected``: the identity it must have (Changed
    otherwise, as when it changes while it is read)."""
    fd, st = _open(path)
    try:
        found = _identity_of(st)
        if expected is not None and not same(expected, found):
            raise Changed("%s changed since it was recorded" % path)
        cached = _cache_get(found) if use_cache else None
        if cached:
            return cached, found, True
        hashed = hashlib.sha256()
        while True:
            block = os.read(fd, READ_BYTES)
            if not block:
                break
            hashed.update(block)
        if not same(found, _identity_of(os.fstat(fd))):
            raise Changed("%s changed while it was read" % path)
    finally:
        os.close(fd)
    value = hashed.hexdigest()
    if use_cache:
        _cache_put(found, value)
    return value, found, False


# -- the cache ---------------------------------------------------------------------------------------------

def _entry_path(ident):
    key = ":".join(str(ident[name]) for name in IDENTITY_KEYS)
    return os.path.join(cache_dir, hashlib.sha256(key.encode()).hexdigest()[:40])


def _private(path):
    try:
        return paths.private_reason(os.lstat(path), path) is None
    except OSError:
        return False


def _cache_get(ident):
    entry = _entry_path(ident)
    if not (_private(cache_dir) and _private(entry)):
        return None
    try:
        with open(entry) as handle:
            found = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    if not isinstance(found, dict) or any(found.get(name) != ident[name] for name in IDENTITY_KEYS):
        return None
    value = found.get("sha256")
    return value if isinstance(value, str) and len(value) == 64 else None


def _cache_put(ident, value):
    """Best effort: a cache that cannot be written costs a hash later, never a wrong answer."""
    try:
        fs.ensure_dir(cache_dir)
        if not _private(cache_dir):
            return
        fs.write_file_atomic(_entry_path(ident), (json.dumps(dict(ident, sha256=value), sort_keys=True)).encode())
        names = os.listdir(cache_dir)
        if len(names) > MAX_ENTRIES:
            aged = sorted((os.lstat(os.path.join(cache_dir, name)).st_mtime, name) for name in names)
            for _mtime, name in aged[:len(names) - MAX_ENTRIES * 9 // 10]:
                os.unlink(os.path.join(cache_dir, name))
    except (IOError, OSError, ValueError, SnapshotError):
        pass

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Safe handling of snapshot paths. PRIVATE to the inferops.snapshot collection.

Snapshots hold a process's whole memory, secrets included, and are restored as root: a path that
an attacker can redirect (traversal, a symlink planted in a shared directory, a directory someone
else owns) must never be written to or restored from. Directories are created 0700, files 0600,
and a snapshot becomes visible only by one atomic rename of its staging directory.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import shutil
import stat

from ansible_collections.inferops.snapshot.plugins.module_utils._errors import UnsafePathError

STAGING_SUFFIX = ".partial"
DIR_MODE = 0o700
FILE_MODE = 0o600


def _trusted_owner(uid):
    return uid in (0, os.geteuid())


def validate_snapshot_dir(path, field="snapshot_dir", root=None):
    """Return the normalised absolute ``path`` or raise UnsafePathError naming ``field``.

    Rules: absolute; no '..' component; inside ``root`` when given; no symlink in a directory that
    someone other than root/us can write; the directory itself (when it exists) a real directory
    owned by root or us and not writable by group or others.
    """
    if not isinstance(path, str) or not path:
        raise UnsafePathError("%s: a non-empty absolute path is required" % field, path=path)
    if "\x00" in path:
        raise UnsafePathError("%s: the path contains a NUL byte" % field, path=path)
    if not os.path.isabs(path):
        raise UnsafePathError("%s: %r is relative; give an absolute path" % (field, path), path=path)
    if ".." in path.split("/"):
        raise UnsafePathError("%s: %r contains '..'; give the path without parent references" % (field, path),
                              path=path)
    normal = os.path.normpath(path)
    if normal == "/":
        raise UnsafePathError("%s: '/' cannot be a snapshot directory" % field, path=path)
    if root is not None:
        root_normal = os.path.normpath(root)
        if os.path.commonpath([root_normal, normal]) != root_normal or normal == root_normal:
            raise UnsafePathError("%s: %r is not below the snapshot root %r" % (field, path, root), path=path)

    current = "/"
    for part in normal.strip("/").split("/"):
        parent, current = current, os.path.join(current, part)
        try:
            st = os.lstat(current)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                break  # the rest will be created by us, 0700
            raise UnsafePathError("%s: cannot inspect %r: %s" % (field, current, exc), path=path)
        if stat.S_ISLNK(st.st_mode):
            pst = os.stat(parent)
            if current == normal or not _trusted_owner(pst.st_uid) or pst.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise UnsafePathError(
                    "%s: %r is a symbolic link%s; refusing to follow it. Use the real path of a directory owned "
                    "by root" % (field, current, "" if current == normal else " in a directory others can write"),
                    path=path)
        elif current == normal:
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePathError("%s: %r exists and is not a directory" % (field, normal), path=path)
            if not _trusted_owner(st.st_uid):
                raise UnsafePathError("%s: %r is owned by uid %d, not root; fix its owner or choose another path"
                                      % (field, normal, st.st_uid), path=path)
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise UnsafePathError("%s: %r is writable by group or others (mode %o); chmod 0700 it"
                                      % (field, normal, stat.S_IMODE(st.st_mode)), path=path)
    return normal


def staging_dir_for(snapshot_dir):
    """The hidden sibling a snapshot is assembled in before it is published."""
    parent, name = os.path.split(snapshot_dir.rstrip("/"))
    return os.path.join(parent, "." + name + STAGING_SUFFIX)


def ensure_dir(path, mode=DIR_MODE):
    """Create ``path`` and missing parents with ``mode``; verify the leaf is a real directory."""
    old_umask = os.umask(0o077)
    try:
        os.makedirs(path, mode=mode, exist_ok=True)
    finally:
        os.umask(old_umask)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError("%r is not a directory" % path, path=path)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    return path


def write_file_atomic(path, data, mode=FILE_MODE):
    """Write bytes to ``path`` through a temporary file and a rename, never following symlinks."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, ".%s.tmp.%d" % (name, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def remove_tree(path):
    """Remove a directory tree we created; symlinks inside are removed, never followed."""
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)

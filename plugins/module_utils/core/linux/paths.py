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
import stat

from ..base import schema
from ..base.errors import ParameterError, UnsafePathError
from . import fs


def _trusted_owner(uid):
    return uid in (0, os.geteuid())


def validate_snapshot_dir(path, field="snapshot_dir", root=None):
    """Return the normalised absolute ``path`` or raise UnsafePathError naming ``field``.

    The policy, for every component of the path that exists:

    - it is owned by root (or the user running this), and a directory is not writable by group or
      others unless it is sticky (like /tmp, where nobody else can replace what is ours);
    - a symbolic link is accepted only at or above the snapshot root (``root``, or the root of the
      ``<root>/<namespace>/<service>/<instance>/<pod>`` layout): an operator may have linked the store
      to a big disk. It must itself be owned by root (or us) in such a directory, and everything it
      resolves to must pass the same checks. Inside the store -- namespace, service, instance, pod --
      every component must be a real directory: nothing there may redirect a snapshot elsewhere;
    - the snapshot directory itself, when it exists, is a directory.
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
        if root_normal == "/":
            raise UnsafePathError("%s: '/' cannot be a snapshot root" % field, path=path)
        if os.path.commonpath([root_normal, normal]) != root_normal or normal == root_normal:
            raise UnsafePathError("%s: %r is not below the snapshot root %r" % (field, path, root), path=path)
    else:
        root_normal = _layout_root(normal)
    _check_components(normal, root_normal, field, path)
    return normal


def _layout_root(normal):
    """The snapshot root of <root>/<namespace>/<service>/<instance>/<pod> ('/' for a shallower path)."""
    parts = normal.strip("/").split("/")
    return "/" + "/".join(parts[:-4]) if len(parts) > 4 else "/"


def _check_components(normal, root, field, original, depth=0):
    current = "/"
    parts = normal.strip("/").split("/")
    for index, part in enumerate(parts):
        parent, current = current, os.path.join(current, part)
        try:
            st = os.lstat(current)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return  # the rest will be created by us, 0700
            raise UnsafePathError("%s: cannot inspect %r: %s" % (field, current, exc), path=original)
        if stat.S_ISLNK(st.st_mode):
            inside = root != "/" and current != root and current.startswith(root.rstrip("/") + "/")
            if current == normal or inside or root == "/":
                raise UnsafePathError(
                    "%s: %r is a symbolic link inside the snapshot store; refusing to follow it: every directory "
                    "below the snapshot root must be a real directory" % (field, current), path=original)
            if not _trusted_owner(st.st_uid) or not _trusted_dir(os.lstat(parent)):
                raise UnsafePathError(
                    "%s: %r is a symbolic link owned by uid %d in %r; only a link owned by root in a directory only "
                    "root can write is followed" % (field, current, st.st_uid, parent), path=original)
            if depth > 8:
                raise UnsafePathError("%s: %r: too many symbolic links" % (field, current), path=original)
            target = os.path.realpath(current)
            rest = os.path.join(target, *parts[index + 1:])
            resolved_root = os.path.join(target, os.path.relpath(root, current)) if root.startswith(current) else root
            _check_components(target, "/", field, original, depth + 1)
            return _check_components(rest, os.path.normpath(resolved_root), field, original, depth + 1)
        if not _trusted_owner(st.st_uid):
            raise UnsafePathError("%s: %r is owned by uid %d, not root; fix its owner or choose another path"
                                  % (field, current, st.st_uid), path=original)
        if current == normal:
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePathError("%s: %r exists and is not a directory" % (field, normal), path=original)
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise UnsafePathError("%s: %r is writable by group or others (mode %o); chmod 0700 it"
                                      % (field, normal, stat.S_IMODE(st.st_mode)), path=original)
        elif not _trusted_dir(st):
            raise UnsafePathError("%s: %r is writable by group or others (mode %o) and not sticky; a path to a "
                                  "snapshot must pass only through directories others cannot change"
                                  % (field, current, stat.S_IMODE(st.st_mode)), path=original)


def private_reason(st, what):
    """Why ``st`` (an lstat) is not an entry of a tree that is ours alone -- a real directory 0700 or a regular
    file 0600, owned by root (or the user running this); None when it is."""
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        wanted = fs.DIR_MODE
    elif stat.S_ISREG(st.st_mode):
        wanted = fs.FILE_MODE
    else:
        return "%s is not a regular file or a directory" % what
    if not _trusted_owner(st.st_uid):
        return "%s is owned by uid %d, not root" % (what, st.st_uid)
    if mode != wanted:
        return "%s has mode %o, not %o" % (what, mode, wanted)
    return None


def _trusted_dir(st):
    return not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or bool(st.st_mode & stat.S_ISVTX)


def check_identity(identity, snapshot_dir):
    """The identity must be well-formed and the pod's name must be part of its snapshot path."""
    if identity is None:
        return None
    schema.validate("manifest", identity, "identity", definition="identity")
    if identity["pod"] not in snapshot_dir.split("/"):
        raise ParameterError(
            "snapshot_dir: %r does not contain the pod name %r; give each pod its own path, e.g. "
            "<root>/%s/%s/%s/%s" % (snapshot_dir, identity["pod"], identity["namespace"], identity["service"],
                                    identity["instance"], identity["pod"]), snapshot_dir=snapshot_dir)
    return identity


# -- inside another root (a container's), never following a link it could plant -------------------

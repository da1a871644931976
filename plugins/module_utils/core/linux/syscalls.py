# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Linux calls the standard library lacks: openat2 (resolution that refuses links), renameat2 (an atomic
exchange), inotify (a folder's entries watched without timestamps), and paths walked below a container's root without
leaving it. PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import errno
import os
import platform
import stat
import struct

from . import fs


def open_dirs_below(root_fd, parts, uid=None, gid=None, create=True):
    """An fd of the directory ``parts`` below ``root_fd``, created 0700 (owned by uid/gid) where missing.

    No symlink is followed at any step, so an image or a process cannot redirect the walk out of
    its root.
    """
    if ".." in parts:
        raise ValueError("bad path %r" % "/".join(parts))
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, fs.DIR_MODE, dir_fd=fd)
                nxt = os.open(part, flags, dir_fd=fd)
                if uid is not None:
                    os.fchown(nxt, uid, gid if gid is not None else -1)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


class LinkRefused(OSError):
    """A symbolic link (or ``..``) on a path resolved inside another root: refused, never followed."""


# openat2(2) (Linux 5.6): one call that resolves a whole path below a directory under rules of its own. Python has no
# wrapper; the syscall's number is 437 on both architectures the collection runs on.
SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_LIBC = []


def _libc():
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _openat2(dir_fd, path, flags, resolve):
    """openat2(dir_fd, path, {flags, 0, resolve}); OSError(ENOSYS) where this host cannot make the call."""
    number = SYS_OPENAT2.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, "openat2 is not known on %s" % platform.machine())
    how = _OpenHow(flags, 0, resolve)
    fd = _libc().syscall(ctypes.c_long(number), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(path)),
                         ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


# renameat2(2) with RENAME_EXCHANGE (Linux 3.15): two paths swap places in one step. glibc wraps it since 2.28; below
# that, the syscall itself.
SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}
RENAME_EXCHANGE = 2
AT_FDCWD = -100


# what a kernel, a libc or a filesystem (NFS, some FUSE) that cannot exchange answers
EXCHANGE_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)


def exchange(first, second):
    """Swap the two existing paths ``first`` and ``second`` atomically; OSError -- its errno in EXCHANGE_UNSUPPORTED
    where this host or filesystem cannot do it."""
    libc, args = _libc(), (ctypes.c_int(AT_FDCWD), ctypes.c_char_p(os.fsencode(first)), ctypes.c_int(AT_FDCWD),
                           ctypes.c_char_p(os.fsencode(second)), ctypes.c_uint(RENAME_EXCHANGE))
    call = getattr(libc, "renameat2", None)
    if call is None:
        number = SYS_RENAMEAT2.get(platform.machine())
        if number is None:
            raise OSError(errno.ENOSYS, "renameat2 is not known on %s" % platform.machine())
        call, args = libc.syscall, (ctypes.c_long(number),) + args
    if call(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), first, None, second)


def _walk_o_path(root_fd, parts):
    """The same resolution without openat2: one component at a time, each opened O_PATH|O_NOFOLLOW and refused when
    it is a link (O_NOFOLLOW alone would open the link itself)."""
    fd = os.dup(root_fd)
    try:
        for index, part in enumerate(parts):
            nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise LinkRefused(errno.ELOOP, "/%s is a symbolic link" % "/".join(parts[:index + 1]))
            if index < len(parts) - 1 and not stat.S_ISDIR(mode):
                raise OSError(errno.ENOTDIR, "/%s is not a directory" % "/".join(parts[:index + 1]))
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_path_in_root(root_fd, inner_path, use_openat2=True):
    """An O_PATH descriptor of ``inner_path`` below ``root_fd`` (a container's root, ``/proc/<pid>/root``), reached
    without following any symbolic link on the way: whoever controls that root (a compromised engine) cannot send
    the host elsewhere. openat2 with RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS; where the kernel
    or a seccomp filter refuses the call, a walk of O_PATH | O_NOFOLLOW opens. A link is LinkRefused (naming it)."""
    parts = _parts(inner_path)
    if ".." in parts:
        raise LinkRefused(errno.EXDEV, "%s has a '..' component" % inner_path)
    if use_openat2:
        try:
            return _openat2(root_fd, "/".join(parts), os.O_PATH | os.O_CLOEXEC,
                            RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG, errno.ELOOP):
                raise
            # ELOOP: a link on the way; the walk below says which one
    return _walk_o_path(root_fd, parts)


def _parts(inner_path):
    parts = [part for part in inner_path.split("/") if part]
    if not parts:
        raise ValueError("bad path %r" % inner_path)
    return parts


def write_below(root_fd, inner_path, data, uid=None, gid=None):
    """Write ``data`` (0600, owned by uid/gid) at ``inner_path`` below ``root_fd``: a temporary name, fsync, rename."""
    parts = _parts(inner_path)
    fd = open_dirs_below(root_fd, parts[:-1], uid, gid)
    try:
        name = parts[-1]
        tmp, out = fs.create_temp(lambda flags, tmp: os.open(tmp, flags, fs.FILE_MODE, dir_fd=fd), name)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            if uid is not None:
                os.fchown(out, uid, gid if gid is not None else -1)
            os.fsync(out)
        finally:
            os.close(out)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def read_below(root_fd, inner_path, limit):
    """Up to ``limit`` bytes of the file at ``inner_path`` below ``root_fd``; None when it is not there."""
    try:
        parts = _parts(inner_path)
        directory = open_dirs_below(root_fd, parts[:-1], create=False)
        try:
            fd = fs.open_regular(parts[-1], dir_fd=directory)
        finally:
            os.close(directory)
        with os.fdopen(fd, "rb") as handle:
            return handle.read(limit)
    except (IOError, OSError, ValueError):
        return None


# inotify(7): what happens to a folder's entries, told by the kernel as it happens -- on every kernel and filesystem,
# where a folder's ctime moves only once per timestamp tick (below Linux 6.13, or without multigrain timestamps: ext2,
# a loop mount) and misses a second rename in the same tick.
IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x8, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR = 0x2000, 0x4000, 0x8000, 0x1000000
# Everything that changes what a name in the folder is, or what a file in it holds; never a read (IN_ACCESS, IN_OPEN):
# the restore's own readers make those.
CHANGES = (IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
           | IN_MOVE_SELF)
_WHAT = ((IN_MODIFY, "written"), (IN_CLOSE_WRITE, "closed after writing"), (IN_MOVED_FROM, "renamed away"),
         (IN_MOVED_TO, "renamed in"), (IN_CREATE, "created"), (IN_DELETE, "removed"),
         (IN_DELETE_SELF, "the folder removed"), (IN_MOVE_SELF, "the folder moved"),
         (IN_UNMOUNT, "its filesystem unmounted"), (IN_IGNORED, "no longer watched"))
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class Watch(object):
    """inotify on folders the caller holds open (``add(fd, label)``): ``changes()`` lists, as (label, name or "",
    what happened), everything that changed their entries since the last call (CHANGES; a lost event -- the queue
    overflowed -- is a change too, labelled None). OSError when this host cannot watch (no inotify, the per-user
    limit of instances or watches reached)."""

    def __init__(self):
        fd = _libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, "no inotify instance (%s)" % os.strerror(code))
        self.fd, self.labels = fd, {}

    def add(self, dir_fd, label):
        """Watch the folder ``dir_fd`` holds (through /proc/self/fd: the very inode, whatever its path is now)."""
        wd = _libc().inotify_add_watch(self.fd, os.fsencode("/proc/self/fd/%d" % dir_fd), CHANGES | IN_ONLYDIR)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, "inotify_add_watch on %s: %s" % (label, os.strerror(code)))
        self.labels[wd] = label

    def changes(self):
        found = []
        while self.fd is not None:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size:offset + _EVENT.size + size].split(b"\0", 1)[0]
                offset += _EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    found.append((None, "", "events lost: the inotify queue overflowed"))
                    continue
                what = ", ".join(text for bit, text in _WHAT if mask & bit) or "changed (0x%x)" % mask
                found.append((self.labels.get(wd, "?"), os.fsdecode(name), what))
        return found

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

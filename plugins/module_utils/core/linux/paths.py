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

import binascii
import ctypes
import errno
import fcntl
import json
import os
import platform
import re
import shutil
import stat
import time

from ..base import schema
from ..base.errors import ParameterError, UnsafePathError
from . import proc

DIR_MODE = 0o700
FILE_MODE = 0o600


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
        wanted = DIR_MODE
    elif stat.S_ISREG(st.st_mode):
        wanted = FILE_MODE
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


def ensure_dir(path, mode=DIR_MODE):
    """Create ``path`` with ``mode`` and its missing parents with 0700; verify the leaf is a real directory.

    The umask is left alone: it is the whole process's, and a thread that sets and restores it races the others --
    two such threads can leave it at 0077 for good, and a file any thread creates meanwhile gets the wrong mode."""
    missing = []
    head = os.path.abspath(path)
    while not os.path.lexists(head):
        missing.append(head)
        head = os.path.dirname(head)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode if directory == missing[0] else 0o700)
        except FileExistsError:
            pass  # made by another thread or process meanwhile; the leaf is checked below
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError("%r is not a directory" % path, path=path)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    return path


def make_dir_if_missing(path):
    """``path`` made as ensure_dir makes it (0700, missing parents 0700) when it is not a directory yet; an existing
    one keeps its mode (/dev/shm, a decrypt dir an operator chose, dockerd's checkpoints folder)."""
    if not os.path.isdir(path):
        ensure_dir(path)
    return path


# write_file_atomic's and write_below's temporary names: .<name>.tmp.<pid>.<random>. The pid alone is not unique: a
# writer killed between its open and its rename leaves its file, and a later process with the same pid (after a reboot,
# or once pids wrap) would fail on it with EEXIST.
TEMP_NAME = re.compile(r"\A\.(.+)\.tmp\.(\d+)(?:\.[0-9a-f]+)?\Z")
TEMP_STALE_AGE = 600.0   # seconds; a record is written in milliseconds


def _create_temp(opener, name):
    """(temporary name, fd) from ``opener(flags, name)``: a fresh name per try, created O_EXCL, never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    for _try in range(8):
        tmp = ".%s.tmp.%d.%s" % (name, os.getpid(), binascii.hexlify(os.urandom(4)).decode())
        try:
            return tmp, opener(flags, tmp)
        except FileExistsError:
            continue  # 32 random bits another writer drew too: draw again
    raise FileExistsError(errno.EEXIST, "no free temporary name for %s" % name)


def write_file_atomic(path, data, mode=FILE_MODE, durable=True):
    """Write bytes to ``path`` through a temporary file and a rename, never following symlinks. ``durable=False``:
    no fsync, for a file whose directory is flushed as a whole later (a snapshot's staging directory, by its seal):
    on ext4 an fsync commits the journal, which first writes out every other file's newly allocated blocks."""
    directory, name = os.path.split(path)
    tmp, fd = _create_temp(lambda flags, tmp: os.open(os.path.join(directory, tmp), flags, mode), name)
    tmp = os.path.join(directory, tmp)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def sweep_temp_files(directory, names, now=None):
    """Remove the temporary files of write_file_atomic for ``names`` in ``directory`` that a killed writer left: its
    pid is no live process here (or is this one's) and the file is older than TEMP_STALE_AGE (a writer on another host
    of a shared store has long renamed its own by then). Returns the removed paths; best effort."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        match = TEMP_NAME.match(entry)
        pid = int(match.group(2)) if match and match.group(1) in names else None
        if pid is None or (pid != os.getpid() and proc.alive(pid)):
            continue
        path = os.path.join(directory, entry)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > TEMP_STALE_AGE:
                os.unlink(path)
                removed.append(path)
        except OSError:
            continue
    return removed


# A snapshot store that refuses writes: read-only, full, or over its quota.
STORE_ERRORS = {errno.EROFS: ("read-only", "remount it read-write, or point the snapshot path at writable storage"),
                errno.ENOSPC: ("full", "free space on it (inferops.snapshot.snapshot_cleanup removes failed and stale "
                                       "snapshots) or grow it"),
                errno.EDQUOT: ("over its quota", "free space on it or raise the quota")}


def store_error(exc):
    """The message for an OSError that says the store cannot be written (STORE_ERRORS) -- naming the path, the
    cause and the fix -- or None for any other error."""
    found = STORE_ERRORS.get(getattr(exc, "errno", None))
    if found is None:
        return None
    path = exc.filename or "?"
    directory, name = os.path.split(path)
    match = TEMP_NAME.match(name)  # write_file_atomic's temporary name: say which file
    if match:
        path = os.path.join(directory, match.group(1))
    return "cannot write %s: %s -- the storage it is on is %s; %s" % (path, exc.strerror or exc, found[0], found[1])


def remove_tree(path):
    """Remove a directory tree we created; symlinks inside are removed, never followed."""
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")
MOUNTINFO = "/proc/self/mountinfo"


def _existing(path):
    path = os.path.realpath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def mounts(mountinfo=None):
    """(mount point, filesystem type) of every line of mountinfo, in its order (the last of stacked mounts
    wins); the octal escapes of the mount point undone. The one reader of mountinfo; IOError when it cannot
    be read."""
    found = []
    with open(mountinfo or MOUNTINFO) as handle:
        for line in handle:
            left, _sep, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 5 or not right:
                continue
            point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
                .replace("\\134", "\\")
            found.append((point, right.split()[0]))
    return found


def filesystem_type(path, mountinfo=None):
    """The type of the filesystem ``path`` (or its nearest existing parent) is on, from mountinfo; None
    when it cannot be read."""
    target, best, kind = _existing(path), None, None
    try:
        found = mounts(mountinfo)
    except (IOError, OSError):
        return None
    for point, fstype in found:
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best)):  # the last of stacked mounts wins
            best, kind = point, fstype
    return kind


def is_tmpfs(path, mountinfo=None):
    """Whether files below ``path`` take memory (tmpfs, ramfs) rather than disk."""
    return filesystem_type(path, mountinfo) in MEMORY_FILESYSTEMS


# A record is a few KiB; one larger than this was not written by the collection (a writer of the store's, or
# /dev/zero behind a link) and is not read into memory.
RECORD_LIMIT = 16 * 1024 * 1024


def read_json(path, limit=RECORD_LIMIT):
    """The JSON object (a dict) in ``path``, or None when the file is missing, unreadable, not JSON or not an object:
    the one reader of the collection's records that may be absent (status, claim, restores, verdicts, settings).
    Records sit in the store, beside snapshots a writer of the store may change: a link, a FIFO (which would
    block the reader, under the pod's lock) or a file over ``limit`` bytes is None too (open_regular)."""
    try:
        fd = open_regular(path)
        try:
            data = read_limited(fd, limit, path)
        finally:
            os.close(fd)
        found = json.loads(data.decode("utf-8"))
    except (IOError, OSError, ValueError):  # ValueError: larger than ``limit`` too
        return None
    return found if isinstance(found, dict) else None


def read_limited(fd, limit, what, each=None):
    """The bytes of the file open at ``fd``, from its start; one larger than ``limit`` bytes is a ValueError naming
    ``what``, not a partial read. ``each(data, offset)`` is called with every piece as it is read."""
    chunks, total = [], 0
    while True:
        data = os.pread(fd, 1 << 20, total)
        if not data:
            break
        if each is not None:
            each(data, total)
        total += len(data)
        if total > limit:
            raise ValueError("%s is larger than %d bytes" % (what, limit))
        chunks.append(data)
    return b"".join(chunks)


def fsync_dir(path):
    """Flush a directory's entries (a rename or a new file in it) to stable storage; never through a link."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tree_bytes(root):
    """The bytes of the regular files below ``root`` by their sizes (nothing read; links not followed); 0 when missing."""
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def free_bytes(path):
    """Bytes an unprivileged writer may still put on the filesystem of ``path`` (or its nearest existing parent)."""
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


# -- inside another root (a container's), never following a link it could plant -------------------

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
                os.mkdir(part, DIR_MODE, dir_fd=fd)
                nxt = os.open(part, flags, dir_fd=fd)
                if uid is not None:
                    os.fchown(nxt, uid, gid if gid is not None else -1)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


class NotRegularFile(OSError, ValueError):
    """A path that must name a plain file names something else (a FIFO, a device, a directory)."""


def open_regular(path, dir_fd=None):
    """A read-only descriptor of the regular file at ``path`` (below ``dir_fd`` when given), never through a link.
    Opened non-blocking, then checked: a FIFO put where a file was expected -- by a writer of the store, or by an
    engine in its own root -- would block a plain open until someone opened its other end, hanging the restore
    or the check; it is refused instead (NotRegularFile). The descriptor reads as a plain one (O_NONBLOCK cleared)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile("%s is not a regular file" % path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def list_plain_files(root):
    """Relative paths of the regular files below ``root``, sorted. A link, FIFO, socket or device anywhere below
    raises NotRegularFile (a snapshot holds only plain files); a folder that cannot be listed raises its OSError
    (os.walk would skip it, leaving its files out of the check without a word)."""
    def refuse(exc):
        raise exc

    found = []
    for directory, dirs, files in os.walk(root, onerror=refuse):
        for name in dirs + files:
            full = os.path.join(directory, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise NotRegularFile("%s is not a regular file or directory; a snapshot holds only plain files"
                                     % os.path.relpath(full, root))
        found.extend(os.path.relpath(os.path.join(directory, name), root) for name in files)
    return sorted(found)


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
        tmp, out = _create_temp(lambda flags, tmp: os.open(tmp, flags, FILE_MODE, dir_fd=fd), name)
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
            fd = open_regular(parts[-1], dir_fd=directory)
        finally:
            os.close(directory)
        with os.fdopen(fd, "rb") as handle:
            return handle.read(limit)
    except (IOError, OSError, ValueError):
        return None

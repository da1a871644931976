# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files and folders as the collection writes and reads them. PRIVATE to the inferops.snapshot collection.

Folders are made 0700 and files 0600; a record is written whole or not at all (a temporary sibling, fsync,
rename); what a writer of the store may have put in place of a file -- a link, a FIFO, a device, something too
large -- is refused, not read; a folder's lock is its flock (``dir_lock``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import binascii
import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import time
from ..base.errors import UnsafePathError
from . import proc


DIR_MODE = 0o700
FILE_MODE = 0o600


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


def create_temp(opener, name):
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
    tmp, fd = create_temp(lambda flags, tmp: os.open(os.path.join(directory, tmp), flags, mode), name)
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
        st = os.statvfs(existing_ancestor(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


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


def existing_ancestor(path):
    path = os.path.realpath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LockBusy(OSError):
    """Another process holds the lock, and the caller would not wait for it."""


def locked_fd(path, shared=False, wait=True, flags=DIR_FLAGS, mode=FILE_MODE):
    """An fd of ``path`` (a folder, never through a link, unless ``flags`` say otherwise) that holds its flock,
    exclusive or ``shared``. ``wait=False``: LockBusy at once when another process holds it. Closing the fd releases
    the lock; a killed holder's is released by the kernel, so no lock outlives its process."""
    fd = os.open(path, flags, mode)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
    except (IOError, OSError) as exc:
        os.close(fd)
        if wait:
            raise
        raise LockBusy(exc.errno, "%s is locked by another process" % path)
    return fd


@contextlib.contextmanager
def locked(path, shared=False, flags=DIR_FLAGS, mode=FILE_MODE):
    """``locked_fd`` held for a ``with`` block (waiting for the lock)."""
    fd = locked_fd(path, shared, True, flags, mode)
    try:
        yield fd
    finally:
        os.close(fd)

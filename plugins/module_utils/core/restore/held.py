# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A snapshot's files held for one restore: the bytes verified are the bytes restored. PRIVATE to
inferops.snapshot.

Verifying a snapshot by path and then letting CRIU (or containerd, or the decryption) read it by path again
leaves a window in which a writer of the store -- a shared export, a PVC other pods mount -- swaps the bytes
after they were hashed. So a restore opens every file of the snapshot once, before it hashes anything, and
holds those descriptors until the restored process has everything it will ever read:

- **leased** (a local filesystem): each descriptor takes a read lease (``F_SETLEASE F_RDLCK``, root's
  CAP_LEASE). The kernel refuses the lease while anyone has the file open for writing, and breaks it when
  anyone opens or truncates it for writing later -- that writer is held off for the lease-break time. The
  verification hashes through the descriptors, CRIU reads the very same inodes through ``view``: a private
  directory (0700) beside the snapshot of hard links to the held inodes (linkat AT_EMPTY_PATH), which no rename
  in the store can redirect -- or, where no link can be made (another mount, a read-only store), copies read
  through the held descriptors.
  ``broken()`` after CRIU has read everything says whether anyone tried to write meanwhile (the restore then
  fails closed: nothing of it runs). A rename breaks no lease, and the view sits in the store, where a writer
  with root's rights could rename a file of its own into it after the check: so once made, the view is checked
  to hold exactly the held inodes (seal_view), its folders are held open, and ``broken()`` also names a folder
  whose ctime moved -- any entry added, removed or renamed in it, or the folder itself moved.
- **copied** (no lease possible: NFS and other network filesystems, or a file already open for writing): the
  verification copies each file into a private directory on tmpfs as it hashes it, reading the store once;
  CRIU reads that copy.

``mode`` says which; ``copy_parent`` is where a copy goes (the node's decrypt directory), checked for room
before anything is copied.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import errno
import fcntl
import os
import signal
import stat
import threading

from ..base import layout
from ..linux import fs, mounts, plaintext, proc

F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
F_GETLEASE = getattr(fcntl, "F_GETLEASE", 1025)
F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
# The kernel tells a lease holder of a break with a signal, SIGIO by default, which would kill the restoring
# process: SIGURG's default is to be ignored. The restore asks the lease's state (broken()) instead.
BREAK_SIGNAL = signal.SIGURG
LEASED, COPIED = "leased", "copied"


class HoldError(Exception):
    """The snapshot cannot be held for this restore: ``reason`` is ``<kind>: <detail>`` (a cold start)."""

    def __init__(self, reason):
        super(HoldError, self).__init__(reason)
        self.reason = reason


class Held:
    def __init__(self, snapshot_dir, copy_parent, leases=True):
        self.snapshot_dir = snapshot_dir
        self.copy_parent = copy_parent
        self.fds = {}             # relpath -> descriptor, opened once
        self.sizes = {}
        self.mode = LEASED if leases else COPIED
        self.why_copied = None if leases else "leases not asked for"
        self.private = None       # plaintext.PrivateDir: the view (leased) or the copy (copied)
        self.linked = False       # the view is hard links to the held inodes
        self._copies = {}         # relpath -> descriptor of its copy (copied)
        self._expected = {}       # relpath in the linked view -> (st_dev, st_ino) this restore put there
        self._folders = {}        # relpath of a folder of the linked view -> (descriptor, its ctime when sealed)
        self._lock = threading.Lock()  # the chunks of one file are hashed (and copied) by several threads

    @classmethod
    def open(cls, snapshot_dir, copy_parent, leases=True):
        """Every file of ``snapshot_dir`` opened once (never through a link), leased where the filesystem allows;
        raises HoldError (a cold start) when it cannot be held at all, or a copy would not fit."""
        held = cls(snapshot_dir, copy_parent, leases)
        try:
            # No snapshot there holds nothing: the verification then names it missing (a first start, not a fault).
            for rel in fs.list_plain_files(snapshot_dir) if os.path.lexists(snapshot_dir) else []:
                fd = fs.open_regular(os.path.join(snapshot_dir, rel))
                held.fds[rel] = fd
                held.sizes[rel] = os.fstat(fd).st_size
                if held.mode == LEASED:
                    try:
                        fcntl.fcntl(fd, F_SETSIG, BREAK_SIGNAL)
                        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
                    except (IOError, OSError) as exc:
                        held._give_up_leases("%s: %s" % (rel, os.strerror(exc.errno)))
            if held.mode == COPIED:
                fs.make_dir_if_missing(copy_parent)
                held._check_room()
                held.private = plaintext.PrivateDir(copy_parent)
            return held
        except fs.NotRegularFile as exc:  # listed as a link or special file, or swapped for one since
            held.close()
            raise HoldError("unsafe_file: %s" % exc)
        except (IOError, OSError) as exc:
            held.close()
            raise HoldError("unreadable: cannot open the snapshot's files for the restore: %s" % exc)
        except HoldError:
            held.close()
            raise

    def _give_up_leases(self, why):
        for fd in self.fds.values():
            try:
                fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
            except (IOError, OSError):
                pass
        self.mode, self.why_copied = COPIED, why

    def _check_room(self):
        need = sum(self.sizes.values())
        free = fs.free_bytes(self.copy_parent)
        if free is not None and need > free:
            raise HoldError("insufficient_space: the snapshot's files cannot be leased here (%s), so the restore "
                            "copies them while it verifies them: %d MiB, and %s has %d MiB free; free space there or "
                            "give the node a larger private directory (decrypt_dir)"
                            % (self.why_copied, need >> 20, self.copy_parent, free >> 20))
        have = proc.available_memory()
        if mounts.is_tmpfs(self.copy_parent) and have is not None and need > have:
            raise HoldError("insufficient_memory: the snapshot's files cannot be leased here (%s), and their copy on "
                            "tmpfs needs %d MiB; this host has %d MiB available" % (self.why_copied, need >> 20,
                                                                                    have >> 20))

    # -- for the verification (manifest.verify's ``files``) --------------------------------------------
    def fd(self, rel):
        """The descriptor ``rel`` was opened with; KeyError when it was not there when the restore began."""
        return self.fds[rel]

    def size(self, rel):
        return os.fstat(self.fds[rel]).st_size

    def sink(self, rel):
        """Where the verification writes what it read of ``rel`` (copied), or None (leased)."""
        if self.mode != COPIED:
            return None
        with self._lock:
            fd = self._copies.get(rel)
            if fd is None:
                target = os.path.join(self.private.path, rel)
                fs.ensure_dir(os.path.dirname(target))
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             fs.FILE_MODE)
                os.ftruncate(fd, self.sizes[rel])
                self._copies[rel] = fd
            return fd

    # -- for the restore --------------------------------------------------------------------------------
    def make_view(self):
        """The directory the restore reads the snapshot from, made once the verification is done: hard links to the
        held inodes in a private directory beside the snapshot (same mount: no copy; CRIU opens them by name from
        inside the container's namespaces, where no /proc link of ours would resolve), else -- another mount, a
        read-only store -- copies read through the held descriptors; when copied, the verified copy itself.
        Raises HoldError when a copy would not fit."""
        if self.private is not None:
            self._copied()
            return self.private.path
        parent = os.path.dirname(self.snapshot_dir.rstrip("/"))
        try:
            self.private = plaintext.PrivateDir(parent, prefix=layout.VIEW_PREFIX)
            for rel, fd in sorted(self.fds.items()):
                target = os.path.join(self.private.path, rel)
                fs.ensure_dir(os.path.dirname(target))
                if not _link_fd(fd, target):
                    raise OSError(errno.EXDEV, "cannot link %s here" % rel)
                self._expected[rel] = _identity(os.fstat(fd))
            self.linked = True
            self.seal_view()
            return self.private.path
        except (IOError, OSError) as exc:
            if self.private is not None:
                self.private.remove()
                self.private = None
            self.why_copied = "no links beside the snapshot (%s)" % exc
        self._check_room()
        fs.make_dir_if_missing(self.copy_parent)
        self.private = plaintext.PrivateDir(self.copy_parent)
        for rel, fd in sorted(self.fds.items()):
            target = os.path.join(self.private.path, rel)
            fs.ensure_dir(os.path.dirname(target))
            _copy(fd, None, target)
        return self.private.path

    @property
    def view(self):
        """make_view()'s directory (made by the pipeline at the end of the verification)."""
        if self.private is None:
            self.make_view()
        return self.private.path

    def _copied(self):
        """The verification is done writing the copy: its descriptors go before anything reads it."""
        for fd in self._copies.values():
            os.close(fd)
        self._copies = {}

    @property
    def images_dir(self):
        return layout.images_dir(self.view)

    def place(self, below, target):
        """The held files below ``below`` (a relpath: the CRIU images) at ``target``, for a reader that insists on a
        path of its own (Docker's checkpoint directory): hard links to the held inodes where the filesystem allows
        (linkat AT_EMPTY_PATH: no rename in the store redirects them), else copies read from the held descriptors
        (or from the verified copy). Returns "hardlink" or "copy"."""
        prefix = below.rstrip("/") + "/"
        wanted = sorted(rel for rel in self.fds if rel.startswith(prefix))
        self._copied()
        how = "hardlink"
        for rel in wanted:
            dst = os.path.join(target, rel[len(prefix):])
            fs.ensure_dir(os.path.dirname(dst))
            if self.mode == LEASED and how == "hardlink" and _link_fd(self.fds[rel], dst):
                self._expect(dst, _identity(os.fstat(self.fds[rel])))
                continue
            how = "copy"
            if self.mode == LEASED:
                self._expect(dst, _copy(self.fds[rel], None, dst))
            else:
                _copy(None, os.path.join(self.private.path, rel), dst)
        return how

    def write_into_view(self, rel, data):
        """A file of this restore's own (a rewritten image) at ``rel`` in the view, created, never replaced."""
        target = os.path.join(self.view, rel)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            self._expect(target, _identity(os.fstat(fd)))
        finally:
            os.close(fd)

    def forget_in_view(self, rel):
        """Remove ``rel`` from the view (this restore replaces it)."""
        os.unlink(os.path.join(self.view, rel))
        self._expected.pop(rel, None)

    def _expect(self, path, identity):
        if self.linked and self.private is not None and path.startswith(self.private.path.rstrip("/") + "/"):
            self._expected[os.path.relpath(path, self.private.path)] = identity

    def seal_view(self):
        """Check that the linked view holds exactly what this restore put there -- real folders, and in them the files
        it linked or wrote, by inode -- and hold its folders open with their ctime, which any later entry added,
        removed or renamed (or the folder moved) changes: ``broken()`` names them. Called once the view is made, and
        again after this restore adds to it. HoldError (a cold start) when it holds anything else. The folders are
        opened and their ctime taken before they are listed, so a change after the listing is seen by ``broken()``
        and one before it by this check."""
        if not self.linked:
            return
        self._close_folders()
        found = {}
        root = os.open(self.private.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        pending = [("", root)]
        try:
            while pending:
                rel, fd = pending.pop()
                self._folders[rel] = (fd, os.fstat(fd).st_ctime_ns)
                for name in sorted(os.listdir(fd)):
                    child = rel + "/" + name if rel else name
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                        pending.append((child, sub))
                        if _identity(os.fstat(sub)) != _identity(st):
                            raise OSError(errno.ESTALE, "%s was replaced while it was checked" % child)
                    else:
                        found[child] = _identity(st) if stat.S_ISREG(st.st_mode) else None
        except OSError as exc:
            for _rel, fd in pending:
                os.close(fd)
            self._close_folders()
            raise HoldError("swapped: the view of the snapshot the restore reads changed while it was made: %s" % exc)
        if found != self._expected:
            self._close_folders()
            odd = sorted(rel for rel in set(found) | set(self._expected) if found.get(rel) != self._expected.get(rel))
            raise HoldError("swapped: the view of the snapshot the restore reads does not hold the verified files "
                            "alone (%s): someone writes the store" % ", ".join(odd[:5]))

    def _changed_folders(self):
        return sorted("the view's folder %s" % (rel or ".") for rel, (fd, ctime) in self._folders.items()
                      if os.fstat(fd).st_ctime_ns != ctime)

    def _close_folders(self):
        for fd, _ctime in self._folders.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._folders = {}

    def broken(self):
        """The files someone opened for writing since they were leased ([] when none, and always when copied)."""
        if self.mode != LEASED:
            return []
        return sorted(rel for rel, fd in self.fds.items() if _lease(fd) != fcntl.F_RDLCK) + self._changed_folders()

    def summary(self):
        return {"mode": self.mode, "files": len(self.fds), "why_copied": self.why_copied, "linked": self.linked}

    def close(self):
        """Let go of everything: leases, descriptors, the view or the copy."""
        for fd in list(self._copies.values()) + list(self.fds.values()):
            try:
                os.close(fd)
            except OSError:
                pass
        self._copies, self.fds = {}, {}
        self._close_folders()
        if self.private is not None:
            self.private.remove()
            self.private = None


_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except (OSError, AttributeError):  # pragma: no cover -- not glibc: copies instead of links
    _LIBC = None


def _link_fd(fd, target):
    """Hard-link the inode ``fd`` holds at ``target`` (linkat AT_EMPTY_PATH, root's CAP_DAC_READ_SEARCH); False when
    the filesystem or the mounts do not allow it (another filesystem or mount: EXDEV)."""
    if _LIBC is None:
        return False
    return _LIBC.linkat(fd, b"", _AT_FDCWD, target.encode(), _AT_EMPTY_PATH) == 0


def _copy(fd, path, target):
    """Copy from the held descriptor ``fd`` (or, without one, the private file ``path``) to ``target`` (0600)."""
    src = os.dup(fd) if fd is not None else os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
        try:
            offset, size = 0, os.fstat(src).st_size
            while offset < size:
                done = os.sendfile(dst, src, offset, min(1 << 30, size - offset))
                if not done:
                    break
                offset += done
            return _identity(os.fstat(dst))
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _identity(st):
    return st.st_dev, st.st_ino


def _lease(fd):
    try:
        return fcntl.fcntl(fd, F_GETLEASE)
    except (IOError, OSError) as exc:
        if exc.errno == errno.EBADF:
            return None
        raise

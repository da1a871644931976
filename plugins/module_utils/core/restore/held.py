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
  anyone opens or truncates it for writing later -- that writer is held off for the lease-break time (45 s by
  default), no longer: ``broken()`` says so, and a path that leases leaves the restored tasks stopped until it
  has asked (stages.py). The verification hashes through the descriptors; CRIU reads the very same inodes
  through ``view``: a private directory (0700) beside the snapshot of hard links to the held inodes (linkat
  AT_EMPTY_PATH) -- or, where no link can be made (another mount, a read-only store), copies read through the
  held descriptors. No reader gets that directory by its path in the store, which a writer of the store could
  exchange for a forged tree: every one gets ``/proc/<this pid>/fd/<N>`` of a folder this restore holds open
  (runc opens ``--image-path`` and hands CRIU the descriptor; CRIU opens ``-D`` once and reads every image
  relative to it). A rename breaks no lease, and the view's folders sit in the store, where a writer with root's
  rights could rename a file of its own into them: each folder is watched (inotify) from before anything is put
  in it, the view is checked to hold exactly the held inodes when it is sealed, and any change of its entries
  after that is named by ``broken()`` -- on every kernel and filesystem, timestamps or not.
- **copied** (no lease possible -- NFS and other network filesystems, a file already open for writing -- or a path
  whose restored tasks may run before everything is read: ``docker start --checkpoint``, a lazy restore): the
  verification copies each file into a private directory on tmpfs as it hashes it, reading the store once;
  CRIU reads that copy.

``mode`` says which; ``copy_parent`` is where a copy goes (the node's decrypt directory), checked for room
before anything is copied.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import ctypes
import errno
import fcntl
import os
import signal
import stat
import threading

from ..base import layout
from ..linux import fs, mounts, plaintext, proc, syscalls

F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
F_GETLEASE = getattr(fcntl, "F_GETLEASE", 1025)
F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
# The kernel tells a lease holder of a break with a signal, SIGIO by default, which would kill the restoring
# process: SIGURG's default is to be ignored. The restore asks the lease's state (broken()) instead.
BREAK_SIGNAL = signal.SIGURG
LEASED, COPIED = "leased", "copied"
DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
SHOWN_CHANGES = 5  # names of a folder of the view, in a reason


class HoldError(Exception):
    """The snapshot cannot be held for this restore: ``reason`` is ``<kind>: <detail>`` (a cold start)."""

    def __init__(self, reason):
        super(HoldError, self).__init__(reason)
        self.reason = reason


class Held:
    def __init__(self, snapshot_dir, copy_parent, leases=True, why=None):
        self.snapshot_dir = snapshot_dir
        self.copy_parent = copy_parent
        self.fds = {}             # relpath -> descriptor, opened once
        self.sizes = {}
        self.mode = LEASED if leases else COPIED
        self.why_copied = None if leases else (why or "leases not asked for")
        self.private = None       # plaintext.PrivateDir: the view (leased) or the copy (copied)
        self.linked = False       # the view is hard links to the held inodes
        self._copies = {}         # relpath -> descriptor of its copy (copied)
        self._dirs = {}           # relpath of a folder of the view ("": its root) -> descriptor, held to the end
        self._dir_ids = {}        # relpath of a folder of the linked view -> (st_dev, st_ino) this restore made
        self._expected = {}       # relpath in the linked view -> (st_dev, st_ino) this restore put there
        self._watch = None        # syscalls.Watch on the linked view's folders
        self._new = set()         # folders made since the last seal (their own changes are this restore's)
        self._sealed = False
        self._changes = []        # what changed in the view since it was sealed
        self._lock = threading.Lock()  # the chunks of one file are hashed (and copied) by several threads

    @classmethod
    def open(cls, snapshot_dir, copy_parent, leases=True, why=None):
        """Every file of ``snapshot_dir`` opened once (never through a link), leased where the filesystem allows
        (``leases=False``: copied, ``why``); raises HoldError (a cold start) when it cannot be held at all, or a copy
        would not fit."""
        held = cls(snapshot_dir, copy_parent, leases, why)
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
            raise HoldError("insufficient_space: the restore copies the snapshot's files as it verifies them (%s): "
                            "%d MiB, and %s has %d MiB free; free space there or give the node a larger private "
                            "directory (decrypt_dir)" % (self.why_copied, need >> 20, self.copy_parent, free >> 20))
        have = proc.available_memory()
        if mounts.is_tmpfs(self.copy_parent) and have is not None and need > have:
            raise HoldError("insufficient_memory: the restore copies the snapshot's files as it verifies them (%s), "
                            "and their copy on tmpfs needs %d MiB; this host has %d MiB available"
                            % (self.why_copied, need >> 20, have >> 20))

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
                fd = os.open(target, FILE_NEW, fs.FILE_MODE)
                os.ftruncate(fd, self.sizes[rel])
                self._copies[rel] = fd
            return fd

    # -- for the restore --------------------------------------------------------------------------------
    def make_view(self):
        """What the restore reads the snapshot from, made once the verification is done: hard links to the held
        inodes in a private directory beside the snapshot (same mount: no copy), watched and sealed, else --
        another mount, a read-only store, no inotify -- copies read through the held descriptors; when copied, the
        verified copy itself. Its folders are held open: returns ``view``. Raises HoldError when a copy would not
        fit, or the linked view holds anything but what this restore put there."""
        if self._dirs:
            return self.view
        if self.private is not None:  # copied: the verification's copy
            self._copied()
            self._open_copy()
            return self.view
        why = self._link_view()
        if why is None:
            return self.view
        self.why_copied = why
        self._check_room()
        fs.make_dir_if_missing(self.copy_parent)
        self.private = plaintext.PrivateDir(self.copy_parent)
        for rel, fd in sorted(self.fds.items()):
            target = os.path.join(self.private.path, rel)
            fs.ensure_dir(os.path.dirname(target))
            _copy(fd, None, target)
        self._open_copy()
        return self.view

    def _link_view(self):
        """The linked view, sealed; None when made, else why not (it is gone again)."""
        parent = os.path.dirname(self.snapshot_dir.rstrip("/"))
        try:
            self.private = plaintext.PrivateDir(parent, prefix=layout.VIEW_PREFIX)
            try:
                self._watch = syscalls.Watch()
                self._folder("")
            except (IOError, OSError) as exc:
                raise _NoView("no watch on a view beside the snapshot (%s)" % exc)
            for rel, fd in sorted(self.fds.items()):
                if not _link_fd(fd, os.path.basename(rel), self._folder(os.path.dirname(rel))):
                    raise OSError(errno.EXDEV, "cannot link %s here" % rel)
                self._expected[rel] = _identity(os.fstat(fd))
            self.linked = True
        except (_NoView, IOError, OSError) as exc:
            self._drop_view()
            return exc.why if isinstance(exc, _NoView) else "no links beside the snapshot (%s)" % exc
        self.seal_view()
        return None

    def _folder(self, rel):
        """The linked view's folder ``rel`` ("": its root), made 0700 where missing -- never through a link, always
        relative to its parent's descriptor -- held open and watched before anything is put in it."""
        if rel in self._dirs:
            return self._dirs[rel]
        if rel:
            parent = self._folder(os.path.dirname(rel))
            os.mkdir(os.path.basename(rel), fs.DIR_MODE, dir_fd=parent)
            fd = os.open(os.path.basename(rel), DIR_OPEN, dir_fd=parent)
        else:
            fd = os.open(self.private.path, DIR_OPEN)
        self._dirs[rel], self._dir_ids[rel] = fd, _identity(os.fstat(fd))
        self._new.add(rel)
        self._watch.add(fd, rel or ".")
        return fd

    def _open_copy(self):
        """The copy's folders held open (the copy is private: nobody else writes there)."""
        pending = [("", os.open(self.private.path, DIR_OPEN))]
        while pending:
            rel, fd = pending.pop()
            self._dirs[rel] = fd
            for name in os.listdir(fd):
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    pending.append((rel + "/" + name if rel else name, os.open(name, DIR_OPEN, dir_fd=fd)))

    @property
    def view(self):
        """make_view()'s directory as the restore's readers get it: ``/proc/<this pid>/fd/<N>`` of its root, which this
        restore holds open (made by the pipeline at the end of the verification)."""
        return self.folder("")

    def folder(self, rel):
        """The view's folder ``rel`` through the descriptor this restore holds (``/proc/<pid>/fd/<N>``: runc, CRIU and
        the lazy-pages daemon open it, and with it the very folder, whatever a writer of the store renames)."""
        if not self._dirs:
            self.make_view()
        if rel not in self._dirs:
            return os.path.join(self.folder(""), rel)
        return "/proc/%d/fd/%d" % (os.getpid(), self._dirs[rel])

    @property
    def images_dir(self):
        return self.folder(layout.IMAGES_DIR)

    @property
    def view_path(self):
        """Where the view is (for a person: no reader is given this path)."""
        return self.private.path if self.private is not None else None

    def _copied(self):
        """The verification is done writing the copy: its descriptors go before anything reads it."""
        for fd in self._copies.values():
            os.close(fd)
        self._copies = {}

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
                continue
            how = "copy"
            if self.mode == LEASED:
                _copy(self.fds[rel], None, dst)
            else:
                _copy(None, os.path.join(self.private.path, rel), dst)
        return how

    def images_with(self, folder, name, data):
        """The CRIU images as verified, but ``name``, which is this restore's own ``data`` (files.img rewritten for
        the pod's new address), in the new folder ``folder`` of the view: links to the held inodes (copied: to the
        verified copy) and the new file, created there, never replaced; the view sealed again. Returns the folder as
        its readers get it (``folder()``). HoldError when the view cannot take it or holds anything else."""
        self.make_view()
        prefix = layout.IMAGES_DIR + "/"
        try:
            if self.linked:
                target = self._folder(folder)
            else:
                os.mkdir(folder, fs.DIR_MODE, dir_fd=self._dirs[""])
                target = self._dirs[folder] = os.open(folder, DIR_OPEN, dir_fd=self._dirs[""])
            for rel in sorted(r for r in self.fds if r.startswith(prefix) and "/" not in r[len(prefix):]):
                base = rel[len(prefix):]
                if base == name:
                    continue
                if self.linked:
                    if not _link_fd(self.fds[rel], base, target):
                        raise OSError(errno.EXDEV, "cannot link %s into the view" % rel)
                    self._expected[folder + "/" + base] = _identity(os.fstat(self.fds[rel]))
                else:
                    os.link(base, base, src_dir_fd=self._dirs[layout.IMAGES_DIR], dst_dir_fd=target,
                            follow_symlinks=False)
            fd = os.open(name, FILE_NEW, fs.FILE_MODE, dir_fd=target)
            try:
                written = memoryview(data)
                while written:
                    written = written[os.write(fd, written):]
                if self.linked:
                    self._expected[folder + "/" + name] = _identity(os.fstat(fd))
            finally:
                os.close(fd)
        except (IOError, OSError) as exc:
            raise HoldError("host_images_unreadable: cannot put the images for the pod's new address beside the "
                            "verified ones: %s" % exc)
        self.seal_view()
        return self.folder(folder)

    def seal_view(self):
        """Check that the linked view holds exactly what this restore put there -- its folders, and in them the files
        it linked or wrote, by inode -- from the descriptors it holds; from then on, any change of the view's entries
        is named by ``broken()``. Called once the view is made, and again after this restore adds to it (what changed
        meanwhile in the folders it had sealed counts; its own new folders' changes are its own). HoldError (a cold
        start) when it holds anything else. The pending events are taken before the folders are listed: a change
        after that is either in the listing or reported later."""
        if not self.linked:
            return
        for label, name, what in self._watch.changes():
            own = label is not None and (_child(label, "") in self._new or
                                         (what == "created" and _child(label, name) in self._new))
            if self._sealed and not own:
                self._changes.append((label, name, what))
        self._new = set()
        found, folders = {}, {}
        try:
            for rel, fd in sorted(self._dirs.items()):
                for name in os.listdir(fd):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        folders[_child(rel, name)] = _identity(st)
                    else:
                        found[_child(rel, name)] = _identity(st) if stat.S_ISREG(st.st_mode) else None
        except OSError as exc:
            raise HoldError("swapped: the view of the snapshot the restore reads changed while it was made: %s" % exc)
        made = dict((rel, ident) for rel, ident in self._dir_ids.items() if rel)
        if found != self._expected or folders != made:
            odd = sorted(rel for rel in set(found) | set(self._expected) | set(folders) | set(made)
                         if found.get(rel, folders.get(rel)) != self._expected.get(rel, made.get(rel)))
            raise HoldError("swapped: the view of the snapshot the restore reads does not hold the verified files "
                            "alone (%s): someone writes the store" % ", ".join(odd[:5]))
        self._sealed = True

    def broken(self):
        """What someone changed since the restore held it ([] when nothing, and always when copied): files opened for
        writing since they were leased, and changes of the view's entries since it was sealed."""
        if self.mode != LEASED:
            return []
        if self._watch is not None and self._sealed:
            self._changes.extend(self._watch.changes())
        return sorted(rel for rel, fd in self.fds.items() if _lease(fd) != fcntl.F_RDLCK) + _described(self._changes)

    def summary(self):
        return {"mode": self.mode, "files": len(self.fds), "why_copied": self.why_copied, "linked": self.linked,
                "watched": self._watch is not None}

    def _drop_view(self):
        """Let go of the view: its watch, its entries (removed through the folders held, deepest first, so that a
        folder exchanged in the store meanwhile is never entered by its path), its folders, and the directory itself
        where it still is what this restore made."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        for rel in sorted(self._dirs, key=lambda r: -len(r.split("/")) if r else 0):
            fd = self._dirs[rel]
            for name in _names(fd):
                try:
                    if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        os.rmdir(name, dir_fd=fd)  # emptied before (deeper); someone else's stays
                    else:
                        os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
        root = self._dir_ids.get("")
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs, self._dir_ids, self._expected = {}, {}, {}
        self.linked = self._sealed = False
        if self.private is not None:
            self.private.remove(expect=root)
            self.private = None

    def close(self):
        """Let go of everything: leases, descriptors, the view or the copy."""
        for fd in list(self._copies.values()) + list(self.fds.values()):
            try:
                os.close(fd)
            except OSError:
                pass
        self._copies, self.fds = {}, {}
        self._drop_view()


class _NoView(OSError):
    def __init__(self, why):
        super(_NoView, self).__init__(errno.ENOSYS, why)
        self.why = why


_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except (OSError, AttributeError):  # pragma: no cover -- not glibc: copies instead of links
    _LIBC = None


def _link_fd(fd, target, dir_fd=_AT_FDCWD):
    """Hard-link the inode ``fd`` holds at ``target`` (relative to ``dir_fd``; linkat AT_EMPTY_PATH, root's
    CAP_DAC_READ_SEARCH); False when the filesystem or the mounts do not allow it (another filesystem or mount:
    EXDEV)."""
    if _LIBC is None:
        return False
    return _LIBC.linkat(fd, b"", dir_fd, os.fsencode(target), _AT_EMPTY_PATH) == 0


def _copy(fd, path, target):
    """Copy from the held descriptor ``fd`` (or, without one, the private file ``path``) to ``target`` (0600)."""
    src = os.dup(fd) if fd is not None else os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst = os.open(target, FILE_NEW, fs.FILE_MODE)
        try:
            offset, size = 0, os.fstat(src).st_size
            while offset < size:
                done = os.sendfile(dst, src, offset, min(1 << 30, size - offset))
                if not done:
                    break
                offset += done
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _names(fd):
    try:
        return os.listdir(fd)
    except OSError:
        return []


def _child(rel, name):
    """The relpath of ``name`` in the view's folder ``rel`` (or its label: "." is the root); ``rel`` itself for no
    name."""
    rel = "" if rel in ("", ".") else rel
    return rel + "/" + name if rel and name else rel or name


def _described(changes):
    """One line per folder of the view, its names in the order they changed: "the view's folder host/criu (core-1.img
    renamed in; x.img created, removed)"."""
    folders = collections.OrderedDict()
    for label, name, what in changes:
        whats = folders.setdefault(label, collections.OrderedDict()).setdefault(name, [])
        if what not in whats:
            whats.append(what)
    lines = []
    for label, names in folders.items():
        told = ["%s%s" % (name + " " if name else "", ", ".join(whats)) for name, whats in names.items()]
        if len(told) > SHOWN_CHANGES:
            told = told[:SHOWN_CHANGES] + ["%d more" % (len(told) - SHOWN_CHANGES)]
        lines.append("the view (%s)" % "; ".join(told) if label is None else
                     "the view's folder %s (%s)" % (label, "; ".join(told)))
    return lines


def _identity(st):
    return st.st_dev, st.st_ino


def _lease(fd):
    try:
        return fcntl.fcntl(fd, F_GETLEASE)
    except (IOError, OSError) as exc:
        if exc.errno == errno.EBADF:
            return None
        raise

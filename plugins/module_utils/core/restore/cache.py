# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verified snapshots staged ahead: the node's cache. PRIVATE to the inferops.snapshot collection.

A restore hashes the whole snapshot before anything of it runs. A node that will restore a snapshot
(after its generation, ahead of a scale-out) can pay that once, ahead of time: ``stage`` copies the
snapshot into a private directory of the node's cache, verifies the copy fully (``manifest.verify``,
the trusted keys when given), and writes a verdict that binds what was verified to the copy's files
as the kernel knows them -- path, size, inode, device, mtime and ctime of every file (ctime changes
on every write, chmod, link or rename, and cannot be set back from user space), the exact listing of
files and directories, and the snapshot's fingerprint (the SHA-256 of its ``checksum.sha256``).

``lookup`` trusts that verdict only while every bound fact still holds and the entry is root's alone
(directories 0700, files 0600: paths.private_reason); anything else drops the entry and returns
None, and the restore verifies the snapshot itself, as without a cache. The restore pipeline
(restore/pipeline.py) still checks the requested snapshot -- its checksum list must hash to the
entry's fingerprint, its signature, manifest, identity and world -- and skips only the content hashing.

Layout (layout.py): ``<stage_dir>/<fingerprint>/{snapshot/, verdict.json}``; a copy is made in
``.<fingerprint>.partial.<pid>`` and published by one rename. An entry in use is held with a shared
flock of its directory; retention (``prune``: by count and bytes, the oldest verified first) and
``drop`` take the exclusive one without waiting, so they never remove an entry a restore reads.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor

from ..base import layout
from ..base.clock import Stopwatch, utc_now
from ..base.errors import ParameterError, SnapshotError
from ..linux import fs, paths
from ..store import hashing, manifest, status

VERDICT_VERSION = 1
BOUND = ("size", "ino", "dev", "mtime_ns", "ctime_ns")   # what a verdict binds of every file of the copy
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


class Entry:
    """A verified copy ``lookup`` found, held (a shared flock of its directory) until ``release``."""

    def __init__(self, path, verdict, fd):
        self.path = path
        self.dir = layout.stage_content(path)
        self.verdict = verdict
        self.fingerprint = verdict["fingerprint"]
        self._fd = fd

    def summary(self):
        return {"dir": self.dir, "verified_at": self.verdict["verified_at"]}

    def release(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def check_root(stage_dir, field="stage_dir"):
    """The normalised cache directory, or ParameterError/UnsafePathError naming ``field`` (paths.py's policy:
    absolute, no '..', every component root's and not writable by others, no link below the root)."""
    if not isinstance(stage_dir, str) or not stage_dir:
        raise ParameterError("%s: give the absolute path of the node's cache of verified snapshots" % field,
                             field=field)
    return paths.validate_snapshot_dir(stage_dir, field=field)


def _stat_fields(st):
    return {"size": st.st_size, "ino": st.st_ino, "dev": st.st_dev, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _listing(content):
    """({reldir: lstat}, {relfile: lstat}) of everything below ``content``; nothing is followed."""
    dirs, files = {}, {}
    for directory, subdirs, names in os.walk(content):
        rel = os.path.relpath(directory, content)
        dirs["" if rel == "." else rel] = os.lstat(directory)
        for name in subdirs + names:
            st = os.lstat(os.path.join(directory, name))
            if not stat.S_ISDIR(st.st_mode):  # a link (to a directory too) or a special file lands here, and fails
                files[os.path.normpath(os.path.join(rel, name))] = st
    return dirs, files


def _check(path, fd, fingerprint):
    """(verdict, None) when the entry at ``path`` (open as ``fd``) is exactly what was verified; (None, why)."""
    lst = os.lstat(path)
    if (lst.st_ino, lst.st_dev) != (os.fstat(fd).st_ino, os.fstat(fd).st_dev):
        return None, "the entry was replaced while it was opened"
    wrong = paths.private_reason(lst, "the entry")
    if wrong:
        return None, wrong
    if sorted(os.listdir(path)) != sorted([layout.STAGE_CONTENT, layout.STAGE_VERDICT]):
        return None, "the entry holds %s, not only %s and %s" % (sorted(os.listdir(path)), layout.STAGE_CONTENT,
                                                                 layout.STAGE_VERDICT)
    vfd = os.open(layout.STAGE_VERDICT, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    with os.fdopen(vfd, "rb") as handle:
        wrong = paths.private_reason(os.fstat(handle.fileno()), layout.STAGE_VERDICT)
        if wrong:
            return None, wrong
        try:
            verdict = json.loads(handle.read().decode("utf-8"))
        except ValueError as exc:
            return None, "%s is not JSON: %s" % (layout.STAGE_VERDICT, exc)
    if not isinstance(verdict, dict) or verdict.get("schema_version") != VERDICT_VERSION \
            or verdict.get("fingerprint") != fingerprint:
        return None, "%s is not a verdict on snapshot %s" % (layout.STAGE_VERDICT, fingerprint)
    content = layout.stage_content(path)
    dirs, files = _listing(content)
    bound = dict((item["path"], item) for item in verdict.get("files") or [])
    if sorted(dirs) != sorted(verdict.get("dirs") or []) or sorted(files) != sorted(bound):
        return None, "the copy's listing is not the one verified"
    for rel, st in sorted(dirs.items()):
        wrong = paths.private_reason(st, "directory %r of the copy" % (rel or "."))
        if wrong:
            return None, wrong
    for rel, st in sorted(files.items()):
        wrong = paths.private_reason(st, "%s of the copy" % rel)
        if wrong:
            return None, wrong
        now = _stat_fields(st)
        changed = [key for key in BOUND if bound[rel].get(key) != now[key]]
        if changed:
            return None, "%s of the copy changed since it was verified (%s)" % (rel, ", ".join(changed))
    if hashing.fingerprint(content) != fingerprint:  # bound by stat already; a few bytes, read to be sure
        return None, "the copy's %s does not hash to %s" % (layout.CHECKSUMS, fingerprint)
    return verdict, None


def find(stage_dir, source=None, fingerprint=None, drop=True):
    """(Entry, None) for the verified copy of snapshot ``source`` (or of ``fingerprint``) in the cache, held
    until released; (None, why) otherwise. A copy that is no longer what was verified is dropped (``drop``)."""
    try:
        root = check_root(stage_dir)
    except SnapshotError as exc:
        return None, exc.msg
    if fingerprint is None:
        fingerprint = hashing.fingerprint(source)
        if fingerprint is None:
            return None, "%s has no readable %s" % (source, layout.CHECKSUMS)
    if not _FINGERPRINT.match(fingerprint):
        return None, "%r is not a fingerprint" % fingerprint
    path = layout.stage_entry(root, fingerprint)
    try:
        fd = fs.locked_fd(path, shared=True, wait=False)
    except fs.LockBusy:
        return None, "the entry is being published or removed"
    except OSError as exc:
        return None, "not staged" if exc.errno == errno.ENOENT else "cannot open %s: %s" % (path, exc)
    try:
        verdict, why = _check(path, fd, fingerprint)
    except (IOError, OSError) as exc:
        verdict, why = None, "cannot read the entry: %s" % exc
    if verdict is not None:
        return Entry(path, verdict, fd), None
    os.close(fd)
    if drop:
        drop_entry(root, fingerprint)
    return None, "stale, dropped: %s" % why if drop else "stale: %s" % why


def lookup(stage_dir, source=None, fingerprint=None, drop=True):
    """The verified copy (Entry, held until released) of ``source`` or ``fingerprint``, or None."""
    return find(stage_dir, source, fingerprint, drop)[0]


def drop_entry(root, fingerprint):
    """Remove an entry unless it is in use (held by a restore) or being published; True when removed."""
    path = layout.stage_entry(root, fingerprint)
    try:
        fd = fs.locked_fd(path, wait=False)
    except OSError:
        return False
    try:
        if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (os.lstat(path).st_ino, os.lstat(path).st_dev):
            return False
        aside = layout.stage_dropped(root, fingerprint, os.getpid())
        os.rename(path, aside)  # out of every lookup's way at once; then removed at leisure
        fs.remove_tree(aside)
        return True
    except (IOError, OSError):
        return False
    finally:
        os.close(fd)


def _read_verdict(path):
    return fs.read_json(layout.stage_verdict(path)) or {}


def entries(stage_dir):
    """[{fingerprint, source, verified_at, bytes}] of the cache's entries, the oldest verified first."""
    root = check_root(stage_dir)
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if _FINGERPRINT.match(name) and os.path.isdir(os.path.join(root, name)):
            verdict = _read_verdict(os.path.join(root, name))
            found.append({"fingerprint": name, "source": verdict.get("source"),
                          "verified_at": verdict.get("verified_at") or "", "bytes": int(verdict.get("bytes") or 0)})
    return sorted(found, key=lambda item: (item["verified_at"], item["fingerprint"]))


def prune(stage_dir, keep=layout.STAGE_DEFAULT_KEEP, max_bytes=layout.STAGE_DEFAULT_MAX_BYTES, protect=(), source=None):
    """Retention: at most ``keep`` entries and ``max_bytes`` bytes, the oldest verified going first, never one in use
    or in ``protect``. Entries of ``source`` other than those protected are superseded (it was regenerated) and go
    first. Abandoned partial copies (their stager is gone) are removed. {dropped, in_use, entries, bytes}."""
    root = check_root(stage_dir)
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.startswith(".") and (layout.STAGE_PARTIAL_INFIX in name or layout.STAGE_DROP_INFIX in name):
            _remove_abandoned(os.path.join(root, name))
    found = entries(root)
    superseded = [item for item in found if source and item["source"] == source and item["fingerprint"] not in protect]
    ordered = superseded + [item for item in found if item not in superseded]
    count, total = len(found), sum(item["bytes"] for item in found)
    dropped, in_use = [], []
    for item in ordered:
        if item not in superseded and count <= keep and total <= max_bytes:
            break
        if item["fingerprint"] in protect:
            continue
        if drop_entry(root, item["fingerprint"]):
            dropped.append(item["fingerprint"])
            count, total = count - 1, total - item["bytes"]
        else:
            in_use.append(item["fingerprint"])
    return {"dropped": dropped, "in_use": in_use, "entries": count, "bytes": total}


def _remove_abandoned(path):
    try:
        fd = fs.locked_fd(path, wait=False)  # a live stager holds it
    except OSError:
        return
    try:
        fs.remove_tree(path)
    except (IOError, OSError):
        pass
    finally:
        os.close(fd)


def _copy_file(source, target):
    """Copy one file, 0600, never following a link at either end; flushed to stable storage."""
    try:
        src = fs.open_regular(source)
    except fs.NotRegularFile:
        raise SnapshotError("unsafe_file: %s is not a regular file" % source)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
        try:
            fast = hasattr(os, "copy_file_range")
            while True:
                try:
                    done = os.copy_file_range(src, dst, 1 << 30) if fast else os.sendfile(dst, src, None, 1 << 30)
                except OSError as exc:
                    if not fast or exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                        raise
                    fast = False
                    continue
                if not done:
                    break
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_tree(source, target, relpaths, workers=None):
    dirs = sorted(set(os.path.dirname(rel) for rel in relpaths) - {""})
    for rel in dirs:
        fs.ensure_dir(os.path.join(target, rel))
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for done in [pool.submit(_copy_file, os.path.join(source, rel), os.path.join(target, rel)) for rel in relpaths]:
            done.result()
    for rel in dirs + [""]:
        fs.fsync_dir(os.path.join(target, rel))


def _check_limits(keep, max_bytes):
    if not isinstance(keep, int) or keep < 1:
        raise ParameterError("keep: the cache keeps at least 1 entry, got %r" % (keep,), field="keep")
    if not isinstance(max_bytes, int) or max_bytes < 1:
        raise ParameterError("max_bytes: give the cache's size limit in bytes (> 0), got %r" % (max_bytes,),
                             field="max_bytes")


def stage(snapshot_dir, stage_dir, trusted=None, min_size=0, workers=None, keep=layout.STAGE_DEFAULT_KEEP,
          max_bytes=layout.STAGE_DEFAULT_MAX_BYTES, check_mode=False):
    """Copy ``snapshot_dir`` into the cache at ``stage_dir`` and verify the copy, once: a snapshot already staged
    and still valid is left alone (changed false). Then retention. Every parameter is checked, naming it, before
    anything is created; a copy that does not verify is removed and the call fails with the reasons.

    Returns {changed, fingerprint, entry, staged: {dir, verified_at}, authenticated, key_id, bytes, durations,
    retention}.
    """
    root = check_root(stage_dir)
    snapshot_dir = paths.validate_snapshot_dir(snapshot_dir)
    _check_limits(keep, max_bytes)
    if os.path.commonpath([root, snapshot_dir]) in (root, snapshot_dir):
        raise ParameterError("stage_dir: %s and the snapshot %s may not contain one another" % (root, snapshot_dir),
                             field="stage_dir")
    fingerprint = hashing.fingerprint(snapshot_dir)
    if fingerprint is None:
        raise SnapshotError("snapshot_dir: %s has no %s: not a published snapshot" % (snapshot_dir, layout.CHECKSUMS))
    try:
        relpaths = manifest.list_files(snapshot_dir)
        # A writer of the store may remove a file between the listing and its lstat: that is the same unreadable
        # snapshot, not an unexpected error.
        size = sum(os.lstat(os.path.join(snapshot_dir, rel)).st_size for rel in relpaths)
    except fs.NotRegularFile as exc:
        raise SnapshotError("unsafe_file: %s" % exc)
    except OSError as exc:
        raise SnapshotError("unreadable: %s could not be listed: %s" % (snapshot_dir, exc))
    if size > max_bytes:
        raise ParameterError("max_bytes: the snapshot holds %d bytes, more than the cache's %d" % (size, max_bytes),
                             field="max_bytes")
    recorded = (status.read(snapshot_dir) or {})
    if recorded.get("status") == "completed" and recorded.get("checksum") not in (None, fingerprint):
        raise SnapshotError("checksum_mismatch: the status record says the snapshot is %s, its %s hashes to %s"
                            % (recorded["checksum"], layout.CHECKSUMS, fingerprint))
    path = layout.stage_entry(root, fingerprint)
    result = {"changed": False, "fingerprint": fingerprint, "snapshot_dir": snapshot_dir, "stage_dir": root,
              "entry": path, "bytes": size, "durations": {}}
    found, why = find(root, fingerprint=fingerprint, drop=not check_mode) if os.path.isdir(root) else (None, None)
    if found is not None:
        found.release()
        return dict(result, staged=found.summary(), authenticated=found.verdict.get("authenticated"),
                    key_id=found.verdict.get("key_id"), reason="already staged and unchanged since it was verified")
    result.update(changed=True, reason="not staged" if why in (None, "not staged") else why)
    if check_mode:
        return dict(result, staged=None)
    fs.make_dir_if_missing(root)  # an existing cache keeps its mode (check_root refused one others can write)
    watch = Stopwatch()
    partial = layout.stage_partial(root, fingerprint, os.getpid())
    fs.remove_tree(partial)  # an earlier process of this pid left it
    os.mkdir(partial, fs.DIR_MODE)
    lock = fs.locked_fd(partial)  # retention leaves a partial copy alone while its stager lives
    try:
        content = layout.stage_content(partial)
        os.mkdir(content, fs.DIR_MODE)
        with watch.timed("copy"):
            _copy_tree(snapshot_dir, content, relpaths, workers)
        with watch.timed("verify"):
            valid, reasons, details = manifest.verify(content, min_size, None, workers, trusted=trusted)
        if valid and details["fingerprint"] != fingerprint:
            valid, reasons = False, ["checksum_mismatch: the snapshot changed while it was copied (%s, then %s)"
                                     % (fingerprint, details["fingerprint"])]
        if not valid:
            raise SnapshotError("snapshot_dir: the copy of %s did not verify: %s" % (snapshot_dir, "; ".join(reasons)),
                                reasons=reasons, **result)
        dirs, files = _listing(content)
        verdict = {"schema_version": VERDICT_VERSION, "fingerprint": fingerprint, "source": snapshot_dir,
                   "identity": (details["manifest"] or {}).get("identity"), "verified_at": utc_now(),
                   "authenticated": details["authenticated"], "key_id": details["key_id"],
                   "trusted_key_ids": sorted(trusted or {}), "bytes": details["bytes"],
                   "hashing": details["hashing"], "dirs": sorted(dirs),
                   "files": [dict(_stat_fields(files[rel]), path=rel) for rel in sorted(files)]}
        fs.write_file_atomic(layout.stage_verdict(partial), (json.dumps(verdict, sort_keys=True) + "\n").encode())
        fs.fsync_dir(partial)
        try:
            os.rename(partial, path)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            found = lookup(root, fingerprint=fingerprint, drop=False)  # another stager of this snapshot was first
            if found is None:
                raise SnapshotError("stage_dir: %s appeared meanwhile and is not a valid copy" % path, **result)
            found.release()
            return dict(result, changed=False, staged=found.summary(), reason="staged meanwhile by another task")
        fs.fsync_dir(root)
    finally:
        os.close(lock)
        fs.remove_tree(partial)
    watch.total()
    retention = prune(root, keep, max_bytes, protect={fingerprint}, source=snapshot_dir)
    return dict(result, staged={"dir": layout.stage_content(path), "verified_at": verdict["verified_at"]},
                authenticated=verdict["authenticated"], key_id=verdict["key_id"], durations=watch.durations,
                hashing=details["hashing"], retention=retention)

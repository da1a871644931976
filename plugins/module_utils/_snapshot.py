# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Life cycle of a snapshot on disk: staging, sealing, atomic publication, status. PRIVATE.

A snapshot is assembled in the hidden sibling ``.<name>.partial``; sealing writes its manifest
and checksums; publishing renames the whole directory into place, so a reader sees either the
old snapshot, none, or the complete new one. A failed generation removes its staging directory
and leaves a ``failed`` status beside the snapshot.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import fcntl
import json
import os

from ansible_collections.inferops.snapshot.plugins.module_utils import _manifest as manifest_utils
from ansible_collections.inferops.snapshot.plugins.module_utils import _paths as paths
from ansible_collections.inferops.snapshot.plugins.module_utils import _schema as schema
from ansible_collections.inferops.snapshot.plugins.module_utils._device import utc_now

STATUS_SUFFIX = ".status.json"
STATUSES = ("generating", "completed", "failed")


def status_path(snapshot_dir):
    """The status record lives beside the snapshot, so it survives the snapshot's removal."""
    parent, name = os.path.split(snapshot_dir.rstrip("/"))
    return os.path.join(parent, "." + name + STATUS_SUFFIX)


def read_status(snapshot_dir):
    try:
        with open(status_path(snapshot_dir)) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


@contextlib.contextmanager
def _status_locked(snapshot_dir):
    """Serialises read-modify-write of status records: the restore-on-create runtime (a restore) and
    a module (a generation, a status change) may update the same record at the same moment, and the
    later atomic rename would silently drop the other's change. The lock is the parent directory's
    flock, so no lock file is left behind."""
    fd = os.open(os.path.dirname(status_path(snapshot_dir)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_record(snapshot_dir, record):
    paths.write_file_atomic(status_path(snapshot_dir), (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())


def write_status(snapshot_dir, status, reason=None, **fields):
    if status not in STATUSES:
        raise ValueError("unknown status %r" % status)
    paths.ensure_dir(os.path.dirname(snapshot_dir.rstrip("/")))
    with _status_locked(snapshot_dir):
        record = read_status(snapshot_dir) or {}
        record.update(fields)
        record.update(status=status, reason=reason, updated_at=utc_now())
        record.setdefault("history", []).append({"status": status, "at": record["updated_at"], "reason": reason})
        record["history"] = record["history"][-20:]
        _write_record(snapshot_dir, record)
    return record


def record_restore(snapshot_dir, entry, keep=20):
    """Add one restore attempt to the snapshot's status record: ``last_restore`` and ``restores``.

    The generation status (``status``, ``history``) is left as it is: a restore does not change
    whether the snapshot was generated. Written by the restore-on-create runtime and readable
    by anything that reads the status record.
    """
    with _status_locked(snapshot_dir):
        record = read_status(snapshot_dir) or {}
        record["last_restore"] = entry
        record["restores"] = (record.get("restores") or [])[-(keep - 1):] + [entry]
        _write_record(snapshot_dir, record)
    return record


def seal(staging_dir, fields, workers=None, progress=None, known=None):
    """Write manifest.json and checksum.sha256 into ``staging_dir``; return (manifest, checksum digest, stats).

    ``known``: digests of files hashed while they were written (see _manifest.Follower); not read again.

    ``fields`` supplies everything but ``files`` and ``total_bytes``, which come from hashing.
    """
    for stale in (manifest_utils.MANIFEST, manifest_utils.CHECKSUMS):
        if os.path.lexists(os.path.join(staging_dir, stale)):
            os.unlink(os.path.join(staging_dir, stale))
    relpaths = manifest_utils.list_files(staging_dir)
    hashes, stats = manifest_utils.seal_hashes(staging_dir, relpaths, workers=workers, progress=progress, known=known)
    files, total = manifest_utils.manifest_files(hashes)
    manifest = dict(fields, schema_version=1, files=files, total_bytes=total)
    schema.validate("manifest", manifest, "manifest")
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")
    paths.write_file_atomic(os.path.join(staging_dir, manifest_utils.MANIFEST), data)
    hashes[manifest_utils.MANIFEST] = manifest_utils._hash_one(os.path.join(staging_dir, manifest_utils.MANIFEST))
    checksums = manifest_utils.format_checksums(hashes).encode("utf-8")
    paths.write_file_atomic(os.path.join(staging_dir, manifest_utils.CHECKSUMS), checksums)
    checksum_digest = manifest_utils._hash_one(os.path.join(staging_dir, manifest_utils.CHECKSUMS))[1]
    return manifest, checksum_digest, stats


def publish(staging_dir, snapshot_dir):
    """Atomically put the sealed staging directory at ``snapshot_dir``, replacing an older snapshot.

    The old snapshot is moved aside first and removed only after the new one is in place.
    """
    _fsync_dir(staging_dir)
    old = None
    if os.path.lexists(snapshot_dir):
        old = snapshot_dir.rstrip("/") + ".old.%d" % os.getpid()
        parent, name = os.path.split(old)
        old = os.path.join(parent, "." + name)
        os.rename(snapshot_dir, old)
    try:
        os.rename(staging_dir, snapshot_dir)
    except OSError:
        if old:
            os.rename(old, snapshot_dir)  # put the previous snapshot back: never lose it
        raise
    _fsync_dir(os.path.dirname(snapshot_dir.rstrip("/")))
    if old:
        paths.remove_tree(old)


def discard(staging_dir):
    """Remove a staging directory after a failure; returns whether there was one."""
    existed = os.path.lexists(staging_dir)
    paths.remove_tree(staging_dir)
    return existed


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The status record beside a snapshot: its one writer and its one reader. PRIVATE to inferops.snapshot.

``.<pod>.status.json`` (schemas/status.schema.json) lives in the snapshot's parent, so it survives
the snapshot's removal. It says where the generation stands (``status``: generating, completed,
failed; ``reason``; a short ``history``) and what was restored from the snapshot (``last_restore``
and ``restores``, one entry per attempt, built by ``restore_entry`` for every path; an attempt of a module
records itself ``restoring`` before its host restore and its outcome over that entry at the end). Modules, the
node's runtime and bare-process restores update it at the same moment, so every update is a
read-modify-write under the parent directory's flock (no lock file is left behind).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import json
import os

from ..base import layout, schema
from ..base.clock import utc_now
from ..linux import fs

STATUSES = ("generating", "completed", "failed")
KEEP_HISTORY = 20
KEEP_RESTORES = 20


def read(snapshot_dir):
    """The record, or None when there is none (or it cannot be read)."""
    return fs.read_json(layout.status_path(snapshot_dir))


@contextlib.contextmanager
def locked(snapshot_dir):
    """The lock of a pod's records (status, claim): the flock of their parent directory."""
    parent = os.path.dirname(layout.status_path(snapshot_dir))
    with fs.locked(parent, flags=os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC):
        yield


def restore_entry(path, outcome, reason=None, container=None, name=None, pid=None, pid_start_time=None, policy=None,
                  device_actions=None, durations=None, identity=None, source=None, runner=None):
    """One restore attempt, the same shape for every path (docker, runtime, criu). ``identity`` and ``source``
    only for a clone (fleet.py): the identity it was restored into and the source the request declared. ``runner``:
    the process running the attempt (proc.identity), where it recorded itself ``restoring`` first."""
    entry = {"path": path, "outcome": outcome, "reason": reason, "at": utc_now(), "node": os.uname()[1],
             "container": container, "name": name, "pid": pid, "pid_start_time": pid_start_time, "policy": policy,
             "device_actions": device_actions, "durations": dict(durations or {})}
    if source is not None:
        entry.update(identity=identity, source=source)
    if runner is not None:
        entry["runner"] = runner
    return entry


def update(snapshot_dir, status=None, reason=None, restore=None, generation_id=None, **fields):
    """The one writer: record a generation ``status`` (with ``reason``, the ``generation_id`` of the run that
    records it, and ``fields``), and/or a ``restore`` attempt (a ``restore_entry``). Returns the record as written."""
    if status is not None and status not in STATUSES:
        raise ValueError("unknown status %r" % status)
    fs.ensure_dir(os.path.dirname(snapshot_dir.rstrip("/")))
    with locked(snapshot_dir):
        record = _valid_parts(read(snapshot_dir) or {})
        record["schema_version"] = 1
        if status is not None:
            record.update(fields)
            record.update(status=status, reason=reason, updated_at=utc_now(), generation_id=generation_id)
            record["history"] = (record.get("history") or [])[-(KEEP_HISTORY - 1):] + [
                {"status": status, "at": record["updated_at"], "reason": reason, "generation_id": generation_id}]
        if restore is not None:  # an attempt's entry replaces the one it wrote before (the same runner)
            kept = [entry for entry in record.get("restores") or []
                    if not (restore.get("runner") and entry.get("runner") == restore["runner"])]
            record["last_restore"] = restore
            record["restores"] = kept[-(KEEP_RESTORES - 1):] + [restore]
        schema.validate("status", record, "status record %s" % layout.status_path(snapshot_dir))
        fs.write_file_atomic(layout.status_path(snapshot_dir),
                             (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    return record


def published_by(record, generation_id):
    """Whether the snapshot beside ``record`` was published by generation ``generation_id``: that generation recorded
    it completed (host_checkpoint does, right after its publish). One whose record says generating was published
    before -- by an earlier run, or by one killed between its publish and that record -- and is complete either way
    (publication is atomic): not this generation's to remove when it fails."""
    record = record or {}
    return bool(generation_id) and record.get("status") == "completed" and record.get("generation_id") == generation_id


def _valid_parts(record):
    """A record written by an older version: keep what the schema still accepts, drop the rest."""
    if not schema.errors("status", record):
        return record
    kept = {}
    properties = schema.SCHEMAS["status"]["properties"]
    for key, value in record.items():
        if key in ("restores", "history") and isinstance(value, list):
            item_schema = properties[key]["items"]
            kept[key] = [item for item in value if not schema.errors("status", item, subschema=item_schema)]
        elif key in properties and not schema.errors("status", value, subschema=properties[key]):
            kept[key] = value
    return kept

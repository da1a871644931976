# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device (NPU) part of a snapshot. PRIVATE to the inferops.snapshot collection.

The ACL runtime keeps a backup of device memory in the host memory of the inference process, so
the bytes travel inside the host (CRIU) snapshot. What is written to disk here is the device
part's metadata: which process and devices, which runtime version, how much device memory.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from . import layout, paths, schema
from .agent import protocol
from .clients.control import AgentSocketClient
from .clock import Deadline, Stopwatch, utc_now
from .errors import RuntimeRefusedError, SnapshotError

RUNTIME_NAME = "ascend-acl"


def device_part_path(directory):
    return os.path.join(directory, layout.DEVICE_PART)


def build_device_part(reply, identity=None, durations=None):
    part = {
        "schema_version": 1,
        "pid": reply["pid"],
        "state": protocol.STATE_BACKED_UP,
        "devices": list(reply.get("devices") or []),
        "runtime": {"name": RUNTIME_NAME, "version": reply.get("runtime_version")},
        "device_memory_bytes": (reply.get("engine") or {}).get("device_memory_bytes"),
        "created_at": utc_now(),
        "durations": dict(durations or {}),
        "note": "device memory is held in the process's host memory and travels in the host snapshot",
    }
    if identity:
        part["identity"] = identity
    schema.validate("manifest", part, "device part", definition="device_part")
    return part


def read_device_part(directory):
    try:
        with open(device_part_path(directory)) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def write_device_part(staging_dir, part):
    """Write device.json into the snapshot's staging directory (0700 dirs, 0600 file, atomic)."""
    paths.ensure_dir(staging_dir)
    paths.ensure_dir(os.path.join(staging_dir, layout.DEVICE_DIR))
    target = device_part_path(staging_dir)
    paths.write_file_atomic(target, (json.dumps(part, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return target


def back_up(client, staging_dir, identity, lease, lock, timeout, check_mode=False):
    """Take the device part: the process LOCKED (when ``lock``) and BACKED_UP under ``lease``, its record written.

    The one home of the device snapshot, for npu_snapshot_backup and for host_checkpoint's ``device_backup``
    (which runs it right before the checkpoint, so that the engine's lock window holds no module start).
    A process already BACKED_UP with its part recorded for this identity is left alone (its lease renewed); one
    the engine backed up itself gets its record and the lease. Returns the task's result fields.
    """
    reply = client.request(protocol.OP_STATE, timeout)
    previous = reply["state"]
    recorded = read_device_part(staging_dir)
    result = dict(previous_state=previous, staging_dir=staging_dir, device_part=device_part_path(staging_dir),
                  endpoint=client.where)
    if previous == protocol.STATE_BACKED_UP and recorded and recorded.get("pid") == reply["pid"] \
            and recorded.get("identity") == identity:
        if lease and not check_mode:
            reply = client.request(protocol.OP_RENEW, timeout, lease)
        return dict(changed=False, state=previous, actions=[], pid=reply["pid"], devices=reply.get("devices", []),
                    runtime_version=reply.get("runtime_version"), lease=reply.get("lease"),
                    device_memory_bytes=recorded.get("device_memory_bytes"), durations={},
                    diff=dict(before=dict(state=previous), after=dict(state=previous)), **result)
    if previous == protocol.STATE_RUNNING and not lock:
        raise RuntimeRefusedError(
            "the process is RUNNING; backup needs it LOCKED: lock it first with inferops.snapshot.npu_snapshot_lock "
            "(state=locked) or set lock=true", state=previous, **result)

    operations = []
    if previous == protocol.STATE_RUNNING:
        operations.append(protocol.OP_LOCK)
    if previous != protocol.STATE_BACKED_UP:
        operations.append(protocol.OP_BACKUP)
    if check_mode:
        return dict(changed=True, state=protocol.STATE_BACKED_UP, actions=operations, pid=reply["pid"],
                    devices=reply.get("devices", []), runtime_version=reply.get("runtime_version"),
                    device_memory_bytes=(reply.get("engine") or {}).get("device_memory_bytes"), lease=None,
                    durations={}, diff=dict(before=dict(state=previous), after=dict(state=protocol.STATE_BACKED_UP)),
                    **result)
    if lease and not operations:  # backed up by the engine itself: the lease starts with this record
        operations.append(protocol.OP_RENEW)

    watch = Stopwatch()
    done = []
    try:
        for op in operations:
            with watch.stage(op):
                reply = client.request(op, timeout, lease)
            done.append(op)
        with watch.stage("record"):
            part = build_device_part(reply, identity, watch.durations)
            write_device_part(staging_dir, part)
    except SnapshotError as exc:
        exc.result.update(actions=done, durations=watch.durations, **result)
        raise
    return dict(changed=True, state=reply["state"], actions=done, pid=reply["pid"], lease=reply.get("lease"),
                devices=reply.get("devices", []), runtime_version=reply.get("runtime_version"),
                device_memory_bytes=part["device_memory_bytes"], durations=watch.durations,
                diff=dict(before=dict(state=previous), after=dict(state=reply["state"])), **result)


def resume(client, timeout, restore=True, before_unlock=None):
    """Bring a locked or backed-up process back to RUNNING with its device memory intact.

    BACKED_UP: RESTORE (copies the backup back onto the device) then UNLOCK. LOCKED: UNLOCK.
    RUNNING: nothing. ``before_unlock()`` runs between the two (and may raise to keep it locked).
    Returns (actions, last reply).
    """
    reply = client.request(protocol.OP_STATE, timeout)
    actions = []
    if reply["state"] == protocol.STATE_BACKED_UP and restore:
        reply = client.request(protocol.OP_RESTORE, timeout)
        actions.append(protocol.OP_RESTORE)
    if before_unlock is not None:
        before_unlock()
    if reply["state"] in (protocol.STATE_LOCKED, protocol.STATE_BACKED_UP):
        reply = client.request(protocol.OP_UNLOCK, timeout)
        actions.append(protocol.OP_UNLOCK)
    return actions, reply


def resume_process(pid, socket_dir, timeout, gone=None, before_unlock=None):
    """Restore and unlock the device state of a restored process through its agent; it must end RUNNING.

    The agent's listening socket comes back with the restored process: wait for it first. Returns the
    actions taken. ``gone()`` says whether the process died meanwhile (the wait then ends at once).

    The restored process holds the lease of the process it was checkpointed from in its memory; its agent
    drops that lease rather than act on it (a lease belongs to the incarnation that took it: see the
    agent's ``launcher.incarnation``), so nothing races this restore, and the unlock ends whatever is left.
    """
    deadline = Deadline(timeout)
    client = AgentSocketClient.for_pid(pid, socket_dir)
    client.wait_listening(deadline.remaining(0.1), gone=gone)
    actions, reply = resume(client, deadline.remaining(1.0), before_unlock=before_unlock)
    if reply.get("state") != protocol.STATE_RUNNING:
        raise RuntimeRefusedError("the process is %s after %s, not RUNNING" % (reply.get("state"), actions),
                                  state=reply.get("state"))
    return actions

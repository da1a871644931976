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

import datetime
import json
import os

from ansible_collections.inferops.snapshot.plugins.module_utils import _protocol as protocol
from ansible_collections.inferops.snapshot.plugins.module_utils import _paths as paths
from ansible_collections.inferops.snapshot.plugins.module_utils import _schema as schema
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import ParameterError

DEVICE_DIR = "device"
DEVICE_PART_FILE = "device.json"
RUNTIME_NAME = "ascend-acl"


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


def device_part_path(directory):
    return os.path.join(directory, DEVICE_DIR, DEVICE_PART_FILE)


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
    paths.ensure_dir(os.path.join(staging_dir, DEVICE_DIR))
    target = device_part_path(staging_dir)
    paths.write_file_atomic(target, (json.dumps(part, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return target


def resume(client, timeout, restore=True):
    """Bring a locked or backed-up process back to RUNNING with its device memory intact.

    BACKED_UP: RESTORE (copies the backup back onto the device) then UNLOCK. LOCKED: UNLOCK.
    RUNNING: nothing. Returns (actions, last reply).
    """
    reply = client.request(protocol.OP_STATE, timeout)
    actions = []
    if reply["state"] == protocol.STATE_BACKED_UP and restore:
        reply = client.request(protocol.OP_RESTORE, timeout)
        actions.append(protocol.OP_RESTORE)
    if reply["state"] in (protocol.STATE_LOCKED, protocol.STATE_BACKED_UP):
        reply = client.request(protocol.OP_UNLOCK, timeout)
        actions.append(protocol.OP_UNLOCK)
    return actions, reply

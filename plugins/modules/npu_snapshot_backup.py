#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: npu_snapshot_backup
short_description: Back up the NPU state of a locked inference process and record the device part of a snapshot
version_added: 0.1.0
description:
  - Moves a LOCKED inference process to BACKED_UP through the control endpoint inside it. The ACL runtime
    copies the process's device memory into the process's own host memory and releases the device.
    The bytes therefore travel in the host snapshot (M(inferops.snapshot.host_checkpoint)) taken next.
  - Records the device part of the snapshot (pid, device ids, runtime version, device memory size,
    duration) as C(device/device.json) in the snapshot's staging directory, a hidden sibling
    C(.<name>.partial) of O(snapshot_dir). The snapshot becomes visible at O(snapshot_dir) only when the
    host part is complete and the whole directory is published by one atomic rename.
  - Idempotent, a process that is already BACKED_UP with its device part recorded is left alone.
requirements:
  - jsonschema (Python library) on the target host
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.identity
  - inferops.snapshot.control_endpoint
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  snapshot_dir:
    description:
      - Absolute path of this pod's snapshot, unique per pod identity
        (for example C(/var/lib/inferops/snapshots/<namespace>/<service>/<instance>/<pod>)).
      - Must not contain C(..), pass through a symlink in a directory others can write, or be owned by
        another user. Directories are created 0700 and files 0600.
    type: path
    required: true
  lock:
    description:
      - Lock a RUNNING process first. When false, a RUNNING process is an error (lock it with
        M(inferops.snapshot.npu_snapshot_lock) first).
    type: bool
    default: false
notes:
  - The backup stays valid only in the memory of the process; take the host snapshot before the
    process exits, then resume the process with M(inferops.snapshot.npu_snapshot_lock) C(state=unlocked).
seealso:
  - module: inferops.snapshot.npu_snapshot_lock
"""

EXAMPLES = r"""
- name: Lock and back up the device state of the engine in container vllm-0
  inferops.snapshot.npu_snapshot_backup:
    container: vllm-0
    lock: true
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity:
      namespace: default
      service: qwen
      instance: p0
      pod: vllm-0
  register: device_backup

- name: Show the size and duration
  ansible.builtin.debug:
    msg: "{{ device_backup.device_memory_bytes }} bytes in {{ device_backup.durations.backup }} s"
"""

RETURN = r"""
previous_state:
  description: Snapshot state before the task.
  returned: success
  type: str
  sample: LOCKED
state:
  description: Snapshot state after the task (BACKED_UP; in check mode the state it would have).
  returned: success
  type: str
  sample: BACKED_UP
actions:
  description: The protocol operations performed, in order.
  returned: success
  type: list
  elements: str
  sample: [lock, backup]
device_part:
  description: Path of the device part's metadata file, in the staging directory.
  returned: success
  type: str
  sample: /var/lib/inferops/snapshots/default/qwen/p0/.vllm-0.partial/device/device.json
staging_dir:
  description: The staging directory the snapshot is assembled in before it is published.
  returned: success
  type: str
  sample: /var/lib/inferops/snapshots/default/qwen/p0/.vllm-0.partial
device_memory_bytes:
  description: Device memory in use by the engine, as the engine reports it (null when it does not).
  returned: success
  type: int
  sample: 67108864
devices:
  description: Device ids the process uses. A restore must run on the same device ids.
  returned: success
  type: list
  elements: int
  sample: [0]
runtime_version:
  description: Version of the ACL runtime in the process.
  returned: success
  type: str
  sample: 9.1.0
pid:
  description: Pid of the engine process inside its own pid namespace.
  returned: success
  type: int
  sample: 1
durations:
  description: Seconds per stage (C(lock), C(backup), C(record)).
  returned: success
  type: dict
  sample: {backup: 0.21, record: 0.001}
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core import device, layout, paths
from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clock import Stopwatch
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import RuntimeRefusedError, SnapshotError

ARGUMENT_SPEC = dict(_module.CONTROL_TARGET_ARGS,
                     snapshot_dir=dict(type="path", required=True),
                     identity=dict(type="dict", options=_module.IDENTITY_OPTIONS),
                     lock=dict(type="bool", default=False))


def main_logic(module):
    params = module.params
    snapshot_dir = paths.validate_snapshot_dir(params["snapshot_dir"])
    staging_dir = layout.staging_dir(snapshot_dir)
    paths.validate_snapshot_dir(staging_dir, field="snapshot_dir (staging sibling)")
    identity = paths.check_identity(params["identity"], snapshot_dir)
    client = _module.control_client(module)
    timeout = params["timeout"]
    watch = Stopwatch()

    reply = client.request(protocol.OP_STATE, timeout)
    previous = reply["state"]
    recorded = device.read_device_part(staging_dir)
    result = dict(previous_state=previous, staging_dir=staging_dir, device_part=device.device_part_path(staging_dir),
                  endpoint=client.where)

    if previous == protocol.STATE_BACKED_UP and recorded and recorded.get("pid") == reply["pid"] \
            and recorded.get("identity") == identity:
        return dict(changed=False, state=previous, actions=[], pid=reply["pid"], devices=reply.get("devices", []),
                         runtime_version=reply.get("runtime_version"),
                         device_memory_bytes=recorded.get("device_memory_bytes"), durations={},
                         diff=dict(before=dict(state=previous), after=dict(state=previous)), **result)
    if previous == protocol.STATE_RUNNING and not params["lock"]:
        raise RuntimeRefusedError(
            "the process is RUNNING; backup needs it LOCKED: lock it first with inferops.snapshot.npu_snapshot_lock "
            "(state=locked) or set lock=true", state=previous, **result)

    operations = []
    if previous == protocol.STATE_RUNNING:
        operations.append(protocol.OP_LOCK)
    if previous != protocol.STATE_BACKED_UP:
        operations.append(protocol.OP_BACKUP)
    if module.check_mode:
        return dict(changed=True, state=protocol.STATE_BACKED_UP, actions=operations, pid=reply["pid"],
                         devices=reply.get("devices", []), runtime_version=reply.get("runtime_version"),
                         device_memory_bytes=(reply.get("engine") or {}).get("device_memory_bytes"),
                         durations={}, diff=dict(before=dict(state=previous), after=dict(state=protocol.STATE_BACKED_UP)),
                         **result)

    done = []
    try:
        for op in operations:
            with watch.stage(op):
                reply = client.request(op, timeout)
            done.append(op)
        with watch.stage("record"):
            part = device.build_device_part(reply, identity, watch.durations)
            device.write_device_part(staging_dir, part)
    except SnapshotError as exc:
        exc.result.update(actions=done, durations=watch.durations, **result)
        raise
    return dict(changed=True, state=reply["state"], actions=done, pid=reply["pid"],
                     devices=reply.get("devices", []), runtime_version=reply.get("runtime_version"),
                     device_memory_bytes=part["device_memory_bytes"], durations=watch.durations,
                     diff=dict(before=dict(state=previous), after=dict(state=reply["state"])), **result)


def main():
    _module.run(ARGUMENT_SPEC, main_logic, **_module.CONTROL_TARGET_OPTIONS)


if __name__ == "__main__":
    main()

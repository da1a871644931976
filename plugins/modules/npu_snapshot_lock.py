#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: npu_snapshot_lock
short_description: Lock or unlock the NPU state of a running inference process
version_added: 0.1.0
description:
  - Drives the Ascend ACL snapshot state machine of an inference process through the control endpoint
    inside that process (the ACL snapshot API only acts on the calling process, so it is never called
    for a foreign pid).
  - C(locked) moves a RUNNING process to LOCKED; from then on every call that changes device resources
    blocks inside the process until it is unlocked. Lock waits for the runtime's background threads
    and fails with ACL error 507905 when they do not park in time.
  - C(unlocked) moves a LOCKED or BACKED_UP process back to RUNNING. A BACKED_UP process is restored
    first (its device memory copied back) unless O(restore_before_unlock=false).
  - The lock carries a lease (O(lease)). If the controller dies before it unlocks -- a cancelled job, a
    lost SSH connection, an OOM -- the agent in the engine brings it back by itself when the lease runs
    out (restore and unlock), and reports what it did as RV(abandoned) (also in
    M(inferops.snapshot.snapshot_info)'s RV(inferops.snapshot.snapshot_info#module:device_abandoned)).
  - C(locked) on a process that is already LOCKED or BACKED_UP renews the lease (the deadline becomes
    O(lease) seconds from now) and reports no change; a task that takes long between the lock and the
    unlock renews it this way.
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
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
  state:
    description:
      - C(locked) keeps the process's device state frozen (LOCKED or BACKED_UP both count as locked).
      - C(unlocked) resumes it (RUNNING).
    type: str
    required: true
    choices: [locked, unlocked]
  restore_before_unlock:
    description:
      - When unlocking a BACKED_UP process, restore its device memory from the backup first. Without the
        restore the process resumes on device memory that may have been released or reset.
    type: bool
    default: true
  lease:
    description:
      - With O(state=locked), seconds the lock is held for this task's play, from the end of the lock (or
        of this renewal). Unless an unlock or a renewal comes within it, the agent restores the device
        memory and unlocks the engine itself. The default is well under the 5 minute generation timeout
        of the snapshot workflow; M(inferops.snapshot.host_checkpoint) renews it while it works.
      - V(0) asks for no lease, the behaviour before leases (the engine stays locked until someone
        unlocks it); needed for an agent or an engine endpoint that predates leases. At most 86400.
      - The unlock of O(state=unlocked) ends the lease. Through an HTTP O(endpoint) the renewal is sent to
        C(endpoint_paths.renew), by default C(/snapshot/renew).
    type: float
    default: 120
notes:
  - The engine must run under the collection's agent launcher (C(python3 -m inferops_agent -- engine.py)) or
    expose the snapshot protocol on its own HTTP endpoint.
seealso:
  - module: inferops.snapshot.npu_snapshot_backup
"""

EXAMPLES = r"""
- name: Freeze the device state of the engine in a container
  inferops.snapshot.npu_snapshot_lock:
    container: vllm-0
    state: locked
    timeout: 30

- name: Renew its lease for 10 more minutes before a long step (no change reported)
  inferops.snapshot.npu_snapshot_lock:
    container: vllm-0
    state: locked
    lease: 600

- name: Resume it (restores device memory first if it was backed up)
  inferops.snapshot.npu_snapshot_lock:
    container: vllm-0
    state: unlocked

- name: Through the engine's own HTTP control endpoint
  inferops.snapshot.npu_snapshot_lock:
    endpoint: http://127.0.0.1:8000
    endpoint_paths:
      lock: /v1/snapshot/suspend
      unlock: /v1/snapshot/resume
    state: locked
"""

RETURN = r"""
previous_state:
  description: Snapshot state before the task.
  returned: success
  type: str
  sample: RUNNING
state:
  description: Snapshot state after the task (in check mode, the state it would have).
  returned: success
  type: str
  sample: LOCKED
actions:
  description: The protocol operations performed, in order.
  returned: success
  type: list
  elements: str
  sample: [lock]
pid:
  description: Pid of the engine process, as seen inside its own pid namespace.
  returned: success
  type: int
  sample: 1
devices:
  description: Device ids the process uses.
  returned: success
  type: list
  elements: int
  sample: [0]
runtime_version:
  description: Version of the ACL runtime loaded in the process.
  returned: success
  type: str
  sample: 9.1.0
endpoint:
  description: The control endpoint that was used.
  returned: success
  type: str
  sample: unix:///proc/4242/root/run/inferops-snapshot/agent.1.sock
durations:
  description: Seconds spent per operation.
  returned: success
  type: dict
  sample: {lock: 0.012}
lease:
  description:
    - The lease the agent holds after the task (null when none, for example after an unlock or with
      O(lease=0)). C(remaining_s) and C(expires_at) say when it runs out.
  returned: success
  type: dict
  sample: {seconds: 120.0, remaining_s: 119.998, expired: false, expires_at: "2026-11-29T12:02:00.000000Z",
           granted_at: "2026-11-29T12:00:00.000000Z", renewed_at: "2026-11-29T12:00:00.000000Z", by: lock}
abandoned:
  description:
    - What the agent did the last time a lease ran out without an unlock (time, previous state, actions,
      errors); null when that never happened or a later lock or unlock cleared it. An unlock or lock
      by this task clears it, so it is the record from before the task.
  returned: success
  type: dict
  sample: {at: "2026-11-29T12:02:00.100000Z", previous_state: BACKED_UP, actions: [restore, unlock], errors: [],
           state: RUNNING, lease_s: 120.0, expired_at: "2026-11-29T12:02:00.000000Z", overdue_s: 0.1}
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import Stopwatch
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import lease_seconds

LOCKED_STATES = (protocol.STATE_LOCKED, protocol.STATE_BACKED_UP)
LEASED = (protocol.OP_LOCK, protocol.OP_RENEW)
ARGUMENT_SPEC = dict(_module.CONTROL_TARGET_ARGS,
                     state=dict(type="str", required=True, choices=["locked", "unlocked"]),
                     restore_before_unlock=dict(type="bool", default=True),
                     lease=dict(type="float", default=120.0))


def plan(current, wanted, restore_before_unlock, lease=None):
    """The operations that take ``current`` to the ``wanted`` (locked/unlocked) state; a renew keeps a lock's lease."""
    if wanted == "locked":
        if current in LOCKED_STATES:
            return [protocol.OP_RENEW] if lease else []
        return [protocol.OP_LOCK]
    if current == protocol.STATE_RUNNING:
        return []
    if current == protocol.STATE_BACKED_UP and restore_before_unlock:
        return [protocol.OP_RESTORE, protocol.OP_UNLOCK]
    return [protocol.OP_UNLOCK]


def main_logic(module):
    client = _module.control_client(module)
    timeout = module.params["timeout"]
    lease = lease_seconds(module.params["lease"])
    reply = client.request(protocol.OP_STATE, timeout)
    previous = state = reply["state"]
    abandoned = reply.get("abandoned")
    operations = plan(previous, module.params["state"], module.params["restore_before_unlock"], lease)
    changes = [op for op in operations if op != protocol.OP_RENEW]  # a renewal changes no state
    watch = Stopwatch()
    if changes and module.check_mode:
        state = protocol.STATE_LOCKED if module.params["state"] == "locked" else protocol.STATE_RUNNING
    elif operations and not module.check_mode:
        done = []
        for op in operations:
            try:
                with watch.timed(op):
                    reply = client.request(op, timeout, lease if op in LEASED else None)
            except SnapshotError as exc:
                exc.result.update(previous_state=previous, actions=done, durations=watch.durations)
                raise
            done.append(op)
        state = reply["state"]
    return dict(changed=bool(changes), previous_state=previous, state=state, actions=operations,
                pid=reply.get("pid"), devices=reply.get("devices", []), runtime_version=reply.get("runtime_version"),
                endpoint=client.where, durations=watch.durations, lease=reply.get("lease"), abandoned=abandoned,
                diff=dict(before=dict(state=previous), after=dict(state=state)))


def main():
    _module.run(ARGUMENT_SPEC, main_logic, requires=(), **_module.CONTROL_TARGET_OPTIONS)


if __name__ == "__main__":
    main()

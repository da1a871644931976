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
  - Idempotent, a process that is already BACKED_UP with its device part recorded is left alone (its
    lease is renewed).
  - The lock and the backup carry a lease (O(lease)). If the controller dies before it unlocks the
    engine -- between this task and the host checkpoint included -- the agent in the engine restores the
    device memory and unlocks the engine by itself when the lease runs out.
    M(inferops.snapshot.host_checkpoint) renews the lease while it checkpoints and seals.
requirements:
  - jsonschema (Python library) on the target host
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.generation
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
  lease:
    description:
      - Seconds the engine may stay locked and backed up without a word from the controller, counted from
        the end of the backup (and from each renewal). When it runs out, the agent restores the device
        memory and unlocks the engine itself, and the next M(inferops.snapshot.snapshot_info) reports it
        (RV(inferops.snapshot.snapshot_info#module:device_abandoned)). The default is well under the 5 minute
        generation timeout of the snapshot workflow; it must be longer than the CRIU dump of the engine
        (the process is frozen then and nothing can renew it).
      - A process that is already BACKED_UP gets its lease renewed for this many seconds.
      - V(0) asks for no lease, the behaviour before leases (the engine stays backed up until someone
        unlocks it); needed for an agent or an engine endpoint that predates leases. At most 86400.
    type: float
    default: 120
  device_memory:
    description:
      - What the backup saves of the device memory, with the args shape of CANN's snapshot API
        (C(aclrtSnapShotProcessBackup(pid, args))). V(required) is the memory the runtime tags required
        (C(backupFlags) 0), V(required_and_optional) the optional memory too (C(backupFlags) 1). The restore uses
        the same.
      - A runtime with only the older shape (no arguments) backs up what it backs up; it takes V(required) only, and
        the task fails for V(required_and_optional). RV(snapshot_api) says which shape the engine's runtime has.
      - An agent that predates this option refuses any value but V(required).
    type: str
    choices: [required, required_and_optional]
    default: required
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
took_over:
  description:
    - The claim of another generation this task took over because that run was over (its lease ran out, or the process
      that stood for it on this host is gone), with C(why) and what the task C(cleaned) up of what it left (its
      runc or CRIU still running, their work dir, the pod's staging directory). Null when there was none.
  returned: always
  type: dict
  sample:
    id: 0f6c1d2e-3a4b-5c5d-8e9f-00112233aabb
    holder: {host: node-1, pid: 4242, what: python3 ansible-playbook}
    why: "the run that held it is gone: its process (pid 4242, python3 ansible-playbook) is gone"
    cleaned: ["removed its staging dir /var/lib/inferops/snapshots/default/qwen/p0/.vllm-0.partial"]
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
snapshot_api:
  description:
    - The snapshot API the backup went through, as recorded in the device part (C(device/device.json)). C(api) is
      C(args) or C(legacy) (null from an agent that predates the record); C(device_memory) what it saved; and
      C(runtime_api_version) and C(driver_api_version) what a restore must find again (args shape).
  returned: success
  type: dict
  sample: {api: args, device_memory: required, runtime_api_version: 10000, driver_api_version: 500}
lease:
  description: The lease the agent holds after the task (null with O(lease=0)); as in M(inferops.snapshot.npu_snapshot_lock).
  returned: success
  type: dict
  sample: {seconds: 120.0, remaining_s: 119.998, expired: false, expires_at: "2026-11-29T12:02:00.000000Z",
           granted_at: "2026-11-29T12:00:00.000000Z", renewed_at: "2026-11-29T12:00:00.000000Z", by: lock}
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import lease_seconds
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import paths
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import device

ARGUMENT_SPEC = dict(_module.CONTROL_TARGET_ARGS, **_module.GENERATION_ARGS)
ARGUMENT_SPEC.update(snapshot_dir=dict(type="path", required=True),
                     identity=dict(type="dict", options=_module.IDENTITY_OPTIONS),
                     lock=dict(type="bool", default=False),
                     lease=dict(type="float", default=120.0),
                     device_memory=dict(type="str", choices=["required", "required_and_optional"], default="required"))


def main_logic(module):
    params = module.params
    _module.positive(params, "generation_lease")
    snapshot_dir = paths.validate_snapshot_dir(params["snapshot_dir"])
    staging_dir = layout.staging_dir(snapshot_dir)
    paths.validate_snapshot_dir(staging_dir, field="snapshot_dir (staging sibling)")
    identity = paths.check_identity(params["identity"], snapshot_dir)
    lease = lease_seconds(params["lease"])
    client = _module.control_client(module)  # checks timeout, endpoint and container: before the claim is written
    held = None if module.check_mode else claim.join(snapshot_dir, params["generation_id"], params["generation_lease"])
    result = device.back_up(client, staging_dir, identity, lease, params["lock"], params["timeout"], module.check_mode,
                            device_memory=params["device_memory"])
    return dict(result, took_over=(held or {}).get("took_over"))


def main():
    _module.run(ARGUMENT_SPEC, main_logic, **_module.CONTROL_TARGET_OPTIONS)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_status
short_description: Read or record the generation status of a pod's snapshot, and clean up after a failure
version_added: 0.1.0
description:
  - The status of a snapshot lives beside it on the host, in C(.<pod>.status.json) next to the snapshot
    directory, so it survives the snapshot's removal. It is one of C(generating), C(completed) or C(failed),
    with the reason, the checksum (when completed), the time of the last change and a short history.
    M(inferops.snapshot.host_checkpoint) writes it for the host part; this module lets the roles record
    what happens around it (warmup, device snapshot, timeouts).
  - Without O(status) the module only reads the record.
  - O(status=failed) with O(clean=true) removes what this pod's generation wrote - its C(.partial) staging sibling,
    O(extra_paths) (for example the pod's device snapshot path) and the published snapshot only when this
    generation published it, that is when the record says O(generation_id) recorded it C(completed) (with it, its
    record of restores) - and keeps the record with the reason. A published snapshot the record does not say this
    generation completed is kept - a snapshot from an earlier run, or from a run killed between its publish and its
    C(completed) record; publication is atomic, so it is whole either way. With O(generation_id) it also releases
    that generation's claim on the pod.
  - O(status=completed) requires a published snapshot; the checksum defaults to the SHA-256 of its
    C(checksum.sha256).
requirements:
  - jsonschema (Python library) on the target host
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.generation
  - inferops.snapshot.identity.REQUIRED
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
    details: Recording the status and reason already recorded, with nothing left to remove, changes nothing.
options:
  snapshot_dir:
    description: The pod's snapshot directory (published or not). The record is its sibling C(.<name>.status.json).
    type: path
    required: true
  status:
    description: The status to record. Omit it to read the record only.
    type: str
    choices: [generating, completed, failed]
  reason:
    description: Why (required with O(status=failed)). Recorded, returned and kept in the history.
    type: str
  checksum:
    description: With O(status=completed), the snapshot's fingerprint. Default is the SHA-256 of its C(checksum.sha256).
    type: str
  clean:
    description:
      - With O(status=failed), remove the staging sibling, O(extra_paths) and the published snapshot when this
        generation (O(generation_id)) recorded it C(completed).
    type: bool
    default: true
  extra_paths:
    description:
      - Further paths of this pod to remove with O(status=failed) and O(clean=true), for example the pod's
        device (NPU) snapshot directory. Each must be absolute, safe (see M(inferops.snapshot.npu_snapshot_backup))
        and contain O(identity.pod) as a component, so that only this pod's files can be removed.
    type: list
    elements: path
    default: []
seealso:
  - module: inferops.snapshot.host_checkpoint
  - module: inferops.snapshot.snapshot_info
"""

EXAMPLES = r"""
- name: Mark the generation failed after a device snapshot error and remove what it left
  inferops.snapshot.snapshot_status:
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}
    status: failed
    reason: "device snapshot failed: ACL error 507905 (lock timeout)"
    extra_paths:
      - /var/lib/inferops/npu/default/qwen/p0/vllm-0

- name: Read it
  inferops.snapshot.snapshot_status:
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}
  register: record
"""

RETURN = r"""
took_over:
  description:
    - The claim of another generation this task took over because that run was over (its lease ran out, or the process
      that stood for it on this host is gone), with C(why) and what the task C(cleaned) up of what it left (its
      runc or CRIU still running, their work dir, the pod's staging directory). Null when there was none.
  returned: when it took one over (status=generating)
  type: dict
  sample:
    id: 0f6c1d2e-3a4b-5c5d-8e9f-00112233aabb
    holder: {host: node-1, pid: 4242, what: python3 ansible-playbook}
    why: "the run that held it is gone: its process (pid 4242, python3 ansible-playbook) is gone"
    cleaned: ["removed its staging dir /var/lib/inferops/snapshots/default/qwen/p0/.vllm-0.partial"]
record:
  description: The status record after the task (null when there is none). In check mode, the record it would write.
  returned: always
  type: dict
  sample: {status: failed, reason: "timeout: ...", updated_at: "2026-11-29T12:00:00.000000Z", history: []}
status:
  description: The status after the task (null when there is no record).
  returned: always
  type: str
  sample: completed
previous:
  description: The status before the task (null when there was no record).
  returned: always
  type: str
  sample: generating
removed:
  description: Paths removed (in check mode, that would be removed).
  returned: always
  type: list
  elements: str
generation_in_progress:
  description:
    - The claim of another generation that holds the pod (id, holder, start, expiry); the task then changed nothing.
  returned: when another generation holds the pod
  type: dict
status_path:
  description: Where the record lives.
  returned: always
  type: str
  sample: /var/lib/inferops/snapshots/default/qwen/p0/.vllm-0.status.json
"""

import os
import re

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import fs, paths
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, status

ARGUMENT_SPEC = dict(
    generation_id=_module.GENERATION_ARGS["generation_id"],
    generation_lease=_module.GENERATION_ARGS["generation_lease"],
    snapshot_dir=dict(type="path", required=True),
    identity=dict(type="dict", required=True, options=_module.IDENTITY_OPTIONS),
    status=dict(type="str", choices=["generating", "completed", "failed"]),
    reason=dict(type="str"),
    checksum=dict(type="str"),
    clean=dict(type="bool", default=True),
    extra_paths=dict(type="list", elements="path", default=[]),
)


def removable(snapshot_dir, identity, extra_paths, record=None, generation_id=None):
    """The paths a failed generation of this pod may have left, each checked to belong to the pod: the published
    snapshot only when this generation published it (status.published_by)."""
    candidates = [layout.staging_dir(snapshot_dir)]
    if status.published_by(record, generation_id):
        candidates.insert(0, snapshot_dir)
    for index, path in enumerate(extra_paths):
        field = "extra_paths[%d]" % index
        path = paths.validate_snapshot_dir(path, field=field)
        if identity["pod"] not in path.split("/"):
            raise ParameterError("%s: %r does not contain the pod name %r; only this pod's own paths can be removed"
                                 % (field, path, identity["pod"]), path=path)
        candidates.append(path)
    return [path for path in candidates if os.path.lexists(path)]


def main_logic(module):
    params = module.params
    _module.positive(params, "generation_lease")
    snapshot_dir = paths.validate_snapshot_dir(params["snapshot_dir"])
    identity = paths.check_identity(params["identity"], snapshot_dir)
    record = status.read(snapshot_dir)
    previous = (record or {}).get("status")
    result = dict(previous=previous, status_path=layout.status_path(snapshot_dir), removed=[])
    wanted = params["status"]
    if wanted is None:
        return dict(changed=False, record=record, status=previous, **result)

    other = claim.live_other(snapshot_dir, params["generation_id"])
    if other and wanted in ("failed", "completed"):
        # Another generation owns the pod now: its staging directory and record are not ours to touch.
        return dict(changed=False, record=record, status=previous, generation_in_progress=other,
                    msg="left alone: %s" % claim.describe(other), **result)
    # every option is checked before the claim is written: a task that fails must leave no claim holding the pod
    if params["checksum"] and not re.match(r"[0-9a-f]{64}\Z", params["checksum"]):
        raise ParameterError("checksum: %r is not a SHA-256 (64 lowercase hex digits); leave it out to use the "
                             "snapshot's own fingerprint" % params["checksum"], field="checksum")
    fields = {"identity": identity}
    if wanted == "failed":
        if not params["reason"]:
            raise ParameterError("reason: required with status=failed; say why the generation failed")
        to_remove = removable(snapshot_dir, identity, params["extra_paths"], record,
                              params["generation_id"]) if params["clean"] else []
    else:
        to_remove = []
        if params["extra_paths"]:
            raise ParameterError("extra_paths: only used with status=failed")
    if wanted == "completed":
        if not os.path.isfile(os.path.join(snapshot_dir, layout.MANIFEST)):
            raise ParameterError("status: cannot record completed, no snapshot is published at %s" % snapshot_dir)
        fields["checksum"] = params["checksum"] or hashing.fingerprint(snapshot_dir)
    if wanted == "generating" and not module.check_mode:
        held = claim.join(snapshot_dir, params["generation_id"], params["generation_lease"])
        if held and held.get("took_over"):  # a killed run's claim: taken over, what it left removed
            result["took_over"] = held["took_over"]

    same = (record is not None and previous == wanted and record.get("reason") == params["reason"]
            and all(record.get(key) == value for key, value in fields.items()))
    result["removed"] = to_remove
    diff = dict(before=dict(status=previous, reason=(record or {}).get("reason"), paths=to_remove),
                after=dict(status=wanted, reason=params["reason"], paths=[]))
    if same and not to_remove:
        return dict(changed=False, record=record, status=previous, **result)
    if module.check_mode:
        preview = dict(record or {}, status=wanted, reason=params["reason"], **fields)
        return dict(changed=True, record=preview, status=wanted, diff=diff, **result)

    for path in to_remove:
        fs.remove_tree(path)
    if to_remove and not os.path.lexists(snapshot_dir) and os.path.isfile(layout.restores_path(snapshot_dir)):
        os.unlink(layout.restores_path(snapshot_dir))  # the record of restores of a snapshot that is gone
    if wanted == "failed" and params["generation_id"]:
        claim.release(snapshot_dir, params["generation_id"])  # this generation is over: the pod is free again
    if same:
        new_record = record
    else:
        new_record = status.update(snapshot_dir, wanted, reason=params["reason"], generation_id=params["generation_id"],
                                   **fields)
    return dict(changed=True, record=new_record, status=wanted, diff=diff, **result)


def main():
    _module.run(ARGUMENT_SPEC, main_logic)


if __name__ == "__main__":
    main()

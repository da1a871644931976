#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: k8s_snapshot_status
short_description: Record the snapshot generation status or the restore outcome of an inference service's pods in Kubernetes
version_added: 0.4.0
description:
  - Writes the collection's state onto the pods O(pods) of a service - the C(snapshot.inferops.org/*) annotations
    (schema C(schemas/k8s-annotations.schema.json)) - and, for a generation that ended, each pod's entry in the
    service's record, the ConfigMap C(inferops-snapshot-<service>) (schema C(schemas/k8s-record.schema.json)), which
    outlives the pods and from which the restore decides. The roles call it instead of writing annotations
    themselves; every value is checked against its schema before the first change is sent.
  - O(status) is the generation's status. C(generating) - annotated with the node each pod runs on. C(completed) -
    with C(reason) removed, each pod's C(checksum), C(total-bytes) and C(duration-seconds) from O(snapshots), its
    C(node); the record gets the pod's entry (identity, node, paths from O(config), image, checksum, size).
    C(failed) - with O(reason) and the checksum removed; the record gets the pod's entry with the reason.
  - O(restore) is what became of a pod's restore. C(restored) - C(restore-reason) removed; with O(restore_from) the
    pod also gets the state of that snapshot (C(status=completed), its O(checksum), host path, O(node), identity),
    as a pod that runs from a completed snapshot of its identity carries it, so that the generation finds the
    instance completed. C(cold) - with O(reason); the pod runs a new engine, so its snapshot state
    (C(status), C(checksum), C(node)) and restore request (C(org.inferops.restore-from)) are removed and the next
    generation snapshots it again. C(failed) - with O(reason).
  - C(updated-at) (and an entry's C(updated_at)) is written only with a change; annotations that already say what
    is asked are left alone. Every change is a JSON merge patch; the record is created when missing.
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - inferops.snapshot.k8s_service
  - inferops.snapshot.attributes
  - inferops.snapshot.k8s_service.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: Reports the annotations and record entries it would write, and writes none.
  diff_mode:
    support: full
    details: Before and after of every annotation (C(pod <name>)) and record entry (C(record <name>)) it changes.
  idempotent:
    support: full
    details: A second run with the same arguments changes nothing (no new C(updated-at) either).
options:
  pods:
    description: Names of the service's pods to write the state of. A pod that does not exist fails the task before
      anything is written.
    type: list
    elements: str
    required: true
  status:
    description: The generation status to record, as described above.
    type: str
    choices: [generating, completed, failed]
  snapshots:
    description:
      - With O(status=completed), each pod's snapshot, keyed by pod name - C(checksum) (required), C(total_bytes) and
        C(duration) (seconds), as M(inferops.snapshot.host_checkpoint) returns them.
    type: dict
    default: {}
  restore:
    description: The restore outcome to record, as described above.
    type: str
    choices: [restored, cold, failed]
  restore_from:
    description: With O(restore=restored), the snapshot directory the pods run from (they get its state).
    type: path
  checksum:
    description: With O(restore_from), that snapshot's fingerprint (the SHA-256 of its C(checksum.sha256)).
    type: str
  node:
    description: With O(restore_from), the node that holds that snapshot.
    type: str
  reason:
    description: Why - required with O(status=failed), O(restore=cold) and O(restore=failed).
    type: str
  record:
    description: With O(status=completed) or O(status=failed), also write the pods' entries in the service's record.
    type: bool
    default: true
seealso:
  - module: inferops.snapshot.k8s_snapshot_pods
  - module: inferops.snapshot.k8s_snapshot_pods_info
  - module: inferops.snapshot.snapshot_status
    description: The same status on the node, beside the snapshot.
"""

EXAMPLES = r"""
- name: The instance's pods are snapshotted now
  inferops.snapshot.k8s_snapshot_status:
    namespace: inference
    service: qwen
    pods: [qwen-p0-0, qwen-p0-1]
    status: generating

- name: Annotate and record them completed, with what host_checkpoint returned
  inferops.snapshot.k8s_snapshot_status:
    namespace: inference
    service: qwen
    config: "{{ snapshot_config }}"
    pods: [qwen-p0-0]
    status: completed
    snapshots:
      qwen-p0-0: {checksum: "{{ checkpoint.checksum }}", total_bytes: "{{ checkpoint.total_bytes }}", duration: 1.9}

- name: The node's runtime started this pod normally
  inferops.snapshot.k8s_snapshot_status:
    namespace: inference
    service: qwen
    pods: [qwen-p0-0]
    restore: cold
    reason: "the restore-on-create runtime started the container normally: checksum_mismatch: host/criu/pages-1.img"
"""

RETURN = r"""
annotated:
  description: The pods whose annotations changed (in check mode, would change).
  returned: always
  type: list
  elements: str
recorded:
  description: The pods whose entry in the service's record changed (in check mode, would change).
  returned: always
  type: list
  elements: str
msg:
  description: A one-line summary.
  returned: always
  type: str
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import client, runner, service

ARGUMENT_SPEC = dict(client.AUTH_ARG_SPEC, **service.SERVICE_ARGS)
ARGUMENT_SPEC.update(
    pods=dict(type="list", elements="str", required=True),
    status=dict(type="str", choices=["generating", "completed", "failed"]),
    snapshots=dict(type="dict", default={}),
    restore=dict(type="str", choices=["restored", "cold", "failed"]),
    restore_from=dict(type="path"),
    checksum=dict(type="str"),
    node=dict(type="str"),
    reason=dict(type="str"),
    record=dict(type="bool", default=True),
)


def main():
    _module.run(ARGUMENT_SPEC, runner.status_logic, requires=(client.LIBRARY, "jsonschema"),
                mutually_exclusive=[("status", "restore")], required_one_of=[("status", "restore")])


if __name__ == "__main__":
    main()

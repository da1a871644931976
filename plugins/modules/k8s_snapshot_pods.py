#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: k8s_snapshot_pods
short_description: Prepare an inference service's pods for a snapshot, or release recreated pods to restore from one
version_added: 0.1.0
description:
  - Does, through the Kubernetes API, the parts of the snapshot workflow that change pods. What the pods of a service
    and its instances are, and the snapshot paths of each pod, are as in M(inferops.snapshot.k8s_snapshot_pods_info).
  - O(state=prepared) makes sure every pod of the chosen instance carries the env C(VLLM_NPU_SNAPSHOT_PATH) with its own
    NPU snapshot path (the engine takes the device snapshot there after warmup, then reports Ready) and the annotations
    C(snapshot.inferops.org/enabled), C(identity), C(npu-path), C(host-path), C(timeout-seconds) and C(status=pending).
    Annotations are merge-patched. A container's env cannot change in a running pod, so a bare pod without the env is
    deleted and created again from its own manifest with the env added (same name, labels, node and spec). A pod owned
    by a controller (StatefulSet, ...) must get the env from its template; the task fails naming the pods and the env
    entries to add, before it changes anything.
  - O(state=released) decides, for every pod of the service held by the scheduling gate C(inferops.org/snapshot-restore)
    (a pod recreated after the snapshot, waiting for this decision), whether it starts from its snapshot. It does when
    the service's record says the snapshot of exactly this pod identity was completed, at the path the O(config) gives
    it, and O(verified) says that it verified valid on the node holding it. Then the pod is annotated
    C(org.inferops.restore-from=<snapshot dir>) (what the restore-on-create runtime reads), bound to that node with a
    C(kubernetes.io/hostname) node selector, and annotated C(snapshot.inferops.org/restore=pending), with the snapshot
    annotations of the generation (C(status=completed), C(checksum), paths) copied from the record. Otherwise it is
    annotated C(restore=cold) with the C(restore-reason) and starts normally. Either way the annotation
    C(snapshot.inferops.org/metadata) holds the new pod's environment as JSON (a downward API volume may project it,
    read-only; the metadata file the restored engine reads is written by the node's runtime and must be on a writable
    path, see docs/kubernetes.md), and then the gate is removed.
    With no O(config) or C(enabled=false) the gate is only removed.
  - O(state=reverted) undoes the env after a failed or timed-out generation, for the pods that never became Ready
    (their engine would still lock itself for a device snapshot after its warmup); bare pods are created again without
    C(VLLM_NPU_SNAPSHOT_PATH); their annotations stay. Ready pods are left alone (resume their engines with
    M(inferops.snapshot.npu_snapshot_lock) C(state=unlocked)).
  - All changes are JSON merge patches, creations and deletions; it never writes a pod's status.
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
    details: Reports the patches and recreations it would make.
  diff_mode:
    support: full
    details: Before and after of the annotations (and env presence) of every pod it changes.
  idempotent:
    support: full
    details: Prepared pods, released pods and reverted pods are left alone the second time.
options:
  device:
    description:
      - Whether the service's snapshots take the device (NPU) state. V(false) is the host-only mode - O(state=prepared)
        makes sure the pods do B(not) carry C(VLLM_NPU_SNAPSHOT_PATH) (a bare pod that does is created again without it),
        and O(state=released) annotates a pod it marks for restore C(org.inferops.restore-device=false), which the
        node's restore-on-create runtime reads (through the env C(INFEROPS_RESTORE_DEVICE) on Docker nodes), so that it
        restores no device state.
    type: bool
    default: true
  state:
    description: C(prepared), C(released) or C(reverted), as described above.
    type: str
    choices: [prepared, released, reverted]
    required: true
  verified:
    description:
      - For O(state=released), the verification of each candidate pod's snapshot on the node that holds it, keyed by pod
        name, each with at least C(valid) and C(reasons) (the result of M(inferops.snapshot.snapshot_verify)). A pod
        without an entry starts normally.
    type: dict
    default: {}
  pods:
    description: For O(state=reverted), the pods to consider. Default is the pods of the chosen instance.
    type: list
    elements: str
  wait_timeout:
    description: Seconds to wait for a deleted pod to be gone before it is created again.
    type: float
    default: 120
seealso:
  - module: inferops.snapshot.k8s_snapshot_pods_info
  - module: inferops.snapshot.snapshot_verify
"""

EXAMPLES = r"""
- name: Inject the NPU snapshot path into the first instance of qwen and annotate its pods
  inferops.snapshot.k8s_snapshot_pods:
    namespace: inference
    service: qwen
    state: prepared
    config: "{{ snapshot_config }}"

- name: Release recreated pods, from their snapshot where it verified
  inferops.snapshot.k8s_snapshot_pods:
    namespace: inference
    service: qwen
    state: released
    config: "{{ snapshot_config }}"
    verified: "{{ dict(verify.results | map(attribute='item.name') | zip(verify.results)) }}"
"""

RETURN = r"""
actions:
  description: What was done (or would be, in check mode), one entry per pod with C(pod), C(action) and details.
  returned: always
  type: list
  elements: dict
  sample: [{pod: qwen-p0-0, action: recreated, reason: "env VLLM_NPU_SNAPSHOT_PATH added"}]
decisions:
  description:
    - For O(state=released), per released pod C(pod), C(restore_from) (null for a normal start), C(node), C(reason),
      and C(status_path), where the node's runtime records what it did (the status record beside the snapshot; null
      for a normal start).
  returned: when O(state=released)
  type: list
  elements: dict
instance:
  description: The chosen instance.
  returned: always
  type: str
pods:
  description: The chosen instance's pods after the change, as in M(inferops.snapshot.k8s_snapshot_pods_info).
  returned: always
  type: list
  elements: dict
enabled:
  description: Whether the service has snapshots on. When false nothing but scheduling gates was touched.
  returned: always
  type: bool
msg:
  description: A one-line summary.
  returned: always
  type: str
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import client, runner, service

ARGUMENT_SPEC = dict(client.AUTH_ARG_SPEC, **service.SERVICE_ARGS)
ARGUMENT_SPEC.update(
    device=service.DEVICE_ARG,
    state=dict(type="str", required=True, choices=["prepared", "released", "reverted"]),
    verified=dict(type="dict", default={}),
    pods=dict(type="list", elements="str"),
    wait_timeout=dict(type="float", default=120.0),
)


def main():
    _module.run(ARGUMENT_SPEC, runner.pods_logic, requires=(client.LIBRARY, "jsonschema"))


if __name__ == "__main__":
    main()

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: k8s_snapshot_pods_info
short_description: Read an inference service's pods, instances and snapshot state from the Kubernetes API, and wait for them
version_added: 0.1.0
description:
  - Lists the pods of an inference service (label O(service_label)C(=<service>)), groups them into instances
    (label O(instance_label)), chooses the instance to snapshot (O(instance), else the first) and describes each of
    its pods - node, engine container and its runtime id, identity (namespace/service/instance/pod), the snapshot
    paths the O(config) gives it, whether it carries the C(VLLM_NPU_SNAPSHOT_PATH) env, and the snapshot state in its
    C(snapshot.inferops.org/*) annotations.
  - Also reads the service's record ConfigMap C(inferops-snapshot-<service>) (which snapshots were completed, on which
    node) and lists the pods waiting for a restore decision (scheduling gate C(inferops.org/snapshot-restore)), with the
    ones that have a completed snapshot to verify as RV(candidates).
  - With O(wait_for), waits until the pods are running (a container id in their status) or Ready, and fails after
    O(wait_timeout) seconds with the last observed state of every pod still missing. It fails at once when a pod
    failed or its snapshot status annotation says C(failed).
  - Reads only; it never changes anything in the cluster.
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
    details: Read-only; it runs (and waits) in check mode too.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  device:
    description:
      - Whether the service's snapshots take the device (NPU) state. With V(true) a pod of the chosen instance is ready
        for its snapshot (C(env_ok) of each of RV(pods)) when it carries C(VLLM_NPU_SNAPSHOT_PATH) with its own NPU path; with V(false)
        (host only - CPU engines, accelerators without a snapshot API) when it does not carry it at all.
    type: bool
    default: true
  wait_for:
    description:
      - C(none) reads once. C(running) waits until each pod has a container id in its status (its container was created
        or restored). C(ready) waits until each pod is Ready (for an engine with C(VLLM_NPU_SNAPSHOT_PATH), warmup done
        and the device snapshot taken) and has a container id.
    type: str
    choices: [none, running, ready]
    default: none
  wait_pods:
    description: Names of the pods to wait for. Default is the pods of the chosen instance.
    type: list
    elements: str
  wait_timeout:
    description: Seconds to wait with O(wait_for) before failing with the last observed state.
    type: float
    default: 300
  wait_sleep:
    description: Seconds between two reads while waiting.
    type: float
    default: 0.5
seealso:
  - module: inferops.snapshot.k8s_snapshot_pods
  - ref: inferops.snapshot.k8s_snapshot_generate
    description: The role that generates a service's snapshots in Kubernetes.
"""

EXAMPLES = r"""
- name: Which instance of qwen would be snapshotted, and where
  inferops.snapshot.k8s_snapshot_pods_info:
    namespace: inference
    service: qwen
    config:
      enabled: true
      npuSnapshotPath: /mnt/snapshots/npu
      hostSnapshotPath: /mnt/snapshots/host
  register: plan

- name: Wait until the instance's engines are warm and their device snapshot is taken
  inferops.snapshot.k8s_snapshot_pods_info:
    namespace: inference
    service: qwen
    instance: "{{ plan.instance }}"
    wait_for: ready
    wait_timeout: 300
"""

RETURN = r"""
enabled:
  description: Whether the service has snapshots on (a valid O(config) with C(enabled=true)).
  returned: always
  type: bool
disabled_reason:
  description: Why nothing is to be done, when RV(enabled) is false.
  returned: always
  type: str
config:
  description: The O(config) with the schema's defaults filled in (C(timeoutSeconds) 300, C(minSizeBytes) 1024).
  returned: always
  type: dict
instances:
  description: The service's instances in natural order, each with its pod names.
  returned: always
  type: list
  elements: dict
  sample: [{name: p0, pods: [qwen-p0-0, qwen-p0-1]}, {name: p1, pods: [qwen-p1-0]}]
unlabelled:
  description: Pods of the service without the O(instance_label) label (they belong to no instance).
  returned: always
  type: list
  elements: str
instance:
  description: The chosen instance (null when the service has no pods).
  returned: always
  type: str
  sample: p0
pods:
  description:
    - The chosen instance's pods, as they are after the wait when O(wait_for) is set. Each has C(name), C(uid), C(node),
      C(phase), C(ready), C(gated), C(controller) (C(Kind/name) or null), C(container), C(container_id) and
      C(container_runtime) (from C(docker://<id>)), C(image), C(identity), C(npu_path), C(host_path), C(staging_path)
      (where a generation assembles the host snapshot before it publishes it at C(host_path)), C(env_ok) (it carries
      C(VLLM_NPU_SNAPSHOT_PATH) with its path; with O(device=false), it does not carry it), C(snapshot) (C(status),
      C(reason), C(checksum) from its annotations) and C(restore) (C(status), C(reason)).
  returned: always
  type: list
  elements: dict
gated:
  description: Pods of the service held by the scheduling gate C(inferops.org/snapshot-restore), described like RV(pods).
  returned: always
  type: list
  elements: dict
record:
  description:
    - The service's record ConfigMap, one entry per pod name (identity, node, host_path, npu_path, image, status,
      checksum, total_bytes, reason, updated_at), as in the collection's C(schemas/k8s-record.schema.json).
    - "An entry that is not valid against it is C({invalid: <why>}); a pod with such an entry is never restored."
  returned: always
  type: dict
candidates:
  description: Gated pods with a completed snapshot in the record, each to verify on its C(node) before a restore.
  returned: always
  type: list
  elements: dict
  sample: [{name: qwen-p0-0, node: node-a, host_path: /mnt/snapshots/host/inference/qwen/p0/qwen-p0-0, image: qwen:1.2}]
completed:
  description: Every pod of the chosen instance is annotated C(completed) and recorded so with the same checksum.
  returned: always
  type: bool
requested:
  description:
    - Running pods of the service (any instance) that carry their own restore request - C(INFEROPS_RESTORE_FROM) in
      their engine container's env, as a template does (docs/fleet.md), or the marker of a release - and whose
      C(snapshot.inferops.org/restore) annotation does not say what happened yet (absent or C(pending)). The node's
      record of the restore (C(status_path), its C(last_restore) and C(restores) entries for this C(container_id))
      tells; the k8s_snapshot role reads it and annotates the pod.
    - Each has C(name), C(uid), C(node), C(container_id), C(container_runtime), C(restore_from), C(status_path),
      C(request_identity) (the env C(INFEROPS_RESTORE_IDENTITY), or null) and C(identity).
  returned: always
  type: list
  elements: dict
waited:
  description: With O(wait_for), the last observed state of each awaited pod (phase, ready, node, containerID, state).
  returned: when O(wait_for) is not C(none)
  type: dict
elapsed:
  description: Seconds spent waiting.
  returned: when O(wait_for) is not C(none)
  type: float
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import client, runner, service

ARGUMENT_SPEC = dict(client.AUTH_ARG_SPEC, **service.SERVICE_ARGS)
ARGUMENT_SPEC.update(
    device=service.DEVICE_ARG,
    wait_for=dict(type="str", default="none", choices=["none", "running", "ready"]),
    wait_pods=dict(type="list", elements="str"),
    wait_timeout=dict(type="float", default=300.0),
    wait_sleep=dict(type="float", default=0.5),
)


def main():
    _module.run(ARGUMENT_SPEC, runner.info_logic, requires=(client.LIBRARY, "jsonschema"))


if __name__ == "__main__":
    main()

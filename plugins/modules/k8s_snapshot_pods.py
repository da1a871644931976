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
  - inferops.snapshot.k8s_auth
  - inferops.snapshot.k8s_auth.SERVICE
  - inferops.snapshot.attributes
  - inferops.snapshot.k8s_auth.ACTIONGROUP
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
  description: For O(state=released), per released pod C(pod), C(restore_from) (null for a normal start), C(node), C(reason).
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

import json

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.inferops.snapshot.plugins.module_utils import _k8s as k8s
from ansible_collections.inferops.snapshot.plugins.module_utils import _k8s_service as svc
from ansible_collections.inferops.snapshot.plugins.module_utils import _schema as schema
from ansible_collections.inferops.snapshot.plugins.module_utils._common import run_module
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import ParameterError


class PodChanger:
    def __init__(self, module, client):
        self.module = module
        self.client = client
        self.params = module.params
        self.namespace = module.params["namespace"]
        self.actions = []
        self.diff = {"before": {}, "after": {}}

    def raw_pods(self, names=None):
        pods = self.client.list_pods(self.namespace, {self.params["service_label"]: self.params["service"]})
        return [pod for pod in pods if names is None or svc.name(pod) in names]

    def note_diff(self, pod, changes, env_before=None, env_after=None):
        current = svc.annotations(pod)
        before = {key: current.get(key) for key in changes}
        after = dict(changes)
        if env_before is not None:
            before[svc.NPU_PATH_ENV + " (env)"], after[svc.NPU_PATH_ENV + " (env)"] = env_before, env_after
        self.diff["before"][svc.name(pod)] = before
        self.diff["after"][svc.name(pod)] = after

    def recreate(self, pod, manifest):
        """Delete the pod, wait until it is gone, create ``manifest`` in its place."""
        self.client.delete_pod(self.namespace, svc.name(pod))
        self.client.wait_pod_gone(self.namespace, svc.name(pod), pod["metadata"].get("uid"), self.params["wait_timeout"])
        self.client.create_pod(self.namespace, manifest)

    # -- prepared -----------------------------------------------------------------------------------
    def prepare(self, state, config):
        wanted_status = {svc.A_STATUS: svc.STATUS_PENDING, svc.A_REASON: None, svc.A_CHECKSUM: None}
        plans, blocked = [], []
        raw = {svc.name(pod): pod for pod in self.raw_pods()}
        for info in state["pods"]:
            pod = raw[info["name"]]
            index, container = svc.engine_container(pod, self.params["container"])
            wanted = svc.generation_annotations(info["identity"], info["npu_path"], info["host_path"], config)
            if info["snapshot"]["status"] not in (svc.STATUS_PENDING, svc.STATUS_GENERATING) or not info["env_ok"]:
                wanted.update(wanted_status)
            changes = svc.annotation_changes(pod, wanted)
            if info["env_ok"]:
                if changes:
                    plans.append(("annotate", pod, changes, None))
            elif info["controller"]:
                blocked.append("%s (owned by %s)" % (info["name"], info["controller"]))
            else:
                wanted.update(wanted_status)
                manifest = svc.recreation_manifest(pod, index, svc.with_env(container, svc.NPU_PATH_ENV, info["npu_path"]),
                                                   wanted)
                plans.append(("recreate", pod, changes, manifest))
        if blocked:
            first = state["pods"][0]
            raise ParameterError(
                "pods %s lack the env %s=<their NPU snapshot path> and belong to a controller, so they cannot be given "
                "it here (a running pod's env cannot change). Add to the engine container of the pod template of "
                "instance %s:\n%s" % (", ".join(blocked), svc.NPU_PATH_ENV, state["instance"],
                                      svc.env_template_hint(config["npuSnapshotPath"], first["identity"])),
                blocked=blocked)
        for action, pod, changes, manifest in plans:
            if action == "annotate":
                self.note_diff(pod, changes)
                self.actions.append({"pod": svc.name(pod), "action": "annotated", "annotations": sorted(changes)})
                if not self.module.check_mode:
                    self.client.patch_pod(self.namespace, svc.name(pod), {"metadata": {"annotations": changes}})
            else:
                self.note_diff(pod, changes, env_before=None, env_after="<npu path>")
                self.actions.append({"pod": svc.name(pod), "action": "recreated",
                                     "reason": "env %s added (a running pod's env cannot change)" % svc.NPU_PATH_ENV})
                if not self.module.check_mode:
                    self.recreate(pod, manifest)

    # -- released -----------------------------------------------------------------------------------
    def release(self, state, enabled, config):
        decisions = []
        raw = {svc.name(pod): pod for pod in self.raw_pods()}
        for info in state["gated"]:
            pod = raw[info["name"]]
            patches, restore_from = [], None
            if enabled:
                restore_from, node, reason = svc.decide(info["identity"], state["record"].get(info["name"]),
                                                        self.params["verified"].get(info["name"]),
                                                        config["hostSnapshotPath"])
                pinned = (pod.get("spec", {}).get("nodeSelector") or {}).get(svc.HOSTNAME_LABEL)
                if restore_from and pinned and pinned != node:
                    restore_from, node, reason = None, None, (
                        "the pod is bound to node %s by its nodeSelector but its snapshot is on node %s" % (pinned, node))
                _index, container = svc.engine_container(pod, self.params["container"])
                wanted = {svc.RESTORE_FROM_ANNOTATION: restore_from,
                          svc.A_RESTORE: svc.RESTORE_PENDING if restore_from else svc.RESTORE_COLD,
                          svc.A_RESTORE_REASON: reason}
                if restore_from:
                    # the pod runs from this completed snapshot of its identity: it carries its snapshot state,
                    # so that the generation role finds the instance completed and leaves it alone
                    entry = state["record"][info["name"]]
                    wanted.update(svc.generation_annotations(info["identity"], info["npu_path"], restore_from, config))
                    wanted.update({svc.A_STATUS: svc.STATUS_COMPLETED, svc.A_REASON: None,
                                   svc.A_CHECKSUM: entry.get("checksum"), svc.A_NODE: node})
                # the environment as the kubelet will resolve it, downward-API references to these annotations included
                released = svc.with_annotations(pod, wanted)
                metadata = svc.restore_metadata(released, container, restore_from is not None, restore_from, reason)
                wanted[svc.A_METADATA] = json.dumps(metadata, sort_keys=True)
                changes = svc.annotation_changes(pod, wanted)
                first = {"metadata": {"annotations": changes}}
                if node:
                    first["spec"] = {"nodeSelector": {svc.HOSTNAME_LABEL: node}}
                patches.append(first)
                self.note_diff(pod, dict((key, "<new environment>" if key == svc.A_METADATA else value)
                                         for key, value in changes.items()))
                decisions.append({"pod": info["name"], "restore_from": restore_from, "node": node, "reason": reason})
            gates = [gate for gate in pod["spec"].get("schedulingGates") or [] if gate.get("name") != svc.RESTORE_GATE]
            patches.append({"spec": {"schedulingGates": gates or None}})
            self.actions.append({"pod": info["name"], "action": "released",
                                 "restore": restore_from is not None})
            if not self.module.check_mode:
                for patch in patches:  # annotations and node first: the gate goes last
                    self.client.patch_pod(self.namespace, info["name"], patch)
        return decisions

    # -- reverted -----------------------------------------------------------------------------------
    def revert(self, state):
        names = self.params["pods"] if self.params["pods"] is not None else [pod["name"] for pod in state["pods"]]
        for pod in self.raw_pods(names):
            index, container = svc.engine_container(pod, self.params["container"])
            env, _unresolved = svc.resolve_env(pod, container)
            if svc.NPU_PATH_ENV not in env or svc.is_ready(pod):
                continue
            if svc.controller(pod):
                self.actions.append({"pod": svc.name(pod), "action": "left", "reason": (
                    "owned by %s: remove %s from its pod template, or its engine will wait for a snapshot after its "
                    "warmup" % (svc.controller(pod), svc.NPU_PATH_ENV))})
                self.module.warn("pod %s: %s" % (svc.name(pod), self.actions[-1]["reason"]))
                continue
            manifest = svc.recreation_manifest(pod, index, svc.with_env(container, svc.NPU_PATH_ENV, None), {})
            self.note_diff(pod, {}, env_before="<npu path>", env_after=None)
            self.actions.append({"pod": svc.name(pod), "action": "recreated",
                                 "reason": "env %s removed: the pod never became Ready for its snapshot" % svc.NPU_PATH_ENV})
            if not self.module.check_mode:
                self.recreate(pod, manifest)


def main_logic(module):
    params = module.params
    client = k8s.K8sClient.from_params(params)
    state = svc.read_service(client, params)
    changer = PodChanger(module, client)
    result = dict(instance=state["instance"], enabled=state["enabled"])
    if params["state"] == "released":
        result["decisions"] = changer.release(state, state["enabled"], state["config"])
    elif not state["enabled"]:
        module.exit_json(changed=False, actions=[], pods=state["pods"], msg=state["disabled_reason"], **result)
    elif params["state"] == "prepared":
        if not state["pods"]:
            raise ParameterError("service %s has no pods in namespace %s with the labels %s=%s and %s=<instance>"
                                 % (params["service"], params["namespace"], params["service_label"], params["service"],
                                    params["instance_label"]))
        changer.prepare(state, state["config"])
    else:
        changer.revert(state)
    changed = bool(changer.actions) and any(action["action"] != "left" for action in changer.actions)
    after = state["pods"] if module.check_mode or not changed else svc.read_service(client, params)["pods"]
    msg = "%d pod(s) changed" % len([a for a in changer.actions if a["action"] != "left"]) if changed else "nothing to change"
    module.exit_json(changed=changed, actions=changer.actions, pods=after, diff=changer.diff, msg=msg, **result)


def main():
    argument_spec = dict(k8s.AUTH_ARGS)
    argument_spec.update(svc.SERVICE_ARGS)
    argument_spec.update(
        state=dict(type="str", required=True, choices=["prepared", "released", "reverted"]),
        verified=dict(type="dict", default={}),
        pods=dict(type="list", elements="str"),
        wait_timeout=dict(type="float", default=120.0),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    if not k8s.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=k8s.KUBERNETES_IMPORT_ERROR)
    if not schema.HAS_JSONSCHEMA:
        module.fail_json(msg=missing_required_lib("jsonschema"), exception=schema.JSONSCHEMA_IMPORT_ERROR)
    run_module(module, main_logic)


if __name__ == "__main__":
    main()

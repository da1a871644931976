# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What k8s_snapshot_pods changes in the cluster: prepare, release and revert a service's pods. PRIVATE.

Merge patches only, through the one Kubernetes client (_k8s.py); the decisions are pure functions of
the API's dicts (_k8s_service.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.inferops.snapshot.plugins.module_utils import _k8s as k8s
from ansible_collections.inferops.snapshot.plugins.module_utils import _k8s_service as svc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import ParameterError


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
        device = svc.wants_npu_env(self.params)
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
                manifest = svc.recreation_manifest(
                    pod, index, svc.with_env(container, svc.NPU_PATH_ENV, info["npu_path"] if device else None), wanted)
                plans.append(("recreate", pod, changes, manifest))
        if blocked and not device:
            raise ParameterError(
                "pods %s carry the env %s and belong to a controller: in the host-only mode (device=false) their engine "
                "would lock itself for a device snapshot after its warmup and wait for a resume that never comes. "
                "Remove %s from the engine container of the pod template of instance %s"
                % (", ".join(blocked), svc.NPU_PATH_ENV, svc.NPU_PATH_ENV, state["instance"]), blocked=blocked)
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
                self.note_diff(pod, changes, env_before=None if device else "<npu path>",
                               env_after="<npu path>" if device else None)
                self.actions.append({"pod": svc.name(pod), "action": "recreated", "reason": (
                    "env %s %s (a running pod's env cannot change)"
                    % (svc.NPU_PATH_ENV, "added" if device else "removed: host-only snapshots"))})
                if not self.module.check_mode:
                    self.recreate(pod, manifest)

    # -- released -----------------------------------------------------------------------------------
    def release(self, state, enabled, config):
        decisions = []
        device = svc.wants_npu_env(self.params)
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
                          # the fingerprint the generation recorded: the node's runtime restores only that snapshot
                          svc.RESTORE_CHECKSUM_ANNOTATION: (state["record"].get(info["name"]) or {}).get("checksum")
                          if restore_from else None,
                          # host-only snapshots (device=false): the node's runtime restores no device state
                          svc.RESTORE_DEVICE_ANNOTATION: "false" if restore_from and not device else None,
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
        return dict(changed=False, actions=[], pods=state["pods"], msg=state["disabled_reason"], **result)
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
    return dict(changed=changed, actions=changer.actions, pods=after, diff=changer.diff, msg=msg, **result)

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the k8s modules do, each a ``*_logic(module)`` for ``_module.run``. PRIVATE to inferops.snapshot.

(As kubernetes.core's module_utils/k8s/runner.py runs its k8s module.) Reads through service.py, every
annotation from pods.py's writer, every record entry from record.py's; all of a task's changes are built
and checked before the first is sent, and in check mode none is.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import math

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout, schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import wait_for
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import (ParameterError, SnapshotError,
                                                                                         SnapshotTimeout)
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import pods, record, service
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s.client import connect

NPU_ENV = layout.ENV_NPU_SNAPSHOT_PATH


class PodChanger:
    """What the module k8s_snapshot_pods does: prepare, release and revert a service's pods."""

    def __init__(self, module, client, pod_list):
        self.module = module
        self.client = client
        self.params = module.params
        self.namespace = module.params["namespace"]
        self.raw = dict((pods.name(pod), pod) for pod in pod_list)
        self.actions = []
        self.diff = {"before": {}, "after": {}}

    def note_diff(self, pod, changes, env_before=None, env_after=None):
        current = pods.annotations(pod)
        before = dict((key, current.get(key)) for key in changes)
        after = dict(changes)
        if env_before is not None or env_after is not None:
            before[NPU_ENV + " (env)"], after[NPU_ENV + " (env)"] = env_before, env_after
        self.diff["before"][pods.name(pod)] = before
        self.diff["after"][pods.name(pod)] = after

    def recreate(self, pod, manifest):
        """Delete the pod, wait until it is gone, create ``manifest`` in its place."""
        self.client.delete_pod(self.namespace, pods.name(pod))
        self.client.wait_pod_gone(self.namespace, pods.name(pod), pod["metadata"].get("uid"),
                                  self.params["wait_timeout"])
        self.client.create_pod(self.namespace, manifest)

    # -- prepared -----------------------------------------------------------------------------------
    def prepare(self, state, config):
        plans, blocked = [], []
        device = service.wants_npu_env(self.params)
        for info in state["pods"]:
            pod = self.raw[info["name"]]
            index, container = pods.engine_container(pod, self.params["container"])
            wanted = pods.generation(info["identity"], info["npu_path"], info["host_path"], config)
            if info["snapshot"]["status"] not in (pods.STATUS_PENDING, pods.STATUS_GENERATING) or not info["env_ok"]:
                wanted.update(pods.snapshot_state(pods.STATUS_PENDING))
            if info["env_ok"]:
                changes = pods.changes(pod, wanted)
                if changes:
                    plans.append(("annotate", pod, changes, None))
            elif info["controller"]:
                blocked.append("%s (owned by %s)" % (info["name"], info["controller"]))
            else:
                wanted.update(pods.snapshot_state(pods.STATUS_PENDING))
                changes = pods.changes(pod, wanted)
                manifest = pods.recreation_manifest(
                    pod, index, pods.with_env(container, NPU_ENV, info["npu_path"] if device else None), changes)
                plans.append(("recreate", pod, changes, manifest))
        if blocked and not device:
            raise ParameterError(
                "pods %s carry the env %s and belong to a controller: in the host-only mode (device=false) their engine "
                "would lock itself for a device snapshot after its warmup and wait for a resume that never comes. "
                "Remove %s from the engine container of the pod template of instance %s"
                % (", ".join(blocked), NPU_ENV, NPU_ENV, state["instance"]), blocked=blocked)
        if blocked:
            first = state["pods"][0]
            raise ParameterError(
                "pods %s lack the env %s=<their NPU snapshot path> and belong to a controller, so they cannot be given "
                "it here (a running pod's env cannot change). Add to the engine container of the pod template of "
                "instance %s:\n%s" % (", ".join(blocked), NPU_ENV, state["instance"],
                                      service.env_template_hint(config["npuSnapshotPath"], first["identity"])),
                blocked=blocked)
        for action, pod, changes, manifest in plans:
            if action == "annotate":
                self.note_diff(pod, changes)
                self.actions.append({"pod": pods.name(pod), "action": "annotated", "annotations": sorted(changes)})
                if not self.module.check_mode:
                    self.client.patch_pod(self.namespace, pods.name(pod), {"metadata": {"annotations": changes}})
            else:
                self.note_diff(pod, changes, env_before=None if device else "<npu path>",
                               env_after="<npu path>" if device else None)
                self.actions.append({"pod": pods.name(pod), "action": "recreated", "reason": (
                    "env %s %s (a running pod's env cannot change)"
                    % (NPU_ENV, "added" if device else "removed: host-only snapshots"))})
                if not self.module.check_mode:
                    self.recreate(pod, manifest)

    # -- released -----------------------------------------------------------------------------------
    def release(self, state, enabled, config):
        decisions = []
        device = service.wants_npu_env(self.params)
        for info in state["gated"]:
            pod = self.raw[info["name"]]
            patches, restore_from = [], None
            if enabled:
                entry = state["record"].get(info["name"]) or {}
                restore_from, node, reason = service.decide(info["identity"], state["record"].get(info["name"]),
                                                            self.params["verified"].get(info["name"]),
                                                            config["hostSnapshotPath"])
                pinned = (pod.get("spec", {}).get("nodeSelector") or {}).get(layout.K8S_HOSTNAME_LABEL)
                if restore_from and pinned and pinned != node:
                    restore_from, node, reason = None, None, (
                        "the pod is bound to node %s by its nodeSelector but its snapshot is on node %s" % (pinned, node))
                _index, container = pods.engine_container(pod, self.params["container"])
                wanted = pods.restore_request(restore_from, entry.get("checksum"), device)
                wanted.update({layout.K8S_RESTORE: pods.RESTORE_PENDING if restore_from else pods.RESTORE_COLD,
                               layout.K8S_RESTORE_REASON: reason})
                if restore_from:
                    # the pod runs from this completed snapshot of its identity: it carries its snapshot state,
                    # so that the generation role finds the instance completed and leaves it alone
                    wanted.update(pods.generation(info["identity"], info["npu_path"], restore_from, config))
                    wanted.update(pods.snapshot_state(pods.STATUS_COMPLETED, node, checksum=entry.get("checksum")))
                # the environment as the kubelet will resolve it, downward-API references to these annotations included
                released = pods.with_annotations(pod, wanted)
                metadata = service.restore_metadata(released, container, restore_from is not None, restore_from,
                                                    reason)
                wanted[layout.K8S_METADATA] = json.dumps(metadata, sort_keys=True)
                changes = pods.changes(pod, wanted)
                first = {"metadata": {"annotations": changes}}
                if node:
                    first["spec"] = {"nodeSelector": {layout.K8S_HOSTNAME_LABEL: node}}
                patches.append(first)
                self.note_diff(pod, dict((key, "<new environment>" if key == layout.K8S_METADATA else value)
                                         for key, value in changes.items()))
                decisions.append({"pod": info["name"], "restore_from": restore_from, "node": node, "reason": reason,
                                  "status_path": layout.status_path(restore_from) if restore_from else None})
            gates = [gate for gate in pod["spec"].get("schedulingGates") or []
                     if gate.get("name") != layout.K8S_RESTORE_GATE]
            patches.append({"spec": {"schedulingGates": gates or None}})
            self.actions.append({"pod": info["name"], "action": "released", "restore": restore_from is not None})
            if not self.module.check_mode:
                for patch in patches:  # annotations and node first: the gate goes last
                    self.client.patch_pod(self.namespace, info["name"], patch)
        return decisions

    # -- reverted -----------------------------------------------------------------------------------
    def revert(self, state):
        names = self.params["pods"] if self.params["pods"] is not None else [pod["name"] for pod in state["pods"]]
        for pod in [self.raw[pod_name] for pod_name in names if pod_name in self.raw]:
            index, container = pods.engine_container(pod, self.params["container"])
            env, _unresolved = pods.resolve_env(pod, container)
            if NPU_ENV not in env or pods.is_ready(pod):
                continue
            if pods.controller(pod):
                self.actions.append({"pod": pods.name(pod), "action": "left", "reason": (
                    "owned by %s: remove %s from its pod template, or its engine will wait for a snapshot after its "
                    "warmup" % (pods.controller(pod), NPU_ENV))})
                self.module.warn("pod %s: %s" % (pods.name(pod), self.actions[-1]["reason"]))
                continue
            manifest = pods.recreation_manifest(pod, index, pods.with_env(container, NPU_ENV, None), {})
            self.note_diff(pod, {}, env_before="<npu path>", env_after=None)
            self.actions.append({"pod": pods.name(pod), "action": "recreated",
                                 "reason": "env %s removed: the pod never became Ready for its snapshot" % NPU_ENV})
            if not self.module.check_mode:
                self.recreate(pod, manifest)


def check_params(params):
    """The module's own options, before it connects: without a cluster, each error hid behind "cannot connect to the
    Kubernetes API"; and a wait of NaN seconds never ended, one with no sleep read the API back to back."""
    for name in ("namespace", "service"):
        problems = schema.errors("manifest", params[name], definition="name")
        if problems:
            raise ParameterError("%s: %s; give the name as Kubernetes has it (it is part of each pod's snapshot "
                                 "identity)" % (name, problems[0].partition(": ")[2]), field=name)
    timeout, sleep = params.get("wait_timeout"), params.get("wait_sleep")
    if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
        raise ParameterError("wait_timeout: must be 0 or more seconds (a finite number), got %s" % timeout,
                             field="wait_timeout")
    if sleep is not None and not (sleep > 0 and math.isfinite(sleep)):
        raise ParameterError("wait_sleep: must be a positive number of seconds, got %s" % sleep, field="wait_sleep")


def pods_logic(module):
    """The logic of the module k8s_snapshot_pods."""
    params = module.params
    check_params(params)
    client = connect(params)
    pod_list = service.list_pods(client, params)
    state = service.read_service(client, params, pod_list)
    changer = PodChanger(module, client, pod_list)
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
    done = [action for action in changer.actions if action["action"] != "left"]
    changed = bool(done)
    after = state["pods"] if module.check_mode or not changed else service.read_service(client, params)["pods"]
    msg = "%d pod(s) changed" % len(done) if changed else "nothing to change"
    return dict(changed=changed, actions=changer.actions, pods=after, diff=changer.diff, msg=msg, **result)


# -- k8s_snapshot_pods_info ------------------------------------------------------------------------------
def _arrived(pod, container_name, wait_for_state):
    ready = pods.is_ready(pod) if wait_for_state == "ready" else True
    return ready and pods.container_id(pod, container_name)[1] is not None


def _wait(client, params, result):
    """Wait until every awaited pod is there; fail at once when one stopped or its snapshot failed."""
    names = params["wait_pods"] if params["wait_pods"] is not None else [pod["name"] for pod in result["pods"]]
    last = {}

    def every_pod_there():
        missing = []
        for pod_name in names:
            pod = client.get_pod(params["namespace"], pod_name)
            if pod is None:
                last[pod_name] = {"phase": None, "exists": False}
                missing.append(pod_name)
                continue
            _index, container = pods.engine_container(pod, params["container"])
            last[pod_name] = pods.summary(pod, container.get("name"))
            if last[pod_name]["phase"] in ("Failed", "Succeeded"):
                raise SnapshotError("pod %s/%s stopped (phase %s) while waiting for it to be %s"
                                    % (params["namespace"], pod_name, last[pod_name]["phase"], params["wait_for"]),
                                    waited=last)
            ann = pods.annotations(pod)
            if ann.get(layout.K8S_STATUS) == pods.STATUS_FAILED:
                raise SnapshotError("pod %s/%s: snapshot status is failed: %s" % (
                    params["namespace"], pod_name, ann.get(layout.K8S_REASON)), waited=last)
            if not _arrived(pod, container.get("name"), params["wait_for"]):
                missing.append(pod_name)
        return not missing, missing

    try:
        _missing, elapsed = wait_for(every_pod_there, params["wait_timeout"], params["wait_sleep"],
                                     what="pods %s" % params["wait_for"])
    except SnapshotTimeout as exc:
        missing = exc.result.get("last_state") or []
        details = "; ".join("%s: %s" % (pod_name, ", ".join("%s=%s" % (key, value) for key, value in sorted(
            last.get(pod_name, {}).items()) if key != "state")) for pod_name in missing)
        raise SnapshotTimeout("timeout: pods not %s within %.0f s: %s" % (params["wait_for"], params["wait_timeout"],
                                                                          details),
                              waited=last, elapsed=exc.result.get("elapsed"), missing=missing)
    return last, round(elapsed, 3)


def info_logic(module):
    """The logic of the module k8s_snapshot_pods_info."""
    params = module.params
    check_params(params)
    client = connect(params)
    result = service.read_service(client, params)
    if params["wait_for"] != "none":
        try:
            waited, elapsed = _wait(client, params, result)
        except SnapshotError as exc:
            exc.result.update(result)
            raise
        # The pods as they are now that every one arrived: read before the wait, a pod recreated just before it
        # had no container yet, and the caller checked a runtime of None (seen on a loaded machine).
        result = dict(service.read_service(client, params), waited=waited, elapsed=elapsed)
    return dict(result, changed=False)


# -- k8s_snapshot_status -------------------------------------------------------------------------------
def _outcome_annotations(pod, params, ident):
    """The annotations ``params`` ask for on ``pod``: a generation status, or a restore outcome."""
    if params["status"] is not None:
        done = params["snapshots"].get(pods.name(pod)) or {}
        return pods.snapshot_state(params["status"], pods.node(pod), params["reason"], done.get("checksum"),
                                   done.get("total_bytes"), done.get("duration"))
    return pods.restore_outcome(params["restore"], params["reason"], ident, params["restore_from"],
                                params["checksum"], params["node"])


def _check_status_params(params, enabled):
    status, restore = params["status"], params["restore"]
    if (status == pods.STATUS_FAILED or restore in (pods.RESTORE_COLD, pods.RESTORE_FAILED)) and not params["reason"]:
        raise ParameterError("reason: required with %s; say why" % (
            "status=failed" if status else "restore=%s" % restore), field="reason")
    if status == pods.STATUS_COMPLETED:
        for pod_name in params["pods"]:
            done = params["snapshots"].get(pod_name)
            try:
                params["snapshots"][pod_name] = dict(
                    checksum=str(done["checksum"]),
                    total_bytes=None if done.get("total_bytes") is None else int(done["total_bytes"]),
                    duration=None if done.get("duration") is None else float(done["duration"]))
            except (AttributeError, KeyError, TypeError, ValueError):
                raise ParameterError("snapshots: give %s's snapshot as {checksum, total_bytes, duration} (what "
                                     "host_checkpoint returned) with status=completed, not %r" % (pod_name, done),
                                     field="snapshots")
    if params["restore_from"] and restore != pods.RESTORE_RESTORED:
        raise ParameterError("restore_from: only with restore=restored", field="restore_from")
    if status in (pods.STATUS_COMPLETED, pods.STATUS_FAILED) and params["record"] and not enabled:
        raise ParameterError("config: recording the generation needs the service's snapshotConfig (its paths are "
                             "in the record); give config, or record=false", field="config")


def status_logic(module):
    """The logic of the module k8s_snapshot_status: a generation status or a restore outcome, on pods and in the
    record."""
    params = module.params
    check_params(params)
    enabled, config, _why = service.normalize_config(params["config"])
    _check_status_params(params, enabled)
    client = connect(params)
    by_name = dict((pods.name(pod), pod) for pod in service.list_pods(client, params))
    missing = [pod_name for pod_name in params["pods"] if pod_name not in by_name]
    if missing:
        raise ParameterError("pods: %s not in service %s (namespace %s, label %s=%s)" % (
            ", ".join(missing), params["service"], params["namespace"], params["service_label"], params["service"]),
            missing=missing)
    patches, entries, diff = {}, {}, {"before": {}, "after": {}}
    for pod_name in params["pods"]:  # everything built and checked before the first write
        pod = by_name[pod_name]
        ident = service.identity(pod, params["service"], params["instance_label"])
        changes = pods.changes(pod, _outcome_annotations(pod, params, ident))
        if changes:
            patches[pod_name] = changes
            current = pods.annotations(pod)
            diff["before"]["pod " + pod_name] = dict((key, current.get(key)) for key in changes)
            diff["after"]["pod " + pod_name] = changes
        if params["status"] in (pods.STATUS_COMPLETED, pods.STATUS_FAILED) and params["record"]:
            info = service.describe(pod, params, config)
            done = params["snapshots"].get(pod_name) or {}
            entries[pod_name] = record.entry(
                ident, info["host_path"], params["status"], node=info["node"], npu_path=info["npu_path"],
                image=info["image"], checksum=done.get("checksum") if params["status"] == pods.STATUS_COMPLETED
                else None, total_bytes=done.get("total_bytes"), reason=params["reason"]
                if params["status"] == pods.STATUS_FAILED else None)
    if not module.check_mode:
        for pod_name, changes in patches.items():
            client.patch_pod(params["namespace"], pod_name, {"metadata": {"annotations": changes}})
    before, after = record.write(client, params["namespace"], params["service"], params["service_label"], entries,
                                 module.check_mode) if entries else ({}, {})
    for pod_name in after:
        diff["before"]["record " + pod_name], diff["after"]["record " + pod_name] = before.get(pod_name), after[pod_name]
    changed = bool(patches or after)
    msg = "%d pod(s) annotated, %d record entr%s written" % (len(patches), len(after), "y" if len(after) == 1 else "ies")
    return dict(changed=changed, annotated=sorted(patches), recorded=sorted(after), diff=diff,
                msg=msg if changed else "nothing to change")

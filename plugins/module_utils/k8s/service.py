# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How an inference service lives in Kubernetes, and what the modules read of it. PRIVATE to inferops.snapshot.

A service's pods carry the label ``inferops.org/service=<service>``; the label
``inferops.org/instance=<instance>`` says which instance (a P or D instance, a group of pods
serving together) each belongs to. A pod's identity is (namespace, service, instance, pod name),
and each of its snapshot paths is ``<root>/<namespace>/<service>/<instance>/<pod>``. The state of
the snapshot workflow lives in the pods' annotations (pods.py) and, so that it survives the pods, in
the service's record (record.py). Everything here is a pure function of the API's dicts, but
``read_service``, which reads them through the client.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout, schema, snapshot_config
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import metadata
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import pods, record
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s.pods import STATUS_COMPLETED

identity_string = layout.identity_string
snapshot_path = layout.snapshot_dir

# The options every k8s module takes besides kubernetes.core's connection options (doc fragment k8s_service).
SERVICE_ARGS = dict(
    namespace=dict(type="str", required=True),
    service=dict(type="str", required=True),
    config=dict(type="dict"),
    instance=dict(type="str"),
    container=dict(type="str"),
    service_label=dict(type="str", default=layout.K8S_SERVICE_LABEL),
    instance_label=dict(type="str", default=layout.K8S_INSTANCE_LABEL),
)
# Each module that takes it adds and documents it (host-only mode); params without it mean device snapshots on.
DEVICE_ARG = dict(type="bool", default=True)


def normalize_config(config):
    """(enabled, config with defaults or None, why disabled). No config or enabled=false means: change nothing."""
    normal = snapshot_config.normalize(config, "snapshotConfig")
    if not normal["configured"]:
        return False, None, snapshot_config.disabled_reason(normal)
    normal = dict((key, value) for key, value in normal.items() if key != "configured")
    return normal["enabled"], normal, snapshot_config.disabled_reason(dict(normal, configured=True))


def wants_npu_env(params):
    """Device snapshots on: the engine needs VLLM_NPU_SNAPSHOT_PATH. Host only: it must not have it (an engine with
    it locks itself after its warmup and waits for a resume that a host-only generation never sends)."""
    return params.get("device", True) is not False


# -- instances and identities -----------------------------------------------------------------------
def natural_key(name):
    """p2 sorts before p10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


def group_instances(pod_list, instance_label=layout.K8S_INSTANCE_LABEL):
    """{instance: [pods sorted by name]} in natural order, and the names of pods without the label."""
    instances, unlabelled = {}, []
    for pod in pod_list:
        instance = pods.labels(pod).get(instance_label)
        if not instance:
            unlabelled.append(pods.name(pod))
            continue
        instances.setdefault(instance, []).append(pod)
    ordered = {}
    for instance in sorted(instances, key=natural_key):
        ordered[instance] = sorted(instances[instance], key=lambda pod: natural_key(pods.name(pod)))
    return ordered, sorted(unlabelled, key=natural_key)


def select_instance(instances, wanted=None):
    """The instance to snapshot: ``wanted`` when given, else the first in natural order."""
    if wanted is not None:
        if wanted not in instances:
            raise ParameterError("instance: the service has no instance %r (it has: %s); label its pods with the "
                                 "instance label or choose another" % (wanted, ", ".join(instances) or "none"),
                                 instances=list(instances))
        return wanted
    return next(iter(instances), None)


def identity(pod, service, instance_label=layout.K8S_INSTANCE_LABEL):
    ident = {"namespace": pod["metadata"]["namespace"], "service": service,
             "instance": pods.labels(pod).get(instance_label), "pod": pods.name(pod)}
    schema.validate("manifest", ident, "identity of pod %s" % pods.name(pod), definition="identity")
    return ident


def env_template_hint(npu_root, ident):
    """The env entries a controller's pod template needs (the pod name comes from the downward API)."""
    path = os.path.join(npu_root, ident["namespace"], ident["service"], ident["instance"], "$(POD_NAME)")
    return ("env:\n- name: POD_NAME\n  valueFrom: {fieldRef: {fieldPath: metadata.name}}\n"
            "- name: %s\n  value: %s" % (layout.ENV_NPU_SNAPSHOT_PATH, path))


def restore_template_env(host_root, service, instance, source_instance=None, source_stem=None):
    """The env entries with which a pod template carries its own restore request (docs/fleet.md): the node's
    restore-on-create runtime then restores a recreated pod from ``<host_root>/<namespace>/<service>/<instance>/
    <pod>`` without any Ansible run -- or starts it normally when there is no valid snapshot there (first start,
    another node, another image). The kubelet expands ``$(VAR)`` from the entries before it.

    ``source_instance`` (with the source pods' name ``source_stem``, e.g. ``qwen-p0-``): a clone -- pod k of this
    instance restores from pod k of the source instance, k from the StatefulSet's pod-index label.
    """
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    root = host_root.rstrip("/")
    pod = "$(POD_NAME)"
    own = "$(POD_NAMESPACE)/%s/%s/$(POD_NAME)" % (service, instance)
    if source_instance:
        if not source_stem:
            raise ParameterError("source_stem: give the source pods' name without the ordinal (e.g. %s-%s-)"
                                 % (service, source_instance), field="source_stem")
        env.append({"name": "POD_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['%s']" % layout.K8S_POD_INDEX_LABEL}}})
        instance, pod = source_instance, source_stem + "$(POD_INDEX)"
    source = "$(POD_NAMESPACE)/%s/%s/%s" % (service, instance, pod)
    env.append({"name": layout.ENV_RESTORE_FROM, "value": "%s/%s" % (root, source)})
    env.append({"name": layout.ENV_RESTORE_IDENTITY, "value": own})
    if source_instance:
        env.append({"name": layout.ENV_RESTORE_SOURCE, "value": source})
    return env


# -- restore ----------------------------------------------------------------------------------------------
def decide(ident, entry, verification, host_root):
    """(restore_from or None, node or None, reason) for a recreated pod.

    Restore only from a snapshot that the record says was completed for exactly this identity, at
    the path this config gives it, and that verification on the node holding it found valid.
    """
    expected = snapshot_path(host_root, ident)
    if not entry:
        return None, None, "no snapshot recorded for %s: first start, normal start" % identity_string(ident)
    if entry.get(record.INVALID):
        return None, None, "the record's entry for %s is invalid (%s): normal start" % (
            identity_string(ident), entry[record.INVALID])
    if entry.get("identity") != ident:
        return None, None, "the recorded snapshot belongs to %s, not %s" % (
            identity_string(entry.get("identity") or {}), identity_string(ident))
    if entry.get("status") != STATUS_COMPLETED:
        return None, None, "the last snapshot generation for this pod %s%s" % (
            entry.get("status") or "has no status", (": " + entry["reason"]) if entry.get("reason") else "")
    if entry.get("host_path") != expected:
        return None, None, "the recorded snapshot is at %s, not at %s where snapshotConfig.hostSnapshotPath puts it" % (
            entry.get("host_path"), expected)
    if not entry.get("node"):
        return None, None, "the record does not say which node holds the snapshot"
    if verification is None:
        return None, None, "the snapshot on node %s was not verified" % entry["node"]
    if not verification.get("valid"):
        return None, None, "snapshot verification failed on node %s: %s" % (
            entry["node"], "; ".join(verification.get("reasons") or ["invalid"]))
    return expected, entry["node"], None


def restore_metadata(pod, container, restore_requested, snapshot_dir, reason=None):
    """The metadata a restored engine reads its new environment from (it keeps the old env).

    ``restore_requested`` says whether the pod was marked for restore-on-create; whether the runtime
    did restore it ends up in the annotation snapshot.inferops.org/restore."""
    env, unresolved = pods.resolve_env(pod, container)
    # Not restored yet: the node's runtime decides; the annotation snapshot.inferops.org/restore says what it did.
    return metadata.document(env, False, snapshot_dir, "k8s_snapshot_restore", reason, unresolved_env=unresolved,
                             pod=pods.name(pod), namespace=pod["metadata"]["namespace"], uid=pod["metadata"].get("uid"),
                             node=pods.node(pod), container=container.get("name"),
                             restore_requested=restore_requested)


# -- the service as the modules report it ----------------------------------------------------------
def describe(pod, params, config):
    """One pod as the roles need it (no env values: they may be secrets)."""
    _index, container = pods.engine_container(pod, params["container"])
    runtime, cid = pods.container_id(pod, container.get("name"))
    ann = pods.annotations(pod)
    ident = identity(pod, params["service"], params["instance_label"])
    info = {"name": pods.name(pod), "namespace": pod["metadata"]["namespace"], "uid": pod["metadata"].get("uid"),
            "node": pods.node(pod), "phase": (pod.get("status") or {}).get("phase"),
            "ready": pods.is_ready(pod), "gated": pods.gated(pod), "controller": pods.controller(pod),
            "container": container.get("name"), "container_id": cid, "container_runtime": runtime,
            "image": container.get("image"), "identity": ident, "npu_path": None, "host_path": None, "staging_path": None, "env_ok": None,
            "snapshot": {"status": ann.get(layout.K8S_STATUS), "reason": ann.get(layout.K8S_REASON),
                         "checksum": ann.get(layout.K8S_CHECKSUM)},
            "restore": {"status": ann.get(layout.K8S_RESTORE), "reason": ann.get(layout.K8S_RESTORE_REASON),
                        "from": ann.get(layout.ANNOTATION_RESTORE_FROM)}}
    if config is not None and config.get("enabled"):
        info["npu_path"] = snapshot_path(config["npuSnapshotPath"], ident)
        info["host_path"] = snapshot_path(config["hostSnapshotPath"], ident)
        info["staging_path"] = layout.staging_dir(info["host_path"])
        env, _unresolved = pods.resolve_env(pod, container)
        info["env_ok"] = (env.get(layout.ENV_NPU_SNAPSHOT_PATH) == info["npu_path"] if wants_npu_env(params)
                          else layout.ENV_NPU_SNAPSHOT_PATH not in env)
    return info


def requested(pod, params):
    """A running pod that carries its own restore request (its template's INFEROPS_RESTORE_FROM, docs/fleet.md, or
    the marker a release left) and whose outcome no annotation records yet: what the node's record must tell.
    None otherwise."""
    ann = pods.annotations(pod)
    if pods.gated(pod) or ann.get(layout.K8S_RESTORE) not in (None, pods.RESTORE_PENDING):
        return None
    _index, container = pods.engine_container(pod, params["container"])
    runtime, cid = pods.container_id(pod, container.get("name"))
    env, _unresolved = pods.resolve_env(pod, container)
    snapshot_dir = env.get(layout.ENV_RESTORE_FROM) or ann.get(layout.ANNOTATION_RESTORE_FROM)
    if not (cid and pods.node(pod) and snapshot_dir and snapshot_dir.startswith("/")):
        return None
    return {"name": pods.name(pod), "uid": pod["metadata"].get("uid"), "node": pods.node(pod), "container_id": cid,
            "container_runtime": runtime, "restore_from": snapshot_dir.rstrip("/"),
            "status_path": layout.status_path(snapshot_dir.rstrip("/")),
            "request_identity": env.get(layout.ENV_RESTORE_IDENTITY),
            "identity": identity(pod, params["service"], params["instance_label"])}


def list_pods(client, params):
    """The service's pods, as the API gives them (env values included: never put them in a result)."""
    return client.list_pods(params["namespace"], {params["service_label"]: params["service"]})


def read_service(client, params, pod_list=None):
    """Everything k8s_snapshot_pods_info returns about the service, read through ``client`` (the pods: once)."""
    enabled, config, why = normalize_config(params["config"])
    pod_list = list_pods(client, params) if pod_list is None else pod_list
    instances, unlabelled = group_instances(pod_list, params["instance_label"])
    instance = select_instance(instances, params["instance"])
    chosen = [describe(pod, params, config) for pod in instances.get(instance, [])]
    gated_pods = [describe(pod, params, config) for members in instances.values() for pod in members
                  if pods.gated(pod)]
    entries = record.parse(client.get_configmap(params["namespace"], record.name(params["service"])))
    candidates = []
    if enabled:
        for pod in gated_pods:
            entry = entries.get(pod["name"])
            if entry and entry.get("status") == STATUS_COMPLETED and entry.get("node"):
                candidates.append({"name": pod["name"], "node": entry["node"], "host_path": pod["host_path"],
                                   "identity": pod["identity"], "image": pod["image"]})
    waiting = [entry for entry in (requested(pod, params) for members in instances.values() for pod in members)
               if entry]
    completed = bool(chosen) and all(
        pod["snapshot"]["status"] == STATUS_COMPLETED and pod["env_ok"]
        and (entries.get(pod["name"]) or {}).get("status") == STATUS_COMPLETED
        and (entries.get(pod["name"]) or {}).get("checksum") == pod["snapshot"]["checksum"] for pod in chosen)
    return dict(enabled=enabled, disabled_reason=why, config=config,
                instances=[{"name": key, "pods": [pods.name(p) for p in value]} for key, value in instances.items()],
                unlabelled=unlabelled, instance=instance, pods=chosen, gated=gated_pods, record=entries,
                candidates=candidates, completed=completed, requested=waiting)

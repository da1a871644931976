# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How an inference service lives in Kubernetes, as pure functions on API dicts. PRIVATE.

A service's pods carry the label ``inferops.org/service=<service>``; the label
``inferops.org/instance=<instance>`` says which instance (a P or D instance, a group of pods
serving together) each belongs to. A pod's identity is (namespace, service, instance, pod name),
and each of its snapshot paths is ``<root>/<namespace>/<service>/<instance>/<pod>``. The state of
the snapshot workflow lives in the pod's annotations (``snapshot.inferops.org/*``) and, so that it
survives the pods, in the service's record ConfigMap ``inferops-snapshot-<service>``.

Nothing here talks to the API (see ``_k8s.py``) or to a node.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import json
import os
import re

from ansible_collections.inferops.snapshot.plugins.module_utils.core import config as core_config
from ansible_collections.inferops.snapshot.plugins.module_utils.core import layout, metadata, schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import ParameterError

SERVICE_LABEL = layout.K8S_SERVICE_LABEL
INSTANCE_LABEL = layout.K8S_INSTANCE_LABEL
HOSTNAME_LABEL = layout.K8S_HOSTNAME_LABEL
RESTORE_GATE = layout.K8S_RESTORE_GATE
A_ENABLED = layout.K8S_ENABLED
A_IDENTITY = layout.K8S_IDENTITY
A_NPU_PATH = layout.K8S_NPU_PATH
A_HOST_PATH = layout.K8S_HOST_PATH
A_TIMEOUT = layout.K8S_TIMEOUT
A_STATUS = layout.K8S_STATUS
A_REASON = layout.K8S_REASON
A_CHECKSUM = layout.K8S_CHECKSUM
A_NODE = layout.K8S_NODE
A_RESTORE = layout.K8S_RESTORE
A_RESTORE_REASON = layout.K8S_RESTORE_REASON
A_METADATA = layout.K8S_METADATA
RESTORE_FROM_ANNOTATION = layout.ANNOTATION_RESTORE_FROM
RESTORE_CHECKSUM_ANNOTATION = layout.ANNOTATION_RESTORE_CHECKSUM
RESTORE_FROM_ENV = layout.ENV_RESTORE_FROM
RESTORE_IDENTITY_ENV = layout.ENV_RESTORE_IDENTITY
# the request's device restore switch (host-only snapshots: the runtime must not look for a device part)
RESTORE_DEVICE_ANNOTATION, RESTORE_DEVICE_ENV = [(annotation, env) for key, annotation, env in layout.RESTORE_REQUEST_KEYS
                                                 if key == "device"][0]
NPU_PATH_ENV = layout.ENV_NPU_SNAPSHOT_PATH

STATUS_PENDING, STATUS_GENERATING, STATUS_COMPLETED, STATUS_FAILED = "pending", "generating", "completed", "failed"
RESTORE_PENDING, RESTORE_COLD, RESTORE_RESTORED = "pending", "cold", "restored"
# Server-set fields dropped when a pod is recreated from its own manifest.
_SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink",
                    "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences", "generateName")


# -- config -----------------------------------------------------------------------------------------
def normalize_config(config):
    """(enabled, config with defaults or None, why disabled). No config or enabled=false means: change nothing."""
    normal = core_config.normalize(config, "snapshotConfig")
    if not normal["configured"]:
        return False, None, core_config.disabled_reason(normal)
    normal = dict((key, value) for key, value in normal.items() if key != "configured")
    return normal["enabled"], normal, core_config.disabled_reason(dict(normal, configured=True))


def record_name(service):
    return layout.K8S_RECORD_PREFIX + service


# -- pods, instances, identities --------------------------------------------------------------------
def natural_key(name):
    """p2 sorts before p10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


def labels(pod):
    return pod.get("metadata", {}).get("labels") or {}


def annotations(pod):
    return pod.get("metadata", {}).get("annotations") or {}


def name(pod):
    return pod["metadata"]["name"]


def group_instances(pods, instance_label=INSTANCE_LABEL):
    """{instance: [pods sorted by name]} in natural order, and the names of pods without the label."""
    instances, unlabelled = {}, []
    for pod in pods:
        instance = labels(pod).get(instance_label)
        if not instance:
            unlabelled.append(name(pod))
            continue
        instances.setdefault(instance, []).append(pod)
    ordered = {}
    for instance in sorted(instances, key=natural_key):
        ordered[instance] = sorted(instances[instance], key=lambda pod: natural_key(name(pod)))
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


def identity(pod, service, instance_label=INSTANCE_LABEL):
    ident = {"namespace": pod["metadata"]["namespace"], "service": service,
             "instance": labels(pod).get(instance_label), "pod": name(pod)}
    schema.validate("manifest", ident, "identity of pod %s" % name(pod), definition="identity")
    return ident


identity_string = layout.identity_string
snapshot_path = layout.snapshot_dir


def engine_container(pod, wanted=None):
    """(index, container) of the inference engine: ``wanted`` by name, else the first container."""
    containers = pod.get("spec", {}).get("containers") or []
    if not containers:
        raise ParameterError("pod %s has no containers" % name(pod))
    if wanted is None:
        return 0, containers[0]
    for index, container in enumerate(containers):
        if container.get("name") == wanted:
            return index, container
    raise ParameterError("container: pod %s has no container named %r (it has: %s)"
                         % (name(pod), wanted, ", ".join(c.get("name", "?") for c in containers)))


def controller(pod):
    """'Kind/name' of the controller owning the pod, or None for a bare pod."""
    for owner in pod.get("metadata", {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return "%s/%s" % (owner.get("kind"), owner.get("name"))
    return None


def gated(pod, gate=RESTORE_GATE):
    return any(item.get("name") == gate for item in pod.get("spec", {}).get("schedulingGates") or [])


def is_ready(pod):
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def container_status(pod, container_name):
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container_name:
            return status
    return {}


def container_id(pod, container_name):
    """(runtime, id) from containerStatuses' ``<runtime>://<id>``, or (None, None) before it runs."""
    value = container_status(pod, container_name).get("containerID") or ""
    if "://" not in value:
        return None, None
    runtime, _sep, ident = value.partition("://")
    return runtime, ident


def summary(pod, container_name):
    """What a wait reports about a pod: enough to tell why it is not there yet."""
    status = pod.get("status") or {}
    cstatus = container_status(pod, container_name)
    return {"phase": status.get("phase"), "ready": is_ready(pod), "node": pod.get("spec", {}).get("nodeName"),
            "containerID": cstatus.get("containerID"), "state": cstatus.get("state"),
            "restartCount": cstatus.get("restartCount"), "gated": bool(pod.get("spec", {}).get("schedulingGates"))}


# -- environment ------------------------------------------------------------------------------------
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD_MAP = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def expand(value, defined):
    """Kubernetes' $(VAR) expansion: earlier variables are substituted, unknown ones kept, $$ escapes."""
    def substitute(match):
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))
    return _REFERENCE.sub(substitute, value)


def field_value(pod, path):
    """The value of a downward-API fieldRef for ``pod``, or None when it is not known (yet)."""
    metadata, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status") or {}
    simple = {"metadata.name": metadata.get("name"), "metadata.namespace": metadata.get("namespace"),
              "metadata.uid": metadata.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"), "status.podIP": status.get("podIP"),
              "status.hostIP": status.get("hostIP")}
    if path in simple:
        return simple[path]
    match = _FIELD_MAP.match(path)
    if match:
        return (metadata.get(match.group(1)) or {}).get(match.group(2))
    return None


def resolve_env(pod, container):
    """(name -> value, names not resolvable here) of a container's env, as the kubelet would set it.

    Literal values (with $(VAR) expansion) and downward-API fieldRefs are resolved; values from
    Secrets, ConfigMaps and resource fields are not read here and only their names are listed.
    """
    env, unresolved = {}, []
    for source in container.get("envFrom") or []:
        ref = source.get("secretRef") or source.get("configMapRef") or {}
        unresolved.append("envFrom:%s%s" % (source.get("prefix") or "", ref.get("name", "?")))
    for item in container.get("env") or []:
        key = item.get("name")
        if "valueFrom" in item:
            field = (item["valueFrom"] or {}).get("fieldRef")
            value = field_value(pod, field.get("fieldPath", "")) if field else None
            if value is None:
                env.pop(key, None)
                unresolved.append(key)
                continue
        else:
            value = expand(item.get("value") or "", env)
        env[key] = value
        if key in unresolved:
            unresolved.remove(key)
    return env, unresolved


def with_env(container, key, value):
    """A copy of ``container`` whose env sets ``key`` to ``value`` (None removes it)."""
    new = copy.deepcopy(container)
    env = [item for item in new.get("env") or [] if item.get("name") != key]
    if value is not None:
        env.append({"name": key, "value": value})
    new["env"] = env
    return new


def env_template_hint(npu_root, ident):
    """The env entries a controller's pod template needs (the pod name comes from the downward API)."""
    path = os.path.join(npu_root, ident["namespace"], ident["service"], ident["instance"], "$(POD_NAME)")
    return ("env:\n- name: POD_NAME\n  valueFrom: {fieldRef: {fieldPath: metadata.name}}\n"
            "- name: %s\n  value: %s" % (NPU_PATH_ENV, path))


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


# -- generation ---------------------------------------------------------------------------------------
def generation_annotations(ident, npu_path, host_path, config):
    return {A_ENABLED: "true", A_IDENTITY: identity_string(ident), A_NPU_PATH: npu_path, A_HOST_PATH: host_path,
            A_TIMEOUT: str(config["timeoutSeconds"])}


def annotation_changes(pod, wanted):
    """The subset of ``wanted`` annotations that differ on ``pod`` (None values: present ones to remove)."""
    current = annotations(pod)
    changes = {}
    for key, value in wanted.items():
        if value is None:
            if key in current:
                changes[key] = None
        elif current.get(key) != value:
            changes[key] = value
    return changes


def with_annotations(pod, changes):
    """A copy of ``pod`` with annotation ``changes`` applied as a merge patch would (None removes)."""
    new = copy.deepcopy(pod)
    merged = dict(annotations(pod))
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    new.setdefault("metadata", {})["annotations"] = merged
    return new


def recreation_manifest(pod, container_index, container, extra_annotations):
    """The pod as it would be created again: same name, labels and spec, server-set fields dropped,
    ``container`` in place of the engine container and ``extra_annotations`` merged."""
    new = {"apiVersion": "v1", "kind": "Pod", "metadata": copy.deepcopy(pod["metadata"]),
           "spec": copy.deepcopy(pod["spec"])}
    for key in _SERVER_METADATA:
        new["metadata"].pop(key, None)
    merged = dict(new["metadata"].get("annotations") or {})
    for key, value in extra_annotations.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    new["metadata"]["annotations"] = merged
    new["spec"]["containers"][container_index] = container
    if new["spec"].get("schedulingGates"):
        new["spec"].pop("nodeName", None)  # the API refuses a gated pod that names its node
    return new


# -- restore --------------------------------------------------------------------------------------------
def parse_record(configmap):
    """{pod name: entry} from the service's record ConfigMap (entries that do not parse are skipped)."""
    entries = {}
    for key, value in ((configmap or {}).get("data") or {}).items():
        try:
            entry = json.loads(value)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries[key] = entry
    return entries


def decide(ident, entry, verification, host_root):
    """(restore_from or None, node or None, reason) for a recreated pod.

    Restore only from a snapshot that the record says was completed for exactly this identity, at
    the path this config gives it, and that verification on the node holding it found valid.
    """
    expected = snapshot_path(host_root, ident)
    if not entry:
        return None, None, "no snapshot recorded for %s: first start, normal start" % identity_string(ident)
    if entry.get("identity") != ident:
        return None, None, "the recorded snapshot belongs to %s, not %s" % (
            identity_string(entry.get("identity") or {"namespace": "?", "service": "?", "instance": "?", "pod": "?"}),
            identity_string(ident))
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
    env, unresolved = resolve_env(pod, container)
    # Not restored yet: the node's runtime decides; the annotation snapshot.inferops.org/restore says what it did.
    return metadata.document(env, False, snapshot_dir, "k8s_snapshot_restore", reason, unresolved_env=unresolved,
                             pod=name(pod), namespace=pod["metadata"]["namespace"], uid=pod["metadata"].get("uid"),
                             node=pod.get("spec", {}).get("nodeName"), container=container.get("name"),
                             restore_requested=restore_requested)


# -- the service as the modules report it ----------------------------------------------------------
SERVICE_ARGS = dict(
    namespace=dict(type="str", required=True),
    service=dict(type="str", required=True),
    config=dict(type="dict"),
    instance=dict(type="str"),
    container=dict(type="str"),
    service_label=dict(type="str", default=SERVICE_LABEL),
    instance_label=dict(type="str", default=INSTANCE_LABEL),
)
# Each module that takes it adds and documents it (host-only mode); params without it mean device snapshots on.
DEVICE_ARG = dict(type="bool", default=True)


def wants_npu_env(params):
    """Device snapshots on: the engine needs VLLM_NPU_SNAPSHOT_PATH. Host only: it must not have it (an engine with
    it locks itself after its warmup and waits for a resume that a host-only generation never sends)."""
    return params.get("device", True) is not False


def describe(pod, params, config):
    """One pod as the roles need it (no env values: they may be secrets)."""
    _index, container = engine_container(pod, params["container"])
    runtime, cid = container_id(pod, container.get("name"))
    ann = annotations(pod)
    ident = identity(pod, params["service"], params["instance_label"])
    info = {"name": name(pod), "namespace": pod["metadata"]["namespace"], "uid": pod["metadata"].get("uid"),
            "node": pod.get("spec", {}).get("nodeName"), "phase": (pod.get("status") or {}).get("phase"),
            "ready": is_ready(pod), "gated": gated(pod), "controller": controller(pod),
            "container": container.get("name"), "container_id": cid, "container_runtime": runtime,
            "image": container.get("image"), "identity": ident, "npu_path": None, "host_path": None, "env_ok": None,
            "snapshot": {"status": ann.get(A_STATUS), "reason": ann.get(A_REASON),
                         "checksum": ann.get(A_CHECKSUM)},
            "restore": {"status": ann.get(A_RESTORE), "reason": ann.get(A_RESTORE_REASON),
                        "from": ann.get(RESTORE_FROM_ANNOTATION)}}
    if config is not None and config.get("enabled"):
        info["npu_path"] = snapshot_path(config["npuSnapshotPath"], ident)
        info["host_path"] = snapshot_path(config["hostSnapshotPath"], ident)
        env, _unresolved = resolve_env(pod, container)
        info["env_ok"] = (env.get(NPU_PATH_ENV) == info["npu_path"] if wants_npu_env(params)
                          else NPU_PATH_ENV not in env)
    return info


def requested(pod, params):
    """A running pod that carries its own restore request (its template's INFEROPS_RESTORE_FROM, docs/fleet.md, or
    the marker a release left) and whose outcome no annotation records yet: what the node's record must tell.
    None otherwise."""
    ann = annotations(pod)
    if gated(pod) or ann.get(A_RESTORE) not in (None, RESTORE_PENDING):
        return None
    _index, container = engine_container(pod, params["container"])
    runtime, cid = container_id(pod, container.get("name"))
    node = pod.get("spec", {}).get("nodeName")
    env, _unresolved = resolve_env(pod, container)
    snapshot_dir = env.get(RESTORE_FROM_ENV) or ann.get(RESTORE_FROM_ANNOTATION)
    if not (cid and node and snapshot_dir and snapshot_dir.startswith("/")):
        return None
    return {"name": name(pod), "uid": pod["metadata"].get("uid"), "node": node, "container_id": cid,
            "container_runtime": runtime, "restore_from": snapshot_dir.rstrip("/"),
            "status_path": layout.status_path(snapshot_dir.rstrip("/")),
            "request_identity": env.get(RESTORE_IDENTITY_ENV),
            "identity": identity(pod, params["service"], params["instance_label"])}


def read_service(client, params):
    """Everything k8s_snapshot_pods_info returns about the service, read through ``client``."""
    enabled, config, why = normalize_config(params["config"])
    pods = client.list_pods(params["namespace"], {params["service_label"]: params["service"]})
    instances, unlabelled = group_instances(pods, params["instance_label"])
    instance = select_instance(instances, params["instance"])
    chosen = [describe(pod, params, config) for pod in instances.get(instance, [])]
    gated_pods = [describe(pod, params, config) for members in instances.values() for pod in members if gated(pod)]
    record = parse_record(client.get_configmap(params["namespace"], record_name(params["service"])))
    candidates = []
    if enabled:
        for pod in gated_pods:
            entry = record.get(pod["name"])
            if entry and entry.get("status") == STATUS_COMPLETED and entry.get("node"):
                candidates.append({"name": pod["name"], "node": entry["node"], "host_path": pod["host_path"],
                                   "identity": pod["identity"], "image": pod["image"]})
    waiting = [entry for entry in (requested(pod, params) for members in instances.values() for pod in members) if entry]
    completed = bool(chosen) and all(
        pod["snapshot"]["status"] == STATUS_COMPLETED and pod["env_ok"]
        and (record.get(pod["name"]) or {}).get("status") == STATUS_COMPLETED
        and (record.get(pod["name"]) or {}).get("checksum") == pod["snapshot"]["checksum"] for pod in chosen)
    return dict(enabled=enabled, disabled_reason=why, config=config,
                instances=[{"name": key, "pods": [name(p) for p in value]} for key, value in instances.items()],
                unlabelled=unlabelled, instance=instance, pods=chosen, gated=gated_pods, record=record,
                candidates=candidates, completed=completed, requested=waiting)

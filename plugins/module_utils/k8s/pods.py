# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One pod as the API gives it, and the annotations the collection keeps on it. PRIVATE to inferops.snapshot.

Pure functions on the API's dicts: the pod's parts (engine container, controller, readiness, container id),
its environment as the kubelet resolves it, the manifest it is created again from -- and the one writer of
the collection's annotations (``snapshot.inferops.org/*`` and the restore-on-create request
``org.inferops.restore-*``): every change a module makes is built here, as a merge patch's
``metadata.annotations`` (None removes a key), and checked against schemas/k8s-annotations.schema.json
before it is sent. Their names live in core/base/layout.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import re
import time

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout, schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError

# The request's device restore switch (host-only snapshots: the runtime must not look for a device part).
RESTORE_DEVICE_ANNOTATION = [annotation for key, annotation, _env in layout.RESTORE_REQUEST_KEYS if key == "device"][0]
STATUS_PENDING, STATUS_GENERATING, STATUS_COMPLETED, STATUS_FAILED = "pending", "generating", "completed", "failed"
RESTORE_PENDING, RESTORE_COLD, RESTORE_RESTORED, RESTORE_FAILED = "pending", "cold", "restored", "failed"
# Server-set fields dropped when a pod is created again from its own manifest.
_SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink",
                    "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences", "generateName")


# -- the pod's parts --------------------------------------------------------------------------------
def labels(pod):
    return pod.get("metadata", {}).get("labels") or {}


def annotations(pod):
    return pod.get("metadata", {}).get("annotations") or {}


def name(pod):
    return pod["metadata"]["name"]


def node(pod):
    return pod.get("spec", {}).get("nodeName")


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


def gated(pod, gate=layout.K8S_RESTORE_GATE):
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
    return {"phase": status.get("phase"), "ready": is_ready(pod), "node": node(pod),
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


# -- the annotations: one writer ------------------------------------------------------------------------
def merged(current, changes):
    """``current`` annotations with ``changes`` applied as a merge patch applies them (None removes a key)."""
    result = dict(current or {})
    for key, value in changes.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


def changes(pod, wanted):
    """The subset of ``wanted`` annotations that differ on ``pod`` (None values: present ones to remove), checked
    against the schema; with something to change, stamped with the time (an unchanged pod is left unchanged)."""
    current = annotations(pod)
    found = dict((key, value) for key, value in wanted.items()
                 if (key in current if value is None else current.get(key) != value))
    if found:
        found[layout.K8S_UPDATED_AT] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    schema.validate("k8s-annotations", found, "the annotation change of pod %s" % name(pod))
    return found


def with_annotations(pod, changes_):
    """A copy of ``pod`` with annotation ``changes_`` applied."""
    new = copy.deepcopy(pod)
    new.setdefault("metadata", {})["annotations"] = merged(annotations(pod), changes_)
    return new


def generation(ident, npu_path, host_path, config):
    """What a pod of the instance being snapshotted carries: where its snapshots go, for how long."""
    return {layout.K8S_ENABLED: "true", layout.K8S_IDENTITY: layout.identity_string(ident),
            layout.K8S_NPU_PATH: npu_path, layout.K8S_HOST_PATH: host_path,
            layout.K8S_TIMEOUT: str(config["timeoutSeconds"])}


def snapshot_state(status, node_=None, reason=None, checksum=None, total_bytes=None, duration=None):
    """The generation's state: pending (prepared), generating (on ``node_``), completed (with the snapshot's
    checksum, size and time) or failed (with the reason); a state carries nothing of an earlier one."""
    if status == STATUS_GENERATING:
        return {layout.K8S_STATUS: status, layout.K8S_NODE: node_}
    if status == STATUS_COMPLETED:
        state = {layout.K8S_STATUS: status, layout.K8S_REASON: None, layout.K8S_CHECKSUM: checksum,
                 layout.K8S_NODE: node_}
        if total_bytes is not None:  # size and time: known only to the run that took the snapshot
            state[layout.K8S_TOTAL_BYTES] = str(int(total_bytes))
        if duration is not None:
            state[layout.K8S_DURATION] = str(round(float(duration), 3))
        return state
    if status == STATUS_FAILED:
        return {layout.K8S_STATUS: status, layout.K8S_REASON: reason, layout.K8S_CHECKSUM: None}
    return {layout.K8S_STATUS: STATUS_PENDING, layout.K8S_REASON: None, layout.K8S_CHECKSUM: None}


def restore_request(snapshot_dir, checksum, device):
    """The restore-on-create runtime's request (``snapshot_dir`` None: no restore, a normal start)."""
    return {layout.ANNOTATION_RESTORE_FROM: snapshot_dir,
            # the fingerprint the generation recorded: the node's runtime restores only that snapshot
            layout.ANNOTATION_RESTORE_CHECKSUM: checksum if snapshot_dir else None,
            # host-only snapshots: the node's runtime restores no device state
            RESTORE_DEVICE_ANNOTATION: "false" if snapshot_dir and not device else None}


def restore_outcome(outcome, reason=None, ident=None, snapshot_dir=None, checksum=None, node_=None):
    """What became of a pod's restore. ``restored`` from a snapshot named here (``snapshot_dir``, its checksum and
    node): the pod runs from that completed snapshot of its identity and carries its state, so that the generation
    finds the instance completed. ``cold``: it runs a new engine and has no snapshot state (the next generation
    takes one), nor a request that a restart of its container would follow."""
    wanted = {layout.K8S_RESTORE: outcome, layout.K8S_RESTORE_REASON: reason}
    if outcome == RESTORE_RESTORED and snapshot_dir:
        wanted.update({layout.K8S_ENABLED: "true", layout.K8S_IDENTITY: layout.identity_string(ident),
                       layout.K8S_HOST_PATH: snapshot_dir})
        wanted.update(snapshot_state(STATUS_COMPLETED, node_, checksum=checksum))
    elif outcome == RESTORE_COLD:
        wanted.update({layout.ANNOTATION_RESTORE_FROM: None, layout.K8S_STATUS: None, layout.K8S_CHECKSUM: None,
                       layout.K8S_NODE: None})
    return wanted


# -- a pod created again -----------------------------------------------------------------------------------
def recreation_manifest(pod, container_index, container, extra_annotations):
    """The pod as it would be created again: same name, labels and spec, server-set fields dropped,
    ``container`` in place of the engine container and ``extra_annotations`` merged."""
    new = {"apiVersion": "v1", "kind": "Pod", "metadata": copy.deepcopy(pod["metadata"]),
           "spec": copy.deepcopy(pod["spec"])}
    for key in _SERVER_METADATA:
        new["metadata"].pop(key, None)
    new["metadata"]["annotations"] = merged(new["metadata"].get("annotations"), extra_annotations)
    new["spec"]["containers"][container_index] = container
    if new["spec"].get("schedulingGates"):
        new["spec"].pop("nodeName", None)  # the API refuses a gated pod that names its node
    return new

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side filters of the snapshot roles: validate a snapshotConfig, plan an instance's pods, the
names of core/base/layout.py for the roles' tasks and templates, and the admission policy the Kubernetes role applies.

The first two run on the controller before anything touches a host, so a bad config or a bad inventory is
rejected with the field that is wrong and how to fix it. Docs: snapshot_config.yml, snapshot_plan.yml, layout.yml,
admission_policy.yml.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import posixpath
import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout, snapshot_config
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import admission

NPU_ENV = layout.ENV_NPU_SNAPSHOT_PATH
POD_KEYS = ("name", "container", "host", "readiness_url", "readiness_file", "env")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")


def _plain(value):
    """Ansible hands filters its own mapping/sequence/str types; work on plain Python ones."""
    if isinstance(value, dict):
        return dict((to_native(k), _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return to_native(value)
    return value


def normalize_config(config):
    """The validated snapshotConfig with the schema's defaults filled in (core/base/snapshot_config.py)."""
    return snapshot_config.normalize(_plain(config))


def _name(value, field):
    if isinstance(value, bool):
        raise ParameterError("%s: got the boolean %s; quote the name (YAML reads a bare yes/no/on/off as a boolean)"
                             % (field, str(value).lower()))
    if not isinstance(value, str) or not _NAME.match(value):
        raise ParameterError("%s: %r is not a valid name: use letters, digits, '.', '_' and '-' (it becomes a "
                             "directory of the snapshot path), starting and ending with a letter or digit"
                             % (field, value))
    return value


def _service(service):
    if not isinstance(service, dict) or service.get("name") in (None, ""):
        raise ParameterError("snapshot_service: give at least the service's name, e.g. "
                             "{namespace: default, name: qwen}")
    unknown = sorted(set(service) - {"namespace", "name"})
    if unknown:
        raise ParameterError("snapshot_service: unknown key(s) %s; only namespace and name are allowed"
                             % ", ".join(unknown))
    return (_name(service.get("namespace") or "default", "snapshot_service.namespace"),
            _name(service["name"], "snapshot_service.name"))


def _pod(pod, field):
    if not isinstance(pod, dict) or "name" not in pod:
        raise ParameterError("%s: each pod needs at least a name" % field)
    unknown = sorted(set(pod) - set(POD_KEYS))
    if unknown:
        raise ParameterError("%s: unknown key(s) %s; allowed: %s" % (field, ", ".join(unknown), ", ".join(POD_KEYS)))
    _name(pod["name"], field + ".name")
    if pod.get("readiness_url") and not re.match(r"^https?://", pod["readiness_url"]):
        raise ParameterError("%s.readiness_url: %r is not an http(s) URL" % (field, pod["readiness_url"]))
    if pod.get("readiness_file") and not posixpath.isabs(pod["readiness_file"]):
        raise ParameterError("%s.readiness_file: %r must be an absolute path inside the container"
                             % (field, pod["readiness_file"]))
    if pod.get("env") is not None and not isinstance(pod["env"], dict):
        raise ParameterError("%s.env: expected a mapping of variable names to values" % field)
    return pod


def plan(instances, config, service, instance=None, host=None, all_instances=False):
    """Which pods of which instance this host acts on, and where each pod's snapshot lives.

    ``instances`` is the inventory's list of ``{name, pods: [...]}``. The instance is the one named
    ``instance``, or the first one. A pod with a ``host`` belongs to that inventory host only; a pod
    without one belongs to every host the play runs on. Each pod gets its own paths, which contain its
    identity (namespace/service/instance/pod), and the environment to inject for an engine that takes
    the device snapshot itself (VLLM_NPU_SNAPSHOT_PATH).
    """
    if isinstance(config, dict) and "configured" in config:  # already normalized: validate it again anyway
        config = dict((k, v) for k, v in config.items() if k != "configured")
    config = normalize_config(config)
    namespace, service_name = _service(_plain(service))
    instances = _plain(instances)
    if not isinstance(instances, list) or not instances:
        raise ParameterError("snapshot_instances: give the service's instances as a list of {name, pods}")
    seen_instances = set()
    checked = []
    for index, item in enumerate(instances):
        field = "snapshot_instances[%d]" % index
        if not isinstance(item, dict) or "name" not in item:
            raise ParameterError("%s: each instance needs a name and its pods" % field)
        unknown = sorted(set(item) - {"name", "pods"})
        if unknown:
            raise ParameterError("%s: unknown key(s) %s; allowed: name, pods" % (field, ", ".join(unknown)))
        _name(item["name"], field + ".name")
        if item["name"] in seen_instances:
            raise ParameterError("%s.name: instance %r is listed twice" % (field, item["name"]))
        seen_instances.add(item["name"])
        pods = item.get("pods") or []
        if not isinstance(pods, list) or not pods:
            raise ParameterError("%s.pods: instance %r has no pods" % (field, item["name"]))
        names = set()
        clean = []
        for pindex, pod in enumerate(pods):
            pod = _pod(pod, "%s.pods[%d]" % (field, pindex))
            if pod["name"] in names:
                raise ParameterError("%s.pods[%d].name: pod %r appears twice in instance %r; every pod needs its "
                                     "own name, it is part of its snapshot path" % (field, pindex, pod["name"],
                                                                                    item["name"]))
            names.add(pod["name"])
            clean.append(pod)
        checked.append({"name": item["name"], "pods": clean})

    if instance:
        chosen = [item for item in checked if item["name"] == instance]
        if not chosen:
            raise ParameterError("instance_name: no instance named %r in snapshot_instances (have: %s)"
                                 % (instance, ", ".join(item["name"] for item in checked)))
    else:
        chosen = checked if all_instances else checked[:1]

    pods = []
    positions = dict((item["name"], index) for index, item in enumerate(checked))
    for item in chosen:
        for pod_index, pod in enumerate(item["pods"]):
            if host is not None and pod.get("host") not in (None, "", host):
                continue
            identity = {"namespace": namespace, "service": service_name, "instance": item["name"],
                        "pod": pod["name"]}
            entry = {
                "name": pod["name"],
                "instance": item["name"],
                "container": pod.get("container") or pod["name"],
                "host": pod.get("host") or None,
                "identity": identity,
                "readiness_url": pod.get("readiness_url") or None,
                "readiness_file": pod.get("readiness_file") or None,
                # Names only: values may be secrets and plans are shown at -v. The restore reads the values
                # from snapshot_instances[index[0]].pods[index[1]].env.
                "env_keys": sorted(pod.get("env") or {}),
                "index": [positions[item["name"]], pod_index],
                "snapshot_dir": None,
                "npu_dir": None,
                "inject_env": {},
            }
            if config.get("enabled"):
                relative = posixpath.join(namespace, service_name, item["name"], pod["name"])
                entry["snapshot_dir"] = posixpath.join(config["hostSnapshotPath"], relative)
                entry["npu_dir"] = posixpath.join(config["npuSnapshotPath"], relative)
                entry["inject_env"] = {NPU_ENV: entry["npu_dir"]}
            pods.append(entry)
    return {
        "enabled": bool(config.get("enabled")),
        "configured": bool(config.get("configured")),
        "instance": chosen[0]["name"] if len(chosen) == 1 else None,
        "instances": [item["name"] for item in chosen],
        "service": {"namespace": namespace, "name": service_name},
        "pods": pods,
        "timeout": config.get("timeoutSeconds"),
        "min_size": config.get("minSizeBytes"),
    }


def _filter(function):
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ParameterError as exc:
            raise AnsibleFilterError(exc.msg)
    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    return wrapper


def snapshot_plan(instances, config, service, instance_name=None, host=None, all_instances=False):
    return plan(instances, config, service, instance=instance_name or None, host=host, all_instances=all_instances)


def layout_value(name):
    """The value of a name of core/base/layout.py, the one home of the names the collection's programs share: roles
    take them from here instead of spelling them."""
    name = _plain(name)
    if not isinstance(name, str) or not name.isupper() or not hasattr(layout, name) \
            or not isinstance(getattr(layout, name), (str, int, float, tuple, list, dict)):
        raise ParameterError("the layout filter: %r is no name of core/base/layout.py (its names are upper case, such as "
                             "MANIFEST or ENV_RESTORE_FROM)" % (name,))
    value = getattr(layout, name)
    return list(value) if isinstance(value, tuple) else value


def admission_policy(namespaces, runtime_classes):
    """The ValidatingAdmissionPolicy and its binding (module_utils/k8s/admission.py) for these namespaces."""
    return admission.objects(_plain(namespaces), _plain(runtime_classes))


class FilterModule(object):
    def filters(self):
        return {
            "snapshot_config": _filter(normalize_config),
            "snapshot_plan": _filter(snapshot_plan),
            "layout": _filter(layout_value),
            "admission_policy": _filter(admission_policy),
        }

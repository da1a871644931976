# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gated_pods: an ansible-rulebook event source for pods held by the snapshot-restore scheduling gate.

Where a pod must wait for a decision before it is scheduled (node-local snapshots: the restore role pins
the pod to the node that holds its snapshot), the restore role must run within seconds of the pod's
creation, and a pod must never stay gated because nothing ran. This source polls the pods of one
namespace (every ``interval`` seconds, one list call) and puts

- ``{"inferops_gated_pod": {namespace, name, uid, service, instance, gated_for}}`` once per pod
  incarnation (uid) that carries the gate: the rulebook runs ``inferops.snapshot.k8s_restore`` for its
  service (extensions/eda/rulebooks/restore_gated_pods.yml);
- ``{"inferops_gate_released": {..., "reason": ...}}`` when a pod is still gated ``release_after`` seconds
  after its creation: the source removes the gate itself (a merge patch with the pod's uid as the
  precondition), so the pod starts -- normally, or restored by the node's runtime when its template
  carries its own restore request (docs/fleet.md). Fail open: a broken rulebook, a failing playbook, a
  stopped controller cost a pod at most ``release_after`` seconds, never its start;
- ``{"inferops_unannotated_pod": {...}}`` once per pod incarnation that runs on its own restore request (the
  template's ``INFEROPS_RESTORE_FROM``: the node's runtime restored it, or started it cold, with no job in
  the way) and whose annotations do not say yet what happened (no ``snapshot.inferops.org/restore``): the
  rulebook runs ``inferops.snapshot.k8s_restore``, whose catch-up reads the node's record of that container
  and annotates the pod -- seconds after it started, off its critical path (``catch_up: false`` turns it off).

Arguments:
  namespace:      the namespace to watch (required)
  service:        only pods with the service label of this value (default: every pod with the gate)
  gate:           the scheduling gate (default inferops.org/snapshot-restore)
  service_label:  default inferops.org/service; instance_label: default inferops.org/instance
  interval:       seconds between polls (default 1)
  release_after:  seconds after which a pod still gated is released (default 60; 0: never)
  catch_up:       also report running pods whose restore is not annotated yet (default true)
  kubeconfig, context: as kubernetes.core (else K8S_AUTH_KUBECONFIG, ~/.kube/config, in-cluster)
  host, api_key, validate_certs, ca_cert: a direct connection instead

Examples:
  sources:
    - inferops.snapshot.gated_pods:
        namespace: inference
        service: qwen
        release_after: 60

Needs the ``kubernetes`` Python package (the collection's requirements/runtime.txt). RBAC: list and
patch on pods in the namespace (docs/kubernetes.md's Role has both).
"""

import asyncio
import datetime
import json
import os
import time

try:  # the collection's one home of these names, when the collection is importable
    from ansible_collections.inferops.snapshot.plugins.module_utils.core import layout as _layout
    GATE, SERVICE_LABEL, INSTANCE_LABEL = _layout.K8S_RESTORE_GATE, _layout.K8S_SERVICE_LABEL, _layout.K8S_INSTANCE_LABEL
    RESTORE_ANNOTATION, RESTORE_ENV = _layout.K8S_RESTORE, _layout.ENV_RESTORE_FROM
    from ansible_collections.inferops.snapshot.plugins.module_utils._k8s_service import requested as _requested
except ImportError:  # ansible-rulebook loads a source by its path: the same values as core/layout.py
    GATE, SERVICE_LABEL, INSTANCE_LABEL = ("inferops.org/snapshot-restore", "inferops.org/service",
                                           "inferops.org/instance")
    RESTORE_ANNOTATION, RESTORE_ENV = "snapshot.inferops.org/restore", "INFEROPS_RESTORE_FROM"
    _requested = None

MERGE = "application/merge-patch+json"
ARGUMENTS = ("namespace", "service", "gate", "service_label", "instance_label", "interval", "release_after",
             "catch_up", "kubeconfig", "context", "host", "api_key", "validate_certs", "ca_cert")


class ArgumentError(ValueError):
    pass


def check_args(args):
    """The arguments with their defaults; ArgumentError naming the field before anything is contacted."""
    args = dict(args or {})
    if not args.get("namespace"):
        raise ArgumentError("namespace: give the namespace whose gated pods to watch")
    unknown = sorted(set(args) - set(ARGUMENTS))
    if unknown:
        raise ArgumentError("unknown argument(s) %s; known: %s" % (", ".join(unknown), ", ".join(ARGUMENTS)))
    for name, default, low in (("interval", 1.0, 0.05), ("release_after", 60.0, 0.0)):
        try:
            args[name] = float(args.get(name, default))
        except (TypeError, ValueError):
            raise ArgumentError("%s: %r is not a number of seconds" % (name, args.get(name)))
        if args[name] < low:
            raise ArgumentError("%s: must be at least %s seconds" % (name, low))
    catch_up = args.get("catch_up", True)
    if not isinstance(catch_up, bool):
        if str(catch_up).lower() not in ("true", "false", "yes", "no"):
            raise ArgumentError("catch_up: %r is not a boolean" % (catch_up,))
        catch_up = str(catch_up).lower() in ("true", "yes")
    args["catch_up"] = catch_up
    args.setdefault("gate", GATE)
    args.setdefault("service_label", SERVICE_LABEL)
    args.setdefault("instance_label", INSTANCE_LABEL)
    return args


def api_client(args):
    import kubernetes  # here, so that the argument check needs nothing installed
    if args.get("host"):
        configuration = kubernetes.client.Configuration()
        configuration.host = args["host"]
        if args.get("api_key"):
            configuration.api_key = {"authorization": "Bearer " + args["api_key"]}
        configuration.verify_ssl = bool(args.get("validate_certs", True))
        if args.get("ca_cert"):
            configuration.ssl_ca_cert = args["ca_cert"]
        return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
    path = args.get("kubeconfig") or os.environ.get("K8S_AUTH_KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if os.path.exists(path):
        return kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(path, context=args.get("context")))
    kubernetes.config.load_incluster_config()
    return kubernetes.client.CoreV1Api()


def _created(pod):
    text = (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def gated(pod, gate):
    return any(item.get("name") == gate for item in (pod.get("spec") or {}).get("schedulingGates") or [])


def describe(pod, args, now):
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    created = _created(pod)
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "service": labels.get(args["service_label"]), "instance": labels.get(args["instance_label"]),
            "gated_for": round(now - created, 1) if created is not None else None}


def unannotated(pod, args):
    """The pod runs on its own restore request and its annotations do not say yet what the node did: the
    restore role's catch-up has something to annotate (its own test, _k8s_service.requested, when the collection
    is importable; the same test on the env's literal value or the annotation it reads otherwise)."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    if status.get("phase") != "Running" or gated(pod, args["gate"]):
        return False
    if _requested is not None:
        try:
            return _requested(pod, {"container": None, "service": (meta.get("labels") or {}).get(args["service_label"]),
                                    "instance_label": args["instance_label"]}) is not None
        except Exception:  # pylint: disable=broad-except  # a pod the role cannot read: not one it would annotate
            return False
    annotations = meta.get("annotations") or {}
    if annotations.get(RESTORE_ANNOTATION) not in (None, "pending"):
        return False
    started = [c for c in status.get("containerStatuses") or [] if "://" in (c.get("containerID") or "")]
    if not started or not (pod.get("spec") or {}).get("nodeName"):
        return False  # no container yet: the node has nothing to tell
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    for item in containers[0].get("env") or []:
        if item.get("name") != RESTORE_ENV:
            continue
        value = item.get("value")
        path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") or ""
        if path.startswith("metadata.annotations['") and path.endswith("']"):
            value = annotations.get(path[len("metadata.annotations['"):-2])
        return bool(value and value.startswith("/"))
    return False


def list_pods(core, args):
    """(gated pods, pods to catch up) of the namespace (and service), from one list call."""
    selector = "%s=%s" % (args["service_label"], args["service"]) if args.get("service") else None
    response = core.list_namespaced_pod(args["namespace"], label_selector=selector, _preload_content=False)
    pods = json.loads(response.data).get("items") or []
    return [pod for pod in pods if gated(pod, args["gate"])], [pod for pod in pods if args["catch_up"] and unannotated(pod, args)]


def release(core, pod, gate):
    """Remove ``gate`` from this very pod (its uid is the precondition: a recreated pod is not touched)."""
    meta = pod["metadata"]
    gates = [item for item in pod["spec"].get("schedulingGates") or [] if item.get("name") != gate]
    core.patch_namespaced_pod(meta["name"], meta["namespace"],
                              {"metadata": {"uid": meta["uid"]}, "spec": {"schedulingGates": gates or None}},
                              _content_type=MERGE, _preload_content=False)


async def main(queue, args):
    """ansible-rulebook's entry point: poll, put events, release pods past their deadline; runs until cancelled."""
    args = check_args(args)
    loop = asyncio.get_running_loop()
    core = await loop.run_in_executor(None, api_client, args)
    seen, released, caught = set(), set(), set()
    while True:
        try:
            pods, behind = await loop.run_in_executor(None, list_pods, core, args)
        except Exception as exc:  # the API is away for a moment: say so, go on polling
            await queue.put({"inferops_gated_pods_error": {"namespace": args["namespace"], "error": str(exc)[:500]}})
            pods, behind = [], []
        now = time.time()
        running = set()
        for pod in behind:
            info = describe(pod, args, now)
            info["age"] = info.pop("gated_for")  # since its creation
            running.add(info["uid"])
            if info["uid"] not in caught:
                caught.add(info["uid"])
                await queue.put({"inferops_unannotated_pod": info})
        caught &= running  # annotated meanwhile, or gone: a pod that loses its annotation again is reported again
        current = set()
        for pod in pods:
            info = describe(pod, args, now)
            current.add(info["uid"])
            if info["uid"] not in seen:
                seen.add(info["uid"])
                await queue.put({"inferops_gated_pod": info})
            if args["release_after"] and info["gated_for"] is not None and info["gated_for"] >= args["release_after"] \
                    and info["uid"] not in released:
                try:
                    await loop.run_in_executor(None, release, core, pod, args["gate"])
                except Exception as exc:  # gone or recreated meanwhile (404, 409): the next poll sees what is there
                    await queue.put({"inferops_gated_pods_error": dict(info, error=str(exc)[:500])})
                    continue
                released.add(info["uid"])
                await queue.put({"inferops_gate_released": dict(info, reason=(
                    "still gated %.0f s after its creation (release_after=%.0f s): released for a start without "
                    "the restore role's decision" % (info["gated_for"], args["release_after"])))})
        seen &= current | released
        released &= current
        await asyncio.sleep(args["interval"])


if __name__ == "__main__":  # a quick look without ansible-rulebook: python gated_pods.py NAMESPACE [SERVICE]
    import sys

    class PrintQueue:
        async def put(self, event):
            print(json.dumps(event, sort_keys=True), flush=True)

    asyncio.run(main(PrintQueue(), {"namespace": sys.argv[1], "service": (sys.argv[2:] or [None])[0]}))

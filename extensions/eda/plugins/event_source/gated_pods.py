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
  kubeconfig, context, host, api_key, validate_certs, ca_cert, ... : kubernetes.core's connection options, the
                  same as the collection's k8s modules take (unset: K8S_AUTH_*, ~/.kube/config, in-cluster)

Examples:
  sources:
    - inferops.snapshot.gated_pods:
        namespace: inference
        service: qwen
        release_after: 60

The names (labels, gate, annotations, env) and the client are the collection's own (core/base/layout.py,
module_utils/k8s/): the source imports them from the collection it is installed with -- ansible-rulebook
loads a source by its path, so the source puts the ``ansible_collections`` tree it lies in on ``sys.path``
when the collection is not importable already. It needs what the collection's k8s modules need where
ansible-rulebook runs: the kubernetes.core collection beside it (a dependency of the collection, installed
with it), ansible-core and the ``kubernetes`` Python package. RBAC: list and patch on pods in the
namespace (docs/kubernetes.md's Role has both).
"""

import asyncio
import datetime
import json
import os
import sys
import time


def _import_the_collection():
    """The collection's names and client, from the collection this file belongs to."""
    try:
        import ansible_collections.inferops.snapshot.plugins.module_utils.k8s.service  # noqa: F401
    except ImportError:
        # .../ansible_collections/inferops/snapshot/extensions/eda/plugins/event_source/gated_pods.py
        tree = os.path.abspath(__file__).split(os.sep)
        if len(tree) < 9 or tree[-8] != "ansible_collections":
            raise ImportError("gated_pods: the inferops.snapshot collection is not importable and this file is not "
                              "inside an installed collection (ansible_collections/inferops/snapshot/...): install "
                              "the collection (ansible-galaxy collection install) where ansible-rulebook runs")
        sys.path.append(os.sep.join(tree[:-8]) or os.sep)
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
    from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import client, pods, service
    return layout, client, pods, service


layout, k8s_client, k8s_pods, k8s_service = _import_the_collection()
SETTINGS = ("namespace", "service", "gate", "service_label", "instance_label", "interval", "release_after",
            "catch_up")
ARGUMENTS = SETTINGS + tuple(sorted(k8s_client.AUTH_ARG_SPEC))


class ArgumentError(ValueError):
    pass


def _boolean(name, value):
    if isinstance(value, bool):
        return value
    if str(value).lower() not in ("true", "false", "yes", "no", "1", "0"):
        raise ArgumentError("%s: %r is not a boolean" % (name, value))
    return str(value).lower() in ("true", "yes", "1")


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
    args["catch_up"] = _boolean("catch_up", args.get("catch_up", True))
    for name, spec in k8s_client.AUTH_ARG_SPEC.items():  # kubernetes.core's types, as its modules check them
        if args.get(name) is not None and spec.get("type") == "bool":
            args[name] = _boolean(name, args[name])
        elif isinstance(args.get(name), str) and spec.get("type") == "list":
            args[name] = [item for item in args[name].split(",") if item]
    args.setdefault("gate", layout.K8S_RESTORE_GATE)
    args.setdefault("service_label", layout.K8S_SERVICE_LABEL)
    args.setdefault("instance_label", layout.K8S_INSTANCE_LABEL)
    return args


def _created(pod):
    text = (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def describe(pod, args, now):
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    created = _created(pod)
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "service": labels.get(args["service_label"]), "instance": labels.get(args["instance_label"]),
            "gated_for": round(now - created, 1) if created is not None else None}


def unannotated(pod, args):
    """The pod runs on its own restore request and its annotations do not say yet what the node did: the
    restore role's catch-up has something to annotate (its own test, k8s/service.requested)."""
    if (pod.get("status") or {}).get("phase") != "Running" or k8s_pods.gated(pod, args["gate"]):
        return False
    try:
        return k8s_service.requested(pod, {"container": None, "service": k8s_pods.labels(pod).get(args["service_label"]),
                                           "instance_label": args["instance_label"]}) is not None
    except Exception:  # pylint: disable=broad-except  # a pod the role cannot read: not one it would annotate
        return False


def list_pods(client, args):
    """(gated pods, pods to catch up) of the namespace (and service), from one list call."""
    pod_list = client.list_pods(args["namespace"], {args["service_label"]: args["service"]} if args.get("service")
                                else None)
    return ([pod for pod in pod_list if k8s_pods.gated(pod, args["gate"])],
            [pod for pod in pod_list if args["catch_up"] and unannotated(pod, args)])


def release(client, pod, gate):
    """Remove ``gate`` from this very pod (its uid is the precondition: a recreated pod is not touched)."""
    meta = pod["metadata"]
    gates = [item for item in pod["spec"].get("schedulingGates") or [] if item.get("name") != gate]
    client.patch_pod(meta["namespace"], meta["name"],
                     {"metadata": {"uid": meta["uid"]}, "spec": {"schedulingGates": gates or None}})


async def main(queue, args):
    """ansible-rulebook's entry point: poll, put events, release pods past their deadline; runs until cancelled."""
    args = check_args(args)
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(None, k8s_client.connect, args)
    seen, released, caught = set(), set(), set()
    while True:
        try:
            pods, behind = await loop.run_in_executor(None, list_pods, client, args)
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
                    await loop.run_in_executor(None, release, client, pod, args["gate"])
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

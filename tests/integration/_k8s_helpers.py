"""Kubernetes side of the integration tests: an API emulator on a loopback port, a kubeconfig for it,
the kubelet of one node played on the local dockerd, and a way to run the collection's playbooks.

The API runs over real HTTP and the collection talks to it through the real kubernetes client
(and kubernetes.core). The emulator (kmock) keeps objects in memory and applies patches as plain
JSON merges; the few things a real API server always does and kmock does not (server-set uid and
creationTimestamp, labelSelector filtering, the kind of a list, a dry run that stores nothing) are added in
``Emulator`` below. It enforces no admission policy.

Nothing here runs a controller: the tests create, delete and recreate pods themselves, as a
StatefulSet would.
"""

import asyncio
import datetime
import json
import os
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from pathlib import Path

import aiohttp.web
import kmock
import kubernetes

from conftest import BIN, COLLECTIONS, REPO, device_args, docker, ensure_collection_link

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import engine_http

MERGE = "application/merge-patch+json"
NPU_RESOURCE = "huawei.com/Ascend910"  # the extended resource Ascend's device plugin advertises (one per chip)
LIST_KINDS = {"pods": "PodList", "configmaps": "ConfigMapList"}
VERBS = {"get", "list", "watch", "create", "patch", "delete"}


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what the real API server does that the roles and the kubelet rely on:
    a uid and creationTimestamp set on creation, and a patch naming another uid than the object's
    refused (the kubelet's status updates must never land on a pod recreated under the same name)."""

    seen = None  # (Authorization header, RBAC verb, resource or URL path, name) of every request served

    async def _handle(self, request):
        if self.seen is not None:
            self.seen.append((request.headers.get("Authorization"),) + rbac_verb(request))
        if request.params.get("dryRun") == "All" and request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            return aiohttp.web.json_response(self._dry_run(request))
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        if request.action == kmock.action.UPDATE and isinstance(request.data, dict):
            uid = (request.data.get("metadata") or {}).get("uid")
            key = (request.resource, request.namespace, request.name)
            if uid is not None and key in self.objects and not self.objects[key].deleted:
                current = (self.objects[key].get("metadata") or {}).get("uid")
                if current != uid:
                    raise kmock.KubernetesError(status=409, reason="Conflict", message=(
                        "Precondition failed: UID in precondition: %s, UID in object meta: %s" % (uid, current)))
        return await super()._handle(request)

    def _dry_run(self, request):
        """What a dry run (kubernetes.core's check mode) is answered, stored nowhere: the created object, or the
        patched one (a JSON merge, as kmock patches)."""
        key = (request.resource, request.namespace or (request.data.get("metadata") or {}).get("namespace"),
               request.name or (request.data.get("metadata") or {}).get("name"))
        current = self.objects[key] if key in self.objects and not self.objects[key].deleted else None
        if request.action == kmock.action.CREATE:
            if current is not None:
                raise kmock.KubernetesError(status=409, reason="AlreadyExists", message="%s already exists" % key[2])
            return request.data
        if current is None:
            raise kmock.KubernetesError(status=404, reason="NotFound", message="%s not found" % key[2])
        return merge_patch(current.raw, request.data)

    async def _serve_list(self, request):
        listing = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            wanted = dict(term.split("=", 1) for term in selector.split(","))
            listing["items"] = [item for item in listing["items"]
                                if all(((item.get("metadata") or {}).get("labels") or {}).get(key) == value
                                       for key, value in wanted.items())]
        return dict(listing, apiVersion="v1", kind=LIST_KINDS.get(request.resource.plural, "List"))


def merge_patch(target, patch):
    """RFC 7386: ``patch`` merged into a copy of ``target`` (None removes a key)."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def rbac_verb(request):
    """(verb, resource, name) as RBAC sees the request: ('get', 'pods', 'p'), ('patch', 'pods/status', 'p'),
    or ('get', '/api', None) for the discovery URLs (nonResourceURLs)."""
    if request.resource is None or not request.resource.plural:
        return (request.method.value.lower(), request.url.path, None)
    resource = request.resource.plural + ("/" + request.subresource if request.subresource else "")
    method = request.method.value
    if method == "GET":
        verb = "watch" if request.params.get("watch") == "true" else ("get" if request.name else "list")
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]
    return (verb, resource, request.name)


class ApiServer:
    """The emulator served on 127.0.0.1 from a background event loop."""

    def __init__(self):
        self._ready = threading.Event()
        self._error = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="k8s-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("the Kubernetes API emulator did not start: %s" % self._error)

    async def _main(self):
        try:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with Emulator() as emulator, kmock.Server(emulator) as server:
                emulator.resources["v1/pods"] = kmock.ResourceInfo(
                    kind="Pod", singular="pod", namespaced=True, verbs=VERBS, subresources={"status"})
                emulator.resources["v1/configmaps"] = kmock.ResourceInfo(
                    kind="ConfigMap", singular="configmap", namespaced=True, verbs=VERBS)
                emulator.seen = []
                self.emulator = emulator
                self.url = str(server.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
        except Exception:
            self._error = traceback.format_exc()
            self._ready.set()

    def stop(self):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def write_kubeconfig(path, url, token="not-checked-by-the-emulator"):
    """A kubeconfig for the emulator: the roles authenticate exactly as against a real cluster (the emulator keeps
    the token of every request, ``Emulator.seen``: a test tells one run's requests from another's by it)."""
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "emulator",
              "clusters": [{"name": "emulator", "cluster": {"server": url}}],
              "users": [{"name": "tester", "user": {"token": token}}],
              "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester",
                                                            "namespace": "default"}}]}
    Path(path).write_text(json.dumps(config))
    os.chmod(path, 0o600)
    return str(path)


def core_api(url):
    configuration = kubernetes.client.Configuration()
    configuration.host = url
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))


def raw(response):
    return json.loads(response.data)


class Api:
    """What the tests read and write in the emulator, as plain dicts."""

    def __init__(self, url, namespace):
        self.core = core_api(url)
        self.namespace = namespace

    def pod(self, name):
        try:
            return raw(self.core.read_namespaced_pod(name, self.namespace, _preload_content=False))
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self):
        return raw(self.core.list_namespaced_pod(self.namespace, _preload_content=False))["items"]

    def create(self, manifest):
        return raw(self.core.create_namespaced_pod(self.namespace, manifest, _preload_content=False))

    def delete(self, name):
        self.core.delete_namespaced_pod(name, self.namespace, _preload_content=False)

    def annotations(self, name):
        return (self.pod(name) or {}).get("metadata", {}).get("annotations") or {}

    def configmap(self, name):
        try:
            return raw(self.core.read_namespaced_config_map(name, self.namespace, _preload_content=False))
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def env(self, name, container=0):
        pod = self.pod(name)
        return {item["name"]: item.get("value") for item in pod["spec"]["containers"][container].get("env") or []}

    def wait(self, predicate, what, timeout=60):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(0.2)
        raise AssertionError("timed out waiting for %s" % what)


def workload_pod(name, namespace, service, instance, image, port, device_dir, npu_root, *, extra_env=None,
                 gated=False, node=None, warmup=2, runtime_class=None, host_network=True, device_mount=None):
    """The pod manifest of one sample engine: host network (dockerd here has no bridge; ``host_network=False``:
    a network namespace of its own, loopback only), its simulated NPU and the NPU snapshot root as hostPath
    volumes, and an emptyDir at the agent's socket directory (a restored process binds its socket again in
    that directory, which a fresh container filesystem would not have). ``runtime_class``: the RuntimeClass
    of the restore-on-create runtime (docs/kubernetes.md). ``device_mount``: where the pod sees its NPU (by
    default at its host path); pods that clone one another see theirs at one path, as NPU pods see /dev/davinci0.

    The engine's metadata file is in that emptyDir: the restore-on-create runtime writes the new
    container's environment there when it restores the engine, and it must be writable (a downward API
    volume is read-only: the runtime could not write into it and would start the container cold). The
    restore role's view of the new environment (annotation snapshot.inferops.org/metadata) is projected
    read-only beside it by a downward API volume, as a pod may do to show it."""
    env = [{"name": "WORKLOAD_PORT", "value": str(port)},
           {"name": "WORKLOAD_WARMUP_SECONDS", "value": str(warmup)},
           {"name": "WORKLOAD_DEVICE_MB", "value": "24"},
           {"name": "WORKLOAD_HOST_MB", "value": "8"},
           {"name": "ACL_SIM_DEVICE_DIR", "value": str(device_mount or device_dir)},
           {"name": "ACL_SIM_DEVICE_MEM_BYTES", "value": "256M"},
           {"name": "INFEROPS_METADATA_FILE", "value": "/run/inferops-snapshot/metadata.json"},
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
           # the restore marker, from the annotation the restore role sets before the container exists
           {"name": "INFEROPS_RESTORE_FROM",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['org.inferops.restore-from']"}}},
           # ... and the fingerprint the generation recorded: the runtime restores only that very snapshot
           {"name": "INFEROPS_RESTORE_CHECKSUM",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['org.inferops.restore-checksum']"}}},
           # the runtime checks the snapshot's identity against the pod's (a snapshot of another pod is refused)
           {"name": "INFEROPS_RESTORE_IDENTITY",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['snapshot.inferops.org/identity']"}}},
           # host-only snapshots: the restore role marks the pod org.inferops.restore-device=false (no device restore)
           {"name": "INFEROPS_RESTORE_DEVICE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['org.inferops.restore-device']"}}}]
    env += [{"name": key, "value": value} for key, value in (extra_env or {}).items()]
    npu = {NPU_RESOURCE: "1"}
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"inferops.org/service": service, "inferops.org/instance": instance, "app": service}},
        "spec": {
            "hostNetwork": host_network,
            "containers": [{
                "name": "engine", "image": image, "env": env, "resources": {"requests": npu, "limits": npu},
                "readinessProbe": {"httpGet": {"path": "/health", "port": port}},
                "volumeMounts": [{"name": "agent", "mountPath": "/run/inferops-snapshot"},
                                 {"name": "npu", "mountPath": str(device_mount or device_dir)},
                                 {"name": "npu-snapshots", "mountPath": str(npu_root)},
                                 {"name": "metadata", "mountPath": "/etc/inferops/metadata", "readOnly": True}],
            }],
            "volumes": [
                {"name": "agent", "emptyDir": {}},
                {"name": "npu", "hostPath": {"path": str(device_dir)}},
                {"name": "npu-snapshots", "hostPath": {"path": str(npu_root)}},
                {"name": "metadata", "downwardAPI": {"items": [{
                    "path": "metadata.json",
                    "fieldRef": {"fieldPath": "metadata.annotations['snapshot.inferops.org/metadata']"}}]}},
            ],
        },
    }
    if runtime_class:
        pod["spec"]["runtimeClassName"] = runtime_class
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": "inferops.org/snapshot-restore"}]
    elif node:
        pod["spec"]["nodeName"] = node
    return pod


class Kubelet:
    """The kubelet (and scheduler) of one node, played on the local dockerd. Small on purpose:

    - schedule: a pod with no node and no scheduling gate, whose nodeSelector does not name another
      node, is bound to this node;
    - run: a pod bound to this node without a container gets one (docker run; host network, or with
      hostNetwork false a network namespace of its own with loopback only, probed from inside it): env from
      literal values, $(VAR) and metadata fieldRefs, resolved when the container is created (so
      INFEROPS_RESTORE_FROM carries the annotation org.inferops.restore-from the restore role set);
      hostPath and emptyDir volumes; downwardAPI files written from the pod's metadata at creation. A pod
      whose runtimeClassName is in ``runtime_classes`` (RuntimeClass -> handler, here a dockerd runtime
      name) runs with ``docker run --runtime <handler>``: the restore-on-create runtime installed by the
      snapshot_node role, which restores the container from its snapshot inside `create` or starts it
      normally. The kubelet itself knows nothing about snapshots;
    - devices: a container that asks for huawei.com/Ascend910 chips gets them as the Ascend device plugin's
      allocation reaches the container runtime, as devices (docker run --device /dev/davinci<N> and
      /dev/davinci_manager): here the chips of the simulated NPU whose memory is the pod's ``npu`` hostPath
      volume (each pod's own, ``simulated_npu_devices``);
    - report: phase, containerID docker://<id>, podIP, and the Ready condition from the readinessProbe;
    - delete: the container of a pod that is gone (or was recreated: another uid) is removed.

    ``before_start(pod)``, when set, is called just before a pod's container is created (the tests use
    it to break a snapshot after the restore role verified it). A pod named in ``held`` ((namespace, name)) is
    reported not Ready, whatever its probe says, until the test takes it out: a warmup that ends on an event of
    the test's, not after a time.
    """

    def __init__(self, url, node, workdir, prefix, runtime_classes=None):
        self.core = core_api(url)
        self.node, self.workdir, self.prefix = node, Path(workdir), prefix
        self.runtime_classes = dict(runtime_classes or {})
        self.before_start = None
        self.held = set()
        self.containers = {}  # pod uid -> {"name", "id", "pod", "meta", "ready", "started", "url", "image"}
        self.events = []  # (pod, "started" or "removed", the dockerd runtime or the container id)
        self._running, self._next_ps = set(), 0.0
        self.errors = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet-" + node, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception:
                self.errors.append(traceback.format_exc())
            self._stop.wait(0.2)

    def stop(self):
        self._stop.set()
        self._thread.join(120)
        for info in list(self.containers.values()):
            docker("rm", "-f", info["id"], check=False)
        self.containers.clear()

    def wait_removed(self, namespace, pod, timeout=60):
        """Until no container of ``pod`` is left (after its deletion)."""
        deadline = time.monotonic() + timeout
        while any((info["meta"]["name"], info["meta"]["namespace"]) == (pod, namespace)
                  for info in list(self.containers.values())):
            if time.monotonic() > deadline:
                raise AssertionError("the kubelet did not remove the container of %s/%s" % (namespace, pod))
            time.sleep(0.1)

    # -- one sync round ---------------------------------------------------------------------------
    def sync(self):
        pods = raw(self.core.list_pod_for_all_namespaces(_preload_content=False))["items"]
        live = {}
        for pod in pods:
            spec, meta = pod["spec"], pod["metadata"]
            if spec.get("schedulingGates"):
                continue
            if not spec.get("nodeName"):
                wanted = (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
                if wanted in (None, self.node):
                    self.patch(meta, {"spec": {"nodeName": self.node}})  # the scheduler's binding
                continue
            if spec["nodeName"] != self.node:
                continue
            live[meta["uid"]] = pod
        for uid in [uid for uid in self.containers if uid not in live]:
            info = self.containers.pop(uid)
            docker("rm", "-f", info["id"], check=False)
            self.events.append((info["pod"], "removed", info["id"]))
        for uid, pod in live.items():
            if uid not in self.containers:
                self.start(pod)
        if time.monotonic() >= self._next_ps:  # one `docker ps` a second, not one inspect per container
            self._running = set(docker("ps", "-q", "--no-trunc", "--filter",
                                       "label=inferops.test.kubelet=" + self.prefix).split())
            self._next_ps = time.monotonic() + 1.0
        for uid, info in list(self.containers.items()):
            self.probe(uid, info)

    def patch(self, meta, body, status=False):
        """A merge patch of this pod incarnation only (its uid is the precondition); False when it is gone."""
        method = self.core.patch_namespaced_pod_status if status else self.core.patch_namespaced_pod
        body = dict(body, metadata={"uid": meta["uid"]})
        try:
            method(meta["name"], meta["namespace"], body, _content_type=MERGE, _preload_content=False)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status not in (404, 409):
                raise
            return False
        return True

    def field(self, pod, path):
        meta = pod["metadata"]
        if path.startswith("metadata.annotations['"):
            return (meta.get("annotations") or {}).get(path[len("metadata.annotations['"):-2], "")
        if path.startswith("metadata.labels['"):
            return (meta.get("labels") or {}).get(path[len("metadata.labels['"):-2], "")
        return {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
                "spec.nodeName": pod["spec"].get("nodeName"), "status.podIP": "127.0.0.1"}[path]

    def docker_args(self, pod, cname):
        spec = pod["spec"]
        container = spec["containers"][0]
        assert not container.get("command") and not container.get("args"), "the image's command is used"
        network = "host" if spec.get("hostNetwork") else "none"  # none: the pod's own namespace (no CNI here)
        args = ["--name", cname, "--network", network, "--label", "inferops.test.kubelet=" + self.prefix]
        runtime_class = spec.get("runtimeClassName")
        if runtime_class:
            assert runtime_class in self.runtime_classes, "no RuntimeClass %s on this node" % runtime_class
            args += ["--runtime", self.runtime_classes[runtime_class]]
        # The pod's annotations go with the container, as the kubelet hands them to the container runtime
        # (dockershim kept them as labels "annotation.<key>"). They cannot reach the OCI config here: dockerd
        # 20.10 has no way to set OCI annotations (`docker run --annotation` needs API 1.43, docker 24). So
        # the restore-on-create runtime reads the marker from the env the pod spec takes from the
        # annotation (INFEROPS_RESTORE_FROM), as docs/kubernetes.md prescribes for Docker nodes.
        for key, value in sorted(((pod["metadata"].get("annotations")) or {}).items()):
            args += ["--label", "annotation.%s=%s" % (key, value)]
        volumes = {volume["name"]: volume for volume in spec.get("volumes") or []}
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                source = volume["hostPath"]["path"]
            elif "emptyDir" in volume:  # the real kubelet's layout: pods/<uid>/volumes/<plugin>/<name>
                source = self.workdir / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~empty-dir" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
            else:  # downwardAPI: files written once, at creation (the real kubelet keeps them updated)
                source = self.workdir / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~downward-api" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
                for item in volume["downwardAPI"]["items"]:
                    (source / item["path"]).write_text(self.field(pod, item["fieldRef"]["fieldPath"]) or "")
            args += ["-v", "%s:%s%s" % (source, mount["mountPath"], ":ro" if mount.get("readOnly") else "")]
        env = {}
        for item in container.get("env") or []:
            if "valueFrom" in item:
                env[item["name"]] = self.field(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
            else:
                value = item.get("value", "")
                for key, known in env.items():
                    value = value.replace("$(%s)" % key, known)
                env[item["name"]] = value
        for key, value in env.items():
            args += ["-e", "%s=%s" % (key, value)]
        args += simulated_npu_devices(pod)
        return args + [container["image"]], env

    def start(self, pod):
        meta = pod["metadata"]
        cname = "%s-%s-%s-%s" % (self.prefix, meta["namespace"], meta["name"], meta["uid"][:6])
        if self.before_start is not None:
            self.before_start(pod)
        args, _env = self.docker_args(pod, cname)
        # With the restore-on-create runtime, `docker run` returns once the runtime restored the container
        # from its snapshot, or started it normally (its log and the snapshot's status record say which).
        docker("run", "-d", *args)
        self.events.append((meta["name"], "started", self.runtime_classes.get(pod["spec"].get("runtimeClassName"))))
        cid, pid = docker("inspect", "--format", "{{.Id}} {{.State.Pid}}", cname).split()
        probe = pod["spec"]["containers"][0].get("readinessProbe", {}).get("httpGet", {})
        self.containers[meta["uid"]] = {"name": cname, "id": cid, "pod": meta["name"], "ready": None,
                                        "netns_pid": None if pod["spec"].get("hostNetwork") else int(pid),
                                        "started": time.monotonic(),
                                        "meta": {"name": meta["name"], "namespace": meta["namespace"],
                                                 "uid": meta["uid"]},
                                        "url": "http://127.0.0.1:%s%s" % (probe.get("port"), probe.get("path", "/"))
                                        if probe else None, "image": pod["spec"]["containers"][0]["image"]}
        self.report(self.containers[meta["uid"]], ready=False)

    def report(self, info, ready, running=True):
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        state = {"running": {"startedAt": now}} if running else {"terminated": {"exitCode": 1, "finishedAt": now}}
        self.patch(info["meta"], {"status": {
            "phase": "Running" if running else "Failed", "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now}],
            "containerStatuses": [{"name": "engine", "containerID": "docker://" + info["id"], "image": info["image"],
                                   "imageID": "", "ready": ready, "started": running, "restartCount": 0,
                                   "state": state}]}}, status=True)
        info["ready"] = ready

    def probe(self, uid, info):
        running = info["id"] in self._running or time.monotonic() - info["started"] < 2.0
        ready = False
        if (info["meta"]["namespace"], info["meta"]["name"]) in self.held:
            pass
        elif running and info["url"]:
            try:
                ready = http_status(info["url"], info["netns_pid"], timeout=1) == 200
            except Exception:
                ready = False
        if ready != info["ready"] or not running:
            if not running and info.get("reported_exit"):
                return
            info["reported_exit"] = not running
            self.report(info, ready, running)


def simulated_npu_devices(pod):
    """The device plugin's allocation for ``pod``'s container, as docker run options: the number of
    huawei.com/Ascend910 chips it asks for, davinci0.. of the simulated NPU of its ``npu`` hostPath volume (whose
    memory files that directory holds), and davinci_manager. None asked for: none given."""
    container = pod["spec"]["containers"][0]
    count = int(((container.get("resources") or {}).get("limits") or {}).get(NPU_RESOURCE, 0))
    if not count:
        return []
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
    assert "hostPath" in volumes.get("npu", {}), "a pod asking for %s needs its simulated NPU (hostPath volume npu)" \
        % NPU_RESOURCE
    return device_args(volumes["npu"]["hostPath"]["path"], *range(count))


def http_status(url, netns_pid=None, timeout=5):
    """The HTTP status of a GET of ``url``: from here, or from inside the network namespace of ``netns_pid``."""
    if netns_pid:
        return engine_http.request(url, timeout=timeout, netns_pid=netns_pid)[0]
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status


def write_inventory(path, node, kubeconfig, more_nodes=()):
    """The controller (localhost, where the API client runs) and one node (or more), all this machine."""
    python = sys.executable
    nodes = {"node-a": {"ansible_connection": "local", "ansible_python_interpreter": python, "k8s_node_name": node}}
    for other in more_nodes:
        nodes[other] = {"ansible_connection": "local", "ansible_python_interpreter": python, "k8s_node_name": other}
    inventory = {"all": {
        "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": python}},
        "children": {"k8s_nodes": {"hosts": nodes}},
        "vars": {"k8s_snapshot_kubeconfig": kubeconfig}}}
    Path(path).write_text(json.dumps(inventory))
    return str(path)


def playbook_command(playbook, inventory, extra_vars, check=False):
    """(argv, env) of ansible-playbook on one of the collection's playbooks."""
    ensure_collection_link()
    vars_file = Path(inventory).with_suffix(".vars-%d.json" % time.monotonic_ns())
    vars_file.write_text(json.dumps(extra_vars))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_PIPELINING="True")
    return ([str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / playbook),
             "-e", "@%s" % vars_file] + (["--check"] if check else []), env)


def run_playbook(playbook, inventory, extra_vars, timeout=240, check=False):
    """ansible-playbook on one of the collection's playbooks; (rc, output). K8S_TEST_SHOW=1 prints the output."""
    command, env = playbook_command(playbook, inventory, extra_vars, check)
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if os.environ.get("K8S_TEST_SHOW"):
        print(proc.stdout[-6000:])
    return proc.returncode, proc.stdout + proc.stderr

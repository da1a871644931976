"""The Kubernetes nodes of the tests as clusters run them: containerd 1.6's CRI plugin on two nodes of this
machine (``scripts/env/cri-node.sh``: node-a, node-b), driven by a kubelet stand-in through the CRI's gRPC API.

- ``CriNodes``: the nodes themselves (start, restart, down, import an image, their paths), through the script.
- ``cri_api()``: the CRI's ``runtime.v1`` proto (tests/integration/cri/runtime_v1.proto), compiled into build/
  at first use with grpc_tools.protoc; ``CriClient``: its two services on one node's socket.
- ``CriKubelet``: the kubelet of one node. It watches the API emulator's pods bound to its node and makes the CRI
  calls the kubelet makes, with the configs the kubelet builds: RunPodSandbox (runtime handler from the pod's
  RuntimeClass), ImageStatus/PullImage by the pull policy, CreateContainer/StartContainer, readiness probes over
  HTTP to the pod IP, the pod's status written back (status subresource, merge patch), and on deletion
  StopContainer, StopPodSandbox, RemoveContainer, RemovePodSandbox. docs/kubernetes.md ("Kubernetes nodes in
  the tests") lists what it reproduces of the kubelet and what not.

Nothing here talks to anything but this machine: the API emulator on 127.0.0.1, the nodes' sockets, and pods on
the nodes' own bridges (a probe of any other address is refused, ``_local_target``).
"""

import contextlib
import datetime
import fcntl
import hashlib
import importlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from pathlib import Path

import kmock
import kubernetes

from conftest import BUILD, REPO, device_args

CRI_NODE_SCRIPT = REPO / "scripts" / "env" / "cri-node.sh"
PROTO = Path(__file__).resolve().parent / "cri" / "runtime_v1.proto"
NODES = ("node-a", "node-b")
MERGE = "application/merge-patch+json"
NPU_RESOURCE = "huawei.com/Ascend910"
OWNER_LABEL = "inferops.test/cri-kubelet"   # the one label the stand-in adds to a sandbox (not the kubelet's)
KUBELET_VERSION = "v1.30.0-inferops-cri-standin"
VERBS = {"get", "list", "watch", "create", "patch", "delete"}
# The kubelet's defaults (k8s.io/kubernetes pkg/securitycontext): what a container that is not privileged and
# whose procMount is Default gets masked and read-only in /proc and /sys.
DEFAULT_MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                        "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                        "/sys/devices/virtual/powercap"]
DEFAULT_READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


# ------------------------------------------------------------------------------------------------ the nodes
class CriNodes:
    """scripts/env/cri-node.sh from the tests: every call waits for the script and fails with its output."""

    def run(self, *args, timeout=300):
        proc = subprocess.run(["bash", str(CRI_NODE_SCRIPT)] + [str(a) for a in args], capture_output=True,
                              text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise AssertionError("cri-node.sh %s failed (%d):\n%s%s" % (" ".join(map(str, args)), proc.returncode,
                                                                        proc.stdout, proc.stderr))
        return proc

    def start(self, *nodes):
        """Start the nodes (or find them running); their status. The stderr says which it did."""
        proc = self.run("start", *nodes)
        return self.status(*nodes), proc.stderr

    def restart(self, node):
        return self.run("restart", node).stderr

    def down(self, node):
        return self.run("down", node).stderr

    def import_image(self, image, *nodes):
        return self.run("import", image, *nodes, timeout=600).stderr

    def status(self, *nodes):
        return json.loads(self.run("status", *nodes).stdout)


def start_nodes(image):
    """Both nodes running, ``image`` (a docker image) in their k8s.io namespace; {node: status}."""
    nodes = CriNodes()
    nodes.run("install")
    status = nodes.start(*NODES)[0]
    nodes.import_image(image, *NODES)
    return status


# ------------------------------------------------------------------------------------------------ the CRI API
_API = None
_API_LOCK = threading.Lock()


def cri_api():
    """(messages, services): the modules grpc_tools.protoc makes of the CRI proto, made once into
    build/cri-api/<hash of the proto and the compiler> (under a lock: two pytest workers may get here at once)."""
    global _API  # pylint: disable=global-statement
    with _API_LOCK:
        if _API is not None:
            return _API
        import grpc_tools  # pylint: disable=import-outside-toplevel
        from importlib.metadata import version  # pylint: disable=import-outside-toplevel
        key = hashlib.sha256(PROTO.read_bytes() + version("grpcio-tools").encode()).hexdigest()[:16]
        base = BUILD / "cri-api"
        out = base / key
        base.mkdir(parents=True, exist_ok=True)
        with open(base / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (out / "runtime_v1_pb2_grpc.py").exists():
                work = base / (".work-%d" % os.getpid())
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                include = Path(grpc_tools.__file__).parent / "_proto"
                proc = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(PROTO.parent),
                                       "-I", str(include), "--python_out", str(work), "--grpc_python_out",
                                       str(work), str(PROTO)], capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise AssertionError("protoc of %s failed: %s" % (PROTO, proc.stderr))
                shutil.rmtree(out, ignore_errors=True)
                os.rename(work, out)
        if str(out) not in sys.path:
            sys.path.insert(0, str(out))
        _API = (importlib.import_module("runtime_v1_pb2"), importlib.import_module("runtime_v1_pb2_grpc"))
        return _API


class CriClient:
    """The CRI's RuntimeService and ImageService on one node's socket."""

    def __init__(self, socket):
        import grpc  # pylint: disable=import-outside-toplevel
        self.pb, services = cri_api()
        self.grpc = grpc
        self.channel = grpc.insecure_channel("unix://" + socket)
        self.runtime = services.RuntimeServiceStub(self.channel)
        self.images = services.ImageServiceStub(self.channel)

    def call(self, service, method, request, timeout=120):
        return getattr(getattr(self, service), method)(request, timeout=timeout)

    def close(self):
        self.channel.close()


def rpc_error(exc):
    """What the kubelet quotes of a failed CRI call: 'rpc error: code = X desc = ...'."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return "rpc error: code = %s desc = %s" % (code.name.title().replace("_", "") if code else "Unknown", details)


# ------------------------------------------------------------------------------------------------ the emulator
def declare_resources(server):
    """What the stand-in reads and writes besides pods: RuntimeClasses (node.k8s.io/v1), Events, Nodes."""
    resources = server.emulator.resources
    resources["node.k8s.io/v1/runtimeclasses"] = kmock.ResourceInfo(
        kind="RuntimeClass", singular="runtimeclass", namespaced=False, verbs=VERBS)
    resources["v1/events"] = kmock.ResourceInfo(kind="Event", singular="event", namespaced=True, verbs=VERBS)
    resources["v1/nodes"] = kmock.ResourceInfo(kind="Node", singular="node", namespaced=False, verbs=VERBS,
                                               subresources={"status"})


def runtime_class(name, handler):
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}


def api_client(url):
    configuration = kubernetes.client.Configuration()
    configuration.host = url
    return kubernetes.client.ApiClient(configuration)


def raw(response):
    return json.loads(response.data)


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------------ small parts
def quantity(text):
    """A Kubernetes quantity as a number (cores or bytes): '250m' -> 0.25, '1Gi' -> 1073741824."""
    text = str(text).strip()
    binary = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
    decimal = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
    for suffix, factor in list(binary.items()) + list(decimal.items()):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def fnv32a(data):
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def expand(value, env):
    """The kubelet's $(VAR) expansion: known names replaced, $$ an escaped $, unknown references kept."""
    def one(match):
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, value)


def qos_class(pod):
    containers = pod["spec"].get("containers") or []
    requests = [((c.get("resources") or {}).get("requests") or {}) for c in containers]
    limits = [((c.get("resources") or {}).get("limits") or {}) for c in containers]
    if not any(requests) and not any(limits):
        return "BestEffort"
    for req, lim in zip(requests, limits):
        for resource in ("cpu", "memory"):
            if resource not in lim or quantity(req.get(resource, lim[resource])) != quantity(lim[resource]):
                return "Burstable"
    return "Guaranteed"


class ConfigError(Exception):
    """What the kubelet reports as CreateContainerConfigError: the spec asks for something it cannot make."""


class PodError(Exception):
    def __init__(self, reason, message):
        super().__init__(message)
        self.reason, self.message = reason, message


# ------------------------------------------------------------------------------------------------ the kubelet
class CriKubelet:
    """The kubelet of one CRI node (``status`` is that node's entry of ``cri-node.sh status``), against the API
    emulator at ``url``. ``schedule``: it also binds pods nobody scheduled (no nodeName, no scheduling gate) whose
    nodeSelector kubernetes.io/hostname is this node -- the scheduler's part, which the restore role relies on when
    it narrows a gated pod to the node holding its snapshot; ``schedule="any"`` binds pods without that selector too.

    ``devices(pod, container)`` -> [(host path, container path, permissions)]: what the device plugins allocate
    (default: the simulated NPU of the pod's ``npu`` hostPath volume for huawei.com/Ascend910, as the test pods of
    _k8s_helpers.workload_pod ask for it).

    ``events`` records what it did, ``errors`` what went wrong inside it (a test asserts it stays empty).
    """

    _live = set()   # the stand-ins of this process that run: a sandbox of any other is an orphan

    def __init__(self, url, node, status, schedule=False, devices=None, resync=0.5):
        self.url, self.node, self.info = url, node, status
        self.schedule, self.resync = schedule, resync
        self.devices = devices or simulated_npu
        self.cri = CriClient(status["socket"])
        self.pb = self.cri.pb
        self.host_ip = status["gateway"]
        self.subnet = ipaddress.ip_network(status["subnet"])
        self.kubelet_root = Path(status["kubelet_root"])
        self.log_root = Path(status["log_dir"])
        self.cgroup_root = status["cgroup_parent"].rstrip("/")
        self.owner = "%d-%s-%s" % (os.getpid(), _start_ticks(os.getpid()), secrets.token_hex(4))
        self.pods = {}          # uid -> pod (the watch's view of the pods bound to this node)
        self.workers = {}       # uid -> PodRecord
        self.events = []        # (pod name, what, detail)
        self.errors = []
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._api = api_client(url)
        self._watch_api = api_client(url)
        self.core = kubernetes.client.CoreV1Api(self._api)
        self.node_api = kubernetes.client.NodeV1Api(self._api)
        CriKubelet._live.add(self.owner)
        self.version = self.cri.call("runtime", "Version", self.pb.VersionRequest(version="v1"))
        self._register_node()
        self._collect_orphans()
        self._watcher = threading.Thread(target=self._watch_loop, name="cri-kubelet-watch-" + node, daemon=True)
        self._syncer = threading.Thread(target=self._sync_loop, name="cri-kubelet-" + node, daemon=True)
        self._watcher.start()
        self._syncer.start()

    # -- lifecycle ---------------------------------------------------------------------------------------
    def stop(self):
        """Stop watching; every pod this stand-in runs is killed and removed (as when a node is drained)."""
        self._stop.set()
        self._changed.set()
        self._syncer.join(180)
        for uid in list(self.workers):
            with contextlib.suppress(Exception):
                self._kill(self.workers.pop(uid))
        CriKubelet._live.discard(self.owner)
        self.cri.close()

    def _watch_loop(self):
        """The kubelet's pod source: a list, then a watch of the pods of all namespaces (fieldSelector
        spec.nodeName=<node>, which the emulator ignores: filtered here too), again after any break."""
        core = kubernetes.client.CoreV1Api(self._watch_api)
        while not self._stop.is_set():
            try:
                listed = raw(core.list_pod_for_all_namespaces(_preload_content=False))["items"]
                with self._lock:
                    self.pods = {p["metadata"]["uid"]: p for p in listed if self._mine(p)}
                self._changed.set()
                for event in kubernetes.watch.Watch().stream(
                        core.list_pod_for_all_namespaces, field_selector="spec.nodeName=" + self.node,
                        _request_timeout=(5, 5)):
                    pod = event["raw_object"] if "raw_object" in event else event["object"]
                    if not isinstance(pod, dict):
                        pod = self._api.sanitize_for_serialization(pod)
                    uid = pod["metadata"]["uid"]
                    with self._lock:
                        if event["type"] == "DELETED" or not self._mine(pod):
                            self.pods.pop(uid, None)
                        else:
                            self.pods[uid] = pod
                    self._changed.set()
                    if self._stop.is_set():
                        return
            except Exception as exc:  # a read timeout ends an idle watch: list and watch again
                if self._stop.is_set():
                    return
                if "timed out" not in str(exc).lower() and "timeout" not in type(exc).__name__.lower():
                    self.errors.append("watch: " + traceback.format_exc())
                    self._stop.wait(0.5)

    def _mine(self, pod):
        spec = pod.get("spec") or {}
        if spec.get("nodeName") == self.node:
            return True
        if self.schedule and not spec.get("nodeName") and not spec.get("schedulingGates"):
            wanted = (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
            return wanted == self.node or (wanted is None and self.schedule == "any")
        return False

    def _sync_loop(self):
        next_gc = time.monotonic() + 10
        while not self._stop.is_set():
            self._changed.wait(self.resync)
            self._changed.clear()
            if self._stop.is_set():
                return
            try:
                self.sync()
                if time.monotonic() >= next_gc:
                    self._collect_orphans()
                    next_gc = time.monotonic() + 10
            except Exception:
                self.errors.append(traceback.format_exc())

    # -- one round ---------------------------------------------------------------------------------------
    def sync(self):
        with self._lock:
            pods = dict(self.pods)
        for uid in [uid for uid in self.workers if uid not in pods]:
            try:
                self._kill(self.workers[uid])
            finally:
                del self.workers[uid]   # only now: a test waiting for the record waits for the whole removal
        for uid, pod in pods.items():
            if not pod["spec"].get("nodeName"):
                self._bind(pod)
                continue
            if pod["metadata"].get("deletionTimestamp"):
                if uid in self.workers:
                    try:
                        self._kill(self.workers[uid])
                    finally:
                        del self.workers[uid]
                self._finish_deletion(pod)
                continue
            record = self.workers.get(uid)
            if record is None:
                record = self.workers[uid] = PodRecord(pod)
            record.pod = pod
            self._sync_pod(record)

    def _bind(self, pod):
        """The scheduler's binding (a merge patch of spec.nodeName, as the other stand-in does)."""
        meta = pod["metadata"]
        body = {"metadata": {"uid": meta["uid"]}, "spec": {"nodeName": self.node}}
        with contextlib.suppress(kubernetes.client.exceptions.ApiException):
            self.core.patch_namespaced_pod(meta["name"], meta["namespace"], body, _content_type=MERGE,
                                           _preload_content=False)
            self.events.append((meta["name"], "bound", self.node))

    def _finish_deletion(self, pod):
        meta = pod["metadata"]
        with contextlib.suppress(kubernetes.client.exceptions.ApiException):
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0,
                                            _preload_content=False)

    def _sync_pod(self, record):
        pod = record.pod
        now = time.monotonic()
        sandbox_ready = self._sandbox_ready(record) if record.sandbox_id is not None else False
        if sandbox_ready is None:   # the runtime does not answer (containerd restarting): nothing is known
            return
        if not sandbox_ready:
            if now < record.backoff_until:
                return
            if record.sandbox_id is not None:  # the sandbox died: the kubelet kills the pod and makes a new one
                self._kill(record, remove=True, keep_record=True)
                record.sandbox_attempt += 1
            try:
                self._run_sandbox(record)
            except PodError as exc:
                record.fail_sandbox(exc.reason, exc.message)
                self._event(pod, "Warning", exc.reason, exc.message)
                self._report(record)
                return
        for index, container in enumerate(pod["spec"]["containers"]):
            state = record.containers.setdefault(container["name"], ContainerRecord(container["name"]))
            self._sync_container(record, index, container, state)
        self._report(record)

    # -- sandboxes ---------------------------------------------------------------------------------------
    def _handler(self, pod):
        """The RuntimeClass's handler (the kubelet's runtimeClassManager.LookupRuntimeHandler)."""
        name = pod["spec"].get("runtimeClassName")
        if not name:
            return ""
        try:
            return raw(self.node_api.read_runtime_class(name, _preload_content=False))["handler"]
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 404:
                raise PodError("FailedCreatePodSandBox",
                               "Failed to create pod sandbox: RuntimeClass \"%s\" not found" % name) from None
            raise

    def sandbox_config(self, pod, attempt=0):
        """The PodSandboxConfig the kubelet builds (kuberuntime generatePodSandboxConfig)."""
        pb, spec, meta = self.pb, pod["spec"], pod["metadata"]
        host_network = bool(spec.get("hostNetwork"))
        labels = dict(meta.get("labels") or {})
        labels.update({"io.kubernetes.pod.name": meta["name"], "io.kubernetes.pod.namespace": meta["namespace"],
                       "io.kubernetes.pod.uid": meta["uid"], OWNER_LABEL: self.owner})
        annotations = dict(meta.get("annotations") or {})
        annotations.setdefault("kubernetes.io/config.source", "api")
        annotations.setdefault("kubernetes.io/config.seen", record_seen(pod))
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=meta["name"], uid=meta["uid"], namespace=meta["namespace"],
                                           attempt=attempt),
            log_directory=str(self.pod_log_dir(pod)), labels=labels, annotations=annotations)
        if not host_network:
            config.hostname = (spec.get("hostname") or meta["name"])[:63].rstrip("-.")
        config.dns_config.CopyFrom(self._dns(pod))
        for container in spec["containers"]:
            for port in container.get("ports") or []:
                config.port_mappings.add(protocol=pb.Protocol.Value(port.get("protocol", "TCP")),
                                         container_port=int(port["containerPort"]),
                                         host_port=int(port.get("hostPort", 0)), host_ip=port.get("hostIP", ""))
        security = spec.get("securityContext") or {}
        linux = config.linux
        linux.cgroup_parent = self.pod_cgroup(pod)
        context = linux.security_context
        context.namespace_options.network = pb.NODE if host_network else pb.POD
        context.namespace_options.pid = (pb.NODE if spec.get("hostPID") else
                                         pb.POD if spec.get("shareProcessNamespace") else pb.CONTAINER)
        context.namespace_options.ipc = pb.NODE if spec.get("hostIPC") else pb.POD
        context.privileged = any((c.get("securityContext") or {}).get("privileged")
                                 for c in spec["containers"])
        if "runAsUser" in security:
            context.run_as_user.value = int(security["runAsUser"])
        if "runAsGroup" in security:
            context.run_as_group.value = int(security["runAsGroup"])
        context.supplemental_groups.extend(int(g) for g in security.get("supplementalGroups") or [])
        if "fsGroup" in security:
            context.supplemental_groups.append(int(security["fsGroup"]))
        context.seccomp.CopyFrom(self._seccomp(security))
        for sysctl in security.get("sysctls") or []:
            linux.sysctls[sysctl["name"]] = str(sysctl["value"])
        return config

    def _dns(self, pod):
        """ClusterFirst (the default): the cluster's DNS -- here the node's own bridge address, where nothing
        answers -- and the cluster's search path; Default and ClusterFirst on the host network: the node's
        resolv.conf; None: the pod's dnsConfig alone."""
        spec, pb = pod["spec"], self.pb
        policy = spec.get("dnsPolicy", "ClusterFirst")
        if policy == "ClusterFirst" and spec.get("hostNetwork"):
            policy = "Default"
        config = pb.DNSConfig()
        if policy in ("ClusterFirst", "ClusterFirstWithHostNet"):
            namespace = pod["metadata"]["namespace"]
            config.servers.append(self.host_ip)
            config.searches.extend(["%s.svc.cluster.local" % namespace, "svc.cluster.local", "cluster.local"])
            config.options.append("ndots:5")
        elif policy == "Default":
            with contextlib.suppress(OSError):
                for line in Path("/etc/resolv.conf").read_text().splitlines():
                    words = line.split()
                    if len(words) > 1 and words[0] == "nameserver":
                        config.servers.append(words[1])
                    elif len(words) > 1 and words[0] == "search":
                        config.searches.extend(words[1:])
                    elif len(words) > 1 and words[0] == "options":
                        config.options.extend(words[1:])
        extra = spec.get("dnsConfig") or {}
        config.servers.extend(extra.get("nameservers") or [])
        config.searches.extend(extra.get("searches") or [])
        config.options.extend("%s:%s" % (o["name"], o["value"]) if o.get("value") is not None else o["name"]
                              for o in extra.get("options") or [])
        return config

    def _seccomp(self, context):
        profile = (context or {}).get("seccompProfile") or {}
        kind = profile.get("type", "Unconfined")   # the kubelet's default without the SeccompDefault feature
        result = self.pb.SecurityProfile(profile_type=self.pb.SecurityProfile.ProfileType.Value(kind))
        if kind == "Localhost":
            result.localhost_ref = profile.get("localhostProfile", "")
        return result

    def pod_cgroup(self, pod):
        """The pod's cgroup as the kubelet's cgroupfs driver names it, below this node's own root."""
        qos = qos_class(pod)
        tier = "" if qos == "Guaranteed" else "/" + qos.lower()
        return "%s/kubepods%s/pod%s" % (self.cgroup_root, tier, pod["metadata"]["uid"])

    def pod_dir(self, pod):
        return self.kubelet_root / "pods" / pod["metadata"]["uid"]

    def pod_log_dir(self, pod):
        meta = pod["metadata"]
        return self.log_root / ("%s_%s_%s" % (meta["namespace"], meta["name"], meta["uid"]))

    def _run_sandbox(self, record):
        pod = record.pod
        handler = self._handler(pod)
        config = self.sandbox_config(pod, record.sandbox_attempt)
        self.pod_log_dir(pod).mkdir(parents=True, exist_ok=True)
        self.pod_dir(pod).mkdir(parents=True, exist_ok=True)
        try:
            response = self.cri.call("runtime", "RunPodSandbox",
                                     self.pb.RunPodSandboxRequest(config=config, runtime_handler=handler))
        except self.cri.grpc.RpcError as exc:
            raise PodError("FailedCreatePodSandBox", "Failed to create pod sandbox: " + rpc_error(exc)) from None
        record.sandbox_id, record.sandbox_config, record.handler = response.pod_sandbox_id, config, handler
        record.sandbox_error = None
        status = self.cri.call("runtime", "PodSandboxStatus",
                               self.pb.PodSandboxStatusRequest(pod_sandbox_id=record.sandbox_id))
        record.pod_ip = self.host_ip if pod["spec"].get("hostNetwork") else status.status.network.ip
        self.events.append((pod["metadata"]["name"], "sandbox", record.sandbox_id))

    def _sandbox_ready(self, record):
        """True, False (not ready, or gone), or None when the runtime does not answer."""
        try:
            status = self.cri.call("runtime", "PodSandboxStatus",
                                   self.pb.PodSandboxStatusRequest(pod_sandbox_id=record.sandbox_id), timeout=30)
        except self.cri.grpc.RpcError as exc:
            return False if exc.code() == self.cri.grpc.StatusCode.NOT_FOUND else None
        return status.status.state == self.pb.SANDBOX_READY

    # -- containers --------------------------------------------------------------------------------------
    def _sync_container(self, record, index, container, state):
        pb, now = self.pb, time.monotonic()
        if state.id is not None:
            try:
                status = self.cri.call("runtime", "ContainerStatus",
                                       pb.ContainerStatusRequest(container_id=state.id), timeout=30).status
            except self.cri.grpc.RpcError as exc:
                if exc.code() != self.cri.grpc.StatusCode.NOT_FOUND:
                    return   # the runtime does not answer: the container's state is unknown, not changed
                status = None
            if status is not None and status.state in (pb.CONTAINER_RUNNING, pb.CONTAINER_CREATED):
                state.observe(status)
                self._probe(record, container, state)
                return
            state.observe(status)
            state.ready = False
            policy = record.pod["spec"].get("restartPolicy", "Always")
            failed = status is None or status.exit_code != 0
            if policy == "Never" or (policy == "OnFailure" and not failed):
                return
            if state.restart_at is None:  # CrashLoopBackOff: 10 s, doubling, at most 5 min
                state.restart_at = now + min(300, 10 * 2 ** min(state.restart_count, 5))
                state.waiting = ("CrashLoopBackOff", "back-off restarting failed container %s in pod %s" % (
                    container["name"], record.pod["metadata"]["name"]))
            if now < state.restart_at:
                return
            state.last_terminated = state.terminated
            state.restart_count += 1
            state.id, state.restart_at = None, None
        if now < state.backoff_until:
            return
        try:
            image_ref = self._ensure_image(record, container, state)
            config = self.container_config(record, index, container, state.restart_count, image_ref)
        except PodError as exc:
            state.fail(exc.reason, exc.message, now)
            self._event(record.pod, "Warning", "Failed", exc.message)
            return
        except ConfigError as exc:
            state.fail("CreateContainerConfigError", str(exc), now)
            self._event(record.pod, "Warning", "Failed", "Error: " + str(exc))
            return
        try:
            created = self.cri.call("runtime", "CreateContainer", pb.CreateContainerRequest(
                pod_sandbox_id=record.sandbox_id, config=config, sandbox_config=record.sandbox_config))
        except self.cri.grpc.RpcError as exc:
            state.fail("CreateContainerError", rpc_error(exc), now)
            self._event(record.pod, "Warning", "Failed", "Error: " + rpc_error(exc))
            return
        state.id = created.container_id
        self.events.append((record.pod["metadata"]["name"], "created", state.id))
        try:
            self.cri.call("runtime", "StartContainer", pb.StartContainerRequest(container_id=state.id))
        except self.cri.grpc.RpcError as exc:
            state.fail("RunContainerError", rpc_error(exc), now)
            self._event(record.pod, "Warning", "Failed", "Error: " + rpc_error(exc))
            return
        state.waiting, state.started_mono, state.probe_due = None, now, now + self._probe_spec(container)[
            "initialDelaySeconds"]
        self.events.append((record.pod["metadata"]["name"], "started", state.id))

    def _ensure_image(self, record, container, state):
        """The kubelet's image manager: ImageStatus, then PullImage when the policy asks for it. On these nodes a
        pull never leaves the machine (every registry is a refused local port): a missing image is ErrImagePull."""
        pb, image = self.pb, container["image"]
        policy = container.get("imagePullPolicy") or ("Always" if ":" not in image.rsplit("/", 1)[-1]
                                                      or image.endswith(":latest") else "IfNotPresent")
        present = self.cri.call("images", "ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=image)))
        if present.image.id and policy != "Always":
            return present.image.id
        if policy == "Never":
            raise PodError("ErrImageNeverPull",
                           "Container image \"%s\" is not present with pull policy of Never" % image)
        if state.pull_failures and time.monotonic() < state.backoff_until:
            raise PodError("ImagePullBackOff", "Back-off pulling image \"%s\"" % image)
        try:
            pulled = self.cri.call("images", "PullImage", pb.PullImageRequest(
                image=pb.ImageSpec(image=image), sandbox_config=record.sandbox_config))
        except self.cri.grpc.RpcError as exc:
            state.pull_failures += 1
            raise PodError("ErrImagePull", "Failed to pull image \"%s\": %s" % (image, rpc_error(exc))) from None
        state.pull_failures = 0
        return pulled.image_ref

    def container_config(self, record, index, container, restart_count, image_ref):
        """The ContainerConfig the kubelet builds (kuberuntime generateContainerConfig)."""
        pb, pod = self.pb, record.pod
        meta, spec = pod["metadata"], pod["spec"]
        env = self.container_env(record, container)
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=container["name"], attempt=restart_count),
            image=pb.ImageSpec(image=image_ref, user_specified_image=container["image"]),
            command=[expand(c, env) for c in container.get("command") or []],
            args=[expand(a, env) for a in container.get("args") or []],
            working_dir=container.get("workingDir", ""),
            log_path="%s/%d.log" % (container["name"], restart_count),
            stdin=bool(container.get("stdin")), stdin_once=bool(container.get("stdinOnce")),
            tty=bool(container.get("tty")))
        for key, value in env.items():
            config.envs.add(key=key, value=value)
        (self.pod_log_dir(pod) / container["name"]).mkdir(parents=True, exist_ok=True)
        config.labels.update({"io.kubernetes.container.name": container["name"],
                              "io.kubernetes.pod.name": meta["name"], "io.kubernetes.pod.namespace": meta["namespace"],
                              "io.kubernetes.pod.uid": meta["uid"]})
        grace = spec.get("terminationGracePeriodSeconds", 30)
        annotations = {
            "io.kubernetes.container.hash": format(fnv32a(json.dumps(container, sort_keys=True).encode()), "x"),
            "io.kubernetes.container.restartCount": str(restart_count),
            "io.kubernetes.container.terminationMessagePath":
                container.get("terminationMessagePath", "/dev/termination-log"),
            "io.kubernetes.container.terminationMessagePolicy": container.get("terminationMessagePolicy", "File"),
            "io.kubernetes.pod.terminationGracePeriod": str(grace)}
        if container.get("ports"):
            annotations["io.kubernetes.container.ports"] = json.dumps(
                [{k: v for k, v in port.items() if k in ("name", "containerPort", "protocol", "hostPort")}
                 | {"protocol": port.get("protocol", "TCP")} for port in container["ports"]], separators=(",", ":"))
        if meta.get("deletionGracePeriodSeconds") is not None:
            annotations["io.kubernetes.pod.deletionGracePeriod"] = str(meta["deletionGracePeriodSeconds"])
        config.annotations.update(annotations)
        for mount in self.container_mounts(record, container):
            config.mounts.append(mount)
        for host, inside, permissions in self.devices(pod, container):
            config.devices.add(host_path=host, container_path=inside, permissions=permissions)
        self._linux(config.linux, pod, container)
        return config

    def _linux(self, linux, pod, container):
        pb = self.pb
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        cpu_request = requests.get("cpu", limits.get("cpu"))
        linux.resources.cpu_shares = max(2, int(quantity(cpu_request) * 1024)) if cpu_request else 2
        if "cpu" in limits:
            linux.resources.cpu_period = 100000
            linux.resources.cpu_quota = max(1000, int(quantity(limits["cpu"]) * 100000))
        if "memory" in limits:
            linux.resources.memory_limit_in_bytes = int(quantity(limits["memory"]))
        qos = qos_class(pod)
        if qos == "Guaranteed":
            linux.resources.oom_score_adj = -997
        elif qos == "BestEffort":
            linux.resources.oom_score_adj = 1000
        else:
            memory = quantity(requests.get("memory", 0)) if requests.get("memory") else 0
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            linux.resources.oom_score_adj = int(min(999, max(2, 1000 - (1000 * memory) // total)))
        context = dict((pod["spec"].get("securityContext") or {}))
        context.update(container.get("securityContext") or {})
        security = linux.security_context
        privileged = bool(context.get("privileged"))
        security.privileged = privileged
        capabilities = context.get("capabilities") or {}
        security.capabilities.add_capabilities.extend(capabilities.get("add") or [])
        security.capabilities.drop_capabilities.extend(capabilities.get("drop") or [])
        if "runAsUser" in context:
            security.run_as_user.value = int(context["runAsUser"])
        if "runAsGroup" in context:
            security.run_as_group.value = int(context["runAsGroup"])
        security.readonly_rootfs = bool(context.get("readOnlyRootFilesystem"))
        security.no_new_privs = context.get("allowPrivilegeEscalation") is False
        pod_context = pod["spec"].get("securityContext") or {}
        security.supplemental_groups.extend(int(g) for g in pod_context.get("supplementalGroups") or [])
        if "fsGroup" in pod_context:
            security.supplemental_groups.append(int(pod_context["fsGroup"]))
        if not privileged and context.get("procMount", "Default") == "Default":
            security.masked_paths.extend(DEFAULT_MASKED_PATHS)
            security.readonly_paths.extend(DEFAULT_READONLY_PATHS)
        spec = pod["spec"]
        security.namespace_options.network = pb.NODE if spec.get("hostNetwork") else pb.POD
        security.namespace_options.pid = (pb.NODE if spec.get("hostPID") else
                                          pb.POD if spec.get("shareProcessNamespace") else pb.CONTAINER)
        security.namespace_options.ipc = pb.NODE if spec.get("hostIPC") else pb.POD
        security.seccomp.CopyFrom(self._seccomp(context))

    def container_env(self, record, container):
        """The container's environment as the kubelet resolves it when it creates the container: literal values
        with $(VAR) expanded against the variables before them, fieldRefs of the pod (status.podIP included: the
        sandbox has its address by then), configMapKeyRef from the API; what it cannot resolve is a config error."""
        pod, env = record.pod, {}
        for item in container.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                env[item["name"]] = expand(item.get("value", ""), env)
            elif "fieldRef" in source:
                env[item["name"]] = self.field(record, source["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                try:
                    data = raw(self.core.read_namespaced_config_map(ref["name"], pod["metadata"]["namespace"],
                                                                    _preload_content=False)).get("data") or {}
                except kubernetes.client.exceptions.ApiException:
                    data = None
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise ConfigError("configmap \"%s\" (key %s) not found" % (ref["name"], ref["key"]))
                env[item["name"]] = data[ref["key"]]
            else:
                raise ConfigError("env %s: %s is not reproduced by the kubelet stand-in" % (
                    item["name"], ", ".join(source)))
        return env

    def field(self, record, path):
        pod = record.pod
        meta = pod["metadata"]
        for prefix, values in (("metadata.annotations['", meta.get("annotations") or {}),
                               ("metadata.labels['", meta.get("labels") or {})):
            if path.startswith(prefix):
                return values.get(path[len(prefix):-2], "")
        values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
                  "spec.nodeName": pod["spec"].get("nodeName", ""),
                  "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
                  "status.hostIP": self.host_ip, "status.hostIPs": self.host_ip,
                  "status.podIP": record.pod_ip or "", "status.podIPs": record.pod_ip or ""}
        if path not in values:
            raise ConfigError("fieldRef %s is not reproduced by the kubelet stand-in" % path)
        return values[path]

    def container_mounts(self, record, container):
        """Volume mounts as the kubelet sets up volumes below its pod directory (pods/<uid>/volumes/<plugin>/<name>):
        hostPath, emptyDir, downwardAPI (files written once, at creation), configMap; then the kubelet's own
        /etc/hosts (pods not on the host network) and termination-log files."""
        pb, pod = self.pb, record.pod
        volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
        base = self.pod_dir(pod) / "volumes"
        propagation = {"None": pb.PROPAGATION_PRIVATE, "HostToContainer": pb.PROPAGATION_HOST_TO_CONTAINER,
                       "Bidirectional": pb.PROPAGATION_BIDIRECTIONAL}
        mounts = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise ConfigError("volume %s not found in the pod" % mount["name"])
            if "hostPath" in volume:
                source = Path(volume["hostPath"]["path"])
                kind = volume["hostPath"].get("type", "")
                if kind == "DirectoryOrCreate":
                    source.mkdir(parents=True, exist_ok=True)
                elif kind == "Directory" and not source.is_dir():
                    raise ConfigError("hostPath type check failed: %s is not a directory" % source)
            elif "emptyDir" in volume:
                source = base / "kubernetes.io~empty-dir" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
            elif "downwardAPI" in volume:
                source = base / "kubernetes.io~downward-api" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
                for item in volume["downwardAPI"].get("items") or []:
                    (source / item["path"]).write_text(self.field(record, item["fieldRef"]["fieldPath"]) or "")
            elif "configMap" in volume:
                source = base / "kubernetes.io~configmap" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
                try:
                    data = raw(self.core.read_namespaced_config_map(
                        volume["configMap"]["name"], pod["metadata"]["namespace"],
                        _preload_content=False)).get("data") or {}
                except kubernetes.client.exceptions.ApiException as exc:
                    raise ConfigError("configmap \"%s\" not found" % volume["configMap"]["name"]) from exc
                for key, value in data.items():
                    (source / key).write_text(value)
            else:
                raise ConfigError("volume %s: %s volumes are not reproduced by the kubelet stand-in" % (
                    mount["name"], ", ".join(k for k in volume if k != "name")))
            host_path = source / mount["subPath"] if mount.get("subPath") else source
            mounts.append(pb.Mount(container_path=mount["mountPath"], host_path=str(host_path),
                                   readonly=bool(mount.get("readOnly")),
                                   propagation=propagation[mount.get("mountPropagation", "None")]))
        if not pod["spec"].get("hostNetwork"):
            hosts = self.pod_dir(pod) / "etc-hosts"
            hostname = (pod["spec"].get("hostname") or pod["metadata"]["name"])[:63]
            hosts.write_text("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost "
                             "ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\n"
                             "fe00::2\tip6-allrouters\n%s\t%s\n" % (record.pod_ip, hostname))
            mounts.append(pb.Mount(container_path="/etc/hosts", host_path=str(hosts)))
        termination = self.pod_dir(pod) / "containers" / container["name"] / secrets.token_hex(4)
        termination.parent.mkdir(parents=True, exist_ok=True)
        termination.touch()
        mounts.append(pb.Mount(container_path=container.get("terminationMessagePath", "/dev/termination-log"),
                               host_path=str(termination)))
        return mounts

    # -- readiness -----------------------------------------------------------------------------------------
    @staticmethod
    def _probe_spec(container):
        probe = container.get("readinessProbe") or {}
        return {"initialDelaySeconds": probe.get("initialDelaySeconds", 0),
                "periodSeconds": probe.get("periodSeconds", 10), "timeoutSeconds": probe.get("timeoutSeconds", 1),
                "successThreshold": probe.get("successThreshold", 1),
                "failureThreshold": probe.get("failureThreshold", 3), "httpGet": probe.get("httpGet"),
                "defined": bool(probe)}

    def _probe(self, record, container, state):
        """The kubelet's readiness prober: HTTP GET to the pod's IP from the node, every periodSeconds."""
        spec = self._probe_spec(container)
        if state.status_state != self.pb.CONTAINER_RUNNING:
            state.ready = False
            return
        if not spec["defined"]:
            state.ready = True
            return
        now = time.monotonic()
        if now < state.probe_due:
            return
        state.probe_due = now + spec["periodSeconds"]
        get = spec["httpGet"]
        if get is None:
            self.errors.append("readiness probe of %s: only httpGet is reproduced" % container["name"])
            return
        port = get["port"]
        if isinstance(port, str) and not port.isdigit():
            port = next(p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port)
        host = get.get("host") or record.pod_ip
        url = "%s://%s:%s%s" % (get.get("scheme", "HTTP").lower(), host, port, get.get("path", "/"))
        ok = self.http_ok(url, timeout=max(1, spec["timeoutSeconds"]),
                          headers={h["name"]: h["value"] for h in get.get("httpHeaders") or []})
        if ok:
            state.successes, state.failures = state.successes + 1, 0
            if state.successes >= spec["successThreshold"]:
                state.ready = True
        else:
            state.failures, state.successes = state.failures + 1, 0
            if state.failures >= spec["failureThreshold"] or not state.ready:
                state.ready = False

    def http_ok(self, url, timeout=1, headers=None):
        """One probe: 200 <= status < 400, as the kubelet counts it (User-Agent kube-probe/<version>)."""
        import http.client  # pylint: disable=import-outside-toplevel
        parts = urllib.parse.urlsplit(url)
        self._local_target(parts.hostname)
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
        try:
            connection.request("GET", (parts.path or "/") + ("?" + parts.query if parts.query else ""),
                               headers=dict({"User-Agent": "kube-probe/1.30", "Accept": "*/*"}, **(headers or {})))
            return 200 <= connection.getresponse().status < 400
        except OSError:
            return False
        finally:
            connection.close()

    def _local_target(self, host):
        """Probes go to this node's pods and its own address, never elsewhere."""
        address = ipaddress.ip_address(host)
        if address not in self.subnet:
            raise AssertionError("the kubelet stand-in of %s refuses to probe %s: not on its bridge %s" % (
                self.node, host, self.subnet))
        if not Path("/sys/class/net", self.info["bridge"]).exists():
            raise AssertionError("the bridge %s of %s is gone" % (self.info["bridge"], self.node))

    # -- status ------------------------------------------------------------------------------------------
    def _report(self, record):
        """The pod's status as the kubelet's status manager writes it (a merge patch of the status subresource,
        for this uid only)."""
        pod = record.pod
        spec = pod["spec"]
        statuses, running, ready, terminated_all = [], 0, True, True
        for container in spec["containers"]:
            state = record.containers.get(container["name"]) or ContainerRecord(container["name"])
            entry = {"name": container["name"], "image": container["image"], "imageID": state.image_ref or "",
                     "ready": bool(state.ready), "restartCount": state.restart_count,
                     "started": state.status_state == self.pb.CONTAINER_RUNNING}
            if state.id:
                entry["containerID"] = "containerd://" + state.id
            if state.waiting is not None or state.id is None:
                reason, message = state.waiting or ("ContainerCreating", None)
                entry["state"] = {"waiting": {"reason": reason} | ({"message": message} if message else {})}
            elif state.status_state == self.pb.CONTAINER_RUNNING:
                entry["state"] = {"running": {"startedAt": state.started_at}}
                running += 1
            elif state.terminated is not None:
                entry["state"] = {"terminated": state.terminated}
            else:
                entry["state"] = {"waiting": {"reason": "ContainerCreating"}}
            if state.last_terminated:
                entry["lastState"] = {"terminated": state.last_terminated}
            terminated_all = terminated_all and "terminated" in entry["state"]
            ready = ready and entry["ready"]
            statuses.append(entry)
        now = now_rfc3339()
        sandbox_ok = record.sandbox_id is not None and record.sandbox_error is None
        conditions = [
            {"type": "PodReadyToStartContainers", "status": "True" if sandbox_ok else "False"},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
            {"type": "ContainersReady", "status": "True" if ready else "False"},
            {"type": "PodScheduled", "status": "True"}]
        if record.sandbox_error is not None:
            # deviation: a real kubelet leaves this reason in an Event only (also posted, _event)
            conditions[0].update({"reason": record.sandbox_error[0], "message": record.sandbox_error[1]})
        if not ready:
            names = [s["name"] for s in statuses if not s["ready"]]
            for condition in conditions[2:4]:
                condition.update({"reason": "ContainersNotReady",
                                  "message": "containers with unready status: [%s]" % " ".join(names)})
        policy = spec.get("restartPolicy", "Always")
        phase = "Pending"
        if running:
            phase = "Running"
        elif terminated_all and statuses and policy != "Always":
            phase = "Succeeded" if all(s["state"]["terminated"].get("exitCode") == 0 for s in statuses) else "Failed"
        status = {"phase": phase, "hostIP": self.host_ip, "hostIPs": [{"ip": self.host_ip}],
                  "qosClass": qos_class(pod), "containerStatuses": statuses, "conditions": conditions}
        if record.pod_ip:
            status["podIP"], status["podIPs"] = record.pod_ip, [{"ip": record.pod_ip}]
        status["startTime"] = record.start_time
        comparable = json.dumps(status, sort_keys=True)
        if comparable == record.last_report:
            return
        for condition in conditions:
            condition["lastTransitionTime"] = record.transitions.setdefault(
                (condition["type"], condition["status"]), now)
        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"],
                                                  {"metadata": {"uid": meta["uid"]}, "status": status},
                                                  _content_type=MERGE, _preload_content=False)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status not in (404, 409):
                raise
            return
        record.last_report = comparable

    def _event(self, pod, kind, reason, message):
        """An Event about the pod, as the kubelet records one (once per reason and message)."""
        meta = pod["metadata"]
        key = (meta["uid"], reason, message)
        if key in self._events_sent:
            return
        self._events_sent.add(key)
        now = now_rfc3339()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "%s.%s" % (meta["name"], secrets.token_hex(8)), "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta["uid"]},
                "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": now,
                "lastTimestamp": now, "source": {"component": "kubelet", "host": self.node},
                "reportingComponent": "kubelet", "reportingInstance": self.node}
        with contextlib.suppress(kubernetes.client.exceptions.ApiException):
            self.core.create_namespaced_event(meta["namespace"], body, _preload_content=False)
        self.events.append((meta["name"], "event", "%s: %s" % (reason, message)))

    _events_sent = set()

    def _register_node(self):
        """The Node object the kubelet registers (when the emulator serves nodes)."""
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node,
                                                           "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
                "spec": {"podCIDR": self.info["subnet"], "podCIDRs": [self.info["subnet"]]},
                "status": {"addresses": [{"type": "InternalIP", "address": self.host_ip},
                                         {"type": "Hostname", "address": self.node}],
                           "nodeInfo": {"containerRuntimeVersion": "%s://%s" % (
                               self.version.runtime_name, self.version.runtime_version),
                               "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                               "architecture": "amd64", "kernelVersion": os.uname().release,
                               "osImage": _os_image(), "bootID": _read("/proc/sys/kernel/random/boot_id"),
                               "machineID": _read("/etc/machine-id"), "systemUUID": ""},
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}
        try:
            self.core.create_node(body, _preload_content=False)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 409:
                with contextlib.suppress(kubernetes.client.exceptions.ApiException):
                    self.core.patch_node(self.node, body, _content_type=MERGE, _preload_content=False)
            elif exc.status != 404:  # an emulator that serves no nodes
                raise

    # -- deletion ----------------------------------------------------------------------------------------
    def _kill(self, record, remove=True, keep_record=False):
        """The kubelet's killPod and then its garbage collection: StopContainer (the grace period), StopPodSandbox,
        RemoveContainer, RemovePodSandbox; the pod's directory, logs and cgroup go with it."""
        pb = self.pb
        grace = int(record.pod["spec"].get("terminationGracePeriodSeconds", 30))
        for state in record.containers.values():
            if state.id:
                with contextlib.suppress(self.cri.grpc.RpcError):
                    self.cri.call("runtime", "StopContainer", pb.StopContainerRequest(container_id=state.id,
                                                                                      timeout=grace),
                                  timeout=grace + 60)
        if record.sandbox_id:
            self._retry("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=record.sandbox_id))
        if remove:
            for state in record.containers.values():
                if state.id:
                    with contextlib.suppress(self.cri.grpc.RpcError):
                        self.cri.call("runtime", "RemoveContainer", pb.RemoveContainerRequest(container_id=state.id))
            if record.sandbox_id:
                self._retry("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=record.sandbox_id))
        self.events.append((record.pod["metadata"]["name"], "removed", record.sandbox_id))
        if keep_record:
            record.sandbox_id, record.containers = None, {}
            return
        shutil.rmtree(self.pod_dir(record.pod), ignore_errors=True)
        shutil.rmtree(self.pod_log_dir(record.pod), ignore_errors=True)
        remove_cgroup(self.pod_cgroup(record.pod))

    def _retry(self, method, request, attempts=3):
        """A sandbox call the kubelet would retry on its next sync: here at once, up to ``attempts`` times."""
        for attempt in range(attempts):
            try:
                return self.cri.call("runtime", method, request)
            except self.cri.grpc.RpcError as exc:
                if attempt == attempts - 1:
                    self.errors.append("%s: %s" % (method, rpc_error(exc)))
                    raise
                time.sleep(0.5)
        return None

    def _collect_orphans(self):
        """The kubelet's garbage collection of sandboxes whose pod is gone: here, the sandboxes of stand-ins that
        no longer run (a killed test run, another worker's stand-in that stopped without cleaning up). Sandboxes
        of live stand-ins of other processes are theirs."""
        pb = self.pb
        try:
            listed = self.cri.call("runtime", "ListPodSandbox", pb.ListPodSandboxRequest(), timeout=30).items
        except self.cri.grpc.RpcError as exc:
            if exc.code() == self.cri.grpc.StatusCode.UNAVAILABLE:
                return   # containerd restarting: next time
            raise
        for sandbox in listed:
            owner = sandbox.labels.get(OWNER_LABEL)
            if not owner or _owner_alive(owner):
                continue
            with contextlib.suppress(self.cri.grpc.RpcError):
                containers = self.cri.call("runtime", "ListContainers", pb.ListContainersRequest(
                    filter=pb.ContainerFilter(pod_sandbox_id=sandbox.id)), timeout=30).containers
                for container in containers:
                    self.cri.call("runtime", "StopContainer", pb.StopContainerRequest(container_id=container.id,
                                                                                      timeout=0))
                self.cri.call("runtime", "StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox.id))
                for container in containers:
                    self.cri.call("runtime", "RemoveContainer", pb.RemoveContainerRequest(container_id=container.id))
                self.cri.call("runtime", "RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id))
                self.events.append((sandbox.metadata.name, "orphan removed", sandbox.id))
            meta = sandbox.metadata
            shutil.rmtree(self.kubelet_root / "pods" / meta.uid, ignore_errors=True)
            shutil.rmtree(self.log_root / ("%s_%s_%s" % (meta.namespace, meta.name, meta.uid)), ignore_errors=True)
            pids = Path("/sys/fs/cgroup/pids" + self.cgroup_root)
            for cgroup in (pids.rglob("pod" + meta.uid) if pids.is_dir() else []):
                remove_cgroup(str(cgroup)[len("/sys/fs/cgroup/pids"):])

    # -- for the tests -----------------------------------------------------------------------------------
    def abandon(self):
        """What a killed test run leaves: the stand-in stops at once and cleans nothing up (its sandboxes become
        orphans for the next stand-in's garbage collection)."""
        self._stop.set()
        self._changed.set()
        self._syncer.join(180)
        CriKubelet._live.discard(self.owner)
        self.workers.clear()
        self.cri.close()

    def get(self, url, timeout=10):
        """(status, body) of a GET from this node to one of its pods (refused for any other address)."""
        import http.client  # pylint: disable=import-outside-toplevel
        parts = urllib.parse.urlsplit(url)
        self._local_target(parts.hostname)
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
        try:
            connection.request("GET", (parts.path or "/") + ("?" + parts.query if parts.query else ""))
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def record(self, namespace, name):
        """The stand-in's record of a pod (its sandbox id, pod IP, containers), or None."""
        for record in list(self.workers.values()):
            meta = record.pod["metadata"]
            if (meta["namespace"], meta["name"]) == (namespace, name):
                return record
        return None

    def wait(self, predicate, what, timeout=120):
        """Until ``predicate()`` is true (its value), or fail naming ``what`` and the stand-in's errors."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError("timed out waiting for %s; kubelet %s errors: %s; events: %s" % (
            what, self.node, self.errors[-3:], self.events[-10:]))


def record_seen(pod):
    return pod["metadata"].get("creationTimestamp") or now_rfc3339()


class PodRecord:
    """What the stand-in knows of one pod (one uid) on its node."""

    def __init__(self, pod):
        self.pod = pod
        self.sandbox_id = None
        self.sandbox_config = None
        self.sandbox_attempt = 0
        self.sandbox_error = None
        self.handler = None
        self.pod_ip = None
        self.containers = {}
        self.backoff_until = 0.0
        self.sandbox_failures = 0
        self.last_report = None
        self.transitions = {}
        self.start_time = now_rfc3339()

    def fail_sandbox(self, reason, message):
        self.sandbox_error = (reason, message)
        self.sandbox_failures += 1
        self.backoff_until = time.monotonic() + min(10, 2 ** (self.sandbox_failures - 1))
        for state in self.containers.values():
            state.waiting = ("ContainerCreating", None)
        for container in self.pod["spec"]["containers"]:
            self.containers.setdefault(container["name"], ContainerRecord(container["name"]))


def stamp(nanoseconds):
    """A CRI time (ns since the epoch) as the API writes times."""
    return datetime.datetime.fromtimestamp(nanoseconds / 1e9, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ContainerRecord:
    def __init__(self, name):
        self.name = name
        self.id = None
        self.image_ref = None
        self.status_state = None
        self.started_at = None
        self.started_mono = None
        self.terminated = None
        self.last_terminated = None
        self.restart_count = 0
        self.restart_at = None
        self.waiting = None
        self.failures_create = 0
        self.pull_failures = 0
        self.backoff_until = 0.0
        self.ready = False
        self.probe_due = 0.0
        self.successes = 0
        self.failures = 0

    def fail(self, reason, message, now):
        self.waiting = (reason, message)
        self.failures_create += 1
        self.backoff_until = now + min(10, 2 ** (self.failures_create - 1))

    def observe(self, status):
        if status is None:
            self.status_state = None
            self.terminated = {"exitCode": 137, "reason": "ContainerStatusUnknown",
                               "message": "The container could not be located when the pod was terminated"}
            return
        self.status_state = status.state
        self.image_ref = status.image_ref or self.image_ref
        if status.started_at:
            self.started_at = stamp(status.started_at)
        if status.state == 2:  # CONTAINER_EXITED
            self.terminated = {"exitCode": status.exit_code, "reason": status.reason or "Error",
                               "containerID": "containerd://" + status.id}
            if status.started_at:
                self.terminated["startedAt"] = stamp(status.started_at)
            if status.finished_at:
                self.terminated["finishedAt"] = stamp(status.finished_at)
            if status.message:
                self.terminated["message"] = status.message
        else:
            self.terminated = None
            if status.state == 1:
                self.waiting = None


def simulated_npu(pod, container):
    """The Ascend device plugin's allocation for ``container`` as CRI devices: huawei.com/Ascend910 chips of the
    simulated NPU whose memory is the pod's ``npu`` hostPath volume (davinci0.. and davinci_manager)."""
    count = int(((container.get("resources") or {}).get("limits") or {}).get(NPU_RESOURCE, 0))
    if not count:
        return []
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes") or []}
    if "hostPath" not in volumes.get("npu", {}):
        raise ConfigError("a container asking for %s needs its simulated NPU (hostPath volume npu)" % NPU_RESOURCE)
    args = device_args(volumes["npu"]["hostPath"]["path"], *range(count))
    devices = []
    for flag, value in zip(args[::2], args[1::2]):
        assert flag == "--device", args
        host, inside = value.split(":", 1)
        devices.append((host, inside, "rwm"))
    return devices


def remove_cgroup(path):
    """The pod's cgroup (cgroupfs) in every hierarchy, once its processes are gone."""
    relative = path.strip("/")
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        target = hierarchy / relative
        if not target.is_dir():
            continue
        for directory in sorted((p for p in target.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            target.rmdir()


def _read(path):
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _os_image():
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "linux"


def _start_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(owner):
    """Whether the stand-in ``owner`` ("<pid>-<start ticks>-<token>") still runs."""
    try:
        pid, ticks, _token = owner.split("-")
    except ValueError:
        return True   # not ours to judge
    if int(pid) == os.getpid():
        return owner in CriKubelet._live
    return _start_ticks(int(pid)) == ticks


# ------------------------------------------------------------------------------------------------ the OCI side
def oci_config(status, container_id):
    """The OCI runtime config containerd wrote for a container (its bundle in the node's state dir)."""
    path = Path(status["state"]) / "io.containerd.runtime.v2.task" / "k8s.io" / container_id / "config.json"
    return json.loads(path.read_text())


def node_leftovers(status):
    """What of a node's pods is still on the machine: network namespaces, veths on its bridge, mounts below its
    state, pod cgroups (empty when the node runs no pod)."""
    netns = Path(status["state"]) / "io.containerd.grpc.v1.cri" / "netns"
    namespaces = sorted(p.name for p in netns.iterdir()) if netns.is_dir() else []
    veths = subprocess.run(["ip", "-o", "link", "show", "master", status["bridge"]], capture_output=True, text=True,
                           check=False).stdout.split("\n")
    veths = [line.split(": ")[1].split("@")[0] for line in veths if ": " in line]
    with open("/proc/self/mountinfo") as handle:
        mounts = [line.split()[4] for line in handle if line.split()[4].startswith(status["state"] + "/")]
    cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup/pids" + status["cgroup_parent"]).rglob("pod*")) \
        if Path("/sys/fs/cgroup/pids" + status["cgroup_parent"]).is_dir() else []
    return {"netns": namespaces, "veths": veths, "mounts": mounts, "cgroups": cgroups}


def cri_section(status):
    """The CRI plugin's whole section of the node's effective config (``containerd config dump``: config.toml and
    its drop-ins merged), as TOML text. containerd 1.6 merges an imported file into the config one plugin at a time:
    the imported file's ``[plugins."io.containerd.grpc.v1.cri"]`` replaces the whole section, so a drop-in that adds
    a runtime handler must carry this section with its handler added (tests/integration/test_cri_node.py shows
    both: a drop-in with the handler alone leaves the node without its CRI plugin)."""
    dump = subprocess.run(["containerd", "--config", status["config"], "config", "dump"], capture_output=True,
                          text=True, check=True).stdout
    lines, inside = [], False
    for line in dump.splitlines():
        header = line.strip()
        if header.startswith("[plugins."):
            inside = header.startswith('[plugins."io.containerd.grpc.v1.cri"')
        elif header.startswith("[") and not header.startswith("[plugins"):
            inside = False
        if inside:
            lines.append(line)
    return "\n".join(lines) + "\n"


def workload_pod(name, namespace, node, device_dir, npu_root, port=8000, runtime_class=None, annotations=None,
                 grace=5, **kwargs):
    """The sample engine's pod for a CRI node: _k8s_helpers.workload_pod on the pod network (its own network
    namespace, a CNI address), the engine listening on its pod IP (WORKLOAD_HOST from status.podIP, as an engine
    bound to its pod address is), the image used as the node has it (imagePullPolicy IfNotPresent: nothing is ever
    pulled), readiness probed every second."""
    from _k8s_helpers import workload_pod as base  # pylint: disable=import-outside-toplevel
    pod = base(name, namespace, kwargs.pop("service", "svc"), kwargs.pop("instance", "p0"),
               kwargs.pop("image", "inferops/workload:latest"), port, device_dir, npu_root, host_network=False,
               node=node, runtime_class=runtime_class, **kwargs)
    container = pod["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    container["env"].append({"name": "WORKLOAD_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    container["readinessProbe"]["periodSeconds"] = 1
    pod["spec"]["terminationGracePeriodSeconds"] = grace
    if annotations:
        pod["metadata"]["annotations"] = dict(annotations)
    return pod


def pause_pod(name, namespace, node, runtime_class=None, annotations=None, image="docker.io/inferops-cri/pause:local"):
    """A pod whose one container is the node's pause image (nothing to pull, nothing to import, starts at once)."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "labels": {"app": name},
                        "annotations": dict(annotations or {})},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never"}]}}
    if runtime_class:
        pod["spec"]["runtimeClassName"] = runtime_class
    return pod

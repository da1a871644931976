"""Shared test fixtures: the simulator library, the sample workload under the agent, and a way to
run the collection's modules exactly as Ansible runs them (ansible ad-hoc, real AnsiballZ)."""

import contextlib
import datetime
import fcntl
import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULE_UTILS = REPO / "plugins" / "module_utils"
BUILD = REPO / "build"
COLLECTIONS = BUILD / "collections"
WORKLOAD = REPO / "tests" / "workload" / "workload.py"
BIN = Path(sys.executable).parent


def ensure_collection_link():
    """Ansible finds the checkout as inferops.snapshot through this link (same as `make collection`)."""
    link = COLLECTIONS / "ansible_collections" / "inferops" / "snapshot"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        if link.exists():
            shutil.rmtree(link)
        with contextlib.suppress(FileExistsError):  # another pytest worker made it just now
            link.symlink_to(REPO)
    return COLLECTIONS


def build_and_install_collection(base):
    """The collection as a user gets it, below ``base``: ansible-galaxy collection build (galaxy.yml's build_ignore
    decides what ships), then install, offline and not through the checkout's link. (tarball, collections path)."""
    dist, installed = Path(base) / "dist", Path(base) / "collections"
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist), str(REPO)],
                   check=True, capture_output=True, text=True)
    tarballs = list(dist.glob("inferops-snapshot-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    clean = {k: v for k, v in os.environ.items() if k != "ANSIBLE_COLLECTIONS_PATH"}  # make exports the link's
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "--force", "-p", str(installed),
                    str(tarballs[0])], check=True, capture_output=True, text=True, env=clean)
    return tarballs[0], installed


@contextlib.contextmanager
def node_wide():
    """Held while a test changes what this node's dockerd knows (the snapshot_node role's read-modify-write of
    daemon.json, then SIGHUP): make test's pytest workers run in parallel, and two of these at once would lose
    one runtime. Everything else a test makes is its own (names, ports, directories)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    asked = time.monotonic()
    with open(BUILD / ".node-wide.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = time.monotonic()
        try:
            yield
        finally:
            # What each holder cost the others (build/node-wide.log): a worker waiting here does nothing else.
            with open(BUILD / "node-wide.log", "a") as log:
                log.write("%s waited %.0f s, held %.0f s\n" % (os.environ.get("PYTEST_CURRENT_TEST", "?"),
                                                               held - asked, time.monotonic() - held))


# make test runs two pytest workers, each taking a whole test file at a time (--dist loadfile), in the order
# collected. The slowest files go first so that the run does not end waiting on one of them (seconds per file
# from a serial run on the 2-core CI machine, docs/dev/environment.md).
SLOW_FILES_FIRST = (
    "test_k8s_snapshot.py", "test_restore_on_create.py", "test_roles.py", "test_ansible_versions.py",
    "test_prereqs_debian.py", "test_awx_ee.py", "test_doc_examples.py",
    "test_fleet_k8s.py", "test_lease_kill.py", "test_demo.py", "test_llama_engine.py", "test_shared_storage.py",
    "test_lazy_pages.py", "test_fleet_clone.py", "test_encryption.py", "test_prereqs.py", "test_multihost.py",
    "test_staged_restore.py", "test_tenants.py", "test_trust_by_default.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


# Unit tests import the collection's module_utils the way Ansible does.
sys.path.insert(0, str(ensure_collection_link()))

AGENT_PATH = BUILD / "agent"


def ensure_agent_package():
    """The agent folder as the package ``inferops_agent``, as an engine image has it (PYTHONPATH=AGENT_PATH)."""
    link = AGENT_PATH / "inferops_agent"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        with contextlib.suppress(FileExistsError):  # another pytest worker made it just now
            link.symlink_to(MODULE_UTILS / "core" / "agent")
    return AGENT_PATH


def agent_command(engine, python=sys.executable):
    """argv that runs ``engine`` under the agent launcher; the process needs agent_env()."""
    return [python, "-m", "inferops_agent", "--", str(engine)]


def agent_env(env=None):
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ensure_agent_package()), env.get("PYTHONPATH")) if p)
    return env


def old_agent_package(tmp_path):
    """A copy of the agent as an image built before leases has it: its protocol knows none of the request fields
    added since (lease, locks, nonce) nor the resumed operation. Its PYTHONPATH entry, for ``ensure_agent_package``'s
    place."""
    old = tmp_path / "old_agent" / "inferops_agent"
    shutil.copytree(str(MODULE_UTILS / "core" / "agent"), str(old))
    protocol = old / "protocol.py"
    known = '{"v", "op", "timeout", "lease", "locks", "device_memory", "nonce"}'
    operations = "OP_RENEW, OP_RELOCK, OP_RESUMED)"
    text = protocol.read_text()
    assert known in text and operations in text, "the agent's known request fields changed: make old_agent_package follow"
    protocol.write_text(text.replace(known, '{"v", "op", "timeout"}').replace(operations, "OP_RENEW, OP_RELOCK)"))
    return old.parent


@pytest.fixture(scope="session")
def simulator_library():
    out = BUILD / "simulator"
    subprocess.run(["bash", str(REPO / "tests" / "simulator" / "build.sh"), str(out)], check=True)
    lib = out / "libascendcl.so"
    assert lib.is_file(), "simulator build produced no %s" % lib
    return lib


# The simulated NPU's device nodes (docs/simulator.md "Device nodes"): what a real NPU process holds after its
# backup, and what CRIU dumps only through the collection's NPU plugin. Every simulated NPU of the tests has its
# own (install_devices), so that no two share a device number: a restore refuses a device another process holds.
ACLSIM_CTL = REPO / "tests" / "simulator" / "aclsim_ctl.py"


def aclsim_ctl(device_dir, *args):
    """tests/simulator/aclsim_ctl.py ``args`` for the simulated NPU in ``device_dir``; its stdout."""
    return subprocess.run([sys.executable, str(ACLSIM_CTL)] + [str(a) for a in args], check=True, capture_output=True,
                          text=True, env=dict(os.environ, ACL_SIM_DEVICE_DIR=str(device_dir))).stdout.strip()


def install_devices(device_dir, count=2):
    """The simulated driver for ``device_dir``: its device nodes (davinci0..count-1, davinci_manager), as a record
    {"nodes": their directory, "chips": {"0": [major, minor]}, "manager": [major, minor], "manager_node": path}."""
    return simulator_ctl().install(count, str(device_dir))


def device_args(device_dir, *devices):
    """``docker run`` options that give a container the simulated NPU of ``device_dir`` as NPU containers get their
    devices: --device for davinci<N> of each of ``devices`` (default 0) and davinci_manager, at /dev (installed
    first where needed)."""
    return simulator_ctl().docker_args(devices or (0,), str(device_dir))


def simulator_ctl():
    """tests/simulator/aclsim_ctl.py as a module (what the fixtures call often, without a Python start each time)."""
    if str(ACLSIM_CTL.parent) not in sys.path:
        sys.path.insert(0, str(ACLSIM_CTL.parent))
    import aclsim_ctl as ctl  # pylint: disable=import-outside-toplevel
    return ctl


def reset_device(device_dir, device_id=0):
    """What deleting the pod (or losing the process) does to the NPU: its memory is gone."""
    subprocess.run([sys.executable, str(REPO / "tests/simulator/aclsim_ctl.py"), "reset", str(device_id)], check=True,
                   env=dict(os.environ, ACL_SIM_DEVICE_DIR=str(device_dir)), capture_output=True)


def renewed_at(lease):
    """When the agent last renewed ``lease`` (a lease view in an agent's reply), as a Unix time: the agent's own clock,
    so that a test can say "renewed after X" however slowly it gets to ask."""
    moment = datetime.datetime.strptime(lease["renewed_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp()


def posix_locks(pid):
    """The POSIX (fcntl) locks process ``pid`` holds, from the host's /proc/locks: sorted (type, dev:inode, start, end)."""
    with open("/proc/locks") as handle:
        fields = [line.split() for line in handle]
    return sorted((f[3], f[5], f[6], f[7]) for f in fields if len(f) > 7 and f[1] == "POSIX" and f[4] == str(pid))


def load_file_module(name, path):
    """The Python file at ``path`` (a script of the repository) imported as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def protobuf_varint(value):
    """``value`` in protobuf's varint encoding (a negative int32/int64 as two's complement on 64 bits)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def criu_image(directory, name, magic, messages, common=True):
    """Write CRIU image ``name`` into ``directory`` as CRIU does: (common magic,) its magic, then each protobuf
    message after its 4-byte size. Returns ``directory``."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import criu_images
    directory.mkdir(parents=True, exist_ok=True)
    data = (struct.pack("<I", criu_images.IMG_COMMON_MAGIC) if common else b"") + struct.pack("<I", magic)
    for message in messages:
        data += struct.pack("<I", len(message)) + message
    (directory / name).write_bytes(data)
    return directory


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url, timeout=10):
    """(status, decoded JSON body) for a GET; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class Workload:
    """The sample inference workload, launched through the in-process agent."""

    def __init__(self, tmp_path, library, device_dir, **env):
        self.tmp_path = tmp_path
        self.port = free_port()
        self.socket_dir = tmp_path / "agent"
        self.log_path = tmp_path / ("workload-%d.log" % self.port)
        self.env = dict(os.environ)
        self.env.update({
            "INFEROPS_ACL_LIBRARY": str(library),
            "ACL_SIM_DEVICE_DIR": str(device_dir),
            "INFEROPS_AGENT_SOCKET_DIR": str(self.socket_dir),
            "INFEROPS_METADATA_FILE": str(tmp_path / "metadata.json"),
            "WORKLOAD_PORT": str(self.port),
            "WORKLOAD_WARMUP_SECONDS": "1",
            "WORKLOAD_DEVICE_MB": "8",
            "WORKLOAD_HOST_MB": "2",
            "PYTHONUNBUFFERED": "1",
        })
        self.env["ACL_SIM_DEVICE_NODES"] = install_devices(device_dir)["nodes"]  # this device directory's nodes
        self.env.update({k: str(v) for k, v in env.items()})
        self.proc = None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    @property
    def pid(self):
        return self.proc.pid

    @property
    def socket_path(self):
        return str(self.socket_dir / ("agent.%d.sock" % self.proc.pid))

    def start(self, engine=None):
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(agent_command(engine or WORKLOAD), env=agent_env(self.env), stdout=self._log,
                                     stderr=subprocess.STDOUT)
        return self

    def wait_socket(self, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.socket_path):
                return
            self._check_alive()
            time.sleep(0.05)
        raise AssertionError("agent socket %s never appeared; log:\n%s" % (self.socket_path, self.log()))

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                status, body = http_get(self.url + "/health", timeout=2)
                last = body
                if status == 200:
                    self.wait_socket()
                    return body
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("workload not ready after %ss (last %r); log:\n%s" % (timeout, last, self.log()))

    def generate(self, prompt, timeout=30):
        status, body = http_get(self.url + "/v1/generate?prompt=" + urllib.parse.quote(prompt), timeout=timeout)
        assert status == 200, "generate failed: %s %r" % (status, body)
        return body["answer"]

    def _check_alive(self):
        if self.proc.poll() is not None:
            raise AssertionError("workload exited with %s; log:\n%s" % (self.proc.returncode, self.log()))

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_log", None):
            self._log.close()


def flip_byte_keeping_mtime(path, offset):
    """Change one byte of a file in place and put its mtime back: only the inode's ctime shows the change."""
    st = os.lstat(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.lstat(path).st_mtime_ns == st.st_mtime_ns and os.lstat(path).st_size == st.st_size


@pytest.fixture
def device_dir(tmp_path):
    path = tmp_path / "npu"
    path.mkdir(mode=0o700)
    yield path
    # The simulator allocates a device's memory for real (1 GiB unless the test says otherwise), and pytest
    # keeps the last three sessions' tmp dirs: a whole suite's devices would fill tens of GB of disk.
    if (path / "nodes.json").exists():
        aclsim_ctl(path, "uninstall")
    for memory in path.iterdir():
        if memory.is_file():
            memory.unlink()


@pytest.fixture
def workload_factory(tmp_path, simulator_library, device_dir):
    started = []

    def make(**env):
        workload = Workload(tmp_path, simulator_library, device_dir, **env)
        started.append(workload)
        return workload

    yield make
    for workload in started:
        workload.stop()


@pytest.fixture
def workload(workload_factory):
    """A warmed-up workload, ready to answer."""
    w = workload_factory().start()
    w.wait_ready()
    return w


def flip_one_byte(path, offset):
    """One byte of a file changed in place (its lowest bit): same inode, same size."""
    with open(str(path), "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


def run_module(module, args, check=False, tmp_dir=None, extra_env=None):
    """Run inferops.snapshot.<module> on localhost through `ansible` (AnsiballZ, real argspec).

    Returns the task result dict; `failed` is set on failure.
    """
    ensure_collection_link()
    tree = Path(tmp_dir or os.environ.get("TMPDIR", "/tmp")) / ("tree-%d-%d" % (os.getpid(), time.monotonic_ns()))
    command = [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
               "-e", "ansible_python_interpreter=%s" % sys.executable,
               "-m", "inferops.snapshot.%s" % module, "-a", json.dumps(args), "--tree", str(tree)]
    if check:
        command.append("--check")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_HOST_KEY_CHECKING="False",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False")
    env.update(extra_env or {})
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    result_file = tree / "localhost"
    if not result_file.exists():
        raise AssertionError("ansible produced no result (rc=%d)\nstdout:\n%s\nstderr:\n%s"
                             % (proc.returncode, proc.stdout, proc.stderr))
    result = json.loads(result_file.read_text())
    shutil.rmtree(tree, ignore_errors=True)
    result["_rc"] = proc.returncode
    result.setdefault("failed", proc.returncode != 0)
    return result


@pytest.fixture(scope="session")
def docker_env():
    """A running experimental dockerd, CRIU >= 4.2 and the workload image; set up if missing (never skipped)."""
    subprocess.run(["bash", str(REPO / "scripts" / "env" / "setup.sh")], check=True)
    subprocess.run(["bash", str(REPO / "scripts" / "build-workload-image.sh")], check=True)
    return "inferops/workload:latest"


@pytest.fixture(scope="session")
def cri_nodes(docker_env):
    """The two Kubernetes nodes of the tests as clusters run them (scripts/env/cri-node.sh: containerd 1.6 with its CRI
    plugin and CNI, node-a and node-b) running, the workload image in their k8s.io namespace: {node: its paths and
    addresses, as `cri-node.sh status` prints them}. Started, or found running from an earlier session: they outlive
    it (docs/kubernetes.md, "Kubernetes nodes in the tests"). tests/integration/_cri_kubelet.py drives them."""
    integration = str(REPO / "tests" / "integration")
    if integration not in sys.path:
        sys.path.insert(0, integration)
    from _cri_kubelet import start_nodes  # pylint: disable=import-outside-toplevel
    return start_nodes(docker_env)


def docker(*args, check=True):
    proc = subprocess.run(["docker"] + [str(a) for a in args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError("docker %s failed: %s" % (" ".join(map(str, args)), proc.stderr))
    return proc.stdout.strip()


class WorkloadContainer:
    """The workload image run the way an operator would: host network, its NPU's device nodes given as devices
    (docker run --device, at /dev/davinci0 and /dev/davinci_manager), the simulated NPU's memory files
    bind-mounted from the host (so they outlive the container, like a real device)."""

    def __init__(self, name, image, device_dir, port, mounts=(), network="host", **env):
        self.name, self.image, self.device_dir, self.port = name, image, device_dir, port
        self.mounts = list(mounts)  # more host directories, each at the same path in the container
        self.volumes = []           # more docker run -v SOURCE:DESTINATION[:OPTIONS]
        self.network = network      # docker run --network: host, or a bridge network (then --ip NET:IP)
        self.env = {"ACL_SIM_DEVICE_DIR": str(device_dir), "ACL_SIM_DEVICE_MEM_BYTES": "256M",
                    "WORKLOAD_PORT": str(port), "WORKLOAD_DEVICE_MB": "32", "WORKLOAD_HOST_MB": "16",
                    "WORKLOAD_WARMUP_SECONDS": "2"}
        self.devices = device_args(device_dir)
        self.env.update({k: str(v) for k, v in env.items()})

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def create_args(self):
        network = self.network.split(":")
        args = ["--name", self.name, "--network", network[0], "-v", "%s:%s" % (self.device_dir, self.device_dir)]
        args += ["--ip", network[1]] if len(network) > 1 else []
        args += self.devices
        for directory in self.mounts:
            args += ["-v", "%s:%s" % (directory, directory)]
        for volume in self.volumes:
            args += ["-v", volume]
        for key, value in sorted(self.env.items()):
            args += ["-e", "%s=%s" % (key, value)]
        return args + [self.image]

    def run(self):
        docker("run", "-d", *self.create_args())
        return self

    def create(self):
        docker("create", *self.create_args())
        return self

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, body = http_get(self.url + "/health", timeout=2)
                if status == 200:
                    return body
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("container %s not ready; logs:\n%s" % (self.name, docker("logs", self.name, check=False)))

    def generate(self, prompt, timeout=60):
        status, body = http_get(self.url + "/v1/generate?prompt=" + urllib.parse.quote(prompt), timeout=timeout)
        assert status == 200, (status, body)
        return body["answer"]

    def info(self):
        return http_get(self.url + "/v1/info")[1]

    @property
    def pid(self):
        """The container's process, as the host sees it."""
        return int(docker("inspect", "--format", "{{.State.Pid}}", self.name))

    def remove(self):
        docker("rm", "-f", self.name, check=False)


@pytest.fixture
def containers():
    made = []

    def make(*args, **kwargs):
        container = WorkloadContainer(*args, **kwargs)
        made.append(container)
        return container

    yield make
    for container in made:
        container.remove()

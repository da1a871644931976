"""The restore-on-create runtime on this machine's shared dockerd, for the integration tests.

``Node`` runs the snapshot_node role against localhost with names and paths of its own: a runtime
name unique to the test session (``inferops-test-<tag>``), its own shim, library, state directory,
log file and snapshot root. ``installed_runtime`` installs it and removes it again at the end
(snapshot_node_state=absent). The role registers the runtime with dockerd by SIGHUP: dockerd is
never restarted, and the other runtimes and daemon.json keys are left as they were.

Used by test_restore_on_create.py (the role and the runtime themselves) and test_k8s_snapshot.py
(the kubelet runs a pod's container under it when the pod names the RuntimeClass).
"""

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import uuid

import pytest

from conftest import (BIN, COLLECTIONS, WorkloadContainer, docker, ensure_collection_link, free_port, http_get,
                      node_wide, reset_device, run_module)

RECAP = re.compile(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


def runtimes():
    """The runtimes dockerd knows now."""
    return json.loads(docker("info", "--format", "{{json .Runtimes}}"))


def read_daemon_json():
    with open("/etc/docker/daemon.json") as handle:
        return json.load(handle)


class Node:
    """The snapshot_node role run against localhost with this test run's own names and paths."""

    def __init__(self, base):
        tag = uuid.uuid4().hex[:6]
        self.base = base
        self.name = "inferops-test-%s" % tag
        self.runtime_path = base / "bin" / "inferops-restore-runtime"
        self.lib_dir = base / "lib"
        self.state_dir = "/run/inferops-test-%s" % tag
        self.log_file = base / "log" / "restore.log"
        # The runtime restores only from below its snapshot roots: the tests keep their snapshots here.
        self.roots = base / "snapshots"
        self.roots.mkdir(mode=0o700)
        self.vars = {
            "snapshot_node_runtime_name": self.name,
            "snapshot_node_runtime_path": str(self.runtime_path),
            "snapshot_node_lib_dir": str(self.lib_dir),
            "snapshot_node_state_dir": self.state_dir,
            "snapshot_node_log_file": str(self.log_file),
            "snapshot_node_snapshot_roots": [str(self.roots)],
            "snapshot_node_restore_timeout": 30,
            # its own boot-time sweep (tmpfiles.d): another test run's node must not rewrite it under this one
            "snapshot_node_tmpfiles_path": str(base / "tmpfiles.d" / "inferops-snapshot.conf"),
            # its own record of restored generations, and no key: these tests restore the unsigned snapshots they take
            # with host_checkpoint (the secure default -- the controller's key trusted -- is test_freshness_and_scope's)
            "snapshot_node_generations_file": str(base / "state" / "generations.json"),
            "snapshot_node_trust_controller_key": False,
        }
        self.playbook = base / "node.yml"
        self.playbook.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n"
                                 "  roles:\n    - role: inferops.snapshot.snapshot_node\n")

    def run_role(self, check=False, diff=False, **overrides):
        """Run the role; returns (ok, changed, failed, output)."""
        ensure_collection_link()
        extra = dict(self.vars, **overrides)
        vars_file = self.base / ("vars-%d.json" % time.monotonic_ns())
        vars_file.write_text(json.dumps(extra))
        command = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", "ansible_python_interpreter=%s" % sys.executable,
                   "-e", "@%s" % vars_file, str(self.playbook)]
        if check:
            command.append("--check")
        if diff:
            command.append("--diff")
        env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_LOCALHOST_WARNING="False")
        with node_wide():
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
        match = RECAP.search(proc.stdout)
        assert match, "no play recap (rc=%d)\n%s\n%s" % (proc.returncode, proc.stdout[-5000:], proc.stderr[-3000:])
        ok, changed, _unreachable, failed = (int(g) for g in match.groups())
        return ok, changed, failed, proc.stdout + proc.stderr

    def install(self):
        """Install and register the runtime; returns (ok, changed, failed) of the run."""
        ok, changed, failed, out = self.run_role()
        assert failed == 0 and changed > 0, out[-5000:]
        assert self.name in runtimes(), "dockerd does not list %s after the role ran:\n%s" % (self.name, out[-3000:])
        return ok, changed, failed

    def remove(self, daemon_before):
        """Snapshot_node_state=absent (forced: the test's own containers may not all be gone yet), then
        check that the node is as it was in ``daemon_before`` and that removing twice changes nothing.
        Returns (ok, changed, failed) of the first removal."""
        ok, changed, failed, out = self.run_role(snapshot_node_state="absent", snapshot_node_force_remove=True)
        removal = (ok, changed, failed)
        after = read_daemon_json()
        assert failed == 0, out[-5000:]
        assert self.name not in runtimes() and self.name not in (after.get("runtimes") or {}), after
        assert {k: v for k, v in after.items() if k != "runtimes"} == \
            {k: v for k, v in daemon_before.items() if k != "runtimes"}
        assert not self.runtime_path.exists() and not self.lib_dir.exists() and not os.path.exists(self.state_dir)
        ok, changed, failed, out = self.run_role(snapshot_node_state="absent")
        assert failed == 0 and changed == 0, "removing twice changed something:\n%s" % out[-5000:]
        return removal

    def log_records(self, container_id=None, event="restore"):
        """The runtime's JSON log lines of one kind (restore attempts by default), optionally of one container."""
        if not self.log_file.exists():
            return []
        records = [json.loads(line) for line in self.log_file.read_text().splitlines() if line.strip()]
        return [r for r in records if r.get("event") == event and (container_id is None or r.get("container") == container_id)]


@contextlib.contextmanager
def installed_runtime(base, **role_vars):
    """A Node whose runtime is installed (with ``role_vars`` over the test's own) for the duration of the block,
    removed afterwards."""
    node = Node(base)
    node.vars.update(role_vars)
    before = read_daemon_json()
    try:
        node.install()
    except BaseException:
        node.run_role(snapshot_node_state="absent", snapshot_node_force_remove=True)  # what did get installed
        raise
    try:
        yield node
    finally:
        node.remove(before)


# -- a warmed-up workload, its snapshot below the node's root, and containers recreated from it ------

PROMPTS = ["what is an NPU?", "restore me on create", "数据"]


def identity(pod):
    return {"namespace": "default", "service": "sample", "instance": "p0", "pod": pod}


class RuntimeContainer(WorkloadContainer):
    """The workload container, run with the restore-on-create runtime."""

    def __init__(self, runtime, *args, **kwargs):
        super(RuntimeContainer, self).__init__(*args, **kwargs)
        self.runtime = runtime

    def create_args(self):
        return ["--runtime", self.runtime] + super(RuntimeContainer, self).create_args()

    @property
    def id(self):
        return docker("inspect", "--format", "{{.Id}}", self.name)


def wait_answer(container, timeout=120):
    """Seconds until the first correct answer is served (polling /v1/generate)."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        try:
            status, body = http_get(container.url + "/v1/generate?prompt=" + urllib.parse.quote(PROMPTS[0]), timeout=5)
            if status == 200:
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("%s never answered; logs:\n%s" % (container.name, docker("logs", container.name, check=False)))


def generate_snapshot(container, snapshot_dir, pod):
    target = {"container": container.name}
    backup = run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=snapshot_dir, identity=identity(pod)))
    assert backup["changed"] and backup["state"] == "BACKED_UP", backup
    checkpoint = run_module("host_checkpoint", {"container": container.name, "snapshot_dir": snapshot_dir,
                                                "identity": identity(pod), "timeout": 120})
    assert checkpoint["changed"] and checkpoint["status"] == "completed", (checkpoint.get("msg"),
                                                                           checkpoint.get("criu_log_tail"))
    resumed = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert resumed["actions"] == ["restore", "unlock"], resumed
    return checkpoint


class WarmEngine:
    """One warmed-up workload engine, removed on exit: its answers to ``prompts`` (``expected``), the seconds from
    its start to them (``cold_seconds``), its facts and image id; snapshots of it taken as the roles take them
    (``take``: host_checkpoint with device backup, resume, replace) for the attacks that start from them."""

    def __init__(self, docker_env, base, prefix, prompts, warmup=None, **sizes):
        self.device_dir = base / "npu"
        self.device_dir.mkdir(mode=0o700)
        self.tag = uuid.uuid4().hex[:6]
        self.name = "%s-%s" % (prefix, self.tag)
        self.prompts, self.warmup = list(prompts), warmup
        env = dict(sizes, **({"WORKLOAD_WARMUP_SECONDS": warmup} if warmup is not None else {}))
        self.container = WorkloadContainer(self.name, docker_env, self.device_dir, free_port(), **env)

    def __enter__(self):
        started = time.monotonic()
        self.container.run()
        try:
            self.container.wait_ready(timeout=(self.warmup or 0) + 120)
            self.expected = [self.container.generate(p) for p in self.prompts]
            self.cold_seconds = time.monotonic() - started
            self.info = self.container.info()
            self.started_at = self.info["started_at"]
            # Recreate from the very image the snapshot was taken from: the shared tag may move meanwhile
            # (another session rebuilding the workload image), which the runtime rightly refuses.
            self.image = docker("inspect", "--format", "{{.Image}}", self.name)
        except BaseException:
            self.container.remove()
            raise
        return self

    def __exit__(self, *exc_info):
        self.container.remove()

    def take(self, snapshot_dir, identity_, **args):
        """Host_checkpoint into ``snapshot_dir`` (``args``: signing_key, encryption_key...); its result."""
        result = run_module("host_checkpoint", dict({
            "container": self.name, "snapshot_dir": snapshot_dir, "identity": identity_, "device_backup": True,
            "resume": True, "if_exists": "replace"}, **args))
        assert result["status"] == "completed" and result["generation"], result
        return result


class WarmSnapshot:
    """A warmed-up workload container snapshotted below ``node``'s snapshot root (the original is removed):
    its answers and facts, and containers recreated from the snapshot under the node's runtime."""

    live = []  # this process's (a pytest worker runs one test module at a time): see recreated_containers_removed

    def __init__(self, node, docker_env, base, prefix, warmup, **sizes):
        WarmSnapshot.live.append(self)
        self.node, self.warmup, self.sizes = node, warmup, sizes
        self.made = []
        with WarmEngine(docker_env, base, prefix, PROMPTS, warmup, **sizes) as original:
            self.device_dir, self.pod, self.port = original.device_dir, original.name, original.container.port
            self.expected, self.cold_seconds, self.info = original.expected, original.cold_seconds, original.info
            self.image_id = original.image
            self.snapshot_dir = str(node.roots / "default" / "sample" / "p0" / self.pod)
            self.checkpoint = generate_snapshot(original.container, self.snapshot_dir, self.pod)
            assert [original.container.generate(p) for p in PROMPTS] == self.expected

    def recreate(self, name=None, **env):
        """A container of the snapshot's image under the node's runtime (not started); ``env`` over the sizes."""
        env.setdefault("WORKLOAD_WARMUP_SECONDS", self.warmup)
        c = RuntimeContainer(self.node.name, name or "%s-%s" % (self.pod, uuid.uuid4().hex[:4]), self.image_id,
                             self.device_dir, self.port, **dict(self.sizes, **env))
        self.made.append(c)
        return c

    def restore(self, **env):
        """A container recreated from the snapshot and answering: (container, seconds from docker run to the first
        answer)."""
        reset_device(self.device_dir)
        c = self.recreate(INFEROPS_RESTORE_FROM=self.snapshot_dir, **env)
        started = time.monotonic()
        c.run()
        wait_answer(c, timeout=self.warmup + 300)
        return c, time.monotonic() - started

    def remove(self):
        while self.made:
            self.made.pop().remove()


@pytest.fixture(autouse=True)
def recreated_containers_removed():
    """Autouse where imported: every container recreated from a WarmSnapshot listens on the snapshot's port (host
    network), so each test's are removed when it ends, passed or failed -- a failed test's restored engine left
    running answered the next tests' requests in place of their own containers."""
    yield
    for warm in WarmSnapshot.live:
        warm.remove()

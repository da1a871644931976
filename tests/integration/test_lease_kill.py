"""The controller dies in the middle of a generation: SIGKILL of the whole ansible-playbook process group
(os.killpg: the playbook, its workers and the module processes) at each step of one pod's generation, on
the real dockerd and CRIU, with the engine under the real agent on the simulated NPU -- driven by
lease_generate.yml (the modules in the role's order, a separate lock task) and by the real
snapshot_generate role. Every time, the
engine serves again within its lease and a few seconds -- unlocked, with the answers it gave before --
and no snapshot is left that verify or restore would accept, except after the publish: a snapshot that
was sealed and published before the kill is complete, and stays valid (its engine was backed up when
CRIU took it, and a restore brings it back as any other).

One container serves the whole matrix (it serves again after each kill: that is the point), so a stage
costs the playbook up to the step, the lease and one look at the result. Each stage is recognised from
what a generation leaves behind -- the agent's state, the files of the staging directory, the published
directory, or the task name in ansible-playbook's streaming output -- and the kill follows at once."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import BIN, COLLECTIONS, ensure_collection_link, free_port, run_module
from _roles_helpers import local_inventory, status_record

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import (AgentSocketClient,
                                                                                             LEASE_MARGIN)

PLAYBOOK = Path(__file__).with_name("lease_generate.yml")
ROLE = "inferops.snapshot.snapshot_generate : "
LEASE = 6.0
SLACK = 4.0          # on top of the lease: the watchdog's restore + unlock, and this test's polling
PROMPTS = ["what is an NPU?", "lease me", "数据"]


class Playbook:
    """Ansible-playbook in its own process group, its output read line by line as it streams."""

    def __init__(self, tmp_path, extra_vars, playbook=PLAYBOOK, host_vars=None, extra_env=None):
        ensure_collection_link()
        number = len(list(tmp_path.glob("inventory-*.json")))
        inventory = tmp_path / ("inventory-%d.json" % number)
        inventory.write_text(json.dumps(local_inventory(**(host_vars or {}))))
        env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_LOCALHOST_WARNING="False",
                   ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable,
                   PYTHONUNBUFFERED="1", **(extra_env or {}))
        command = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook), "-e", json.dumps(extra_vars)]
        self.lines = []
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def started(self, task):
        return any(line.startswith("TASK [%s" % task) for line in self.lines)

    def step(self, stage):
        return self.started(self.names[stage])

    def kill(self):
        """What a cancelled AWX job, a lost SSH connection or an OOM killer does to the controller: SIGKILL of
        ansible-playbook's process group and of its workers' (each worker calls setsid, so the module it runs
        is in the worker's group, not the playbook's). The playbook's group is stopped first, so that no new
        worker starts meanwhile. What a module started in a session of its own (runc, CRIU) lives on, as it
        does on a real host when the controller goes away."""
        if self.proc.poll() is not None:
            return time.monotonic()
        os.killpg(self.proc.pid, signal.SIGSTOP)
        workers = controller_groups(self.proc.pid)
        for pgid in workers - {self.proc.pid}:
            killpg(pgid, signal.SIGSTOP)  # no worker forks another meanwhile
        workers |= controller_groups(self.proc.pid)
        for pgid in workers - {self.proc.pid}:
            killpg(pgid, signal.SIGKILL)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(10)
        self.killed_groups = sorted(workers | {self.proc.pid})
        return time.monotonic()

    def finish(self, timeout=180):
        self.proc.wait(timeout)
        self._reader.join(10)
        return self.proc.returncode

    def output(self):
        return "\n".join(self.lines[-60:])


def wait(predicate, timeout, what, run=None, interval=0.005):
    started = time.monotonic()
    while True:
        found = predicate()
        if found:
            return found
        if run is not None and run.proc.poll() is not None:
            raise AssertionError("the playbook ended (rc=%s) before %s:\n%s" % (run.proc.returncode, what, run.output()))
        if time.monotonic() - started > timeout:
            raise AssertionError("%s did not happen within %s s%s" % (what, timeout, (":\n" + run.output()) if run else ""))
        time.sleep(interval)


def controller_groups(root):
    """The process groups of ``root`` and of every process below it (its workers may be its grandchildren, each in
    a session of its own, the module in its worker's), except those of runc and CRIU: a module starts them in a
    session of their own, and they outlive the controller on a real host too."""
    table = process_table()
    below, todo = set(), [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _pgid) in table.items():
            if ppid == parent and pid not in below:
                below.add(pid)
                todo.append(pid)
    spared = set(table[pid][1] for pid in below if comm(pid) in ("runc", "criu"))
    return set(table[pid][1] for pid in below | {root} if pid in table) - spared


def killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # ended meanwhile


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as handle:
            return handle.read().strip()
    except OSError:
        return None


def process_table():
    """{pid: (ppid, pgid)} of every process."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(pid)] = (int(fields[1]), int(fields[2]))
    return table


def files(directory):
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def checkpoints_running(container_id):
    """Runc checkpoint processes for the container (started in their own session: a kill of the playbook
    does not stop them, as on a real host where the module's children outlive the controller)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if b"checkpoint" in argv and container_id.encode() in argv:
            found.append(int(pid))
    return found


class Pod:
    def __init__(self, container, root, host_pid, container_id):
        self.container = container
        self.name = container.name
        self.identity = {"namespace": "t", "service": "lease", "instance": "p0", "pod": self.name}
        self.snapshot_dir = root / "t" / "lease" / "p0" / self.name
        self.staging = self.snapshot_dir.parent / (".%s.partial" % self.name)
        self.root = root
        self.host_pid = host_pid
        self.container_id = container_id
        self.agent = AgentSocketClient.for_pid(host_pid, "/run/inferops-snapshot")

    def variables(self, readiness_file=None):
        return {"lease_seconds": LEASE, "lease_generation_id": uuid.uuid4().hex, "lease_pod": {
            "name": self.name, "container": self.name, "snapshot_dir": str(self.snapshot_dir),
            "identity": self.identity, "readiness_url": self.container.url + "/health",
            "readiness_file": readiness_file}}

    def role_inventory(self, readiness_file=None, timeout=120):
        ready = {"readiness_file": readiness_file} if readiness_file else {"readiness_url": self.container.url + "/health"}
        return {"snapshot_config": {"enabled": True, "hostSnapshotPath": str(self.root),
                                    "npuSnapshotPath": str(self.root.parent / "npu-snapshots"), "timeoutSeconds": timeout},
                "snapshot_service": {"namespace": "t", "name": "lease"},
                "snapshot_instances": [{"name": "p0", "pods": [dict(name=self.name, **ready)]}]}

    def state(self):
        return self.agent.request("state", 5)

    def running(self):
        reply = self.state()
        return reply if reply["state"] == "RUNNING" else None

    def forget(self):
        """Remove what a stage left, so that the next one starts from nothing (as root, like the modules)."""
        for path in (self.snapshot_dir, self.staging, self.root.parent / "npu-snapshots"):
            shutil.rmtree(str(path), ignore_errors=True)
        for record in (layout.status_path(str(self.snapshot_dir)), layout.claim_path(str(self.snapshot_dir))):
            if os.path.exists(record):  # the killed generation's claim would hold the pod for its lease
                os.unlink(record)


# Each stage: how to recognise it (returns what was seen, or None), what the agent then does when the lease
# runs out, and whether the snapshot is published (and valid) afterwards.
def at_warmup(run, pod):
    if run.step("warmup"):
        time.sleep(1.0)  # the module runs, waiting for a readiness file that never comes
        return "waiting for the warmup"
    return None


def at_lock(run, pod):
    """The module playbook locks in a task of its own; the role locks and backs up in one (the lease covers
    both from the start of the lock): then the first state that is not RUNNING is the step."""
    if run.step("lock"):
        state = pod.state()
        if state["state"] == "LOCKED" or (run.names["lock"] == run.names["backup"] and state["state"] == "BACKED_UP"):
            return "%s, the lease %.1f s" % (state["state"], state["lease"]["remaining_s"])
    return None


def at_backup(run, pod):
    return "device part recorded" if (pod.staging / "device" / "device.json").exists() else None


def at_checkpoint(run, pod):
    images = files(pod.staging / "host" / "criu")
    if images and checkpoints_running(pod.container_id):
        return "CRIU writing %d image files" % len(images)
    return None


def at_seal(run, pod):
    found = files(pod.staging) + ["host/" + name for name in files(pod.staging / "host")]
    if "host/container.json" in found and "checksum.sha256" not in found and pod.staging.exists():
        return "sealing: %s" % ", ".join(n for n in found if not n.startswith("host/criu"))
    return None


def at_publish(run, pod):
    return "published" if pod.snapshot_dir.is_dir() else None


def at_verify(run, pod):
    if run.step("verify"):
        time.sleep(0.3)
        return "the checksum task started"
    return None


def at_unlock(run, pod):
    return "the unlock task started" if run.step("unlock") else None


STAGES = [
    # name, recogniser, the agent's actions at expiry, published and valid afterwards
    ("warmup", at_warmup, None, False),
    ("lock", at_lock, (["unlock"], ["restore", "unlock"]), False),
    ("backup", at_backup, ["restore", "unlock"], False),
    ("checkpoint", at_checkpoint, ["restore", "unlock"], False),
    ("seal", at_seal, (["restore", "unlock"], ["unlock"]), False),
    ("publish", at_publish, (["restore", "unlock"], ["unlock"]), True),
    ("verify", at_verify, (["restore", "unlock"], ["unlock"]), True),
    ("unlock", at_unlock, (["restore", "unlock"], ["unlock"]), True),
]


class ModulePlaybook:
    """Lease_generate.yml: the role's modules, with the lock in a task of its own."""

    resumes = False  # the engine stays BACKED_UP until the unlock task
    names = {"warmup": "Wait for the warmup", "lock": "Lock the engine", "backup": "Device snapshot",
             "verify": "Checksum of the published snapshot", "unlock": "Unlock the engine"}

    def __init__(self, pod):
        self.pod = pod

    def start(self, readiness_file=None):
        run = Playbook(self.pod.tmp, self.pod.variables(readiness_file))
        run.names = self.names
        return run


class Role:
    """The real snapshot_generate role, with the test's lease: its variable snapshot_generate_lease, and the same
    lease through module_defaults for a role that does not pass one to its modules yet."""

    resumes = True  # its host_checkpoint may resume the engine right after the checkpoint (resume: true)
    names = {"warmup": ROLE + "Wait for the warmup", "lock": ROLE + "Device and host snapshot",
             "backup": ROLE + "Device and host snapshot",
             "verify": ROLE + "Checksum", "unlock": ROLE + "Unlock the engine"}

    def __init__(self, pod):
        self.pod = pod
        self.playbook = pod.tmp / "lease_role.yml"
        self.playbook.write_text(
            "- name: Generate with the snapshot_generate role, under a short lease\n"
            "  hosts: all\n"
            "  gather_facts: false\n"
            "  module_defaults:\n"
            "    inferops.snapshot.npu_snapshot_backup: {lease: %s}\n"
            "    inferops.snapshot.npu_snapshot_lock: {lease: %s}\n"
            "  roles:\n"
            "    - inferops.snapshot.snapshot_generate\n" % (LEASE, LEASE))

    def start(self, readiness_file=None):
        run = Playbook(self.pod.tmp, {"snapshot_generate_poll_interval": 0.2, "snapshot_generate_lease": LEASE},
                       playbook=self.playbook,
                       host_vars=self.pod.role_inventory(readiness_file))
        run.names = self.names
        return run


def start_pod(image, base):
    from conftest import WorkloadContainer, docker
    device_dir = base / "npu"
    device_dir.mkdir(mode=0o700)
    name = "lease-kill-%s" % uuid.uuid4().hex[:8]
    # Big enough that the dump and the seal last a few hundred milliseconds each: long enough to be caught.
    container = WorkloadContainer(name, image, device_dir, free_port(), WORKLOAD_DEVICE_MB="32",
                                  WORKLOAD_HOST_MB="96", WORKLOAD_WARMUP_SECONDS="1")
    container.run()
    container.wait_ready()
    host_pid = int(docker("inspect", "--format", "{{.State.Pid}}", name))
    container_id = docker("inspect", "--format", "{{.Id}}", name)
    p = Pod(container, base / "host", host_pid, container_id)
    p.expected = [container.generate(prompt) for prompt in PROMPTS]
    p.tmp = base
    return p


@pytest.fixture(scope="module")
def pods(docker_env, tmp_path_factory):
    """Two engines: while the lease of the one just abandoned runs out, the next step is taken on the other."""
    made = []
    try:
        while len(made) < 2:
            made.append(start_pod(docker_env, tmp_path_factory.mktemp("lease-kill")))
        yield made
    finally:
        for p in made:
            p.container.remove()


class Aftermath(threading.Thread):
    """What must follow a kill, checked while the next step runs on the other engine."""

    def __init__(self, pod, stage, what, killed_at, actions, published, may_resume):
        super().__init__(daemon=True)
        self.pod, self.stage, self.what, self.killed_at = pod, stage, what, killed_at
        self.actions, self.published, self.may_resume = actions, published, may_resume
        self.error = self.summary = None
        self.start()

    def run(self):
        try:
            self.summary = self.check()
        except BaseException as exc:  # pylint: disable=broad-except  # raised in the test's thread by result()
            self.error = exc

    def result(self):
        self.join(120)
        assert not self.is_alive(), "the check after the %s step hangs" % self.stage
        if self.error is not None:
            raise self.error
        return self.summary

    def check(self):
        pod, stage, actions = self.pod, self.stage, self.actions
        # A checkpoint outlives its controller (runc and CRIU run in their own session): nothing may touch
        # the frozen process's sockets before it is thawed.
        wait(lambda: not checkpoints_running(pod.container_id), 60, "the end of the orphaned checkpoint", interval=0.05)
        first = pod.state()
        if self.may_resume and first["state"] == "RUNNING" and first["abandoned"] is None:
            actions = None  # host_checkpoint (resume: true) had brought the engine back before the kill
        reply = wait(pod.running, LEASE + SLACK,
                     "the engine RUNNING again after a kill at the %s step (%s)" % (stage, self.what), interval=0.05)
        back_after = time.monotonic() - self.killed_at
        assert [pod.container.generate(p) for p in PROMPTS] == pod.expected, stage
        assert reply["lease"] is None, (stage, reply["lease"])
        record = reply["abandoned"]
        if actions is None:
            assert record is None and back_after < SLACK, (stage, record, back_after)
        else:
            assert record is not None and record["errors"] == [], (stage, record)
            assert record["actions"] == actions or record["actions"] in actions, (stage, record)
            assert record["state"] == "RUNNING" and record["lease_s"] == LEASE, (stage, record)
        if not self.published:
            # verify and every restore path read the published directory only: there is none (a staging
            # directory may be left; nothing ever restores from it)
            assert not os.path.lexists(str(pod.snapshot_dir)), stage
            assert (status_record(pod.snapshot_dir) or {}).get("status") in (None, "generating"), stage
        else:  # sealed and published before the kill: complete, and valid
            info = run_module("snapshot_info", {"snapshot_dir": str(pod.snapshot_dir), "identity": pod.identity,
                                                "container": pod.name})
            assert info["published"] and info["valid"] and info["checksum"], (stage, info["reasons"])
            assert info["device_state"] == "RUNNING" and info["device_abandoned"] == record, (stage, info)
            assert status_record(pod.snapshot_dir)["status"] in ("generating", "completed"), stage
        pod.forget()
        return "%s; serving again %.1f s after the kill" % (self.what, back_after)


@pytest.mark.parametrize("driver", [ModulePlaybook, Role], ids=["modules", "role"])
def test_the_engine_serves_again_after_the_controller_is_killed_at_each_step(pods, driver):
    started = time.monotonic()
    for pod in pods:
        pod.forget()
    drivers = [driver(p) for p in pods]
    pending = {}
    seen = {}
    for number, (stage, recognise, actions, published) in enumerate(STAGES):
        index = number % len(pods)
        pod = pods[index]
        if index in pending:
            done = pending.pop(index)
            seen[done.stage] = done.result()
        run = drivers[index].start("/tmp/never-warmed-up" if stage == "warmup" else None)
        try:
            what = wait(lambda: recognise(run, pod), 90, "the %s step" % stage, run)
        finally:
            killed_at = run.kill()
        may_resume = drivers[index].resumes and stage in ("seal", "publish", "verify", "unlock")
        pending[index] = Aftermath(pod, stage, what, killed_at, actions, published, may_resume)
    for done in pending.values():
        seen[done.stage] = done.result()

    # The next generation goes through: its lock clears the record, the snapshot is valid.
    pod = pods[0]
    run = drivers[0].start()
    assert run.finish() == 0, run.output()
    assert pod.state()["state"] == "RUNNING" and pod.state()["abandoned"] is None and pod.state()["lease"] is None
    info = run_module("snapshot_info", {"snapshot_dir": str(pod.snapshot_dir), "identity": pod.identity,
                                        "container": pod.name})
    assert info["valid"] and info["usable"] and info["device_abandoned"] is None, info
    assert [pod.container.generate(p) for p in PROMPTS] == pod.expected
    pod.forget()
    print(json.dumps(dict(seen, total="%.0f s" % (time.monotonic() - started)), indent=1))


TIMEOUT = 20  # the bounded-lease test's snapshot_config.timeoutSeconds; the role's lease stays its default (120 s)
AGENT_ACTS = 2.0  # the watchdog's restore + unlock once the lease ran out (0.1 s measured; the rest is for a busy host)


class DefaultLeaseRole(Role):
    """The snapshot_generate role as an operator runs it: its own lease (snapshot_generate_lease, 120 s) and a short
    generation timeout (timeoutSeconds)."""

    def __init__(self, pod):
        self.pod = pod
        self.playbook = pod.tmp / "default_lease_role.yml"
        self.playbook.write_text("- name: Generate with the snapshot_generate role and its default lease\n"
                                 "  hosts: all\n  gather_facts: false\n"
                                 "  roles:\n    - inferops.snapshot.snapshot_generate\n")

    def start(self, readiness_file=None):
        run = Playbook(self.pod.tmp, {"snapshot_generate_poll_interval": 0.2}, playbook=self.playbook,
                       host_vars=self.pod.role_inventory(readiness_file, timeout=TIMEOUT))
        run.names = self.names
        return run


def test_the_lease_ends_with_the_generation_timeout_when_the_module_dies_with_its_controller(pods):
    """With timeoutSeconds 20 and the role's default lease of 120 s, the module killed with its
    controller at the lock, the backup and the checkpoint leaves the engine locked no longer than the timeout plus
    LEASE_MARGIN: its agent brings it back by then (it waited the whole 120 s before)."""
    seen = {}
    stages = (("lock", at_lock), ("backup", at_backup), ("checkpoint", at_checkpoint))
    for number, (stage, recognise) in enumerate(stages):
        pod = pods[number % len(pods)]
        pod.forget()
        run = DefaultLeaseRole(pod).start()
        try:
            what = wait(lambda: recognise(run, pod), 90, "the %s step" % stage, run)
        finally:
            killed_at = run.kill()
        wait(lambda: not checkpoints_running(pod.container_id), 60, "the end of the orphaned checkpoint", interval=0.05)
        reply = wait(pod.running, TIMEOUT + LEASE_MARGIN + SLACK,
                     "the engine RUNNING again within timeout + margin after a kill at the %s step (%s)" % (stage, what),
                     interval=0.05)
        back_after = time.monotonic() - killed_at
        record = reply["abandoned"]
        assert record is not None and record["errors"] == [] and record["state"] == "RUNNING", (stage, record)
        assert record["lease_s"] <= TIMEOUT + LEASE_MARGIN, (stage, record)
        # from the kill: the lease ran out by then, plus the agent's own restore and unlock (a fraction of a second)
        assert back_after <= TIMEOUT + LEASE_MARGIN + AGENT_ACTS, (stage, back_after)
        assert [pod.container.generate(p) for p in PROMPTS] == pod.expected, stage
        seen[stage] = "%s; lease %.1f s; serving again %.1f s after the kill" % (what, record["lease_s"], back_after)
        pod.forget()
    print(json.dumps(seen, indent=1))

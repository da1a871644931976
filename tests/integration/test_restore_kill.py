"""A restore killed mid-way never leaves the engine down: real dockerd and CRIU, the engine under the real agent on
the simulated NPU, ``snapshot_restore`` run by ansible-playbook and killed with it (its process group and its
workers', test_lease_kill.py's machinery) after the engine came back from the snapshot and before its device state
did.

- ``method: docker``, killed right after ``docker start --checkpoint`` returned (the docker CLI is reached through a
  wrapper that holds there): the run is on record (``restoring``, its process named); a second run while the first
  still holds says so and touches nothing; once the first is killed, the engine's agent holds its restore lease and,
  when it runs out, finishes the restore itself -- its POSIX locks taken back (Docker restores none), the device
  state restored, unlocked -- and serves the answers it gave before. The rerun says what it found (the killed run,
  the engine its agent finished), marks the killed run ``interrupted``, and restores the container from the start.
  Killed at the same point and rerun at once, the rerun finds the engine still waiting (BACKED_UP, restore lease)
  and does the same.
- A bare process (engine criu), killed while its restore path talks to the restored agent (the engine's RESTORE_POST
  hook is slow, a test knob of the sample workload): the restore path had bounded the restore lease by its own
  deadline, and the engine serves again within it; the rerun kills the process tree and restores it. Killed right
  after CRIU (a criu wrapper on PATH holds there), the tree was left stopped for the page images' verdict and never
  ran: nothing may resume it, and the rerun says so, kills it and restores it.

The Docker image is built under a tag of its own from this checkout: the shared machine's other checkouts build
inferops/workload:latest from their own agent, and this test needs this one's."""

import os
import subprocess
import time
import uuid

import pytest

from conftest import (REPO, WORKLOAD, WorkloadContainer, agent_command, docker, free_port, posix_locks, reset_device,
                      run_module)
from test_bare_process_restore import (generate, identity as bare_identity, kill_marked, marked,
                                       snapshot_path as bare_snapshot_path, wait_ready, workload_env)
from test_lease_kill import Playbook, wait

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import (AgentSocketClient,
                                                                                             LEASE_MARGIN)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import proc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import containerd_leak
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status

pytestmark = pytest.mark.timeout(900)

TAG = "inferops/workload:restore-kill"
PROMPTS = ["what is an NPU?", "killed mid-way", "数据"]
RESTORE_LEASE = 20.0   # the image's INFEROPS_AGENT_RESTORE_LEASE in these engines
SLACK = 10.0           # the agent's restore and unlock, and this test's polling, on a busy machine
PLAYBOOK = """
- name: One snapshot_restore, killed by the test
  hosts: all
  gather_facts: false
  tasks:
    - name: Restore
      inferops.snapshot.snapshot_restore:
        snapshot_dir: "{{ r.snapshot_dir }}"
        identity: "{{ r.identity }}"
        engine: "{{ r.engine | default(omit) }}"
        container: "{{ r.container | default(omit) }}"
        method: "{{ r.method | default(omit) }}"
        docker_cli: "{{ r.docker_cli | default(omit) }}"
        agent_socket_dir: "{{ r.agent_socket_dir | default(omit) }}"
        metadata_path: "{{ r.metadata_path | default(omit) }}"
        timeout: "{{ r.timeout }}"
"""
DOCKER_WRAPPER = """#!/bin/sh
# the docker CLI, held right after `docker start --checkpoint` returned: where the test kills the run
if [ "$1" = start ] && [ "$2" = --checkpoint ]; then
    docker "$@" || exit $?
    touch {flag}
    exec sleep 600
fi
exec docker "$@"
"""
CRIU_WRAPPER = """#!/bin/sh
# criu, held right after `criu restore` returned: where the test kills the run
if [ "$1" = restore ]; then
    {criu} "$@" || exit $?
    touch {flag}
    exec sleep 600
fi
exec {criu} "$@"
"""


def script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def started_run(tmp_path, restore, extra_env=None):
    playbook = tmp_path / "restore_killed.yml"
    playbook.write_text(PLAYBOOK)
    return Playbook(tmp_path, {"r": restore}, playbook=playbook, extra_env=extra_env)


def last_restore(snapshot_dir):
    return (status.read(snapshot_dir) or {}).get("last_restore") or {}


def agent_state(client):
    try:
        return client.request("state", 5)
    except Exception:  # pylint: disable=broad-except  # not listening yet, or stopped: asked again
        return None


def serving(client):
    reply = agent_state(client)
    return reply if reply and reply["state"] == "RUNNING" else None


# ------------------------------------------------------------------------------------------- method: docker

@pytest.fixture(scope="module")
def environment():
    """dockerd, CRIU and the simulated NPU as the docker_env fixture sets them up, without building the shared
    inferops/workload:latest (the image below is this file's own)."""
    subprocess.run(["bash", str(REPO / "scripts" / "env" / "setup.sh")], check=True)


@pytest.fixture(scope="module")
def image(environment):
    subprocess.run(["bash", str(REPO / "scripts" / "build-workload-image.sh"), TAG], check=True)
    return TAG


@pytest.fixture(scope="module")
def warm(image, tmp_path_factory):
    """An engine warmed up in a container (POSIX read locks held on a bind mount, as SQLite's), its snapshot, and the
    container removed: what a restore recreates."""
    base = tmp_path_factory.mktemp("restore-kill")
    device_dir, cache = base / "npu", base / "cache"
    device_dir.mkdir(mode=0o700)
    cache.mkdir(mode=0o700)
    name = "rkill-%s" % uuid.uuid4().hex[:8]
    container = WorkloadContainer(name, image, device_dir, free_port(), mounts=[cache], WORKLOAD_LOCK_DIR=cache,
                                  INFEROPS_AGENT_RESTORE_LEASE=RESTORE_LEASE)
    ident = {"namespace": "t", "service": "rkill", "instance": "p0", "pod": name}
    snap = str(base / "snapshots" / "t" / "rkill" / "p0" / name)
    try:
        container.run()
        container.wait_ready()
        expected = [container.generate(p) for p in PROMPTS]
        locks = posix_locks(container.pid)
        assert len(locks) == 2, locks
        backup = run_module("npu_snapshot_backup", {"container": name, "lock": True, "snapshot_dir": snap,
                                                    "identity": ident})
        assert backup["state"] == "BACKED_UP", backup
        taken = run_module("host_checkpoint", {"container": name, "snapshot_dir": snap, "identity": ident,
                                               "timeout": 120})
        assert taken["status"] == "completed", (taken.get("msg"), taken.get("criu_log_tail"))
        docker("rm", "-f", name)
        yield dict(base=base, name=name, identity=ident, snapshot_dir=snap, container=container, expected=expected,
                   locks=locks, device_dir=device_dir)
    finally:
        container.remove()
        sweep_containerd_copies(snap)


def sweep_containerd_copies(snap):
    """The copy of the images containerd leaves for a `docker start --checkpoint` (containerd_leak.py): a killed run
    never removed its own. Only this snapshot's: nobody else restores it."""
    images = containerd_leak._fingerprint(os.path.join(snap, "host", "criu"))
    for copy in containerd_leak.list_copies(containerd_leak.temp_dirs()):
        if containerd_leak._is_copy_of(copy, images):
            subprocess.run(["rm", "-rf", "--", copy], check=False)


def docker_restore(w, **extra):
    return dict({"snapshot_dir": w["snapshot_dir"], "identity": w["identity"], "container": w["name"],
                 "method": "docker", "timeout": 120}, **extra)


def kill_after_docker_start(w, tmp_path):
    """A restore of the removed container killed right after `docker start --checkpoint`; (the killed run's
    record, the agent's client, when it was killed)."""
    docker("rm", "-f", w["name"], check=False)
    reset_device(w["device_dir"])
    flag = tmp_path / ("started-%s" % uuid.uuid4().hex[:6])
    wrapper = script(tmp_path / "docker-holding", DOCKER_WRAPPER.format(flag=flag))
    run = started_run(tmp_path, docker_restore(w, docker_cli=wrapper))
    try:
        wait(flag.exists, 180, "docker start --checkpoint", run)
        # a second run while the first still holds: it says so and touches nothing
        meanwhile = run_module("snapshot_restore", docker_restore(w))
        assert meanwhile["failed"] is False and meanwhile["changed"] is False, meanwhile
        assert "another restore of this snapshot is in progress" in meanwhile["reason"], meanwhile["reason"]
    finally:
        killed_at = run.kill()
    record = last_restore(w["snapshot_dir"])
    client = AgentSocketClient.for_pid(w["container"].pid, "/run/inferops-snapshot")
    return record, client, killed_at


def check_killed_run_on_record(w, record):
    container_id = docker("inspect", "--format", "{{.Id}}", w["name"])
    assert record["outcome"] == "restoring" and record["path"] == "docker", record
    assert record["container"] == container_id and record["until"] > record["at"], record
    assert proc.gone_reason(record["runner"]), "the killed run's process still lives: %s" % record["runner"]


def rerun(w, args, found_state):
    result = run_module("snapshot_restore", args)
    assert result["failed"] is False and result["restored"] is True and result["reason"] is None, \
        (result.get("msg"), result.get("reason"), result.get("interrupted"))
    found = result["interrupted"]
    assert found["gone"] and "is gone" in found["gone"], found
    assert found["engine"]["state"] == found_state, found
    assert found["reason"].startswith("interrupted: the restore started at %s" % found["at"]), found["reason"]
    record = status.read(args["snapshot_dir"])
    outcomes = [(entry["outcome"], entry.get("runner", {}).get("pid")) for entry in record["restores"][-2:]]
    assert outcomes[0] == ("interrupted", found["runner"]["pid"]) and outcomes[1][0] == "restored", outcomes
    assert record["restores"][-2]["reason"] == found["reason"]
    return result


def test_a_docker_restore_killed_after_docker_start_serves_again_within_its_restore_lease_and_the_rerun_restores_it(
        warm, tmp_path):
    w = warm
    record, client, killed_at = kill_after_docker_start(w, tmp_path)
    check_killed_run_on_record(w, record)
    first = wait(lambda: agent_state(client), 30, "the restored agent's answer", interval=0.1)
    if first["state"] == "BACKED_UP":  # how it waits (a loaded machine may take the whole lease to ask)
        assert first["lease"]["by"] == "restore" and first["lease"]["seconds"] == RESTORE_LEASE, first["lease"]
    reply = wait(lambda: serving(client), RESTORE_LEASE + SLACK, "the engine RUNNING again within its restore lease",
                 interval=0.2)
    back_after = time.monotonic() - killed_at
    assert back_after <= RESTORE_LEASE + SLACK, back_after
    record = reply["abandoned"]
    assert record["lease_by"] == "restore" and record["errors"] == [], record
    # Docker restores no POSIX lock: the agent took both back from its last look before the checkpoint
    assert record["actions"] == ["resumed", "relock", "restore", "unlock"], record
    assert posix_locks(w["container"].pid) == w["locks"]
    assert [w["container"].generate(p) for p in PROMPTS] == w["expected"]
    info = w["container"].info()
    assert info["metadata"]["restored"] is True and reply["resumed"]["by"] == "lease"

    result = rerun(w, docker_restore(w), "RUNNING")
    found = result["interrupted"]
    assert found["engine"]["abandoned"]["lease_by"] == "restore", found
    assert found["done"] == "stopped the container and restores it from the start", found
    assert "after its agent finished the restore itself (resumed, relock, restore, unlock)" in found["reason"]
    assert [w["container"].generate(p) for p in PROMPTS] == w["expected"]
    again = AgentSocketClient.for_pid(w["container"].pid, "/run/inferops-snapshot").request("state", 5)
    assert again["resumed"]["by"] == "restore" and again["abandoned"] is None and again["lease"] is None, again
    assert w["container"].info()["metadata"]["restore_nonce"] != info["metadata"]["restore_nonce"]
    assert posix_locks(w["container"].pid) == w["locks"]
    print("\nkilled after docker start --checkpoint; serving again %.1f s after the kill; the rerun: %s"
          % (back_after, found["reason"]))


def test_a_rerun_right_after_the_kill_finds_the_engine_waiting_and_restores_it(warm, tmp_path):
    w = warm
    record, client, _killed_at = kill_after_docker_start(w, tmp_path)
    check_killed_run_on_record(w, record)
    result = rerun(w, docker_restore(w), "BACKED_UP")
    found = result["interrupted"]
    assert found["engine"]["lease"]["by"] == "restore", found
    assert "waiting for a restore path (restore lease, " in found["reason"], found["reason"]
    assert [w["container"].generate(p) for p in PROMPTS] == w["expected"]
    reply = AgentSocketClient.for_pid(w["container"].pid, "/run/inferops-snapshot").request("state", 5)
    assert reply["state"] == "RUNNING" and reply["abandoned"] is None and reply["resumed"]["by"] == "restore", reply


# ------------------------------------------------------------------------------------------- a bare process

@pytest.fixture
def bare(environment, simulator_library, tmp_path):
    """A warmed-up workload as a bare process under the agent (restore lease RESTORE_LEASE, its first restore hook
    slow), its snapshot, and the process killed and its device wiped: what a restore brings back."""
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    mark, port = uuid.uuid4().hex, free_port()
    env = workload_env(tmp_path, simulator_library, port, device_dir, mark)
    (tmp_path / "cache").mkdir(mode=0o700)
    hook = tmp_path / "restore-hook-started"
    env.update(WORKLOAD_LOCK_DIR=str(tmp_path / "cache"), INFEROPS_AGENT_RESTORE_LEASE=str(RESTORE_LEASE),
               WORKLOAD_SLOW_RESTORE_HOOK=str(hook), WORKLOAD_SLOW_RESTORE_HOOK_SECONDS="8")
    proc = subprocess.Popen(agent_command(WORKLOAD), env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pod = "rkill-bare-%s" % mark[:6]
    b = dict(base=tmp_path, mark=mark, url="http://127.0.0.1:%d" % port, env=env, pid=proc.pid, pod=pod, hook=hook,
             snapshot_dir=bare_snapshot_path(tmp_path / "snapshots", pod), socket_dir=env["INFEROPS_AGENT_SOCKET_DIR"])
    try:
        wait_ready(b["url"], proc)
        b["expected"] = [generate(b["url"], p) for p in PROMPTS]
        b["locks"] = posix_locks(proc.pid)
        target = {"pid": proc.pid, "agent_socket_dir": b["socket_dir"]}
        backup = run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=b["snapshot_dir"],
                                                        identity=bare_identity(pod)))
        assert backup["state"] == "BACKED_UP", backup
        taken = run_module("host_checkpoint", {"engine": "criu", "pid": proc.pid, "snapshot_dir": b["snapshot_dir"],
                                               "identity": bare_identity(pod), "agent_socket_dir": b["socket_dir"],
                                               "timeout": 120})
        assert taken["status"] == "completed", (taken.get("msg"), taken.get("criu_log_tail"))
        proc.kill()
        proc.wait(30)
        reset_device(device_dir)
        yield b
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        kill_marked(b["pid"], mark)
        assert not marked(b["pid"], mark), "the restored process is left running"


def bare_restore(b, timeout=30):
    return {"engine": "criu", "snapshot_dir": b["snapshot_dir"], "identity": bare_identity(b["pod"]),
            "agent_socket_dir": b["socket_dir"], "metadata_path": b["env"]["INFEROPS_METADATA_FILE"],
            "timeout": timeout}


def bare_rerun(b, found_state=None):
    result = run_module("snapshot_restore", dict(bare_restore(b, timeout=60), health_url=b["url"] + "/health",
                                                 health_timeout=60))
    assert result["failed"] is False and result["restored"] is True and result["pid"] == b["pid"], \
        (result.get("msg"), result.get("reason"), result.get("interrupted"))
    found = result["interrupted"]
    assert found["gone"] and "is gone" in found["gone"] and found["done"].startswith("killed pid %d" % b["pid"]), found
    if found_state:
        assert found["engine"]["state"] == found_state, found
    entries = status.read(b["snapshot_dir"])["restores"][-2:]
    assert [entry["outcome"] for entry in entries] == ["interrupted", "restored"], entries
    assert [generate(b["url"], p) for p in PROMPTS] == b["expected"]
    assert posix_locks(b["pid"]) == b["locks"]
    return found


def test_a_bare_restore_killed_after_it_reached_the_agent_serves_again_within_the_lease_it_bounded(bare):
    b = bare
    timeout = 30
    run = started_run(b["base"], bare_restore(b, timeout=timeout))
    try:
        wait(b["hook"].exists, 180, "the restore path's resumed (the engine's slow hook)", run)
    finally:
        killed_at = run.kill()
    record = last_restore(b["snapshot_dir"])
    assert record["outcome"] == "restoring" and record["path"] == "criu" and record["pid"] == b["pid"], record
    client = AgentSocketClient.for_pid(b["pid"], b["socket_dir"])
    reply = wait(lambda: serving(client), timeout + LEASE_MARGIN + SLACK,
                 "the engine RUNNING again within the lease the restore path bounded", interval=0.2)
    back_after = time.monotonic() - killed_at
    assert back_after <= timeout + LEASE_MARGIN + SLACK, back_after
    abandoned = reply["abandoned"]
    assert abandoned["lease_by"] == "restore" and abandoned["errors"] == [], abandoned
    assert abandoned["lease_s"] <= timeout + LEASE_MARGIN and abandoned["lease_s"] != RESTORE_LEASE, abandoned
    # the restore path told its nonce (the hook ran for it); CRIU gave one lock back, the agent took the other
    assert abandoned["actions"] == ["relock", "restore", "unlock"], abandoned
    assert reply["resumed"]["by"] == "restore" and reply["resumed"]["hooks"] == 1
    assert posix_locks(b["pid"]) == b["locks"]
    assert [generate(b["url"], p) for p in PROMPTS] == b["expected"]
    found = bare_rerun(b, "RUNNING")
    print("\nbare, killed in the restore path's resumed: serving again %.1f s after the kill (lease %.1f s); the "
          "rerun: %s" % (back_after, abandoned["lease_s"], found["reason"]))


def test_a_bare_restore_killed_right_after_criu_left_a_tree_that_never_ran_and_the_rerun_replaces_it(bare):
    b = bare
    flag = b["base"] / "criu-restored"
    real = subprocess.run(["sh", "-c", "command -v criu"], capture_output=True, text=True, check=True).stdout.strip()
    holding = b["base"] / "criu-holding"
    holding.mkdir()
    script(holding / "criu", CRIU_WRAPPER.format(criu=real, flag=flag))
    run = started_run(b["base"], bare_restore(b), extra_env={"PATH": "%s:%s" % (holding, os.environ["PATH"])})
    try:
        wait(flag.exists, 180, "criu restore", run)
    finally:
        run.kill()
    assert last_restore(b["snapshot_dir"])["outcome"] == "restoring"
    # CRIU left the tree stopped for the page images' verdict, which never came: it never ran, nothing resumes it
    assert open("/proc/%d/stat" % b["pid"]).read().rsplit(")", 1)[1].split()[0] == "T"
    found = bare_rerun(b)
    assert "stopped: CRIU left it stopped for a verdict that never came" in found["engine"]["process"], found
    print("\nbare, killed right after CRIU: the rerun: %s" % found["reason"])

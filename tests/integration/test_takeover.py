"""A run killed with its controller is taken over at once by the next: real dockerd,
CRIU and the simulated NPU's engine under its agent, the real snapshot_generate role and host_checkpoint.

- One generation id, a uuid, names the run in its claim, its status record, its results and its messages.
- ansible-playbook's process group (the playbook, its workers, the module) is killed at the checkpoint --
  runc and CRIU live on in their own session, as they do when a job is cancelled -- and a rerun right after
  takes the claim over at once, naming the dead run and what it removed of what that run left (its staging
  directory, runc's work directory), instead of being refused until the claim's lease runs out.
- A host_checkpoint killed mid-checkpoint leaves runc's work dir (inferops-dump-<maker>-...): snapshot_cleanup
  removes it, and so does the next run of the pod.

Each kill is recognised from what a generation leaves behind (a runc checkpoint running for the container, its
images appearing in the staging directory), and the kill follows at once (test_lease_kill.py's machinery)."""

import json
import os
import re
import time
import uuid

import pytest

from conftest import docker, run_module
from test_lease_kill import PROMPTS, Playbook, checkpoints_running, start_pod, wait

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status

ROLE = "inferops.snapshot.snapshot_generate : "
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def pod(docker_env, tmp_path_factory):
    made = start_pod(docker_env, tmp_path_factory.mktemp("takeover"))
    try:
        yield made
    finally:
        made.container.remove()


def role_playbook(pod):
    path = pod.tmp / "takeover_role.yml"
    path.write_text("- name: Generate with the snapshot_generate role\n  hosts: all\n  gather_facts: false\n"
                    "  roles:\n    - inferops.snapshot.snapshot_generate\n")
    return path


def start_role(pod, readiness_file=None, **extra):
    run = Playbook(pod.tmp, dict({"snapshot_generate_poll_interval": 0.2}, **extra), playbook=role_playbook(pod),
                   host_vars=pod.role_inventory(readiness_file))
    run.names = {"warmup": ROLE + "Wait for the warmup", "checkpoint": ROLE + "Device and host snapshot"}
    return run


def work_path(container_id):
    """Runc's --work-path of the checkpoint of the container that is running now, or None."""
    for pid in checkpoints_running(container_id):
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            argv = handle.read().decode().split("\0")
        if "--work-path" in argv:
            return argv[argv.index("--work-path") + 1]
    return None


def at_checkpoint(run, pod):
    """CRIU is writing the images of a runc checkpoint of the pod's container: (its work dir, what was seen)."""
    images = pod.staging / "host" / "criu"
    work = work_path(pod.container_id)
    if work and images.is_dir() and os.listdir(str(images)):
        return work, "CRIU writing %d image files" % len(os.listdir(str(images)))
    return None


def serving_again(pod):
    wait(lambda: not checkpoints_running(pod.container_id), 60, "the end of the orphaned checkpoint", interval=0.05)
    return [pod.container.generate(p) for p in PROMPTS]


def test_one_generation_id_names_the_run_in_its_claim_its_record_its_results_and_its_messages(pod):
    pod.forget()
    ready = "/tmp/takeover-ready-%s" % uuid.uuid4().hex[:6]
    run = start_role(pod, readiness_file=ready)
    try:
        held = wait(lambda: claim.read(str(pod.snapshot_dir)), 90, "the run's claim", run)
        generation = held["id"]
        assert re.match(r"\A[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\Z", generation), "not a uuid: %r" % generation
        record = wait(lambda: status.read(str(pod.snapshot_dir)), 30, "the status record", run)
        assert record["status"] == "generating" and record["generation_id"] == generation, record
    except BaseException:
        run.kill()
        raise
    docker("exec", pod.name, "touch", ready)
    assert run.finish() == 0, run.output()
    record = status.read(str(pod.snapshot_dir))
    assert record["status"] == "completed" and record["generation_id"] == generation, record
    assert set(entry["generation_id"] for entry in record["history"]) == {generation}, record["history"]
    summary = [line for line in run.lines if "%s: completed in generation %s" % (pod.name, generation) in line]
    assert summary, run.output()
    assert claim.read(str(pod.snapshot_dir)) is None, "released at the end"
    pod.forget()


def test_a_rerun_after_the_controller_was_killed_takes_the_claim_over_at_once_and_cleans_up(pod):
    pod.forget()
    expected = pod.expected
    killed = start_role(pod)
    try:
        work, what = wait(lambda: at_checkpoint(killed, pod), 120, "the checkpoint", killed)
        dead = claim.read(str(pod.snapshot_dir))
    finally:
        killed.kill()
    assert dead and dead["holder"]["kind"] == "controller" and dead["work"]["dirs"] == [work], dead
    assert os.path.isdir(str(pod.staging)), "the killed run left its staging directory"

    started = time.monotonic()
    rerun = start_role(pod)
    assert rerun.finish() == 0, rerun.output()
    seconds = time.monotonic() - started
    took = [line for line in rerun.lines if "took over the claim of generation %s" % dead["id"] in line]
    assert took and "the run that held it is gone" in took[0], rerun.output()
    assert "removed its staging dir %s" % pod.staging in took[0], took[0]
    # Its CRIU work dir is removed by the take-over -- or was already, by any run on this host that swept the work
    # dirs whose maker is gone (make test runs other generations beside this one): gone either way, checked below.
    assert "removed its CRIU work dir %s" % work in took[0] or not os.path.lexists(work), took[0]
    record = status.read(str(pod.snapshot_dir))
    assert record["status"] == "completed" and record["generation_id"] != dead["id"], record
    assert not os.path.exists(work), "the dead run's runc work dir is still there: %s" % work
    assert serving_again(pod) == expected
    assert seconds < claim.DEFAULT_LEASE, "the rerun waited for the dead run's claim to lapse (%.0f s)" % seconds
    print("\nkilled at the checkpoint (%s); the rerun took over and completed in %.1f s: %s" % (what, seconds, took[0]))
    pod.forget()


HOST_CHECKPOINT = """
- name: One host_checkpoint of the pod (killed mid-checkpoint by the test)
  hosts: all
  gather_facts: false
  tasks:
    - name: Host snapshot
      inferops.snapshot.host_checkpoint:
        container: "{{ pod.container }}"
        snapshot_dir: "{{ pod.snapshot_dir }}"
        identity: "{{ pod.identity }}"
        device_backup: true
        resume: true
        lease: 30
        if_exists: replace
        timeout: 60
        generation_id: "{{ generation }}"
      register: done
    - name: Keep the result
      ansible.builtin.copy: {content: "{{ done | to_json }}", dest: "{{ result_file }}", mode: '0600'}
"""


def private_temp(pod):
    """TMPDIR of the runs of the sweep test: make test runs other generations beside it, and each sweeps the work
    dirs whose maker is gone in the temp dir it uses -- the killed run's too, before this test's own sweep."""
    path = pod.tmp / "temp"
    path.mkdir(mode=0o700, exist_ok=True)
    return {"TMPDIR": str(path)}


def host_checkpoint(pod, generation, result_file):
    playbook = pod.tmp / "host_checkpoint.yml"
    playbook.write_text(HOST_CHECKPOINT)
    variables = {"generation": generation, "result_file": str(result_file),
                 "pod": {"container": pod.name, "snapshot_dir": str(pod.snapshot_dir), "identity": pod.identity}}
    return Playbook(pod.tmp, variables, playbook=playbook, extra_env=private_temp(pod))


def kill_mid_checkpoint(pod, generation):
    run = host_checkpoint(pod, generation, pod.tmp / ("never-%s.json" % generation))
    try:
        work, _what = wait(lambda: at_checkpoint(run, pod), 120, "the checkpoint", run)
    finally:
        run.kill()
    serving_again(pod)
    assert os.path.isdir(work), "runc's work dir went with the killed module: nothing to sweep"
    return work


def test_a_killed_checkpoints_work_dir_is_swept_by_snapshot_cleanup_and_by_the_next_run(pod):
    pod.forget()
    first = kill_mid_checkpoint(pod, "killed-1")
    assert re.match(r"\Ainferops-dump-\d+-\d+-[a-z0-9_]{8}\Z", os.path.basename(first)), first
    assert os.path.dirname(first) == private_temp(pod)["TMPDIR"], first
    preview = run_module("snapshot_cleanup", {"root": str(pod.root), "remove": ["failed"], "check_images": False},
                         check=True, extra_env=private_temp(pod))
    assert first in preview["work_dirs_removed"] and os.path.isdir(first), preview
    cleaned = run_module("snapshot_cleanup", {"root": str(pod.root), "remove": ["failed"], "check_images": False},
                         extra_env=private_temp(pod))
    assert cleaned["failed"] is False and first in cleaned["work_dirs_removed"], cleaned
    assert not os.path.exists(first)

    pod.forget()
    second = kill_mid_checkpoint(pod, "killed-2")
    result_file = pod.tmp / "next-run.json"
    run = host_checkpoint(pod, "next-run", result_file)
    assert run.finish() == 0, run.output()
    result = json.loads(result_file.read_text())
    assert result["status"] == "completed", result
    gone = (result["work_dirs_swept"] or []) + list((result["took_over"] or {}).get("cleaned") or [])
    assert any(second in entry for entry in gone), result
    assert not os.path.exists(second)
    assert serving_again(pod) == pod.expected
    pod.forget()


def test_the_claim_names_a_live_holder_and_refuses(pod, tmp_path):
    """The take-over never reaches a run that lives: a second run while the first waits for its warmup is
    refused, naming the first's generation and the process that holds it (still running)."""
    pod.forget()
    ready = "/tmp/takeover-live-%s" % uuid.uuid4().hex[:6]
    first = start_role(pod, readiness_file=ready)
    try:
        held = wait(lambda: claim.read(str(pod.snapshot_dir)), 90, "the first run's claim", first)
        second = start_role(pod, snapshot_generate_fail_on_error=False)
        assert second.finish() == 0, second.output()
        refused = [line for line in second.lines if "another generation of this pod's snapshot is in progress: "
                   "generation %s" % held["id"] in line]
        assert refused and "which is still running" in refused[0], second.output()
        assert claim.read(str(pod.snapshot_dir))["id"] == held["id"]
    finally:
        docker("exec", pod.name, "touch", ready)
        first.finish()
    assert layout.claim_path(str(pod.snapshot_dir)) and claim.read(str(pod.snapshot_dir)) is None
    pod.forget()

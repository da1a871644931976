"""The snapshot roles and playbooks run with ansible-playbook against the real dockerd: input rejected
before anything runs, check mode, idempotence, waiting for the warmup, an instance undone as a whole
when one pod fails, and cleanup. The molecule scenarios (extensions/molecule) cover the seed's test table."""

import json
import subprocess
import os
import time
import uuid

import pytest

from conftest import docker, free_port, reset_device, run_module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import cache as stage
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status
from _roles_helpers import local_inventory, run_playbook, finish, status_record
from _runtime_helpers import installed_runtime

PROMPTS = ["what is an NPU?", "数据"]


def config(root, **extra):
    return dict({"enabled": True, "hostSnapshotPath": str(root / "host"), "npuSnapshotPath": str(root / "npu"),
                 "timeoutSeconds": 120}, **extra)


def inventory(root, service, pods, instance="p0", **extra):
    return local_inventory(snapshot_config=config(root, **extra), snapshot_service={"namespace": "t", "name": service},
                           snapshot_instances=[{"name": instance, "pods": pods}])


def listing(root):
    found = []
    for directory, dirs, files in os.walk(str(root)):
        found += [os.path.relpath(os.path.join(directory, name), str(root)) for name in dirs + files]
    return sorted(found)


@pytest.mark.parametrize("bad, words", [
    ({"snapshot_instances": [{"name": "p0", "pods": [{"container": "x"}]}]},
     "Validating arguments against arg spec"),
    ({"snapshot_instances": [{"name": "p0", "pods": [{"name": "x", "readyness_url": "y"}]}]},
     "readyness_url"),
    ({"snapshot_config": {"enabled": True, "npuSnapshotPath": "/a", "hostSnapshotPath": "relative"}},
     "snapshot_config is invalid at hostSnapshotPath"),
    ({"snapshot_config": {"enabled": "maybe"}}, "snapshot_config is invalid at enabled"),
    ({"snapshot_instances": [{"name": "p0", "pods": [{"name": "a"}, {"name": "a"}]}]}, "pod 'a' appears twice"),
])
def test_bad_input_is_rejected_before_anything_runs(tmp_path, bad, words):
    inv = inventory(tmp_path, "bad", [{"name": "no-such-container-%s" % uuid.uuid4().hex[:6]}])
    inv["all"]["hosts"]["npu-host"].update(bad)
    playbooks = ("generate.yml", "restore.yml", "verify.yml", "cleanup.yml") if "hostSnapshotPath" in words else \
        ("generate.yml",)
    for playbook in playbooks:
        run = run_playbook(tmp_path / "runs", playbook, inv)
        assert run.rc != 0 and words in run.stdout, (playbook, run)
        assert run.recap["npu-host"]["changed"] == 0, (playbook, run)
    assert not (tmp_path / "host").exists() and not (tmp_path / "npu").exists()


SECRET_HEADER = "Bearer never-in-a-log-%s" % uuid.uuid4().hex[:8]


@pytest.mark.parametrize("bad, words", [
    ({"snapshot_generate_warmup_timeout": -5}, "snapshot_generate_warmup_timeout: must be a finite number of seconds "
                                               "greater than 0, got -5; give how long the warmup may take"),
    ({"snapshot_generate_poll_interval": "nan"}, "snapshot_generate_poll_interval: must be a finite number"),
    ({"snapshot_generate_progress_interval": 0}, "snapshot_generate_progress_interval: must be a finite number"),
    ({"snapshot_generate_lease": "inf"}, "snapshot_generate_lease: must be a finite number of seconds 0 or more"),
    ({"snapshot_generate_unlock_timeout": -3}, "snapshot_generate_unlock_timeout: must be a finite number"),
    ({"snapshot_generate_max_age": -1}, "snapshot_generate_max_age: must be a finite number of seconds 0 or more, "
                                        "got -1; give the seconds a snapshot may be restored for"),
    ({"snapshot_generate_max_age": "nan"}, "snapshot_generate_max_age: must be a finite number"),
    ({"snapshot_generate_statement_validity": 0}, "snapshot_generate_statement_validity: must be a finite number of "
                                                  "seconds greater than 0, got 0; give the seconds the statement"),
    ({"snapshot_generate_statement_validity": "inf"}, "snapshot_generate_statement_validity: must be a finite number"),
    ({"snapshot_generate_stage_dir": "relative/stage"},
     'snapshot_generate_stage_dir: "relative/stage" is not an absolute path; give the node\'s cache'),
    ({"snapshot_generate_keys_dir": "rel/keys"}, 'snapshot_generate_keys_dir: "rel/keys" is not an absolute path'),
    ({"snapshot_generate_runc_root": "rel/runc"}, 'snapshot_generate_runc_root: "rel/runc" is not an absolute path'),
    ({"snapshot_generate_agent_socket_dir": "rel"}, 'snapshot_generate_agent_socket_dir: "rel" is not an absolute'),
    ({"snapshot_generate_canary": {"URL": "http://127.0.0.1:8000/v1/completions"}},
     "snapshot_generate_canary.URL. Supported parameters include: body, compare, headers, method, url"),
    ({"snapshot_generate_canary": {"method": "GET"}}, "snapshot_generate_canary.url: give the engine's URL to ask"),
    ({"snapshot_generate_canary": {"url": "https://127.0.0.1:8000/"}},
     'snapshot_generate_canary.url: "https://127.0.0.1:8000/" is not an http:// URL'),
    ({"snapshot_generate_canary": {"url": "http://127.0.0.1:8000/", "compare": "full",
                                   "headers": {"Authorization": SECRET_HEADER}}},
     'snapshot_generate_canary.compare: "full" is not exact, status or json:<field path>'),
])
def test_generate_refuses_bad_role_variables_before_the_claim_in_check_mode_too(tmp_path, bad, words):
    """Checked right after the plan: no claim, no status record, no key, no warmup wait, in both modes."""
    inv = inventory(tmp_path, "pre", [{"name": "no-such-container-%s" % uuid.uuid4().hex[:6],
                                       "readiness_url": "http://127.0.0.1:%d/" % free_port()}])
    inv["all"]["hosts"]["npu-host"].update(dict({"snapshot_generate_keys_dir": str(tmp_path / "keys"),
                                                 "snapshot_generate_warmup_timeout": 600}, **bad))
    for check in (True, False):
        run = run_playbook(tmp_path / "runs", "generate.yml", inv, check=check)
        assert run.rc != 0 and words in run.stdout, (check, run)
        assert run.recap["npu-host"]["changed"] == 0, (check, run)
        assert SECRET_HEADER not in run.stdout + run.stderr, "a canary header value was repeated"
        assert "snapshot_generate : Start the report" not in run.stdout, "the role went on past its preflight"
    for made in ("host", "npu", "keys"):
        assert not (tmp_path / made).exists(), made


@pytest.mark.parametrize("bad, words", [
    ({"snapshot_cleanup_max_age": -1}, "snapshot_cleanup_max_age: must be a whole number of seconds 0 or more, got -1"),
    ({"snapshot_cleanup_generation_grace": 0},
     "snapshot_cleanup_generation_grace: must be a whole number of seconds greater than 0, got 0"),
])
def test_cleanup_refuses_a_negative_max_age_and_names_its_variables(tmp_path, bad, words):
    """Max_age -1 was "no age limit" without a word; the grace's error named the module's option only."""
    (tmp_path / "host").mkdir()
    inv = inventory(tmp_path, "pre", [{"name": "p0"}])
    inv["all"]["hosts"]["npu-host"].update(bad)
    for check in (True, False):
        run = run_playbook(tmp_path / "runs", "cleanup.yml", inv, check=check)
        assert run.rc != 0 and words in run.stdout, (check, run)
        assert run.recap["npu-host"]["changed"] == 0, (check, run)
        assert "snapshot_cleanup : Validate the snapshot config" not in run.stdout, "the role went on past its check"
    assert listing(tmp_path / "host") == []


@pytest.fixture
def pod_factory(docker_env, containers, tmp_path):
    def make(name=None, readiness=True, **env):
        name = name or "roles-%s" % uuid.uuid4().hex[:6]
        device_dir = tmp_path / ("dev-" + name)
        device_dir.mkdir(mode=0o700)
        c = containers(name, docker_env, device_dir, free_port(), WORKLOAD_DEVICE_MB="16", WORKLOAD_HOST_MB="4", **env)
        pod = {"name": name}
        if readiness:
            pod["readiness_url"] = c.url + "/health"
        return c, pod
    return make


def test_generate_check_mode_then_idempotent_second_run(tmp_path, pod_factory):
    c, pod = pod_factory()
    c.run().wait_ready()
    expected = [c.generate(p) for p in PROMPTS]
    inv = inventory(tmp_path, "idem", [pod])
    snap = tmp_path / "host" / "t" / "idem" / "p0" / pod["name"]

    preview = run_playbook(tmp_path / "runs", "generate.yml", inv, check=True)
    assert preview.rc == 0 and preview.recap["npu-host"]["changed"] >= 1, preview
    assert "would snapshot pod %s" % pod["name"] in preview.stdout
    host = preview.facts["npu-host"]
    assert host["snapshot_generate_outcome"]["status"] == "would_generate"
    assert [r["status"] for r in host["snapshot_generate_results"]] == ["would_generate"]
    assert not (tmp_path / "host").exists() and not (tmp_path / "npu").exists(), "check mode wrote something"
    assert c.info()["snapshot_state"] == "RUNNING"

    stage_dir = tmp_path / "stage"  # the node's cache of verified snapshots: each new one is staged there
    inv["all"]["hosts"]["npu-host"]["snapshot_generate_stage_dir"] = str(stage_dir)
    first = run_playbook(tmp_path / "runs", "generate.yml", inv)
    assert first.rc == 0 and first.recap["npu-host"]["changed"] >= 3, first
    result = first.facts["npu-host"]["snapshot_generate_results"][0]
    assert result["status"] == "completed" and result["snapshot_dir"] == str(snap)
    staged, why = stage.find(str(stage_dir), str(snap), drop=False)
    assert staged is not None, "the new snapshot was not staged: %s" % why
    staged.release()
    record = status_record(snap)
    assert record["status"] == "completed" and record["checksum"] == result["checksum"]
    assert [c.generate(p) for p in PROMPTS] == expected and c.info()["snapshot_state"] == "RUNNING"

    again = run_playbook(tmp_path / "runs", "generate.yml", inv)
    assert again.rc == 0 and again.recap["npu-host"]["changed"] == 0, again
    assert "%s: unchanged" % pod["name"] in again.stdout and "a completed snapshot is already there" in again.stdout
    assert again.facts["npu-host"]["snapshot_generate_outcome"]["status"] == "unchanged"
    assert status_record(snap)["updated_at"] == record["updated_at"], "the second run rewrote the status"

    preview_again = run_playbook(tmp_path / "runs", "generate.yml", inv, check=True)
    assert preview_again.rc == 0 and preview_again.recap["npu-host"]["changed"] == 0, preview_again

    verify = run_playbook(tmp_path / "runs", "verify.yml", inv, check=True)
    assert verify.rc == 0 and verify.recap["npu-host"]["changed"] == 0, verify
    checked = verify.facts["npu-host"]["snapshot_verify_results"][0]
    assert checked["usable"] and checked["valid"] and checked["status"] == "completed"


def keys_dir(tmp_path, name):
    """A controller key folder of its own: an AWX job's fresh container has no ~/.inferops/keys either."""
    path = tmp_path / name
    path.mkdir(mode=0o700)
    return str(path)


def predicted_then_run(tmp_path, playbook, inv):
    """The playbook in check mode, then for real: (check run, real run)."""
    return (run_playbook(tmp_path / "runs", playbook, inv, check=True),
            run_playbook(tmp_path / "runs", playbook, inv))


def test_check_mode_fails_where_the_run_fails_on_a_missing_container(tmp_path):
    """--check predicts the run: a pod whose container is missing fails generate both ways (it used to be a green
    'would snapshot ... NOT running'), and restore too when no snapshot can recreate the container (it used to be
    'would start normally')."""
    missing = "roles-missing-%s" % uuid.uuid4().hex[:6]
    inv = inventory(tmp_path, "predict", [{"name": missing}])
    inv["all"]["hosts"]["npu-host"].update(snapshot_generate_keys_dir=keys_dir(tmp_path, "gen-keys"),
                                           snapshot_restore_keys_dir=keys_dir(tmp_path, "restore-keys"),
                                           snapshot_restore_method="docker")
    words = {"generate.yml": "container %s is missing; start it before generating its snapshot" % missing,
             "restore.yml": "'%s' does not exist and there is no valid snapshot to recreate it from" % missing}
    for playbook, said in sorted(words.items()):
        check, real = predicted_then_run(tmp_path, playbook, inv)
        for run in (check, real):
            assert run.rc != 0 and said in run.stdout, (playbook, run)


def test_check_mode_on_a_fresh_controller_requires_the_signature_the_run_will(tmp_path, pod_factory):
    """A restore job in a container without the generating controller's key (AWX's fresh job container): its check
    run used to make no key, require no signature and say 'would restore'; the run makes a key, requires signatures
    and refuses the snapshot. Both now refuse it alike (signature_untrusted), and nothing of it is run."""
    c, pod = pod_factory()
    c.run().wait_ready()
    inv = inventory(tmp_path, "fresh", [pod])
    inv["all"]["hosts"]["npu-host"].update(snapshot_generate_keys_dir=keys_dir(tmp_path, "generate-job"),
                                           snapshot_restore_method="docker")
    generated = run_playbook(tmp_path / "runs", "generate.yml", inv)
    assert generated.rc == 0, generated
    c.remove()
    reset_device(c.device_dir)
    inv["all"]["hosts"]["npu-host"]["snapshot_restore_keys_dir"] = keys_dir(tmp_path, "restore-job")
    try:
        check, real = predicted_then_run(tmp_path, "restore.yml", inv)
        for run in (check, real):
            assert run.rc != 0 and "no valid snapshot to recreate it from (signature_untrusted: " in run.stdout, run
    finally:
        docker("rm", "-f", pod["name"], check=False)


def test_waits_for_the_warmup_file_and_undoes_the_whole_instance_when_one_pod_fails(tmp_path, pod_factory):
    ready = "/tmp/inferops-warmed-up"
    a, pod_a = pod_factory(readiness=False)
    pod_a["readiness_file"] = ready
    b, pod_b = pod_factory(WORKLOAD_STUCK_BACKGROUND_THREAD="1", ACL_SIM_LOCK_TIMEOUT_MS="1000")
    for c in (a, b):
        c.run().wait_ready()
    expected = [a.generate(p) for p in PROMPTS]
    inv = inventory(tmp_path, "pair", [pod_a, pod_b])
    snap_a = tmp_path / "host" / "t" / "pair" / "p0" / pod_a["name"]

    running = run_playbook(tmp_path / "runs", "generate.yml", inv, extra_vars=[{"snapshot_generate_fail_on_error": False}],
                           popen=True)
    deadline = time.monotonic() + 60
    while (status_record(snap_a) or {}).get("status") != "generating" and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # the role must still be waiting: the file that says "warmed up" is not there yet
    record = status_record(snap_a)
    assert record["status"] == "generating" and record["reason"] == "waiting for the warmup", record
    assert a.info()["snapshot_state"] == "RUNNING" and not snap_a.exists()
    docker("exec", a.name, "touch", ready)
    run = finish(running)

    assert run.rc == 0, run
    host = run.facts["npu-host"]
    assert host["snapshot_generate_outcome"]["status"] == "failed", host
    results = {r["pod"]: r for r in host["snapshot_generate_results"]}
    assert results[pod_b["name"]]["reason"].startswith("device snapshot of pod %s failed" % pod_b["name"])
    assert "507905" in results[pod_b["name"]]["reason"]
    assert results[pod_a["name"]]["reason"].startswith("instance p0 failed at pod %s: " % pod_b["name"])
    assert str(snap_a) in results[pod_a["name"]]["removed"], "pod a's completed snapshot must go with the instance"
    history_a = [h["status"] for h in status_record(snap_a)["history"]]
    assert history_a[-2:] == ["completed", "failed"], history_a
    # pod a's signed statement of its latest generation stays: it only ever refuses older generations, and the next
    # generation supersedes it (pod b never completed, so it has none)
    assert listing(tmp_path / "host") == sorted(["t", "t/pair", "t/pair/p0", "t/pair/p0/.%s.status.json" % pod_a["name"],
                                                 "t/pair/p0/.%s.latest.json" % pod_a["name"],
                                                 "t/pair/p0/.%s.status.json" % pod_b["name"]])
    assert not (tmp_path / "npu").exists() or listing(tmp_path / "npu") == ["t", "t/pair", "t/pair/p0"]
    assert host["snapshot_generate_engines"][pod_a["name"]]["engine"] == "RUNNING"
    assert host["snapshot_generate_engines"][pod_b["name"]] == {"engine": "RUNNING", "serving": True}
    assert [a.generate(p) for p in PROMPTS] == expected and [b.generate(p) for p in PROMPTS] == expected

    cleaned = run_playbook(tmp_path / "runs", "cleanup.yml", inv)
    assert cleaned.rc == 0 and cleaned.recap["npu-host"]["changed"] == 1, cleaned
    result = cleaned.facts["npu-host"]["snapshot_cleanup_result"]
    # the failed records go; pod a's statement stays (removing it would let an older generation back in)
    assert result["summary"]["failed"] == 2 and \
        os.listdir(str(tmp_path / "host" / "t" / "pair" / "p0")) == [".%s.latest.json" % pod_a["name"]]
    again = run_playbook(tmp_path / "runs", "cleanup.yml", inv)
    assert again.rc == 0 and again.recap["npu-host"]["changed"] == 0, again


def test_a_second_run_on_the_same_pods_is_refused_and_touches_neither_their_files_nor_their_engines(
        tmp_path, pod_factory):
    """Two generations of one pod at once (a retried AWX job, two operators): the second is refused naming the
    first, removes nothing of what the first wrote and never unlocks the engine the first may be checkpointing."""
    ready = "/tmp/inferops-warmed-up"
    a, pod_a = pod_factory(readiness=False)
    pod_a["readiness_file"] = ready
    a.run().wait_ready()
    expected = [a.generate(p) for p in PROMPTS]
    inv = inventory(tmp_path, "twice", [pod_a])
    snap = tmp_path / "host" / "t" / "twice" / "p0" / pod_a["name"]
    first = run_playbook(tmp_path / "runs", "generate.yml", inv, popen=True)
    deadline = time.monotonic() + 60
    while (status_record(snap) or {}).get("status") != "generating" and time.monotonic() < deadline:
        time.sleep(0.2)
    held = claim.read(str(snap))
    assert held and status_record(snap)["status"] == "generating", held
    second = run_playbook(tmp_path / "runs", "generate.yml", inv, extra_vars=[{"snapshot_generate_fail_on_error": False}])
    assert second.rc == 0, second
    entry = second.facts["npu-host"]["snapshot_generate_results"][0]
    assert entry["status"] == "failed" and "another generation of this pod's snapshot is in progress" in entry["reason"] \
        and held["id"] in entry["reason"], entry
    assert "Unlock the engine" not in second.stdout, "the second run went for the first run's engine"
    assert claim.read(str(snap))["id"] == held["id"] and status_record(snap)["status"] == "generating"
    docker("exec", a.name, "touch", ready)
    done = finish(first)
    assert done.rc == 0 and done.facts["npu-host"]["snapshot_generate_results"][0]["status"] == "completed", done
    assert claim.read(str(snap)) is None and [a.generate(p) for p in PROMPTS] == expected


def test_snapshot_status_records_failed_and_removes_only_the_pods_paths(tmp_path):
    identity = {"namespace": "t", "service": "s", "instance": "p0", "pod": "pod-x"}
    snap = tmp_path / "host" / "t" / "s" / "p0" / "pod-x"
    npu = tmp_path / "npu" / "t" / "s" / "p0" / "pod-x"
    staging = snap.parent / ".pod-x.partial"
    for path in (snap, npu, staging):
        path.mkdir(parents=True, mode=0o700)
    args = {"snapshot_dir": str(snap), "identity": identity, "status": "failed", "reason": "timeout: late",
            "extra_paths": [str(npu)], "generation_id": "run-x"}

    refused = run_module("snapshot_status", dict(args, extra_paths=[str(tmp_path / "npu")]))
    assert refused["failed"] and "does not contain the pod name 'pod-x'" in refused["msg"], refused
    assert npu.exists()

    # a published snapshot no record says run-x completed is not run-x's to remove
    foreign = run_module("snapshot_status", args, check=True)
    assert foreign["changed"] and sorted(foreign["removed"]) == sorted([str(staging), str(npu)]), foreign
    status.update(str(snap), "completed", generation_id="run-x")  # run-x published it, then failed after

    preview = run_module("snapshot_status", args, check=True)
    assert preview["changed"] and sorted(preview["removed"]) == sorted([str(snap), str(staging), str(npu)])
    assert snap.exists() and status_record(snap)["status"] == "completed"

    done = run_module("snapshot_status", args)
    assert done["changed"] and done["status"] == "failed" and done["previous"] == "completed"
    assert not snap.exists() and not staging.exists() and not npu.exists()
    record = status_record(snap)
    assert record["status"] == "failed" and record["reason"] == "timeout: late" and record["identity"] == identity

    again = run_module("snapshot_status", args)
    assert again["changed"] is False and again["removed"] == []
    read = run_module("snapshot_status", {"snapshot_dir": str(snap), "identity": identity})
    assert read["changed"] is False and read["status"] == "failed"
    no_snapshot = run_module("snapshot_status", {"snapshot_dir": str(snap), "identity": identity, "status": "completed"})
    assert no_snapshot["failed"] and "no snapshot is published" in no_snapshot["msg"]
    no_reason = run_module("snapshot_status", {"snapshot_dir": str(snap), "identity": identity, "status": "failed"})
    assert no_reason["failed"] and no_reason["msg"].startswith("reason: required")


def test_restore_role_through_the_restore_on_create_runtime(tmp_path, pod_factory):
    """Snapshot_restore_method=runtime: the role recreates the deleted container under the snapshot_node
    runtime, which verifies and restores it; the warmed-up answers come back."""
    (tmp_path / "node").mkdir()
    with installed_runtime(tmp_path / "node") as node:
        c, pod = pod_factory()
        c.run().wait_ready()
        expected = [c.generate(p) for p in PROMPTS]
        inv = local_inventory(
            snapshot_config=config(node.roots), snapshot_service={"namespace": "t", "name": "rt"},
            snapshot_instances=[{"name": "p0", "pods": [pod]}],
            snapshot_restore_method="runtime", snapshot_restore_runtime_name=node.name)
        generated = run_playbook(tmp_path / "runs", "generate.yml", inv)
        assert generated.rc == 0 and generated.facts["npu-host"]["snapshot_generate_results"][0]["status"] == "completed", \
            generated
        c.remove()
        reset_device(c.device_dir)
        try:
            restored = run_playbook(tmp_path / "runs", "restore.yml", inv)
            assert restored.rc == 0, restored
            result = restored.facts["npu-host"]["snapshot_restore_results"][0]
            assert result["restored"] is True, result
            assert docker("inspect", "--format", "{{.HostConfig.Runtime}}", pod["name"]) == node.name
            container_id = docker("inspect", "--format", "{{.Id}}", pod["name"])
            assert [r["outcome"] for r in node.log_records(container_id)] == ["restored"]
            assert [c.generate(p) for p in PROMPTS] == expected
        finally:
            docker("rm", "-f", pod["name"], check=False)


def test_a_failed_run_leaves_a_pod_it_was_refused_alone_even_after_the_other_run_released_it(tmp_path):
    """The race the claim alone cannot see: run B is refused on pod A (run A holds it), run A completes and
    releases its claim, then B cleans up after its failure. B must not remove A's snapshot or record it failed;
    the pods B did claim are still cleaned up."""
    root = tmp_path / "host" / "t" / "race" / "p0"
    pods = []
    for name in ("pod-a", "pod-b"):
        snap = root / name
        snap.mkdir(parents=True, mode=0o700)
        (snap / "manifest.json").write_text("{}\n")
        pods.append({"pod": {"name": name, "container": "c-" + name, "instance": "p0", "snapshot_dir": str(snap),
                             "npu_dir": str(tmp_path / "npu" / "t" / "race" / "p0" / name),
                             "identity": {"namespace": "t", "service": "race", "instance": "p0", "pod": name}}})
    status.update(str(root / "pod-a"), "completed", identity=pods[0]["pod"]["identity"], checksum="a" * 64)
    assert claim.read(str(root / "pod-a")) is None, "run A has released its claim"
    run_b = claim.new_id()
    status.update(str(root / "pod-b"), "completed", identity=pods[1]["pod"]["identity"], generation_id=run_b)
    playbook = tmp_path / "cleanup-after-refusal.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: inferops.snapshot.snapshot_generate\n"
        "        tasks_from: failed.yml\n      vars:\n" + "".join("        %s: %s\n" % (key, json.dumps(value)) for key, value in {
            "_snapshot_generate_todo": pods,
            "_snapshot_generate_held": ["pod-a"],  # refused at its claim: run A held it then
            "_snapshot_generate_left": {"pod-b": "unlocked"},  # pod-b's engine needs nothing (keeps the test off Docker)
            "_snapshot_generate_id": run_b,  # it published pod-b's snapshot, then failed
            "_snapshot_generate_failure": {"pod": "pod-a", "step": "claim", "reason": "another generation of this "
                                           "pod's snapshot is in progress: generation x"},
            "snapshot_generate_results": []}.items()))
    run = run_playbook(tmp_path / "runs", playbook, local_inventory())
    assert run.rc == 0, run
    assert (root / "pod-a" / "manifest.json").exists() and status_record(root / "pod-a")["status"] == "completed"
    assert not (root / "pod-b").exists() and status_record(root / "pod-b")["status"] == "failed"
    results = dict((entry["pod"], entry) for entry in run.facts["npu-host"]["snapshot_generate_results"])
    assert results["pod-a"]["removed"] == [] and "another generation" in results["pod-a"]["reason"], results
    assert results["pod-b"]["removed"] == [str(root / "pod-b")], results


def test_a_read_only_store_is_a_clear_error_the_cleanup_does_not_fail_on_and_the_summary_is_printed(
        tmp_path, pod_factory):
    """With the snapshot store read-only, generation used to fail with "unexpected error in
    snapshot_status: [Errno 30] Read-only file system", its cleanup failed the same way, and the per-pod summary was
    never printed. Now the error names the path and the cause, the cleanup goes on, every engine serves and the
    summary says what happened to the pod; the role's failure says what it could do -- nothing removed, nothing
    recorded -- where it used to say the snapshot paths were removed and the status records said failed."""
    c, pod = pod_factory()
    c.run().wait_ready()
    expected = [c.generate(p) for p in PROMPTS]
    store = tmp_path / "host"
    store.mkdir(mode=0o700)
    subprocess.run(["mount", "--bind", str(store), str(store)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(store)], check=True)
        run = run_playbook(tmp_path / "runs", "generate.yml", inventory(tmp_path, "ro", [pod]),
                           extra_vars=[{"snapshot_generate_fail_on_error": False}])  # the results are dumped
        failing = run_playbook(tmp_path / "runs", "generate.yml", inventory(tmp_path, "ro", [pod]))
    finally:
        subprocess.run(["umount", str(store)], check=True)
    assert run.rc == 0 and run.facts["npu-host"]["snapshot_generate_outcome"]["status"] == "failed", run
    said = " ".join(failing.stdout.split())
    assert failing.rc == 2 and "It removed no path. The failure could not be recorded beside the snapshot of %s " \
        "(see the reason)." % pod["name"] in said and "were removed" not in said, failing.stdout[-3000:]
    assert "unexpected error" not in run.stdout, run
    entry = run.facts["npu-host"]["snapshot_generate_results"][0]
    assert entry["status"] == "failed" and "cannot write %s" % store in entry["reason"] \
        and "Read-only file system -- the storage it is on is read-only; remount it read-write" in entry["reason"], entry
    assert "%s: failed" % pod["name"] in run.stdout, "the per-pod summary was not printed"
    assert run.facts["npu-host"]["snapshot_generate_engines"][pod["name"]] == {"engine": "RUNNING", "serving": True}
    assert [c.generate(p) for p in PROMPTS] == expected


def test_a_host_only_generation_says_it_never_locked_the_engine(tmp_path, pod_factory):
    """snapshot_generate_device=false (a CPU engine): the per-pod line used to say "engine left None"."""
    c, pod = pod_factory()
    c.run().wait_ready()
    run = run_playbook(tmp_path / "runs", "generate.yml", inventory(tmp_path, "hostonly", [pod]),
                       extra_vars=[{"snapshot_generate_device": False}])
    assert run.rc == 0 and run.facts["npu-host"]["snapshot_generate_outcome"]["status"] == "completed", run
    assert run.facts["npu-host"]["snapshot_generate_engines"][pod["name"]] == {"engine": None, "serving": True}
    said = " ".join(run.stdout.split())
    assert "; host only, the engine was never locked, serving" in said and "None" not in said, run.stdout[-3000:]

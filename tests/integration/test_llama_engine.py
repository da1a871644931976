"""A real third-party engine under the agent: llama.cpp's OpenAI-compatible server from PyPI
llama-cpp-python (built from source once, cached), on a tiny random-weight model the test writes
itself, snapshotted with the collection's host_checkpoint and brought back by a plain
`docker run --runtime <restore-on-create runtime>`. Real dockerd, runc, CRIU and llama.cpp: nobody on
this project wrote the engine, its threads (OpenMP pool), its listening socket or its memory-mapped
model file on a read-only bind mount. The engine is a CPU engine: the host part only, device restore
off (the collection's host-only mode).

Identical greedy answers alone prove nothing here: a deterministic model gives them after a cold
start too. So the test also proves that the restored process is the checkpointed one, with a probe
whose answer depends on the history of the process (see test_restored_engine_is_the_checkpointed_process),
and that a cold start is one (the probe gives a fresh process's first answer).

The problems this engine showed: a model file changed in place (1) or swapped under an engine
that read it at start (2), other engine arguments (3) now end in a cold start naming the fact;
an engine holding file locks (4) is checkpointed and restored, and holds its locks again (CRIU drops
those on a file the process maps: restore/file_locks.py has the agent take them back).
"""

import os
import time

import pytest

from _llama_helpers import (SERVICE, Generated, LlamaEngine, assert_cold_start, cold_reference, generate, identity,
                            llama_engines, llama_image, llama_model, llama_node, posix_locks, process_start_ticks,
                            recreate, restore_env, snapshot_dir, take_snapshot, unique_name, write_model)
from _roles_helpers import local_inventory, run_playbook
from conftest import docker, flip_one_byte, run_module

FIXTURES = (llama_engines, llama_image, llama_model, llama_node)  # pytest finds the imported fixtures here

PROMPTS = ["what is an NPU?", "restore me on create", "the quick brown fox", "数据"]


def test_engine_image_serves_deterministic_greedy_completions(llama_image, llama_model, llama_engines):
    """The image runs llama.cpp's server under the agent (the agent's socket is there) and a cold start
    answers like any other cold start: what makes 'identical answers' a meaningful comparison."""
    first = llama_engines(llama_image, llama_model).run()
    first.wait_ready()
    answers = first.completions(PROMPTS)
    assert len(set(answers)) == len(PROMPTS) and all(answers), answers  # the model is not degenerate
    assert first.completions(PROMPTS) == answers, "greedy decoding is deterministic within a process"
    assert "inferops_agent" in first.inspect("{{json .Config.Entrypoint}}")
    assert first.environ().get("PYTHONPATH") == "/opt/inferops"
    ls = first.logs()
    assert "inferops-agent[1]: listening on /run/inferops-snapshot/agent.1.sock" in ls, ls[-3000:]
    first.remove()
    second = llama_engines(**first.config()).run()
    second.wait_ready()
    assert second.completions(PROMPTS) == answers, "a cold start gives the same greedy answers"


def test_restored_engine_is_the_checkpointed_process(llama_image, llama_model, llama_node, llama_engines):
    """Generate -> delete -> restore with `docker run --runtime`: identical completions, and the same process.

    The continuity proof is an RNG probe (LlamaEngine.probe): a completion sampled at temperature 1
    with no seed in the request. For such a request llama-cpp-python seeds the sampler with the next
    link of a seed chain kept in the process (Llama._seed: each completion that brings no seed first
    does ``set_seed(random.Random(_seed).randint(0, 2**32))``), starting from the server's ``--seed``.
    So the probe's answer is a function of the number of completions the process has served:

    - every fresh process answers its first probes with the same ``cold`` answers (positions 0-2);
    - the original process, after 3 probes and 4 greedy completions, was checkpointed at position 7;
      it then answered ``after`` (positions 7-9), asked right after the checkpoint, so they are
      exactly what the checkpointed state answers next;
    - the restored process must answer a probe from ``after``. A cold start could not: its first
      answers are ``cold``, and the test checks that ``after`` and ``cold`` share no answer (24 tokens
      sampled from a vocabulary of ~380: a collision is not a realistic event). It is ``after[0]``
      unless something sent the restored engine an unseeded completion before the test did (e.g. a
      post-restore canary replaying a request); then a later one, still never a cold one.

    CRIU does not carry the kernel's process start time over (a restored task is a new task, the
    start time in /proc/1/stat is the restore's: checked below), and the pid inside the container is
    1 either way, so neither can tell a restore from a cold start; the seed chain lives in the
    engine's own memory, as its KV cache and weights do. As a second, independent witness, the
    restored process keeps the environment it was checkpointed with (no INFEROPS_RESTORE_FROM).
    The control at the end starts the same container cold and gets ``cold[0]``.
    """
    pod = unique_name("g")
    snap = snapshot_dir(llama_node.roots, pod)
    original = llama_engines(llama_image, llama_model, name=pod)
    started = time.monotonic()
    original.run()
    original.wait_ready()
    cold = original.probes(3)
    expected = original.completions(PROMPTS)
    cold_seconds = time.monotonic() - started
    original_ticks = process_start_ticks(original)

    checkpoint = take_snapshot(original, snap, pod)
    after = original.probes(3)
    assert not set(after) & set(cold), "the probe does not tell the stream positions apart: %r %r" % (cold, after)
    assert original.completions(PROMPTS) == expected, "the original keeps serving after the checkpoint"
    original.remove()

    restored = llama_engines(**original.config(runtime=llama_node.name, env=restore_env(snap)))
    started = time.monotonic()
    restored.run()
    restored.wait_ready()
    restore_seconds = time.monotonic() - started
    first = restored.probe()
    assert first in after, "not the checkpointed process: probe %r, the snapshot's next answers %r, a cold " \
                           "start's first answers %r" % (first, after, cold)
    assert restored.completions(PROMPTS) == expected

    record = llama_node.log_records(restored.id)[-1]
    assert record["outcome"] == "restored" and record["reason"] is None, record
    assert record["snapshot"] == snap and not record.get("device_actions"), record
    assert "INFEROPS_RESTORE_FROM" not in restored.environ(), "the restored process has its old environment"
    restored_ticks = process_start_ticks(restored)
    assert restored_ticks > original_ticks, "CRIU carried the start time over: it is a witness after all"
    assert "inferops_agent" in restored.inspect("{{json .Config.Entrypoint}}")
    print("\nllama.cpp restore on create: ready %.2f s after docker run (cold start to answers %.2f s), "
          "probe position %d after the checkpoint; checkpoint %s, %d bytes; runtime stages %s"
          % (restore_seconds, cold_seconds, after.index(first), checkpoint["durations"],
             checkpoint["total_bytes"], record["durations"]))
    restored.remove()

    control = llama_engines(**original.config())
    control.run()
    control.wait_ready()
    assert control.probe() == cold[0], "a cold start answers the probe like the original's first answer"
    assert control.completions(PROMPTS) == expected


def test_engine_holding_file_locks_is_checkpointed_and_restored(
        llama_image, llama_model, llama_node, llama_engines, tmp_path):
    """Llama-cpp-python's disk prompt cache (``--cache true --cache_type disk``:
    diskcache, i.e. SQLite in WAL mode) keeps POSIX locks on its database while the server runs. The
    container checkpoint must take the process with them (CRIU --file-locks; without it the
    checkpoint failed, "criu failed: type NOTIFY errno 0"), and the restore bring the same
    process back, serving from its cache. The test checks that the engine does hold POSIX locks when
    the checkpoint is taken.

    The cache lives below the server's working directory, here a bind mount (-w /cache), so that its
    files exist at restore, and they must be as they were at the checkpoint: CRIU refuses a file
    whose size changed ("cache.db-wal has bad size" when the original went on serving). So the
    original is removed right after the checkpoint, before it serves (and writes) again, and the
    answers the checkpointed state gives next come from a reference engine that replays the same
    requests from a fresh start, with a cache of its own: llama-cpp-python is deterministic given
    its history. (A real deployment has the same constraint: files an engine writes on a mount must
    be at restore as they were at the checkpoint.)"""
    cache, reference_cache = tmp_path / "cache", tmp_path / "reference-cache"
    cache.mkdir()
    reference_cache.mkdir()
    pod = unique_name("l")
    settings = dict(args=["--cache", "true", "--cache_type", "disk"], docker_args=["-w", "/cache"])
    original = llama_engines(llama_image, llama_model, name=pod, mounts=["%s:/cache" % cache], **settings).run()
    original.wait_ready()
    cold = original.probes(2)
    expected = original.completions(PROMPTS)
    locks = posix_locks(original)
    assert len(locks) >= 1, "the engine holds no POSIX lock: this test would not exercise --file-locks"
    assert os.path.exists(str(cache / ".cache" / "llama_cache" / "cache.db"))
    snap = snapshot_dir(llama_node.roots, pod)
    take_snapshot(original, snap, pod)
    original.remove()

    reference = llama_engines(**original.config(mounts=["%s:/cache" % reference_cache])).run()
    reference.wait_ready()
    assert reference.probes(2) == cold and reference.completions(PROMPTS) == expected, "not deterministic"
    after = reference.probes(2)
    assert not set(after) & set(cold)
    reference.remove()

    restored = llama_engines(**original.config(runtime=llama_node.name, env=restore_env(snap))).run()
    restored.wait_ready()
    record = llama_node.log_records(restored.id)[-1]
    assert record["outcome"] == "restored", record["reason"]
    # SQLite in the restored process believes it holds its locks: it must (CRIU drops the lock on the mapped
    # cache.db-shm at the restore; the engine's agent takes it back before the engine is unlocked)
    assert posix_locks(restored) == locks, "the restored process does not hold the locks it had"
    assert record["file_locks"]["checkpointed"] == len(locks) and record["file_locks"]["taken_back"] >= 1, record
    assert restored.probe() in after, "not the checkpointed process"
    assert restored.completions(PROMPTS) == expected, "the restored engine and its disk cache do not serve"
    assert posix_locks(restored) == locks, "the restored process lost its locks while serving"


def test_model_changed_in_place_same_size_comes_back_cold(llama_image, llama_model, llama_node, llama_engines):
    """Problem 1: the mmapped model file rewritten in place: same path, inode and size, other weights.
    CRIU checks only the size of a mapped file; the snapshot's fingerprint of the mount's files catches it."""
    g = generate(llama_node, llama_engines, llama_image, llama_model, PROMPTS)
    path = os.path.join(str(llama_model), "tiny.gguf")
    before = os.stat(path)
    write_model(llama_image, llama_model, seed=7, in_place=True)
    after = os.stat(path)
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino), "not changed in place"
    reference = cold_reference(llama_engines, g)
    assert reference[1] != g.expected, "another seed, another model"
    engine, record = recreate(llama_node, llama_engines, g)
    assert_cold_start(engine, record, g, reference, "files_mismatch: /models/tiny.gguf changed", "3616032")


def test_model_read_at_start_then_swapped_comes_back_cold(llama_image, llama_model, llama_node, llama_engines):
    """Problem 2 (the restore): with --use_mmap false the weights are read at start and the file is
    closed, so CRIU knows nothing of it; a new model file of another size renamed over it must not
    restore the old weights."""
    g = generate(llama_node, llama_engines, llama_image, llama_model, PROMPTS, args=["--use_mmap", "false"])
    write_model(llama_image, llama_model, seed=9, n_layer=3)
    reference = cold_reference(llama_engines, g)
    assert reference[1] != g.expected
    engine, record = recreate(llama_node, llama_engines, g)
    assert_cold_start(engine, record, g, reference, "files_mismatch: /models/tiny.gguf changed")


def test_other_engine_arguments_come_back_cold(llama_image, llama_model, llama_node, llama_engines):
    """Problem 3: the container is recreated with other engine arguments (--n_ctx 128 --seed 7): a cold
    start with them, for a reason that shows both command lines; docker inspect shows what runs."""
    g = generate(llama_node, llama_engines, llama_image, llama_model, PROMPTS)
    reference = cold_reference(llama_engines, g, n_ctx=128, seed=7)
    engine, record = recreate(llama_node, llama_engines, g, n_ctx=128, seed=7)
    assert_cold_start(engine, record, g, reference, "args_mismatch:", "'--n_ctx', '512', '--seed', '42'",
                      "'--n_ctx', '128', '--seed', '7'")
    assert engine.inspect("{{json .Args}}").count('"128"') == 1


def test_generation_replaces_a_stale_snapshot_and_force_regenerates(
        llama_image, llama_model, llama_node, llama_engines):
    """Problem 2 (the generation; deliver item 3): after the model file was swapped, the completed
    snapshot belongs to another world. The next generation must replace it (status says why) instead
    of keeping it; ``force`` regenerates an unchanged one. (The restore side of problem 2 is above.)"""
    g = generate(llama_node, llama_engines, llama_image, llama_model, PROMPTS, args=["--use_mmap", "false"])
    write_model(llama_image, llama_model, seed=9, n_layer=3)
    engine, record = recreate(llama_node, llama_engines, g)
    assert record["outcome"] == "cold", record
    args = {"container": engine.name, "snapshot_dir": g.snap, "identity": identity(g.pod), "method": "runc",
            "require_device_part": False}
    info = run_module("snapshot_info", {"snapshot_dir": g.snap, "identity": identity(g.pod), "container": engine.name,
                                        "device_state": False})
    assert info["usable"] is False and info["stale_reasons"][0].startswith("files_mismatch: /models/"), info
    again = run_module("host_checkpoint", args)
    assert again["changed"] is True and again["status"] == "completed", again
    assert again["replaced_because"][0].startswith("files_mismatch: /models/"), again
    kept = run_module("host_checkpoint", args)
    assert kept["changed"] is False and kept["replaced_because"] == [], kept
    forced = run_module("host_checkpoint", dict(args, force=True))
    assert forced["changed"] is True and forced["replaced_because"] == ["force"], forced
    engine.remove()  # its sockets: the restored copy listens where it did
    restored, record = recreate(llama_node, llama_engines, g)
    assert record["outcome"] == "restored", record


def test_the_roles_in_host_only_mode_generate_restore_and_force_with_a_canary(
        llama_image, llama_model, llama_node, llama_engines, tmp_path):
    """The roles for a CPU engine (no NPU, no device part), as an operator runs them: generate.yml
    with snapshot_generate_device=false and a canary, restore.yml with snapshot_restore_device=false and the default
    method (auto: this node's restore-on-create runtime holds the snapshot root), and a forced regeneration."""
    pod = unique_name("r")
    original = llama_engines(llama_image, llama_model, name=pod).run()
    original.wait_ready()
    cold = original.probes(2)
    expected = original.completions(PROMPTS)
    inventory = local_inventory(
        snapshot_config={"enabled": True, "hostSnapshotPath": str(llama_node.roots),
                         "npuSnapshotPath": str(tmp_path / "npu"), "timeoutSeconds": 120},
        snapshot_service={"namespace": "default", "name": SERVICE},
        snapshot_instances=[{"name": "p0", "pods": [{"name": pod, "container": pod,
                                                     "readiness_url": original.url + "/v1/models"}]}],
        snapshot_generate_device=False, snapshot_restore_device=False, snapshot_restore_runtime_name=llama_node.name,
        snapshot_generate_canary={"url": original.url + "/v1/completions", "compare": "json:choices.0.text",
                                  "body": {"prompt": "canary", "max_tokens": 8, "temperature": 0.0}})
    first = run_playbook(tmp_path / "runs", "generate.yml", inventory)
    assert first.rc == 0, first
    result = first.facts["npu-host"]["snapshot_generate_results"][0]
    assert result["status"] == "completed" and result["device"] is None, result
    snap = snapshot_dir(llama_node.roots, pod)
    assert os.path.isfile(os.path.join(snap, "canary.json")) and not os.path.exists(os.path.join(snap, "device"))
    after = original.probes(2)
    assert not set(after) & set(cold)

    forced = run_playbook(tmp_path / "runs", "generate.yml", inventory, extra_vars=[{"snapshot_generate_force": True}])
    assert forced.rc == 0 and forced.facts["npu-host"]["snapshot_generate_results"][0]["status"] == "completed", forced
    assert forced.facts["npu-host"]["snapshot_generate_results"][0]["checksum"] != result["checksum"]
    after = original.probes(2)  # the state the forced snapshot holds is followed by these
    original.remove()

    restored = run_playbook(tmp_path / "runs", "restore.yml", inventory)
    assert restored.rc == 0, restored
    entry = restored.facts["npu-host"]["snapshot_restore_results"][0]
    assert entry["restored"] is True and entry["method"] == "runtime", entry
    record = llama_node.log_records(docker("inspect", "--format", "{{.Id}}", pod))[-1]
    assert record["outcome"] == "restored" and record["device_actions"] is None, record  # host only, by the runtime
    engine = LlamaEngine(**original.config(name=pod))
    assert engine.completions(PROMPTS) == expected
    assert engine.probes(2) != cold, "a fresh process: the restore did not bring the checkpointed one back"
    docker("rm", "-f", pod)


# -- a changed model is always seen -----------------------------------------------------------------

def unsampled_offset(path):
    """An offset in the model's tensor data that none of the 16 evenly spread 64 KiB blocks an older collection
    fingerprinted covers: a change there kept the old fingerprint."""
    size = os.path.getsize(str(path))
    step = (size - 65536) // 15
    return step * 11 + 65536 + (step - 65536) // 2


def rename_over_with_one_byte_changed(path):
    """How model updates are rolled out: the new file written beside the old one and renamed over it (same size)."""
    data = bytearray(open(str(path), "rb").read())
    data[unsampled_offset(path)] ^= 0x01
    staged = str(path) + ".new"
    with open(staged, "wb") as handle:
        handle.write(bytes(data))
    os.rename(staged, str(path))


def edit_in_place_with_mtime_put_back(path):
    """One byte changed in place, its mtime put back (what a careful copy tool or `touch -r` does)."""
    before = os.stat(path)
    flip_one_byte(path, unsampled_offset(path))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def edit_in_place(path):
    flip_one_byte(path, unsampled_offset(path))


@pytest.mark.parametrize("change, model_rw", [
    (rename_over_with_one_byte_changed, False),  # a same-size model renamed over the old one
    (edit_in_place_with_mtime_put_back, False),  # same inode, size and mtime
    (edit_in_place, True),  # weights read from a read-write volume (common) are the world as much as read-only ones
], ids=["renamed-over", "in-place-mtime-restored", "read-write-mount"])
def test_a_changed_model_comes_back_cold_naming_the_file(
        llama_image, llama_model, llama_node, llama_engines, change, model_rw):
    """One byte changed anywhere in the model (here where no block an older collection sampled
    lies) is seen, however it was changed: a cold start that is a fresh process of the new model, files_mismatch
    naming the file."""
    g = generate(llama_node, llama_engines, llama_image, llama_model, PROMPTS, model_rw=model_rw)
    path = os.path.join(str(llama_model), "tiny.gguf")
    size = os.path.getsize(path)
    change(path)
    assert os.path.getsize(path) == size
    reference = cold_reference(llama_engines, g)
    engine, record = recreate(llama_node, llama_engines, g)
    assert_cold_start(engine, record, g, reference, "files_mismatch: /models/tiny.gguf changed (size %d, sha256 " % size)


def test_the_quick_recheck_sees_a_changed_model_and_other_arguments_and_verify_names_why(
        llama_image, llama_model, llama_node, llama_engines, tmp_path):
    """Generate.yml with its default recheck (quick) used to say `unchanged` after the model file or the engine's
    arguments changed, keeping a stale snapshot, while verify.yml said NOT usable without the reason. The quick
    recheck applies every staleness reason a restore applies (world facts included), regenerates, and says why."""
    pod = unique_name("q")
    original = llama_engines(llama_image, llama_model, name=pod).run()
    original.wait_ready()
    inventory = local_inventory(
        snapshot_config={"enabled": True, "hostSnapshotPath": str(llama_node.roots),
                         "npuSnapshotPath": str(tmp_path / "npu"), "timeoutSeconds": 120},
        snapshot_service={"namespace": "default", "name": SERVICE},
        snapshot_instances=[{"name": "p0", "pods": [{"name": pod, "container": pod,
                                                     "readiness_url": original.url + "/v1/models"}]}],
        snapshot_generate_device=False, snapshot_restore_device=False)
    first = run_playbook(tmp_path / "runs", "generate.yml", inventory)
    assert first.rc == 0 and first.facts["npu-host"]["snapshot_generate_results"][0]["status"] == "completed", first
    kept = run_playbook(tmp_path / "runs", "generate.yml", inventory)
    assert kept.rc == 0 and kept.facts["npu-host"]["snapshot_generate_results"][0]["status"] == "unchanged", kept

    rename_over_with_one_byte_changed(os.path.join(str(llama_model), "tiny.gguf"))
    verified = run_playbook(tmp_path / "runs", "verify.yml", inventory)
    result = verified.facts["npu-host"]["snapshot_verify_results"][0]
    assert result["usable"] is False and any(r.startswith("files_mismatch: /models/tiny.gguf changed")
                                             for r in result["reasons"]), result
    assert "%s: NOT usable" % pod in verified.stdout and "files_mismatch: /models/tiny.gguf changed" in verified.stdout, \
        verified
    # a rollout restarts the engine on the new model (the running one still maps the old, deleted file)
    docker("restart", pod)
    original.wait_ready()
    regenerated = run_playbook(tmp_path / "runs", "generate.yml", inventory)
    entry = regenerated.facts["npu-host"]["snapshot_generate_results"][0]
    assert regenerated.rc == 0 and entry["status"] == "completed", regenerated
    assert entry["reason"].startswith("replaced a snapshot that was not usable: files_mismatch: /models/tiny.gguf"), entry
    assert entry["checksum"] != first.facts["npu-host"]["snapshot_generate_results"][0]["checksum"]

    original.remove()  # recreated with other arguments
    other = llama_engines(**original.config(name=pod, n_ctx=256)).run()
    other.wait_ready()
    again = run_playbook(tmp_path / "runs", "generate.yml", inventory)
    entry = again.facts["npu-host"]["snapshot_generate_results"][0]
    assert again.rc == 0 and entry["status"] == "completed" and "args_mismatch: " in entry["reason"], entry


@pytest.mark.parametrize("change", ["same-size", "other-size", "read-at-start"])
def test_a_removed_pod_whose_model_changed_is_recreated_from_its_record_and_started_cold(
        llama_image, llama_model, llama_node, llama_engines, tmp_path, change):
    """The pod's container is gone and its model was updated; the
    snapshot is stale but intact, so restore.yml creates the container from the snapshot's record and starts it cold
    with the reason -- never leaves the pod down ("could not start ... no valid snapshot to recreate it from")."""
    pod = unique_name("d")
    args = ["--use_mmap", "false"] if change == "read-at-start" else []
    original = llama_engines(llama_image, llama_model, name=pod, args=args).run()
    original.wait_ready()
    inventory = local_inventory(
        snapshot_config={"enabled": True, "hostSnapshotPath": str(llama_node.roots),
                         "npuSnapshotPath": str(tmp_path / "npu"), "timeoutSeconds": 120},
        snapshot_service={"namespace": "default", "name": SERVICE},
        snapshot_instances=[{"name": "p0", "pods": [{"name": pod, "container": pod,
                                                     "readiness_url": original.url + "/v1/models"}]}],
        snapshot_generate_device=False, snapshot_restore_device=False, snapshot_restore_runtime_name=llama_node.name)
    generated = run_playbook(tmp_path / "runs", "generate.yml", inventory)
    assert generated.rc == 0, generated
    original.remove()
    path = os.path.join(str(llama_model), "tiny.gguf")
    if change == "other-size":
        write_model(llama_image, llama_model, seed=9, n_layer=3)
    else:
        rename_over_with_one_byte_changed(path)
    reference = cold_reference(llama_engines, Generated(original=original, prompts=PROMPTS))  # (the port is free)
    restored = run_playbook(tmp_path / "runs", "restore.yml", inventory)
    assert restored.rc == 0, restored
    entry = restored.facts["npu-host"]["snapshot_restore_results"][0]
    assert entry["restored"] is False and entry["reason"].startswith("files_mismatch: /models/tiny.gguf changed"), entry
    engine = LlamaEngine(**original.config(name=pod))
    engine.wait_ready()
    assert engine.probe() == reference[0] and engine.completions(PROMPTS) == reference[1], "not a cold start of the new model"
    docker("rm", "-f", pod)

"""Restore on create: the snapshot_node role installs the restore-on-create runtime on the real
(shared) dockerd, and containers recreated with a plain `docker run --runtime` come back from their
snapshot -- or cold, when the snapshot is not usable. No mocks: real dockerd, containerd, runc,
CRIU and the sample workload on the simulated NPU.

The runtime is installed under a name, paths and a state directory of its own for this test run
and removed at the end (state=absent, SIGHUP); dockerd is never restarted."""

import base64
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import time
import uuid

import pytest

from _runtime_helpers import (PROMPTS, Node, WarmSnapshot, identity, read_daemon_json, runtimes, wait_answer)
from _runtime_helpers import recreated_containers_removed  # noqa: F401  # pylint: disable=unused-import  # the fixture
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.layout import IDENTITY_KEYS
from conftest import WorkloadContainer, docker, reset_device, run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import (manifest as manifest_utils, seal,
                                                                                   status)

WARMUP = 8.0


@pytest.fixture(scope="module")
def node(docker_env, tmp_path_factory):
    """The runtime installed through the role: check mode first, then twice (idempotence)."""
    base = tmp_path_factory.mktemp("node")
    n = Node(base)
    before = read_daemon_json()
    ok, changed, failed, out = n.run_role(check=True)
    n.check_run = (ok, changed, failed)
    assert failed == 0, out[-5000:]
    # this node's entry only: other test runs on the machine may register their own runtimes meanwhile
    assert n.name not in read_daemon_json().get("runtimes", {}) and not n.runtime_path.exists(), \
        "check mode changed the node"
    n.first_run = n.install()
    ok, changed, failed, out = n.run_role()
    n.second_run = (ok, changed, failed, out)
    try:
        yield n
    finally:
        n.removal = n.remove(before)


def changed_tasks(output):
    """The TASK headers and results of the tasks that reported a change."""
    blocks = re.split(r"\n(?=TASK \[)", output)
    return "\n".join(block for block in blocks if "changed:" in block)[-6000:]


def test_role_installs_registers_idempotently(node):
    assert node.check_run[2] == 0
    assert node.second_run[1] == 0, "second run changed something:\n%s" % changed_tasks(node.second_run[3])
    assert node.name in runtimes(), runtimes()
    daemon = read_daemon_json()
    assert daemon["runtimes"][node.name] == {"path": str(node.runtime_path)}
    assert daemon.get("experimental") is True, "other daemon.json keys are kept"
    assert os.access(node.runtime_path, os.X_OK)
    with open("/etc/criu/runc.conf") as handle:
        assert "tcp-close" in handle.read().split()
    settings = json.loads((node.lib_dir / "runtime.json").read_text())
    assert settings["snapshot_roots"] == [str(node.roots)] and settings["criu"].startswith("/")
    assert stat.S_IMODE((node.lib_dir / "runtime.json").stat().st_mode) == 0o600, "it may hold keys as text"


@pytest.mark.parametrize("overrides, message", [
    ({"snapshot_node_restore_timeout": -5}, "snapshot_node_restore_timeout: give a number of seconds in (0, 3600]"),
    ({"snapshot_node_min_size": -1}, "snapshot_node_min_size: give a number of bytes, 0 or more"),
    ({"snapshot_node_runtime_name": "bad name/.."}, "snapshot_node_runtime_name: \"bad name/..\" is no name"),
    ({"snapshot_node_encryption_keys": ["not-a-key"]}, "snapshot_node_encryption_keys[0]: not a 256-bit key"),
    ({"snapshot_node_encryption_keys": ["/nonexistent/inferops.key"]},
     "snapshot_node_encryption_keys[0]: cannot read the key file /nonexistent/inferops.key"),
    ({"snapshot_node_trusted_keys": [{"kee": "/x.pub"}]}, "snapshot_node_trusted_keys[0]"),
])
def test_settings_the_runtime_could_not_use_are_refused_naming_the_variable_before_they_are_written(
        node, overrides, message):
    """The runtime loads its keys only when a container asks for a restore, and without them restores nothing: the
    role reported success while every restore on the node became a cold start."""
    before = (node.lib_dir / "runtime.json").read_bytes()
    ok, changed, failed, out = node.run_role(**overrides)
    assert failed == 1 and message in out, out[-3000:]
    assert (node.lib_dir / "runtime.json").read_bytes() == before, "the settings were written"


def test_encryption_keys_given_as_text_are_shown_nowhere(node):
    """Snapshot_node_encryption_keys may be key text (from a vault): --diff printed it in the job's log."""
    key = base64.b64encode(os.urandom(32)).decode()
    ok, changed, failed, out = node.run_role(check=True, diff=True, snapshot_node_encryption_keys=[key])
    assert failed == 0 and changed >= 1, out[-3000:]
    assert key not in out and key[:16] not in out, "the key is in the output"


def test_role_refuses_what_would_hurt_running_containers(node, docker_env):
    """No dockerd restart nobody allowed, and no removal while containers still use the runtime."""
    before = read_daemon_json()
    ok, changed, failed, out = node.run_role(snapshot_node_docker_daemon_options={"storage-driver": "vfs"})
    assert failed == 1 and "snapshot_node_docker_restart=true" in out and "Nothing was written" in out, out[-3000:]
    after = read_daemon_json()  # other test runs on the machine may (un)register their own runtimes meanwhile
    assert after.get("storage-driver") == before.get("storage-driver") and \
        after["runtimes"].get(node.name) == before["runtimes"].get(node.name)
    name = "roc-user-%s" % uuid.uuid4().hex[:6]
    docker("create", "--name", name, "--runtime", node.name, "--network", "none", docker_env, "true")
    try:
        ok, changed, failed, out = node.run_role(snapshot_node_state="absent")
        assert failed == 1 and name in out and "snapshot_node_force_remove" in out, out[-3000:]
        assert node.name in runtimes() and node.runtime_path.exists()
    finally:
        docker("rm", "-f", name, check=False)


@pytest.fixture(scope="module")
def warm(node, docker_env, tmp_path_factory):
    """A warmed-up workload container and its snapshot below the node's snapshot root."""
    w = WarmSnapshot(node, docker_env, tmp_path_factory.mktemp("warm"), "roc", WARMUP)
    yield dict(pod=w.pod, snapshot_dir=w.snapshot_dir, expected=w.expected, cold_seconds=w.cold_seconds, info=w.info,
               device_dir=w.device_dir, recreate=w.recreate, image=w.image_id, port=w.port)
    w.remove()


def assert_cold(node, container, warm, reason_start):
    """The container started normally: a new process that warmed up, serving correct answers."""
    container.wait_ready(timeout=WARMUP + 90)
    assert [container.generate(p) for p in PROMPTS] == warm["expected"], "a cold start serves correct answers too"
    info = container.info()
    assert info["started_at"] != warm["info"]["started_at"] and info["phase"] == "serving"
    assert info["started_at"] + WARMUP <= info["ready_at"] + 0.5, "a cold start warms up"
    records = node.log_records(container.id)
    assert records and records[-1]["outcome"] == "cold", records
    assert records[-1]["reason"].startswith(reason_start), records[-1]
    assert info["metadata"]["restored"] is False and info["metadata"]["reason"] == records[-1]["reason"]
    return records[-1], info


def test_recreated_container_comes_back_warm_with_identical_answers(node, warm):
    reset_device(warm["device_dir"])
    c = warm["recreate"](INFEROPS_RESTORE_FROM=warm["snapshot_dir"], POD_IP="10.9.8.7")
    started = time.monotonic()
    c.run()
    wait_answer(c)
    first_answer = time.monotonic() - started  # docker run included
    answers = [c.generate(p) for p in PROMPTS]
    assert answers == warm["expected"], "the device memory was not restored"
    info = c.info()
    assert info["started_at"] == warm["info"]["started_at"], "not the warmed-up process: it started again"
    assert info["pid"] == warm["info"]["pid"] and info["snapshot_state"] == "RUNNING"
    assert info["metadata"]["restored"] is True and info["metadata"]["env"]["POD_IP"] == "10.9.8.7"
    assert info["metadata"]["container_id"] == c.id

    record = node.log_records(c.id)[-1]
    assert record["outcome"] == "restored" and record["reason"] is None, record
    assert record["snapshot"] == warm["snapshot_dir"] and record["name"] == c.name
    assert record["device_actions"] == ["restore", "unlock"]
    for stage in ("prepare", "verify", "host_restore", "verify_pages", "metadata", "device_restore", "total"):
        assert stage in record["durations"], record["durations"]
    # the page images were hashed while CRIU restored, into tasks it left stopped until the verdict
    overlapped = record["verify"]["overlapped"]
    assert overlapped["files"] >= 1 and overlapped["task_states_at_verdict"] == ["T"] and overlapped["released"], overlapped
    # ... through a CRIU configuration file that is now a link to the host's own (the next checkpoint reads that)
    conf = os.path.join(node.state_dir, c.id, "criu.conf")
    assert os.readlink(conf) == "/etc/criu/runc.conf", conf
    bundle = "/var/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby/%s/config.json" % c.id
    assert "org.criu.config" not in (json.loads(open(bundle).read()).get("annotations") or {}), "the bundle is back"
    assert "10.9.8.7" not in node.log_file.read_text(), "env values never go to the log"
    status_record = status.read(warm["snapshot_dir"])
    assert status_record["status"] == "completed" and status_record["last_restore"]["outcome"] == "restored"
    assert status_record["last_restore"]["container"] == c.id
    # the snapshot is untouched by the restore: it still verifies
    valid, reasons, _details = manifest_utils.verify(warm["snapshot_dir"], 1024, {})
    assert valid, reasons
    print("\nrestore on create: first correct answer %.2f s after docker run (cold start %.2f s); stages %s"
          % (first_answer, warm["cold_seconds"], record["durations"]))

    # the restored process is the container's: exec, top and its old environment (hence the metadata file)
    environ = docker("exec", c.name, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ")
    assert "INFEROPS_RESTORE_FROM" not in environ and "POD_IP" not in environ
    assert "inferops_agent" in docker("top", c.name)
    # docker restart: policy "once" -> the restart starts cold, and serves correct answers
    docker("restart", "--time", "5", c.name)
    assert_cold(node, c, warm, "policy_once:")
    # docker stop / start / rm behave as with runc
    docker("stop", "--time", "5", c.name)
    assert docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", c.name) == "exited 0"
    docker("start", c.name)
    c.wait_ready(timeout=WARMUP + 60)
    container_id = c.id
    docker("rm", "-f", c.name)
    assert not os.path.exists(os.path.join(node.state_dir, container_id))


def test_restore_policy_always_restores_again_on_restart(node, warm):
    reset_device(warm["device_dir"])
    c = warm["recreate"](INFEROPS_RESTORE_FROM=warm["snapshot_dir"], INFEROPS_RESTORE_POLICY="always")
    c.run()
    wait_answer(c)
    assert c.info()["started_at"] == warm["info"]["started_at"]
    docker("stop", "--time", "5", c.name)
    reset_device(warm["device_dir"])
    docker("start", c.name)
    wait_answer(c)
    assert [c.generate(p) for p in PROMPTS] == warm["expected"]
    assert c.info()["started_at"] == warm["info"]["started_at"]
    assert [r["outcome"] for r in node.log_records(c.id)] == ["restored", "restored"]
    c.remove()


def identity_env(warm):
    """The pod identity a copy of the snapshot must be restored as (its path below the root spells another one):
    what an orchestrator passes with a snapshot it placed elsewhere."""
    return {"INFEROPS_RESTORE_IDENTITY": "/".join(identity(warm["pod"])[key] for key in IDENTITY_KEYS)}


def corrupt_copy(node, warm, suffix, mutate, reseal=False):
    """A copy of the snapshot below the node's root, broken by ``mutate(snapshot_dir)``.

    reseal=True writes fresh checksums and manifest after the damage: a snapshot that verifies but
    cannot be restored, to reach the CRIU failure paths behind verification.
    """
    src = warm["snapshot_dir"]
    dst = str(node.roots / suffix / "sample" / "p0" / warm["pod"])
    os.makedirs(os.path.dirname(dst), mode=0o700)
    if not reseal:
        shutil.copytree(src, dst)
        mutate(dst)
        return dst
    staging = os.path.join(os.path.dirname(dst), ".%s.partial" % warm["pod"])
    shutil.copytree(src, staging)
    manifest = json.loads(open(os.path.join(staging, "manifest.json")).read())
    mutate(staging)
    fields = {k: v for k, v in manifest.items() if k not in ("files", "total_bytes", "schema_version")}
    seal.seal(staging, fields)
    seal.publish(staging, dst)
    return dst


def pages_file(directory):
    images = os.path.join(directory, "host", "criu")
    return os.path.join(images, sorted(f for f in os.listdir(images) if f.startswith("pages-"))[0])


def flip_byte(directory):
    with open(pages_file(directory), "r+b") as handle:
        handle.seek(8192)
        byte = handle.read(1)
        handle.seek(8192)
        handle.write(bytes([byte[0] ^ 0x20]))


def test_corrupted_snapshot_comes_back_cold(node, warm):
    snap = corrupt_copy(node, warm, "corrupt", flip_byte)
    c = warm["recreate"](INFEROPS_RESTORE_FROM=snap, **identity_env(warm))
    c.run()
    record, _info = assert_cold(node, c, warm, "checksum_mismatch: host/criu/pages-")
    # found while CRIU restored: the tasks it made were still stopped, and were killed without ever running
    overlapped = record["verify"]["overlapped"]
    assert overlapped["task_states_at_verdict"] == ["T"] and overlapped["released"] is False, overlapped
    assert status.read(snap) is None or status.read(snap)["last_restore"]["outcome"] == "cold"
    assert os.path.exists(pages_file(snap)), "an invalid snapshot is never deleted"
    c.remove()


@pytest.mark.parametrize("case", ["outside_roots", "missing", "bad_timeout", "another_generation"])
def test_unusable_requests_come_back_cold(node, warm, tmp_path, case):
    if case == "outside_roots":
        outside = tmp_path / "elsewhere" / warm["pod"]
        shutil.copytree(warm["snapshot_dir"], str(outside))
        env, reason = {"INFEROPS_RESTORE_FROM": str(outside)}, "unsafe_path:"
    elif case == "missing":
        env, reason = dict(identity_env(warm), INFEROPS_RESTORE_FROM=str(node.roots / "nothing" / warm["pod"])), \
            "missing:"
    elif case == "another_generation":  # intact and signed as far as it goes, but not the one the orchestrator chose
        env, reason = {"INFEROPS_RESTORE_FROM": warm["snapshot_dir"], "INFEROPS_RESTORE_CHECKSUM": "0" * 64}, \
            "checksum_mismatch: the snapshot was recorded as " + "0" * 64
    else:
        env, reason = {"INFEROPS_RESTORE_FROM": warm["snapshot_dir"], "INFEROPS_RESTORE_TIMEOUT": "soon"}, "bad_request:"
    c = warm["recreate"](**env)
    c.run()
    assert_cold(node, c, warm, reason)
    c.remove()


def truncate_pages(directory):
    path = pages_file(directory)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


def delete_pages(directory):
    os.unlink(pages_file(directory))


@pytest.mark.parametrize("case", ["criu_error", "criu_hang"])
def test_restore_failures_behind_verification_fall_back_cold(node, warm, case):
    """A snapshot whose checksums are right but whose images are not: CRIU fails, or spins forever
    on a truncated pages image. Either way the container starts cold, within the time limit, and
    nothing is left mounted or half-restored."""
    mutate = delete_pages if case == "criu_error" else truncate_pages
    snap = corrupt_copy(node, warm, "resealed-" + case, mutate, reseal=True)
    valid, reasons, _details = manifest_utils.verify(snap, 1024, {})
    assert valid, reasons
    c = warm["recreate"](INFEROPS_RESTORE_FROM=snap, INFEROPS_RESTORE_TIMEOUT="5", **identity_env(warm))
    started = time.monotonic()
    c.run()
    record, _info = assert_cold(node, c, warm, "criu_failed:" if case == "criu_error" else "timeout:")
    if case == "criu_error":
        assert "pages" in record["reason"], record  # the cause from the CRIU log, not its unwinding
    assert record["durations"]["total"] < 5 + 15, record
    assert time.monotonic() - started < 5 + 15 + WARMUP + 30
    with open("/proc/self/mountinfo") as handle:
        leftovers = [line for line in handle if node.state_dir in line or "/criu-root" in line and c.id in line]
    assert leftovers == [], leftovers
    c.remove()


def test_device_restore_failure_removes_the_restored_process_and_starts_cold(node, warm):
    """The host restore succeeds but the NPU is held by another process, so the ACL runtime refuses
    RESTORE: the runtime kills the restored process again and the container starts cold.

    The lock is released as soon as the attempt is logged, before the cold-started engine opens the
    device (that takes it well over 100 ms: runc create, start, Python, the agent)."""
    reset_device(warm["device_dir"])
    c = warm["recreate"](INFEROPS_RESTORE_FROM=warm["snapshot_dir"])
    holder = os.open(str(warm["device_dir"] / "device0"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        run = subprocess.Popen(["docker", "run", "-d"] + c.create_args(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not [r for r in node.log_records() if r.get("name") == c.name] and time.monotonic() < deadline:
            time.sleep(0.002)
    finally:
        os.close(holder)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    record, _info = assert_cold(node, c, warm, "device_restore_failed:")
    assert "busy" in record["reason"] or "507909" in record["reason"], record
    assert record["durations"]["host_restore"] > 0 and record["restored_pid"], record
    assert not os.path.exists("/proc/%d" % record["restored_pid"]) or \
        "python" not in open("/proc/%d/cmdline" % record["restored_pid"]).read()
    c.remove()


def test_container_without_the_marker_starts_exactly_as_with_runc(node, warm):
    script = "echo out; echo err >&2; cat /proc/self/status | grep -c NSpid; exit 3"
    results = []
    for runtime in ("runc", node.name):
        proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "--runtime", runtime, warm["image"],
                               "sh", "-c", script], capture_output=True, text=True, timeout=120, check=False)
        results.append((proc.returncode, proc.stdout, proc.stderr))
    assert results[0] == results[1] == (3, "out\n1\n", "err\n"), results
    # the workload itself: the same container under runc and under the runtime, one after the other
    outcomes = {}
    for runtime in ("runc", node.name):
        before = len(node.log_records())
        c = warm["recreate"]()
        c.runtime = runtime
        c.run()
        ready = c.wait_ready(timeout=WARMUP + 60)
        assert [c.generate(p) for p in PROMPTS] == warm["expected"]
        assert docker("inspect", "--format", "{{.HostConfig.Runtime}}", c.name) == runtime
        assert len(node.log_records()) == before, "an unmarked container never reaches the restore path"
        assert not os.path.exists(os.path.join(node.state_dir, c.id))
        docker("stop", "--time", "5", c.name)
        outcomes[runtime] = (ready["phase"], docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                                                    c.name))
        c.remove()
    assert outcomes["runc"] == outcomes[node.name], outcomes


def test_snapshot_restore_method_runtime_uses_the_runtime(node, warm):
    """Snapshot_restore method=runtime: the module creates the container with the runtime and starts it;
    compared with method=docker (docker start --checkpoint) on the same snapshot."""
    seconds = {}
    for method in ("docker", "runtime"):
        name = "%s-%s" % (warm["pod"], method)
        reset_device(warm["device_dir"])
        started = time.monotonic()
        try:
            result = run_module("snapshot_restore", {
                "snapshot_dir": warm["snapshot_dir"], "identity": identity(warm["pod"]), "container": name,
                "method": method, "runtime_name": node.name, "env": {"POD_IP": "10.4.4.4"},
                "health_url": "http://127.0.0.1:%d/health" % warm["port"], "health_timeout": 60})
            seconds[method] = time.monotonic() - started
            assert result.get("failed") is False and result["restored"] is True, result
            c = WorkloadContainer(name, warm["image"], warm["device_dir"], warm["port"])
            assert [c.generate(p) for p in PROMPTS] == warm["expected"]
            info = c.info()
            assert info["started_at"] == warm["info"]["started_at"]
            assert info["metadata"]["env"]["POD_IP"] == "10.4.4.4" and info["metadata"]["restored"] is True
            if method == "runtime":
                assert result["placement"] == "runtime" and result["created"] is True
                # the module hashes what it acts on (manifest, container record); the runtime the images: once each
                assert result["verify"]["checksums"].startswith("verified but"), result["verify"]
                assert result["verify"]["hashed_bytes"] < 10 ** 6 < result["verify"]["bytes"], result["verify"]
                assert result["runtime_record"]["outcome"] == "restored", result["runtime_record"]
                assert docker("inspect", "--format", "{{.HostConfig.Runtime}}", name) == node.name
                again = run_module("snapshot_restore", {"snapshot_dir": warm["snapshot_dir"], "method": method,
                                                        "identity": identity(warm["pod"]), "container": name,
                                                        "runtime_name": node.name})
                assert again["changed"] is False, again
        finally:
            docker("rm", "-f", name, check=False)
    print("\nsnapshot_restore to healthy: method=docker %.2f s, method=runtime %.2f s" % (seconds["docker"], seconds["runtime"]))

    missing = run_module("snapshot_restore", {"snapshot_dir": warm["snapshot_dir"], "identity": identity(warm["pod"]),
                                              "container": "%s-none" % warm["pod"], "method": "runtime",
                                              "runtime_name": "no-such-runtime-%s" % uuid.uuid4().hex[:4]})
    assert missing["failed"] and "snapshot_node" in missing["msg"], missing
    # the default, method=auto: the fast path when this node's runtime can restore the snapshot, docker when not
    for runtime_name, method in ((node.name, "runtime"), ("no-such-runtime-%s" % uuid.uuid4().hex[:4], "docker")):
        auto = run_module("snapshot_restore", {"snapshot_dir": warm["snapshot_dir"], "identity": identity(warm["pod"]),
                                               "container": "%s-auto" % warm["pod"], "runtime_name": runtime_name},
                          check=True)
        assert auto["method"] == method and auto["restored"] is True, auto


def test_snapshot_restore_method_runtime_leaves_hashing_to_the_runtime_which_refuses_corruption(node, warm):
    """The module does not hash the images with method=runtime (the runtime does, right before it restores): a
    flipped page byte passes the module's checks and is caught by the runtime, which refuses the create -- the
    container was made from the snapshot's record, so nothing of a snapshot that may be forged runs -- and the
    task fails with the runtime's reason, leaving no container."""
    snap = corrupt_copy(node, warm, "corrupt-module", flip_byte)
    name = "%s-rtcorrupt" % warm["pod"]
    reset_device(warm["device_dir"])
    try:
        preview = run_module("snapshot_restore", {"snapshot_dir": snap, "identity": identity(warm["pod"]),
                                                  "container": name, "method": "runtime", "runtime_name": node.name},
                             check=True)
        assert preview["restored"] is False and preview["verify"]["checksums"] == "verified", preview
        assert preview["reason"].startswith("checksum_mismatch: host/criu/pages-"), preview
        result = run_module("snapshot_restore", {
            "snapshot_dir": snap, "identity": identity(warm["pod"]), "container": name, "method": "runtime",
            "runtime_name": node.name, "health_url": "http://127.0.0.1:%d/health" % warm["port"],
            "health_timeout": WARMUP + 90})
        assert result["failed"] is True and result["restored"] is False, result
        assert result["verify"]["checksums"].startswith("verified but") and result["verify"]["valid"] is True
        assert result["runtime_record"]["outcome"] == "failed", result["runtime_record"]
        assert result["msg"].startswith("refused by the restore-on-create runtime: checksum_mismatch: host/criu/pages-")
        assert "removed, nothing of it ran" in result["msg"], result
        assert "checksum_mismatch: host/criu/pages-" in result["reason"], result["reason"]
        assert docker("ps", "--all", "--quiet", "--filter", "name=^%s$" % name) == "", "nothing of it is left"
        assert node.log_records()[-1]["outcome"] == "failed"
    finally:
        docker("rm", "-f", name, check=False)


def test_auto_without_the_runtime_starts_a_large_state_cold_at_once_instead_of_taking_dockers_slow_path(node, warm):
    """Method=auto on a node whose runtime cannot restore the snapshot never takes a path slower than a cold
    start. Above docker_path_max_bytes it starts the container cold at once, with the reason, recreating it from the
    verified record -- without hashing the images it will not restore."""
    name = "%s-slow" % warm["pod"]
    try:
        result = run_module("snapshot_restore", {
            "snapshot_dir": warm["snapshot_dir"], "identity": identity(warm["pod"]), "container": name,
            "runtime_name": "no-such-runtime-%s" % uuid.uuid4().hex[:4], "docker_path_max_bytes": 1 << 20,
            "health_url": "http://127.0.0.1:%d/health" % warm["port"], "health_timeout": WARMUP + 90})
        assert result.get("failed") is False and result["restored"] is False, result
        assert result["method"] == "cold" and result["method_reason"].startswith("docker_path_slower_than_cold: "), result
        assert result["reason"] == result["method_reason"] and result["created"] is True
        assert result["verify"]["valid"] is True and result["verify"]["hashed_bytes"] < 10 ** 6, result["verify"]
        assert "host_restore" not in result["durations"], "docker start --checkpoint never ran"
        c = WorkloadContainer(name, warm["image"], warm["device_dir"], warm["port"])
        assert [c.generate(p) for p in PROMPTS] == warm["expected"] and c.info()["started_at"] != warm["info"]["started_at"]
    finally:
        docker("rm", "-f", name, check=False)

"""Snapshot_restore method=docker on the real dockerd and CRIU: the environment a snapshot
recorded never goes on a command line and shows in no field of a result, failures included; and when CRIU fails
the restore, the log the message names still exists (containerd removes its own copy with the failed task).

The engine is a bare Python loop in the base image (no NPU: the host part only) that holds a file open in its
container's own writable layer: a container recreated from the snapshot's record does not have that file, so
CRIU's restore fails there ("Can't open file ... on restore") -- a real CRIU failure on the Docker path. The docker
CLI is reached through a wrapper that logs every command line it is given and, when told to, fails `docker create`
echoing its arguments (as docker does for some bad ones)."""

import json
import os
import stat
import time
import uuid

import pytest

from conftest import docker, run_module

SECRET = "s3cr3t-token-%s" % uuid.uuid4().hex[:8]
HOLDER = ("import time\nf = open('/tmp/held', 'w')\nf.write('x')\nf.flush()\nprint('ready', flush=True)\n"
          "while True:\n    time.sleep(1)\n")
WRAPPER = """#!/bin/sh
# logs its command line; checks the --env-file it is given; fails `docker create` when {fail} exists
python3 - "$@" <<'PY' >> {log}
import json, os, stat, sys
args = sys.argv[1:]
entry = {{"argv": args}}
if "--env-file" in args:
    path = args[args.index("--env-file") + 1]
    st, parent = os.stat(path), os.stat(os.path.dirname(path))
    entry.update(env_file=path, mode=stat.S_IMODE(st.st_mode), dir_mode=stat.S_IMODE(parent.st_mode),
                 holds_secret={secret!r} in open(path).read())
print(json.dumps(entry))
PY
if [ "$1" = create ] && [ -e {fail} ]; then
    echo "Error response from daemon: simulated failure for: $*" >&2
    exit 125
fi
exec docker "$@"
"""


@pytest.fixture
def snapshot(docker_env, tmp_path):
    name = "inferops-dpath-%s" % uuid.uuid4().hex[:6]
    docker("run", "-d", "--name", name, "--network", "none", "-e", "API_TOKEN=" + SECRET, "inferops/base:bookworm",
           "python3", "-c", HOLDER)
    try:
        identity = {"namespace": "t", "service": "dpath", "instance": "p0", "pod": name}
        snap = tmp_path / "snapshots" / "t" / "dpath" / "p0" / name
        deadline = time.monotonic() + 60
        while "ready" not in docker("logs", name) and time.monotonic() < deadline:
            time.sleep(0.1)
        taken = run_module("host_checkpoint", {"container": name, "snapshot_dir": str(snap), "identity": identity,
                                               "require_device_part": False, "method": "runc", "timeout": 120})
        assert taken["failed"] is False and taken["status"] == "completed", taken
        docker("rm", "-f", name)
        yield {"name": name, "identity": identity, "snap": str(snap)}
    finally:
        docker("rm", "-f", name, check=False)


def wrapper(tmp_path):
    script = tmp_path / "docker-wrapper"
    log, fail = tmp_path / "docker-argv.jsonl", tmp_path / "fail-create"
    script.write_text(WRAPPER.format(log=log, fail=fail, secret=SECRET))
    script.chmod(0o755)
    return str(script), log, fail


def restore_args(snapshot, docker_cli):
    return {"snapshot_dir": snapshot["snap"], "identity": snapshot["identity"], "container": snapshot["name"],
            "method": "docker", "device_restore": False, "docker_cli": docker_cli, "timeout": 60,
            "env": {"POD_IP": "10.9.8.7"}}


def test_the_recorded_environment_is_on_no_command_line_and_in_no_field_of_a_failed_result(snapshot, tmp_path):
    docker_cli, log, fail = wrapper(tmp_path)
    fail.write_text("")
    failed = run_module("snapshot_restore", restore_args(snapshot, docker_cli))
    assert failed["failed"], failed
    shown = json.dumps(failed)
    assert SECRET not in shown, "the recorded environment shows in the failed result: %s" % shown[:3000]
    assert "simulated failure" in shown, "the failure itself is reported: %s" % shown[:3000]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    creates = [call for call in calls if call["argv"][:1] == ["create"]]
    assert creates and all(SECRET not in " ".join(call["argv"]) for call in calls), calls
    for call in creates:
        assert call["mode"] == 0o600 and call["dir_mode"] == 0o700 and call["holds_secret"], call
        assert not os.path.exists(call["env_file"]) and not os.path.exists(os.path.dirname(call["env_file"]))


def test_a_criu_failure_on_the_docker_path_names_a_log_that_exists(snapshot, tmp_path):
    docker_cli, log, _fail = wrapper(tmp_path)
    try:
        result = run_module("snapshot_restore", restore_args(snapshot, docker_cli))
        assert result["failed"] is False and result["restored"] is False, result
        reason = result["reason"]
        assert "Can't open file tmp/held on restore" in reason, reason
        kept = reason.split("(CRIU log: ")[1].split(")")[0]
        assert os.path.isfile(kept) and stat.S_IMODE(os.stat(kept).st_mode) == 0o600, reason
        assert "Can't open file tmp/held on restore" in open(kept, errors="replace").read()
        assert "containerd" not in reason, "names containerd's copy, which is gone: %s" % reason
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        assert all(SECRET not in " ".join(call["argv"]) for call in calls), calls
        assert SECRET not in json.dumps(result)
        state = docker("inspect", "--format", "{{.State.Running}}", snapshot["name"])
        assert state == "true", "started cold after the failed restore"
    finally:
        docker("rm", "-f", snapshot["name"], check=False)


def test_a_criu_failure_of_docker_checkpoint_create_names_a_log_that_exists(docker_env, tmp_path):
    """The generation's Docker path (method=docker): CRIU cannot dump a character device of a major it has no plugin
    for (here /dev/loop-control, held open); the error names CRIU's cause and a kept copy of containerd's
    criu-dump.log, which goes with the task."""
    name = "inferops-dpath-%s" % uuid.uuid4().hex[:6]
    holder = "import time\nf = open('/dev/loop-control', 'rb')\nprint('ready', flush=True)\ntime.sleep(600)\n"
    docker("run", "-d", "--name", name, "--network", "none", "--device", "/dev/loop-control", "inferops/base:bookworm",
           "python3", "-c", holder)
    try:
        deadline = time.monotonic() + 60
        while "ready" not in docker("logs", name) and time.monotonic() < deadline:
            time.sleep(0.1)
        identity = {"namespace": "t", "service": "dpath", "instance": "p0", "pod": name}
        result = run_module("host_checkpoint", {"container": name, "identity": identity, "method": "docker",
                                                "snapshot_dir": str(tmp_path / "s" / "t" / "dpath" / "p0" / name),
                                                "require_device_part": False, "timeout": 120})
        assert result["failed"] and result["criu_log"], result
        assert os.path.isfile(result["criu_log"]) and "(CRIU log: %s)" % result["criu_log"] in result["msg"], result
        assert result["criu_error"] and result["criu_error"] in open(result["criu_log"], errors="replace").read()
        assert "containerd" not in result["msg"], result["msg"]
    finally:
        docker("rm", "-f", name, check=False)

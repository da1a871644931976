"""snapshot_node_state=absent on a busy node: containers come and go between the role's listing and its
inspection of them. One that vanished meanwhile must not fail the removal (CI saw it: another test's container
removed in that window); dockerd not answering must still stop it, never read as "nobody uses the runtime".
Real dockerd and the real role; only the docker CLI's listing is shaped, by a wrapper on PATH."""

import os
import shutil

from _runtime_helpers import Node, read_daemon_json, runtimes

VANISHED = "0" * 56 + "deadbeef"
REAL_DOCKER = shutil.which("docker")


def _wrap_docker(directory, ps=None, inspect_error=None):
    """A docker CLI that answers ``ps`` with ``ps`` (ids) and ``inspect`` with ``inspect_error``; else the real one."""
    directory.mkdir(exist_ok=True)
    script = directory / "docker"
    lines = ["#!/bin/sh"]
    if ps is not None:
        lines.append('if [ "$1" = ps ]; then printf "%s\\n"; exit 0; fi' % "\\n".join(ps))
    if inspect_error is not None:
        lines.append('if [ "$1" = inspect ]; then echo "%s" >&2; exit 1; fi' % inspect_error)
    lines.append('exec %s "$@"' % REAL_DOCKER)
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return str(directory)


def test_removal_is_not_failed_by_a_container_that_vanished_but_stops_when_dockerd_does_not_answer(
        tmp_path, docker_env, monkeypatch):
    base = tmp_path / "node"
    base.mkdir()
    node = Node(base)
    before = read_daemon_json()
    node.install()
    path = os.environ["PATH"]
    try:
        down = _wrap_docker(tmp_path / "down", ps=[VANISHED],
                            inspect_error="Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
        monkeypatch.setenv("PATH", down + os.pathsep + path)
        ok, changed, failed, out = node.run_role(snapshot_node_state="absent")
        assert failed == 1 and "Cannot connect to the Docker daemon" in out, out[-3000:]
        assert node.name in runtimes() and node.runtime_path.exists(), "nothing removed while dockerd did not answer"

        vanished = _wrap_docker(tmp_path / "vanished", ps=[VANISHED])  # the real inspect: "No such object"
        monkeypatch.setenv("PATH", vanished + os.pathsep + path)
        ok, changed, failed, out = node.run_role(snapshot_node_state="absent")
        assert failed == 0 and changed > 0, out[-5000:]
        assert node.name not in runtimes() and not node.runtime_path.exists()
    finally:
        monkeypatch.setenv("PATH", path)
        node.remove(before)

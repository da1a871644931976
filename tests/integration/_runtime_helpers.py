"""The restore-on-create runtime (issue 5) on this machine's shared dockerd, for the integration tests.

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
import uuid

from conftest import BIN, COLLECTIONS, docker, ensure_collection_link

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
        }
        self.playbook = base / "node.yml"
        self.playbook.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n"
                                 "  roles:\n    - role: inferops.snapshot.snapshot_node\n")

    def run_role(self, check=False, **overrides):
        """Run the role; returns (ok, changed, failed, output)."""
        ensure_collection_link()
        extra = dict(self.vars, **overrides)
        vars_file = self.base / ("vars-%d.json" % time.monotonic_ns())
        vars_file.write_text(json.dumps(extra))
        command = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", "ansible_python_interpreter=%s" % sys.executable,
                   "-e", "@%s" % vars_file, str(self.playbook)]
        if check:
            command.append("--check")
        env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_LOCALHOST_WARNING="False")
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
        """snapshot_node_state=absent (forced: the test's own containers may not all be gone yet), then
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
def installed_runtime(base):
    """A Node whose runtime is installed for the duration of the block, removed afterwards."""
    node = Node(base)
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

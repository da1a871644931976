"""The boot-time sweep of stale plaintext, on the real dockerd + CRIU: a restore of an encrypted snapshot
by the node runtime is killed (SIGKILL, as the OOM killer does) while its plaintext is in the node's decrypt
directory; the plaintext stays behind -- nothing of the dead run can remove it -- until the tmpfiles.d entry the
snapshot_node role installed is applied as at boot (`systemd-tmpfiles --remove --boot`), which removes it. Applied
without --boot (a running node), the entry leaves plaintext alone: a live run's is in use then.

The node's decrypt directory is this test's own, and systemd-tmpfiles is limited to it (--prefix): the plaintext
of other runs on this machine in /dev/shm is never touched."""

import os
import shutil
import signal
import subprocess
import time
import uuid

import pytest

from _runtime_helpers import installed_runtime
from conftest import WorkloadContainer, docker, free_port, reset_device, run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import plaintext, proc

pytestmark = pytest.mark.timeout(600)
TMPFILES = shutil.which("systemd-tmpfiles") or "systemd-tmpfiles"


def plaintext_in(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith(plaintext.PREFIX))


def flock_holder(path):
    """The pid holding a flock on the directory ``path`` (/proc/locks: FLOCK ... <pid> <major>:<minor>:<inode>)."""
    st = os.stat(path)
    wanted = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    with open("/proc/locks") as handle:
        for line in handle:
            fields = line.split()
            if fields[1] == "FLOCK" and fields[5] == wanted:
                return int(fields[4])
    return None


def unmount_below(directory):
    """Mounts a killed CRIU may leave below the runtime's state directory (its cgroup yard, runc's criu root)."""
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    for point in sorted((p for p in points if p == directory or p.startswith(directory + "/")), reverse=True):
        subprocess.call(["umount", "-l", point])


@pytest.fixture(scope="module")
def node(docker_env, tmp_path_factory):
    base = tmp_path_factory.mktemp("sweep-node")
    key = base / "snapshot.key"
    key.write_bytes(os.urandom(32))
    os.chmod(str(key), 0o600)
    decrypt_dir = "/dev/shm/inferops-test-sweep-%s" % uuid.uuid4().hex[:8]
    os.mkdir(decrypt_dir, 0o700)
    try:
        with installed_runtime(base, snapshot_node_decrypt_dir=decrypt_dir, snapshot_node_encryption_keys=[str(key)],
                               snapshot_node_require_signature=False) as installed:  # its snapshot is unsigned
            installed.key, installed.decrypt_dir = key, decrypt_dir
            yield installed
            unmount_below(installed.state_dir)
        assert not os.path.exists(installed.vars["snapshot_node_tmpfiles_path"]), "state=absent removes the entry"
    finally:
        shutil.rmtree(decrypt_dir, ignore_errors=True)


def test_a_restore_killed_mid_way_leaves_no_plaintext_after_the_boot_sweep(node, docker_env):
    pod = "sweep-%s" % uuid.uuid4().hex[:6]
    ident = {"namespace": "default", "service": "sweep", "instance": "p0", "pod": pod}
    snap = str(node.roots / "default" / "sweep" / "p0" / pod)
    device_dir = node.base / "npu"
    device_dir.mkdir(mode=0o700)
    # some host memory, so that decrypting it takes a while: the kill lands while the plaintext is there
    engine = WorkloadContainer(pod, docker_env, device_dir, free_port(), WORKLOAD_HOST_MB=96)
    restored = "%s-r" % pod
    try:
        engine.run()
        engine.wait_ready()
        assert run_module("npu_snapshot_backup", dict(container=pod, lock=True, snapshot_dir=snap,
                                                      identity=ident))["state"] == "BACKED_UP"
        checkpoint = run_module("host_checkpoint", dict(container=pod, snapshot_dir=snap, identity=ident,
                                                        encryption_key=str(node.key), timeout=120))
        assert checkpoint["status"] == "completed", checkpoint
        engine.remove()
        reset_device(device_dir)

        again = WorkloadContainer(restored, docker_env, device_dir, engine.port, WORKLOAD_HOST_MB=96,
                                  INFEROPS_RESTORE_FROM=snap, INFEROPS_RESTORE_IDENTITY=layout.identity_string(ident))
        run = subprocess.Popen(["docker", "run", "-d", "--runtime", node.name] + again.create_args(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        left = []
        while not left:  # the restore's plaintext appears (the runtime is decrypting): kill it there
            assert run.poll() is None and time.monotonic() < deadline, ("the restore ended before it was killed",
                                                                        run.communicate())
            left = plaintext_in(node.decrypt_dir)
        held = os.path.join(node.decrypt_dir, left[0])
        holder = None
        while holder is None and os.path.exists(held):  # it takes its flock right after making the directory
            holder = flock_holder(held)
        assert holder is not None, "the plaintext was gone before the restore could be killed"
        tree = proc.descendants(holder)
        os.kill(holder, signal.SIGKILL)  # first: it must not get to remove anything
        proc.kill_quietly(tree)
        run.communicate(timeout=120)
        # the dead run's plaintext is still there; nothing of it is left to remove it
        assert plaintext_in(node.decrypt_dir) == left and os.path.isdir(held), os.listdir(node.decrypt_dir)

        entry = node.vars["snapshot_node_tmpfiles_path"]
        with open(entry) as handle:
            assert 'R! "%s/%s*"' % (node.decrypt_dir, plaintext.PREFIX) in handle.read().splitlines()
        sweep = [TMPFILES, "--remove", "--prefix=%s" % node.decrypt_dir, entry]
        running = subprocess.run(sweep, capture_output=True, text=True, check=False)
        assert running.returncode == 0, running.stderr
        assert plaintext_in(node.decrypt_dir) == left, "applied on a running node, the sweep took plaintext"
        booting = subprocess.run(sweep[:2] + ["--boot"] + sweep[2:], capture_output=True, text=True, check=False)
        assert booting.returncode == 0, booting.stderr
        assert plaintext_in(node.decrypt_dir) == [], "the boot-time sweep left plaintext behind"
    finally:
        docker("rm", "-f", restored, check=False)
        engine.remove()
        unmount_below(node.state_dir)

"""The playbooks run by a normal user: without become every role stops at once with an error that
names root and how to become it; with become (sudo, as AWX's Privilege Escalation does) generate,
verify and restore work against the real workload. The test user and its sudoers entry are made here
and removed afterwards."""

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import hashlib

import pytest

from conftest import REPO, build_and_install_collection, free_port, reset_device

USER = "inferops-become"
SUDOERS = "/etc/sudoers.d/inferops-become-test"
PROMPTS = ["what is an NPU?", "数据"]


# make test may run under any umask, from a checkout under a folder other users cannot search: what the test user
# runs -- a venv and the collection installed from its tarball -- lies outside the checkout, with modes set here.
USER_VENV = Path("/var/cache/inferops/become-venv")


@pytest.fixture(scope="module")
def user_venv():
    """A venv of the system's python3 with the pinned ansible-core: a normal user can run it (the project's
    .venv may sit on an interpreter below /root). Made once, reused while the requirements are unchanged."""
    venv = USER_VENV
    reqs = [REPO / "requirements" / name for name in ("constraints.txt", "target.txt")]
    stamp = hashlib.sha256(b"".join(path.read_bytes() for path in reqs)).hexdigest()
    stamp_file = venv / ".stamp"
    if not (venv / "bin" / "ansible-playbook").exists() or not stamp_file.exists() or stamp_file.read_text() != stamp:
        shutil.rmtree(str(venv), ignore_errors=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "-c", str(reqs[0]), "ansible-core",
                        "-r", str(reqs[1])], check=True, capture_output=True)
        stamp_file.write_text(stamp)
    readable_by_everyone(venv)
    return venv / "bin"


@pytest.fixture(scope="module")
def user_collection():
    """The collection as a user installs it (ansible-galaxy), where the test user can read it; its collections path."""
    base = Path(tempfile.mkdtemp(prefix="inferops-become-collection-", dir="/tmp"))
    _tarball, installed = build_and_install_collection(base)
    readable_by_everyone(installed)
    yield installed
    shutil.rmtree(str(base), ignore_errors=True)


def readable_by_everyone(path):
    """go+rX on the tree at ``path`` and go+x on the folders above it (made by pytest or by the system)."""
    below = [os.path.join(top, name) for top, dirs, files in os.walk(str(path)) for name in dirs + files]
    for entry in [str(path)] + below:
        if not os.path.islink(entry):
            mode = os.stat(entry).st_mode
            os.chmod(entry, mode | 0o044 | (0o011 if mode & 0o100 else 0))
    for folder in Path(path).parents:
        if not os.stat(str(folder)).st_mode & 0o001:
            os.chmod(str(folder), os.stat(str(folder)).st_mode | 0o011)


@pytest.fixture(scope="module")
def normal_user():
    made = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
        made = True
    with open(SUDOERS, "w") as handle:
        handle.write("%s ALL=(root) NOPASSWD: ALL\n" % USER)
    os.chmod(SUDOERS, 0o440)
    subprocess.run(["visudo", "-c", "-f", SUDOERS], check=True, capture_output=True)
    yield USER
    os.unlink(SUDOERS)
    if made:
        subprocess.run(["userdel", "--remove", USER], check=False, capture_output=True)


class AsUser:
    def __init__(self, user, bin_dir, collections, inventory):
        self.user, self.bin, self.collections = user, bin_dir, collections
        self.dir = tempfile.mkdtemp(prefix="inferops-become-")
        shutil.chown(self.dir, user)
        self.inventory = os.path.join(self.dir, "inventory.json")
        with open(self.inventory, "w") as handle:
            json.dump(inventory, handle)
        shutil.chown(self.inventory, user)

    def play(self, playbook, become, check=False):
        playbooks = self.collections / "ansible_collections" / "inferops" / "snapshot" / "playbooks"
        command = ["runuser", "-u", self.user, "--", "env", "HOME=%s" % pwd.getpwnam(self.user).pw_dir,
                   "ANSIBLE_COLLECTIONS_PATH=%s" % self.collections, "ANSIBLE_NOCOLOR=1",
                   "ANSIBLE_LOCALHOST_WARNING=False", "PATH=%s:/usr/local/bin:/usr/bin:/bin" % self.bin,
                   str(self.bin / "ansible-playbook"), "-i", self.inventory, str(playbooks / playbook)]
        command += (["--become"] if become else []) + (["--check"] if check else [])
        return subprocess.run(command, cwd=self.dir, capture_output=True, text=True, timeout=600, check=False)

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def test_without_become_each_role_names_root_and_with_become_the_playbooks_work(
        normal_user, user_venv, user_collection, tmp_path, containers, docker_env):
    name = "become-%s" % uuid.uuid4().hex[:6]
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    pod = containers(name, docker_env, device_dir, free_port(), WORKLOAD_DEVICE_MB="16", WORKLOAD_HOST_MB="4")
    pod.run().wait_ready()
    expected = [pod.generate(p) for p in PROMPTS]
    root = tmp_path / "snapshots"
    inventory = {"all": {"hosts": {"npu-host": {
        "ansible_connection": "local", "ansible_python_interpreter": str(user_venv / "python"),
        "snapshot_config": {"enabled": True, "hostSnapshotPath": str(root / "host"), "npuSnapshotPath": str(root / "npu")},
        "snapshot_service": {"namespace": "b", "name": "svc"},
        "snapshot_instances": [{"name": "p0", "pods": [{"name": name, "readiness_url": pod.url + "/health"}]}]}}}}
    user = AsUser(normal_user, user_venv, user_collection, inventory)
    try:
        for playbook, role in (("generate.yml", "snapshot_generate"), ("verify.yml", "snapshot_verify"),
                               ("restore.yml", "snapshot_restore"), ("cleanup.yml", "snapshot_cleanup"),
                               ("node_setup.yml", "snapshot_prereqs")):
            run = user.play(playbook, become=False)
            assert run.returncode != 0, run.stdout[-3000:]
            assert ("inferops.snapshot.%s needs root on npu-host" % role) in run.stdout, run.stdout[-3000:]
            assert "but its tasks run as uid=%d(%s)" % (pwd.getpwnam(normal_user).pw_uid, normal_user) in run.stdout
            assert "ansible-playbook -b" in run.stdout and "changed=0" in run.stdout
        assert not (root / "host").exists(), "nothing may be written before the privilege check"

        generated = user.play("generate.yml", become=True)
        assert generated.returncode == 0, generated.stdout[-4000:]
        assert "%s: completed" % name in generated.stdout
        verified = user.play("verify.yml", become=True, check=True)
        assert verified.returncode == 0 and "%s: usable" % name in verified.stdout, verified.stdout[-4000:]
        pod.remove()
        reset_device(device_dir)
        restored = user.play("restore.yml", become=True)
        assert restored.returncode == 0 and "%s: restored from its snapshot" % name in restored.stdout, \
            restored.stdout[-4000:]
        assert [pod.generate(p) for p in PROMPTS] == expected
    finally:
        user.cleanup()

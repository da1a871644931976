"""The ansible-core minors meta/runtime.yml claims (requires_ansible >= 2.16) besides the one the project
venv has: the generate, verify and restore playbooks, each with that minor's own ansible-playbook (a venv
per version under build/, made by scripts/ansible-versions.sh, which also runs sanity and the unit tests
in them), against the real workload. Before 2.19 a value templated through role vars comes back as a
string: verify.yml's MiB figure crashed on it."""

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import COLLECTIONS, REPO, ensure_collection_link, free_port, reset_device
from _roles_helpers import recap, status_record

PROMPTS = ["what is an NPU?", "数据"]


def older_versions():
    text = (REPO / "requirements" / "constraints.txt").read_text()
    return [line.split(":", 1)[1].split()[0] for line in text.splitlines() if line.startswith("# older-ansible-core:")]


@pytest.fixture(scope="session")
def venvs():
    """{version: venv dir}, made once (reused while requirements/ is unchanged)."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "ansible-versions.sh"), "venvs"], check=True,
                         capture_output=True, text=True, timeout=1800).stdout.split()
    return dict(zip(older_versions(), (Path(line) for line in out)))


def play(venv, tmp_path, playbook, inventory, check=False):
    """ansible-playbook of that venv on one of the collection's playbooks; (rc, stdout, facts of npu-host)."""
    ensure_collection_link()
    number = len(list(tmp_path.glob("main-*.yml")))
    (tmp_path / ("inventory-%d.json" % number)).write_text(json.dumps(inventory))
    facts = tmp_path / ("facts-%d.json" % number)
    main = tmp_path / ("main-%d.yml" % number)
    main.write_text(
        "- import_playbook: %s\n"
        "- hosts: npu-host\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.copy:\n"
        "        content: \"{{ {'generate': snapshot_generate_results | default(none), 'verify': snapshot_verify_results"
        " | default(none), 'restore': snapshot_restore_results | default(none)} | to_json }}\"\n"
        "        dest: %s\n        mode: '0600'\n      check_mode: false\n      changed_when: false\n"
        % (REPO / "playbooks" / playbook, facts))
    command = [str(venv / "bin" / "ansible-playbook"), "-i", str(tmp_path / ("inventory-%d.json" % number)), str(main)]
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="False", PATH="%s:%s" % (venv / "bin", os.environ["PATH"]))
    proc = subprocess.run(command + (["--check"] if check else []), env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    found = json.loads(facts.read_text()) if facts.exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, found


@pytest.mark.parametrize("version", older_versions())
def test_generate_verify_restore_on_an_older_ansible_core(version, venvs, tmp_path, containers, docker_env):
    venv = venvs[version]
    assert subprocess.run([str(venv / "bin" / "ansible-playbook"), "--version"], capture_output=True, text=True,
                          check=True).stdout.startswith("ansible-playbook [core %s]" % version)
    name = "core%s-%s" % (version.replace(".", ""), uuid.uuid4().hex[:6])
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    pod = containers(name, docker_env, device_dir, free_port(), WORKLOAD_DEVICE_MB="16", WORKLOAD_HOST_MB="4")
    pod.run().wait_ready()
    expected = [pod.generate(p) for p in PROMPTS]
    root = tmp_path / "snapshots"
    inventory = {"all": {"hosts": {"npu-host": {
        "ansible_connection": "local", "ansible_python_interpreter": str(venv / "bin" / "python"),
        "snapshot_config": {"enabled": True, "hostSnapshotPath": str(root / "host"), "npuSnapshotPath": str(root / "npu")},
        "snapshot_service": {"namespace": "v", "name": "svc"},
        "snapshot_instances": [{"name": "p0", "pods": [{"name": name, "readiness_url": pod.url + "/health"}]}]}}}}
    runs = tmp_path / "runs"
    runs.mkdir()

    rc, out, facts = play(venv, runs, "generate.yml", inventory)
    assert rc == 0, out[-4000:]
    [generated] = facts["generate"]
    snapshot_dir = root / "host" / "v" / "svc" / "p0" / name
    assert generated["status"] == "completed" and generated["checksum"] == status_record(snapshot_dir)["checksum"]
    assert isinstance(generated["checkpoint"]["total_bytes"], int), generated  # not a string before 2.19

    rc, out, facts = play(venv, runs, "verify.yml", inventory, check=True)
    assert rc == 0, out[-4000:]
    [checked] = facts["verify"]
    assert checked["usable"] is True and isinstance(checked["bytes"], int), checked
    assert "%s: usable - status completed, published, %.1f MiB, verifies" % (name, checked["bytes"] / 1048576) in out
    assert recap(out)["npu-host"]["changed"] == 0

    pod.remove()
    reset_device(device_dir)
    rc, out, facts = play(venv, runs, "restore.yml", inventory)
    assert rc == 0, out[-4000:]
    [restored] = facts["restore"]
    assert restored["restored"] is True, restored
    assert [pod.generate(p) for p in PROMPTS] == expected

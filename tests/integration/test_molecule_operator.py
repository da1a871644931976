"""The operator molecule scenario (extensions/molecule/operator) the way an operator runs it, against
this machine as their NPU host: from the collection as ansible-galaxy installs it (with the MOLECULE_GLOB
extensions/molecule/README.md gives: an installed copy has no galaxy.yml), an inventory file of their own,
a pod of the sample workload with a completed snapshot, `molecule test -s operator`. Nothing may change: the
snapshot, its status record and the running engine stay as they were."""

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from conftest import BIN, REPO, build_and_install_collection, free_port
from _roles_helpers import run_playbook, status_record


def plain(text):
    """molecule's output without colours and box drawing, its wrapped lines joined."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return " ".join(re.sub(r"^\s*[\u2500-\u257f]+", "", line).strip() for line in text.splitlines())


def documented_glob():
    """The MOLECULE_GLOB extensions/molecule/README.md tells an operator to export in an installed collection."""
    [value] = re.findall(r"^export MOLECULE_GLOB='([^']+)'$", (REPO / "extensions/molecule/README.md").read_text(),
                         flags=re.M)
    return value


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The collection's root as ansible-galaxy installs it: no galaxy.yml, no build/, no link to the checkout."""
    _tarball, collections = build_and_install_collection(tmp_path_factory.mktemp("installed"))
    root = collections / "ansible_collections" / "inferops" / "snapshot"
    assert not (root / "galaxy.yml").exists() and (root / "MANIFEST.json").exists()
    return root


def molecule(root, env_overrides, command=("test", "-s", "operator")):
    """molecule in the installed collection's root, with the documented MOLECULE_GLOB; nothing of the checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("INFEROPS_MOLECULE_", "MOLECULE_")) and k != "ANSIBLE_COLLECTIONS_PATH"}
    env.update(PATH="%s:%s" % (BIN, os.environ["PATH"]), MOLECULE_GLOB=documented_glob(), **env_overrides)
    return subprocess.run([str(BIN / "molecule")] + list(command), cwd=str(root), env=env,
                          capture_output=True, text=True, timeout=900, check=False)


def test_without_the_settings_molecule_lists_every_scenario_and_the_operator_one_says_what_to_set(installed):
    listed = molecule(installed, {}, command=("list",))
    assert listed.returncode == 0, listed.stdout + listed.stderr
    for scenario in ("default", "generate", "restore", "failure", "operator"):
        assert re.search(r"\b%s\b" % scenario, plain(listed.stdout + listed.stderr)), scenario
    unset = molecule(installed, {})
    assert unset.returncode != 0
    assert "set INFEROPS_MOLECULE_HOST to a host of your inventory" in plain(unset.stdout + unset.stderr) and \
        "INFEROPS_MOLECULE_INVENTORY is not set" in plain(unset.stdout + unset.stderr), plain(unset.stdout)[-3000:]


def test_operator_scenario_on_this_host_changes_nothing(installed, tmp_path, containers, docker_env):
    name = "molop-%s" % uuid.uuid4().hex[:6]
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    pod = containers(name, docker_env, device_dir, free_port(), WORKLOAD_DEVICE_MB="16", WORKLOAD_HOST_MB="4")
    pod.run().wait_ready()
    root = tmp_path / "snapshots"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "snapshot_config": {"enabled": True, "hostSnapshotPath": str(root / "host"),
                                "npuSnapshotPath": str(root / "npu")},
            "snapshot_service": {"namespace": "op", "name": "svc"},
            "snapshot_instances": [{"name": "p0", "pods": [{"name": name, "readiness_url": pod.url + "/health"}]}]}
    inventory = {"npu_nodes": {"hosts": {"npu-01": host}}}
    generated = run_playbook(tmp_path / "runs", "generate.yml", {"all": {"hosts": {"npu-01": host}}})
    assert generated.rc == 0, generated
    snapshot_dir = root / "host" / "op" / "svc" / "p0" / name
    before = status_record(snapshot_dir)
    inventory_file = tmp_path / "inventory.json"
    inventory_file.write_text(json.dumps(inventory))

    report = tmp_path / "report.json"
    run = molecule(installed, {"INFEROPS_MOLECULE_INVENTORY": str(inventory_file), "INFEROPS_MOLECULE_HOST": "npu-01",
                               "INFEROPS_MOLECULE_POD": name, "INFEROPS_MOLECULE_REPORT": str(report)})
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]
    found = json.loads(report.read_text())
    assert found["host"] == "npu-01" and found["pod"] == name, found
    assert found["generate"]["status"] == "unchanged", found  # the quick check: nothing to snapshot again
    assert found["verify"]["usable"] is True and found["verify"]["checksum"] == before["checksum"], found
    assert found["restore"]["started"] is False and found["restore"]["failed"] is False, found  # it runs: left alone
    assert status_record(snapshot_dir) == before, "the dry runs changed the status record"
    assert pod.info()["snapshot_state"] == "RUNNING"

    unknown = molecule(installed, {"INFEROPS_MOLECULE_INVENTORY": str(inventory_file), "INFEROPS_MOLECULE_HOST": "npu-01",
                                   "INFEROPS_MOLECULE_POD": "no-such-pod"})
    assert unknown.returncode != 0
    assert "no-such-pod is not a pod of snapshot_instances on npu-01 (its pods: %s)" % name in \
        plain(unknown.stdout + unknown.stderr), plain(unknown.stdout + unknown.stderr)[-3000:]

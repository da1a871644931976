"""The snapshot_prereqs role (playbooks/node_setup.yml) on this Debian 12 machine, for real: the node as
it is (its CRIU, its experimental dockerd) with scratch copies of the two files it writes, the CRIU
fallback (criu 4.2.x from Debian forky into a private prefix, downloaded from the machine's Debian
mirror), and the errors that name what to fix. The machine's own daemon.json, runc.conf and criu are
never written: the role gets scratch paths for them."""

import json
import os
import subprocess
import sys

from _roles_helpers import local_inventory, run_playbook

NO_RUNTIME = {"snapshot_node_setup_runtime": False}


def scratch_files(tmp_path):
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text(json.dumps({"storage-driver": "vfs", "log-level": "warn"}))
    runc_conf = tmp_path / "criu" / "runc.conf"
    runc_conf.parent.mkdir()
    os.chmod(str(runc_conf.parent), 0o755)  # the mode the role keeps it at, whatever make test's umask (CI: 077)
    runc_conf.write_text("log-file /var/log/criu-runc.log\ntcp-close\n")
    plugins = tmp_path / "criu-plugins"  # where the role installs the CRIU NPU plugin (CRIU's own dir otherwise)
    return {"snapshot_prereqs_docker_daemon_json": str(daemon_json), "snapshot_prereqs_criu_config": str(runc_conf),
            "snapshot_prereqs_criu_plugin_dir": str(plugins)}


def test_prepares_this_node_and_a_second_run_changes_nothing(tmp_path):
    files = dict(scratch_files(tmp_path), snapshot_prereqs_criu_cache=str(tmp_path / "cache"))  # the plugin's build
    inventory = local_inventory(**files)

    preview = run_playbook(tmp_path / "runs", "node_setup.yml", inventory, extra_vars=[NO_RUNTIME], check=True)
    # daemon.json, runc.conf, the NPU plugin's source and directory (built and installed for real only)
    assert preview.rc == 0 and preview.recap["npu-host"]["changed"] == 4, preview
    assert json.loads(open(files["snapshot_prereqs_docker_daemon_json"]).read()) == {"storage-driver": "vfs",
                                                                                     "log-level": "warn"}

    first = run_playbook(tmp_path / "runs", "node_setup.yml", inventory, extra_vars=[NO_RUNTIME])
    assert first.rc == 0 and first.recap["npu-host"]["changed"] == 6, first  # + the plugin's source, build, directory, install
    assert os.path.isfile(os.path.join(files["snapshot_prereqs_criu_plugin_dir"], "inferops_npu_plugin.so"))
    assert json.loads(open(files["snapshot_prereqs_docker_daemon_json"]).read()) == {
        "storage-driver": "vfs", "log-level": "warn", "experimental": True}, "other keys are kept"
    assert open(files["snapshot_prereqs_criu_config"]).read().splitlines() == [
        "log-file /var/log/criu-runc.log", "tcp-close", "skip-in-flight"], "other lines are kept, none twice"
    # This machine's dockerd already runs experimental (scripts/env/setup.sh): nothing to restart.
    assert "dockerd experimental: True" in first.stdout and "criu 4.2" in first.stdout, first

    again = run_playbook(tmp_path / "runs", "node_setup.yml", inventory, extra_vars=[NO_RUNTIME])
    assert again.rc == 0 and again.recap["npu-host"]["changed"] == 0, again


def test_criu_from_debian_into_a_private_prefix_when_the_distribution_is_too_old(tmp_path):
    """Debian 12 offers criu 3.17: the role unpacks 4.2.x from forky behind a wrapper, which passes
    `criu check`. The running dockerd cannot see the scratch wrapper's directory, and the role says so."""
    prefix, wrapper = tmp_path / "prefix", tmp_path / "bin" / "criu"
    settings = dict(scratch_files(tmp_path), snapshot_prereqs_criu=str(wrapper),
                    snapshot_prereqs_criu_prefix=str(prefix), snapshot_prereqs_criu_wrapper=str(wrapper),
                    snapshot_prereqs_criu_cache=str(tmp_path / "cache"))
    run = run_playbook(tmp_path / "runs", "node_setup.yml", local_inventory(**settings), extra_vars=[NO_RUNTIME])
    assert run.rc != 0, run
    assert "Unpack criu and its libraries into the prefix" in run.stdout and "changed: [npu-host]" in run.stdout, run
    assert (prefix / "INFEROPS-SOURCE").read_text().startswith("criu 4.2"), run
    version = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True, check=True).stdout
    assert "Version: 4.2" in version
    check = subprocess.run([str(wrapper), "check"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "lacks %s: runc started by it cannot find criu" % wrapper.parent in run.stdout, run

    # A second run keeps the prefix (it only checks the wrapper) and stops at the same place.
    again = run_playbook(tmp_path / "runs", "node_setup.yml", local_inventory(**settings), extra_vars=[NO_RUNTIME])
    assert again.rc != 0 and again.recap["npu-host"]["changed"] == 0, again
    assert "lacks %s" % wrapper.parent in again.stdout, again


def test_says_what_to_install_when_the_modules_python_has_no_jsonschema(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    settings = dict(scratch_files(tmp_path), snapshot_prereqs_python=str(bare / "bin" / "python"),
                    snapshot_prereqs_install_packages=False)
    run = run_playbook(tmp_path / "runs", "node_setup.yml", local_inventory(**settings), extra_vars=[NO_RUNTIME])
    assert run.rc != 0, run
    assert "%s on npu-host has no jsonschema, the modules need 4.0 or later" % (bare / "bin" / "python") in run.stdout, run


def test_a_dockerd_restart_nobody_allowed_is_refused_before_daemon_json_is_written(tmp_path):
    """dockerd runs without experimental features (its answer stubbed at the process boundary: this machine's dockerd
    has them on): daemon.json was written first and the role failed after, leaving a file dockerd does not run with
    for its next unrelated restart to pick up."""
    files = scratch_files(tmp_path)
    before = open(files["snapshot_prereqs_docker_daemon_json"]).read()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text("#!/bin/sh\n[ \"$1\" = info ] && { echo false; exit 0; }\nexec /usr/bin/docker \"$@\"\n")
    (fake / "docker").chmod(0o755)
    env = dict(os.environ, PATH="%s:%s" % (fake, os.environ.get("PATH", "")))
    run = run_playbook(tmp_path / "runs", "node_setup.yml", local_inventory(**files), extra_vars=[NO_RUNTIME], env=env)
    assert run.rc != 0 and "runs without experimental features" in run.stdout, run
    assert "Nothing was written to it" in run.stdout, run
    assert open(files["snapshot_prereqs_docker_daemon_json"]).read() == before, "daemon.json was written"

"""The AWX layout run the way AWX runs it: ansible-runner on a private data dir holding the project
(extensions/awx/project: the wrapper playbooks AWX lists), the inventory, the survey's answers as extra
vars, privilege escalation on. The real workload in a container on this machine's dockerd. Each job's
artifacts (set_stats, what AWX hands to the next node of a workflow) are read from its stats event and
passed on as the next job's extra vars, as an AWX workflow does."""

import json
import os
import shutil
import sys
import uuid

import ansible_runner
import pytest
import yaml

from conftest import BIN, COLLECTIONS, REPO, ensure_collection_link, free_port, reset_device
from _roles_helpers import status_record

AWX = REPO / "extensions" / "awx"
PROMPTS = ["what is an NPU?", "数据"]


def survey_answers(name, **overrides):
    """What AWX sends when the survey is accepted with its defaults (multiselect: a list)."""
    answers = {}
    for question in json.loads((AWX / "surveys" / ("%s.json" % name)).read_text())["spec"]:
        default = question.get("default")
        if question["type"] == "multiselect":
            default = [item for item in default.split("\n") if item]
        answers[question["variable"]] = default
    answers.update(overrides)
    return answers


def role_options(role, entry="main"):
    specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"][entry]["options"]


@pytest.mark.parametrize("survey, role", [("generate", "snapshot_generate"), ("cleanup", "snapshot_cleanup")])
def test_every_survey_question_sets_a_variable_its_role_takes(survey, role):
    options = role_options(role)
    spec = json.loads((AWX / "surveys" / ("%s.json" % survey)).read_text())
    assert spec["name"] and spec["description"] and spec["spec"]
    for question in spec["spec"]:
        assert {"question_name", "variable", "type", "required"} <= set(question), question
        variable = question["variable"]
        if variable == "snapshot_hosts":  # the play's host pattern, not a role variable
            continue
        assert variable in options, "%s: %s is no option of %s" % (survey, variable, role)
        wanted = options[variable]
        if "choices" in question and "choices" in wanted:
            assert set(question["choices"]) <= set(wanted["choices"]), question
        if question["type"] == "integer":
            assert wanted["type"] in ("int", "float"), question
        if question["type"] == "multiplechoice" and wanted["type"] == "bool":
            assert set(question["choices"]) == {"true", "false"}, question


class Awx:
    """One private data dir, as AWX prepares it for each job of the project."""

    def __init__(self, tmp_path, inventory):
        ensure_collection_link()
        self.root = tmp_path / "awx"
        shutil.copytree(AWX / "project", self.root / "project")
        (self.root / "inventory").mkdir(parents=True)
        (self.root / "inventory" / "hosts.json").write_text(json.dumps(inventory))
        # The execution environment has the collection installed; here it is this checkout.
        self.env = {"ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "PATH": "%s:%s" % (BIN, os.environ["PATH"]),
                    "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "False"}

    def launch(self, playbook, extravars, check=False):
        runner = ansible_runner.run(private_data_dir=str(self.root), playbook=playbook, extravars=extravars,
                                    envvars=self.env, cmdline="--become" + (" --check" if check else ""),
                                    ident=uuid.uuid4().hex[:8], quiet=True)
        stats = [event for event in runner.events if event["event"] == "playbook_on_stats"]
        assert stats, "no stats event: %s\n%s" % (runner.status, runner.stdout.read()[-3000:])
        return runner, stats[-1]["event_data"].get("artifact_data") or {}

    @staticmethod
    def output(runner):
        with open(runner.stdout.name) as handle:
            return handle.read()


def test_wrapper_playbooks_through_ansible_runner_hand_their_artifacts_on(tmp_path, containers, docker_env):
    name = "awx-%s" % uuid.uuid4().hex[:6]
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    pod = containers(name, docker_env, device_dir, free_port(), WORKLOAD_DEVICE_MB="16", WORKLOAD_HOST_MB="4")
    pod.run().wait_ready()
    expected = [pod.generate(p) for p in PROMPTS]
    root = tmp_path / "snapshots"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "snapshot_config": {"enabled": True, "hostSnapshotPath": str(root / "host"),
                                "npuSnapshotPath": str(root / "npu")},
            "snapshot_service": {"namespace": "awx", "name": "svc"},
            "snapshot_instances": [{"name": "p0", "pods": [{"name": name, "readiness_url": pod.url + "/health"}]}]}
    awx = Awx(tmp_path, {"all": {"hosts": {"npu-host": host}}})
    snapshot_dir = root / "host" / "awx" / "svc" / "p0" / name

    # A Check job first (job type Check in AWX): nothing written, the plan handed on.
    runner, artifacts = awx.launch("generate.yml", survey_answers("generate", snapshot_hosts="npu-host"), check=True)
    assert runner.status == "successful", awx.output(runner)[-3000:]
    assert artifacts["snapshot_generate_by_host"]["npu-host"]["outcome"]["status"] == "would_generate", artifacts
    assert not snapshot_dir.exists()

    runner, generated = awx.launch("generate.yml", survey_answers("generate", snapshot_hosts="npu-host"))
    assert runner.status == "successful" and runner.rc == 0, awx.output(runner)[-3000:]
    mine = generated["snapshot_generate_by_host"]["npu-host"]
    assert mine["outcome"]["status"] == "completed" and mine["outcome"]["instance"] == "p0", mine
    [result] = mine["results"]
    assert result["status"] == "completed" and result["checksum"] == status_record(snapshot_dir)["checksum"]
    assert isinstance(result["checkpoint"]["total_bytes"], int) and result["checkpoint"]["total_bytes"] > 1024
    assert mine["engines"][name] == {"engine": "RUNNING", "serving": True}
    assert "RETRYING" not in awx.output(runner)

    # The next node of a workflow gets the artifacts as extra vars: they must not disturb it.
    runner, verified = awx.launch("verify.yml", dict(generated, snapshot_hosts="npu-host"))
    assert runner.status == "successful", awx.output(runner)[-3000:]
    [checked] = verified["snapshot_verify_by_host"]["npu-host"]
    assert checked["usable"] and checked["valid"] and checked["checksum"] == result["checksum"], checked
    assert isinstance(checked["bytes"], int) and checked["bytes"] > 1024

    # An unchanged second generate (the nightly schedule): quick re-check, nothing hashed.
    runner, again = awx.launch("generate.yml", dict(generated, **survey_answers("generate", snapshot_hosts="npu-host")))
    assert runner.status == "successful", awx.output(runner)[-3000:]
    assert again["snapshot_generate_by_host"]["npu-host"]["outcome"]["status"] == "unchanged", again

    pod.remove()
    reset_device(device_dir)
    runner, restored = awx.launch("restore.yml", dict(verified, snapshot_hosts="npu-host"))
    assert runner.status == "successful", awx.output(runner)[-3000:]
    [back] = restored["snapshot_restore_by_host"]["npu-host"]
    assert back["restored"] is True and back["pod"] == name, back
    assert [pod.generate(p) for p in PROMPTS] == expected

    runner, cleaned = awx.launch("cleanup.yml", survey_answers("cleanup", snapshot_hosts="npu-host"))
    assert runner.status == "successful", awx.output(runner)[-3000:]
    cleanup = cleaned["snapshot_cleanup_by_host"]["npu-host"]
    assert cleanup["removed"] == [] and snapshot_dir.is_dir(), cleanup  # in use by the restored container


def test_awx_configuration_playbook_names_files_that_exist():
    """extensions/awx/configure.yml cannot run without an AWX here; what it reads from disk must exist."""
    play = yaml.safe_load((AWX / "configure.yml").read_text())[0]
    assert play["vars"]["awx_playbook_dir"] == ""  # the project's repository holds extensions/awx/project/ at its root
    for template in play["vars"]["awx_templates"]:
        assert (AWX / "project" / template["playbook"]).is_file(), template
        # a fork of this repository as the project: docs/awx.md's awx_playbook_dir
        assert (REPO / "extensions/awx/project" / template["playbook"]).is_file(), template
        if "survey" in template:
            assert (AWX / "surveys" / template["survey"]).is_file(), template

"""The AWX layout run the way AWX runs it: each job with ansible-runner on a fresh private data dir holding
the project (extensions/awx/project: the wrapper playbooks AWX lists) and the inventory, and a fresh HOME
(an execution environment keeps nothing between jobs: no key made on first use survives), AWX's own extra
vars (awx_job_id, tower_job_id), the signing key's credential injected as AWX's injectors do (the file
injector's file written 0600 into the job's private data dir, the extra vars rendered from configure.yml's
credential type), the survey's answers as extra vars, privilege escalation on. The real workload in a
container on this machine's dockerd. Each job's artifacts (set_stats, what AWX hands to the next node of a
workflow) are read from its stats event and passed on as the next job's extra vars, as an AWX workflow does."""

import base64
import itertools
import json
import os
import shutil
import sys
import uuid

import ansible_runner
import jinja2.sandbox
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

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


def configure_tasks():
    return yaml.safe_load((AWX / "configure.yml").read_text())[0]["tasks"]


def credential_type(name_variable):
    """A credential type configure.yml makes, its injector templates as AWX stores them (Ansible renders the
    task's arguments once, which leaves AWX's own templates)."""
    [task] = [task["awx.awx.credential_type"] for task in configure_tasks()
              if task.get("awx.awx.credential_type", {}).get("name") == "{{ %s }}" % name_variable]
    return task, json.loads(jinja2.Environment().from_string(json.dumps(task["injectors"])).render())


def signing_credential_type():
    return credential_type("awx_signing_credential")


def encryption_credential():
    """The encryption key's injectors and the operator's key (`openssl rand -base64 32`)."""
    return credential_type("awx_encryption_credential")[1], {"encryption_key": base64.b64encode(os.urandom(32)).decode()}


def signing_key_pair():
    """What the operator gives configure.yml (`openssl genpkey -algorithm ed25519`, `openssl pkey -pubout`)."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return {"signing_key": private, "public_key": public}


def inject(injectors, inputs, private_data_dir):
    """AWX's injection of a custom credential: the file injector's template rendered into a 0600 file in the
    job's private data dir (its path is tower.filename), then the extra vars rendered with it."""
    sandbox = jinja2.sandbox.ImmutableSandboxedEnvironment()
    namespace = dict(inputs)
    if "file" in injectors:
        env_dir = private_data_dir / "env"
        env_dir.mkdir(exist_ok=True)
        path = env_dir / ("credential-%s" % uuid.uuid4().hex[:8])
        path.write_text(sandbox.from_string(injectors["file"]["template"]).render(**inputs))
        path.chmod(0o600)
        namespace["tower"] = {"filename": str(path)}
    return {name: sandbox.from_string(template).render(**namespace)
            for name, template in injectors["extra_vars"].items()}


class Awx:
    """AWX's job model: every launch a fresh private data dir (the project, the inventory) and a fresh HOME."""

    def __init__(self, tmp_path, inventory, credential=None, encryption=None):
        ensure_collection_link()
        self.tmp_path = tmp_path
        self.inventory = inventory
        self.credential = credential  # the inputs of the signing key's credential, attached to every template
        self.encryption = encryption  # (injectors, inputs) of the encryption key's credential, or none
        self.jobs = itertools.count(1)
        self.homes = []
        # The execution environment has the collection installed; here it is this checkout.
        self.env = {"ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "PATH": "%s:%s" % (BIN, os.environ["PATH"]),
                    "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "False"}

    def launch(self, playbook, extravars, check=False, credential=True, awx=True, encryption=True):
        job = next(self.jobs)
        root = self.tmp_path / ("awx-job-%d" % job)
        shutil.copytree(AWX / "project", root / "project")
        (root / "inventory").mkdir(parents=True)
        (root / "inventory" / "hosts.json").write_text(json.dumps(self.inventory))
        home = root / "home"
        home.mkdir(mode=0o700)
        self.homes.append(home)
        if awx:  # AWX's own extra vars, in every job it runs
            extravars = dict(extravars, awx_job_id=job, tower_job_id=job, awx_job_template_name=playbook)
        if awx and credential and self.credential:
            extravars.update(inject(signing_credential_type()[1], self.credential, root))
        if awx and encryption and self.encryption:
            extravars.update(inject(*self.encryption, root))
        runner = ansible_runner.run(private_data_dir=str(root), playbook=playbook, extravars=extravars,
                                    envvars=dict(self.env, HOME=str(home)),
                                    cmdline="--become" + (" --check" if check else ""),
                                    ident=uuid.uuid4().hex[:8], quiet=True)
        stats = [event for event in runner.events if event["event"] == "playbook_on_stats"]
        assert stats, "no stats event: %s\n%s" % (runner.status, runner.stdout.read()[-3000:])
        return runner, stats[-1]["event_data"].get("artifact_data") or {}

    def keys_made(self):
        """Signing keys made on first use in the jobs' HOMEs (the roles' default keys dir, ~/.inferops/keys)."""
        return [str(path) for home in self.homes for path in home.rglob("signing.pem")]

    @staticmethod
    def output(runner):
        with open(runner.stdout.name) as handle:
            return handle.read()

    @staticmethod
    def task_results(runner, action):
        """The results of every task (and loop item) of a module in the job's events."""
        results = []
        for event in runner.events:
            data = event.get("event_data", {})
            if event["event"] in ("runner_on_ok", "runner_on_failed") and data.get("task_action") == action:
                results.extend(data["res"].get("results") or [data["res"]])
        return results


def warm_pod_host(tmp_path, containers, docker_env, prefix, service):
    """A warmed-up engine in a container of its own and the inventory host whose one pod it is: (name, pod, its
    answers to PROMPTS, the snapshot root, the host's variables)."""
    name = "%s-%s" % (prefix, uuid.uuid4().hex[:6])
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    pod = containers(name, docker_env, device_dir, free_port(), WORKLOAD_DEVICE_MB="16", WORKLOAD_HOST_MB="4")
    pod.run().wait_ready()
    expected = [pod.generate(p) for p in PROMPTS]
    root = tmp_path / "snapshots"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "snapshot_config": {"enabled": True, "hostSnapshotPath": str(root / "host"),
                                "npuSnapshotPath": str(root / "npu")},
            "snapshot_service": {"namespace": "awx", "name": service},
            "snapshot_instances": [{"name": "p0", "pods": [{"name": name, "readiness_url": pod.url + "/health"}]}]}
    return name, pod, expected, root, host


def test_wrapper_playbooks_through_ansible_runner_hand_their_artifacts_on(tmp_path, containers, docker_env):
    name, pod, expected, root, host = warm_pod_host(tmp_path, containers, docker_env, "awx", "svc")
    awx = Awx(tmp_path, {"all": {"hosts": {"npu-host": host}}}, credential=signing_key_pair())
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
    reset_device(pod.device_dir)
    runner, restored = awx.launch("restore.yml", dict(verified, snapshot_hosts="npu-host"))
    assert runner.status == "successful", awx.output(runner)[-3000:]
    [back] = restored["snapshot_restore_by_host"]["npu-host"]
    assert back["restored"] is True and back["pod"] == name, back
    assert [pod.generate(p) for p in PROMPTS] == expected
    # Signed by the credential's key in the generate job, trusted through it in the restore job: two HOMEs.
    assert back["verify"]["authenticated"] is True, back["verify"]

    runner, cleaned = awx.launch("cleanup.yml", survey_answers("cleanup", snapshot_hosts="npu-host"))
    assert runner.status == "successful", awx.output(runner)[-3000:]
    cleanup = cleaned["snapshot_cleanup_by_host"]["npu-host"]
    assert cleanup["removed"] == [] and snapshot_dir.is_dir(), cleanup  # in use by the restored container
    assert awx.keys_made() == []  # every job signed with, or trusted, the credential's key


def test_the_encryption_credential_encrypts_in_one_job_and_decrypts_in_another(tmp_path, containers, docker_env):
    """Both credentials, each job in its own HOME: the generate job encrypts with the injected key; a restore job
    without the encryption credential cannot decrypt (nothing starts), one with it decrypts the container's record
    with it and starts the container from it, authenticated. It starts cold by design here: this node has no
    restore-on-create runtime, and docker start --checkpoint never restores an encrypted snapshot (encrypted:)."""
    name, pod, expected, root, host = warm_pod_host(tmp_path, containers, docker_env, "awx-enc", "enc")
    awx = Awx(tmp_path, {"all": {"hosts": {"npu-host": host}}}, credential=signing_key_pair(),
              encryption=encryption_credential())
    runner, generated = awx.launch("generate.yml", survey_answers("generate", snapshot_hosts="npu-host"))
    assert runner.status == "successful", awx.output(runner)[-3000:]
    assert generated["snapshot_generate_by_host"]["npu-host"]["outcome"]["status"] == "completed", generated
    snapshot_dir = root / "host" / "awx" / "enc" / "p0" / name
    recorded = json.loads((snapshot_dir / "manifest.json").read_text())["encryption"]
    assert "host/container.json" in recorded["files"], recorded

    pod.remove()
    reset_device(pod.device_dir)
    runner, refused = awx.launch("restore.yml", {"snapshot_hosts": "npu-host"}, encryption=False)
    [cold] = refused["snapshot_restore_by_host"]["npu-host"]
    assert cold["restored"] is False and "crypt" in cold["reason"], cold  # decrypt_failed: without the key

    assert not cold["created"] and "decrypt" not in cold["durations"], cold

    runner, restored = awx.launch("restore.yml", {"snapshot_hosts": "npu-host", "snapshot_restore_method": "docker"})
    assert runner.status == "successful", awx.output(runner)[-3000:]
    [back] = restored["snapshot_restore_by_host"]["npu-host"]
    assert back["verify"]["valid"] and back["verify"]["authenticated"] is True, back["verify"]
    assert back["created"] is True and "decrypt" in back["durations"], back
    assert back["restored"] is False and back["reason"].startswith("encrypted: docker start --checkpoint"), back
    assert [pod.generate(p) for p in PROMPTS] == expected  # the engine, started from the decrypted record
    assert awx.keys_made() == []


def restore_host(tmp_path):
    """A host whose service has snapshots off: its jobs touch no container."""
    root = tmp_path / "snapshots"
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "snapshot_config": {"enabled": False, "hostSnapshotPath": str(root / "host"),
                                "npuSnapshotPath": str(root / "npu")},
            "snapshot_service": {"namespace": "awx", "name": "svc"},
            "snapshot_instances": [{"name": "p0", "pods": [{"name": "awx-cred-absent"}]}]}


@pytest.mark.parametrize("playbook", ["restore.yml", "generate.yml", "refresh.yml", "node_setup.yml"])
def test_a_job_without_the_signing_credential_fails_at_its_first_task_naming_it(tmp_path, playbook):
    awx = Awx(tmp_path, {"all": {"hosts": {"npu-host": restore_host(tmp_path)}}}, credential=signing_key_pair())
    runner = awx.launch(playbook, {"snapshot_hosts": "npu-host"}, credential=False)[0]
    assert runner.status == "failed", awx.output(runner)[-3000:]
    ran = [event["event_data"]["task"] for event in runner.events
           if event["event"] in ("runner_on_ok", "runner_on_failed", "runner_on_skipped")]
    assert ran == ['In AWX, check that the job has the credential "inferops snapshot signing key"'], ran
    [failed] = [event["event_data"]["res"] for event in runner.events if event["event"] == "runner_on_failed"]
    assert 'no credential of type "inferops snapshot signing key"' in failed["msg"], failed
    assert awx.keys_made() == [] and not (tmp_path / "snapshots").exists()


def test_outside_awx_the_wrappers_keep_the_controllers_own_key(tmp_path):
    """No awx_job_id: the controller keeps its key in ~/.inferops/keys, made on first use, as before."""
    awx = Awx(tmp_path, {"all": {"hosts": {"npu-host": restore_host(tmp_path)}}})
    runner, restored = awx.launch("restore.yml", {"snapshot_hosts": "npu-host"}, awx=False)
    skipped = [event["event_data"]["task"] for event in runner.events if event["event"] == "runner_on_skipped"]
    assert skipped[:2] == ['In AWX, check that the job has the credential "inferops snapshot signing key"',
                           "In AWX, trust the credential's public key instead of a key made in this job's execution "
                           "environment"], skipped
    [key] = awx.task_results(runner, "inferops.snapshot.snapshot_signing_key")
    assert key["changed"] is True, key
    # the pod itself fails as before (snapshots off, no container): what the wrappers do not change
    [pod] = restored["snapshot_restore_by_host"]["npu-host"]
    assert pod["failed"] and "container awx-cred-absent does not exist" in pod["reason"], pod
    [home] = awx.homes
    assert awx.keys_made() == [str(home / ".inferops" / "keys" / "signing.pem")]


def test_the_credential_injects_what_the_roles_and_the_wrappers_read():
    """configure.yml's credential types: the file injector's path is the generate role's (and refresh's) signing
    key, the public half the variable the wrappers' first play trusts; the encryption key the generate role's and
    the variable the first play decrypts with; each attached to the templates that use it."""
    signing_type, injectors = signing_credential_type()
    assert signing_type["kind"] == "cloud"
    assert {field["id"] for field in signing_type["inputs"]["fields"]} == {"signing_key", "public_key"}
    [secret] = [field for field in signing_type["inputs"]["fields"] if field.get("secret")]
    assert secret["id"] == "signing_key"
    assert injectors["file"] == {"template": "{{ signing_key }}"}
    assert injectors["extra_vars"] == {"snapshot_generate_signing_key": "{{ tower.filename }}",
                                       "snapshot_awx_signing_public_key": "{{ public_key }}"}
    assert "snapshot_generate_signing_key" in role_options("snapshot_generate")
    check = (AWX / "project" / "signing_key.yml").read_text()
    assert "snapshot_awx_signing_public_key" in check
    play = yaml.safe_load((AWX / "configure.yml").read_text())[0]
    signing = sorted(template["playbook"] for template in play["vars"]["awx_templates"] if template.get("signing"))
    assert signing == ["generate.yml", "node_setup.yml", "refresh.yml", "restore.yml"]
    encrypting = sorted(template["playbook"] for template in play["vars"]["awx_templates"] if template.get("encryption"))
    assert encrypting == ["generate.yml", "node_setup.yml", "restore.yml"]
    encryption_type, encryption_injectors = credential_type("awx_encryption_credential")
    assert [field["id"] for field in encryption_type["inputs"]["fields"] if field.get("secret")] == ["encryption_key"]
    assert encryption_injectors == {"extra_vars": {"snapshot_generate_encryption_key": "{{ encryption_key }}",
                                                   "snapshot_awx_encryption_key": "{{ encryption_key }}"}}
    assert "snapshot_generate_encryption_key" in role_options("snapshot_generate")
    assert "snapshot_awx_encryption_key" in check
    for playbook in signing:
        first = yaml.safe_load((AWX / "project" / playbook).read_text())[0]
        assert first["ansible.builtin.import_playbook"] == "signing_key.yml", playbook


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

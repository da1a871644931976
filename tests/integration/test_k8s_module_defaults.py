"""module_defaults for the collection's Kubernetes modules (docs/kubernetes.md, "Connection and module_defaults",
whose example runs here as written), through ansible-playbook against the Kubernetes API emulator (kmock, real
HTTP): ``group/inferops.snapshot.k8s`` sets kubernetes.core's connection options of the collection's modules and --
the group extends kubernetes.core's (meta/runtime.yml) -- of kubernetes.core's modules too, and reaches the
k8s_snapshot role's modules from the play. No kubeconfig anywhere else: a module the defaults did not reach cannot
connect."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import doc_blocks
from _k8s_helpers import Api, ApiServer, workload_pod, write_kubeconfig
from conftest import BIN, COLLECTIONS, ensure_collection_link

pytestmark = pytest.mark.timeout(300)
NAMESPACE, TOKEN = "inference", "token-of-the-group-defaults"  # the docs' namespace


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = ApiServer()
    base = tmp_path_factory.mktemp("module-defaults")
    kubeconfig = write_kubeconfig(base / "kubeconfig", server.url)
    config = json.loads(Path(kubeconfig).read_text())
    config["users"][0]["user"]["token"] = TOKEN  # the requests of the defaults' connection, told apart
    Path(kubeconfig).write_text(json.dumps(config))
    Api(server.url, NAMESPACE).create(workload_pod("qwen-p0-0", NAMESPACE, "qwen", "p0", "inferops/workload:latest", 1,
                                                   base, base))
    yield {"server": server, "kubeconfig": kubeconfig, "base": base}
    server.stop()


def run(api, name, plays, **extra_vars):
    """ansible-playbook on ``plays``; (rc, output). No kubeconfig but what the plays give: HOME has none, no
    K8S_AUTH_* is set, and this is no pod."""
    ensure_collection_link()
    home = api["base"] / ("home-" + name)
    home.mkdir(exist_ok=True)
    playbook = api["base"] / ("%s.yml" % name)
    playbook.write_text(plays if isinstance(plays, str) else yaml.safe_dump(plays, sort_keys=False))
    env = dict((key, value) for key, value in os.environ.items()
               if not key.startswith("K8S_AUTH_") and key != "KUBERNETES_SERVICE_HOST")
    env.update(HOME=str(home), ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    command = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
               "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)]
    for key, value in extra_vars.items():
        command += ["-e", "%s=%s" % (key, value)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def play(api, name, module_defaults, tasks):
    return run(api, name, [{"name": name, "hosts": "localhost", "gather_facts": False,
                            "module_defaults": module_defaults, "tasks": tasks}])


def requests_with_the_token(api):
    return [entry[1:] for entry in api["server"].emulator.seen if entry[0] == "Bearer " + TOKEN]


def test_group_defaults_reach_the_collections_modules_kubernetes_cores_and_the_role(api):
    before = len(requests_with_the_token(api))
    rc, output = play(api, "group", {"group/inferops.snapshot.k8s": {"kubeconfig": api["kubeconfig"]}}, [
        {"name": "The collection's module", "inferops.snapshot.k8s_snapshot_pods_info": {
            "namespace": NAMESPACE, "service": "qwen"}, "register": "info"},
        {"name": "kubernetes.core's module (the group extends group/kubernetes.core.k8s)",
         "kubernetes.core.k8s_info": {"kind": "Pod", "namespace": NAMESPACE}, "register": "core"},
        {"name": "The role's restore entry point, with no connection variable of its own",
         "ansible.builtin.include_role": {"name": "inferops.snapshot.k8s_snapshot", "tasks_from": "restore"},
         "vars": {"k8s_snapshot_namespace": NAMESPACE, "k8s_snapshot_service": "qwen"}},
        {"ansible.builtin.assert": {"that": [
            "info.instance == 'p0' and info.pods | map(attribute='name') | list == ['qwen-p0-0']",
            "core.resources | map(attribute='metadata.name') | list == ['qwen-p0-0']",
            "k8s_snapshot_restore_results == []"]}},
    ])
    assert rc == 0, output[-4000:]
    made = requests_with_the_token(api)[before:]
    assert ("list", "pods", None) in made and ("get", "configmaps", "inferops-snapshot-qwen") in made, made


def test_kubernetes_cores_own_group_does_not_reach_the_collections_modules(api):
    """As documented: a group names the modules of its collection and those it extends; kubernetes.core's group
    cannot name this collection's, so its defaults do not reach them (use group/inferops.snapshot.k8s)."""
    rc, output = play(api, "core-group", {"group/kubernetes.core.k8s": {"kubeconfig": api["kubeconfig"]}}, [
        {"kubernetes.core.k8s_info": {"kind": "Pod", "namespace": NAMESPACE}},
        {"inferops.snapshot.k8s_snapshot_pods_info": {"namespace": NAMESPACE, "service": "qwen"}},
    ])
    assert rc != 0 and "cannot connect to the Kubernetes API" in output, output[-4000:]
    assert "ok: [localhost]" in output  # kubernetes.core's own module got its group's defaults


def test_the_docs_example_runs_as_written(api):
    """The doc's play (doctest: k8s-module-defaults), then a play that checks what its two tasks read."""
    (api["base"] / "docs-example.yml").write_text(doc_blocks.block("docs/kubernetes.md", "k8s-module-defaults"))
    before = len(requests_with_the_token(api))
    rc, output = run(api, "docs-check", [
        {"import_playbook": "docs-example.yml"},
        {"name": "What the example read", "hosts": "localhost", "gather_facts": False, "tasks": [
            {"ansible.builtin.assert": {"that": [
                "plan.instance == 'p0' and plan.pods | map(attribute='name') | list == ['qwen-p0-0']",
                "listed.resources | map(attribute='metadata.name') | list == ['qwen-p0-0']"]}}]},
    ], k8s_kubeconfig=api["kubeconfig"])
    assert rc == 0, output[-4000:]
    assert len(requests_with_the_token(api)) > before

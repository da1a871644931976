"""k8s_snapshot_admission_policy: the k8s_snapshot role applies the admission policy and its binding through
kubernetes.core.k8s (ansible-playbook, real HTTP, the Kubernetes API emulator): check mode writes nothing, the first
run creates both objects as the admission_policy filter builds them, a second run changes nothing, a bad namespace
name fails naming the field before anything is written, and every request the role made is granted by the
ClusterRole in docs/kubernetes.md. The emulator stores the policy but enforces nothing (only an API server does:
tests/unit/k8s/test_admission.py evaluates its CEL)."""

import re
import uuid

import kmock
import pytest
import yaml

from _k8s_helpers import VERBS, ApiServer, run_playbook, write_inventory, write_kubeconfig
from conftest import REPO

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import admission

pytestmark = pytest.mark.timeout(600)
GROUP = "admissionregistration.k8s.io/v1/"
KINDS = {"validatingadmissionpolicies": "ValidatingAdmissionPolicy",
         "validatingadmissionpolicybindings": "ValidatingAdmissionPolicyBinding"}
TASK = "Apply the admission policy that keeps restore requests to"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = ApiServer()
    for plural, kind in KINDS.items():
        server.emulator.resources[GROUP + plural] = kmock.ResourceInfo(
            kind=kind, singular=kind.lower(), namespaced=False, verbs=VERBS)
    base = tmp_path_factory.mktemp("admission")
    token = "admission-" + uuid.uuid4().hex[:8]
    inventory = write_inventory(base / "inventory.json", "node-a",
                                write_kubeconfig(base / "kubeconfig", server.url, token=token))
    yield {"server": server, "inventory": inventory, "token": "Bearer " + token}
    server.stop()


def stored(cluster):
    """{kind: object} of the admission objects the emulator holds."""
    return dict((KINDS[resource.plural], obj.raw) for (resource, _namespace, name), obj
                in cluster["server"].emulator.objects.items()
                if resource.group + "/" + resource.version + "/" == GROUP and resource.plural in KINDS
                and name == layout.K8S_ADMISSION_POLICY and not obj.deleted)


def restore(cluster, check=False, **extra):
    """k8s_restore.yml for a service without pods: nothing to restore, only the policy to apply."""
    variables = {"k8s_snapshot_namespace": "inference", "k8s_snapshot_service": "qwen",
                 "k8s_snapshot_node_group": "k8s_nodes", "k8s_snapshot_admission_policy": True,
                 "k8s_snapshot_admission_namespaces": ["team-a", "inference"]}
    variables.update(extra)
    return run_playbook("k8s_restore.yml", cluster["inventory"], variables, check=check)


def task_status(output):
    """ok / changed / failed of the role's admission task, as ansible-playbook printed it."""
    match = re.search(r"TASK \[[^\]]*%s[^\]]*\] \*+\n(ok|changed|fatal): \[localhost\]" % re.escape(TASK), output)
    assert match, output[-4000:]
    return match.group(1)


def test_the_role_applies_the_policy_and_its_binding_once(cluster):
    rc, output = restore(cluster, check=True)
    assert rc == 0 and task_status(output) == "changed", output[-4000:]
    assert stored(cluster) == {}, "check mode wrote to the cluster"

    rc, output = restore(cluster)
    assert rc == 0 and task_status(output) == "changed", output[-4000:]
    policy, binding = admission.objects(["inference", "team-a"], ["inferops-restore"])
    objects = stored(cluster)
    assert sorted(objects) == sorted(KINDS.values()), objects
    for wanted in (policy, binding):
        got = objects[wanted["kind"]]
        assert got["spec"] == wanted["spec"] and got["metadata"]["name"] == layout.K8S_ADMISSION_POLICY, got

    rc, output = restore(cluster)
    assert rc == 0 and task_status(output) == "ok", output[-4000:]
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0 ", output), output[-2000:]
    assert stored(cluster) == objects

    # a run with a bad namespace name fails naming it, and leaves the policy as it was
    rc, output = restore(cluster, k8s_snapshot_admission_namespaces=["inference", "Team_B"])
    assert rc != 0 and "namespaces[1]: 'Team_B' is not a namespace name" in output, output[-4000:]
    assert stored(cluster) == objects


def test_the_clusterrole_in_the_docs_is_exactly_what_the_admission_task_uses(cluster):
    """Every request of the role's runs above to the admission objects is granted by the ClusterRole that
    docs/kubernetes.md gives for k8s_snapshot_admission_policy, and it grants nothing more."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    documents = [doc for block in text.split("```yaml")[1:] for doc in yaml.safe_load_all(block.split("```")[0])]
    roles = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "ClusterRole"
             and doc["metadata"]["name"] == "inferops-snapshot-admission"]
    assert len(roles) == 1, "docs/kubernetes.md has no ClusterRole inferops-snapshot-admission"
    granted = {(verb, resource, name) for rule in roles[0]["rules"] for resource in rule["resources"]
               for verb in rule["verbs"] for name in rule.get("resourceNames") or [None]}
    assert all(rule["apiGroups"] == ["admissionregistration.k8s.io"] for rule in roles[0]["rules"])
    made = {entry[1:] for entry in cluster["server"].emulator.seen
            if entry[0] == cluster["token"] and entry[2] in KINDS}
    assert made, "the role made no request for the admission objects"
    used = set()
    for verb, resource, name in made:
        key = (verb, resource, name) if (verb, resource, name) in granted else (verb, resource, None)
        assert key in granted, "the role used %s %s %s, which the documented ClusterRole does not grant" % (
            verb, resource, name)
        used.add(key)
    assert used == granted, "the documented ClusterRole grants more than the role uses: %s" % sorted(granted - used)

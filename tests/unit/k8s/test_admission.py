"""The admission policy that keeps restore requests in the namespaces an operator lists (k8s/admission.py): its
structure against core/base/layout.py's names, and its CEL evaluated for real (cel-python) as an API server would for a
pod's CREATE or UPDATE -- a pod of an unlisted namespace with any forbidden field is denied with a message naming
the field, its value, the namespace and the fix; a listed namespace, or a pod without them, is admitted."""

import copy
import re

import celpy
import pytest
from ansible.errors import AnsibleFilterError

from conftest import REPO

from ansible_collections.inferops.snapshot.plugins.filter.snapshot import FilterModule
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import admission

LISTED = ["inference", "team-a"]
RUNTIME_CLASS = "inferops-restore"  # docs/kubernetes.md's runtimeClassName
POLICY, BINDING = admission.objects(LISTED, [RUNTIME_CLASS])
REQUEST_ANNOTATIONS = [annotation for _key, annotation, _env in layout.RESTORE_REQUEST_KEYS]
OWN_SETTINGS_ENV = [env for key, _annotation, env in layout.RESTORE_REQUEST_KEYS
                    if key in ("metadata_file", "agent_socket_dir")]
CEL = celpy.Environment()


def pod(namespace="tenant-b", annotations=None, env=(), runtime_class=None, init_env=(), ephemeral_env=()):
    container = {"name": "engine", "image": "qwen:1.2"}
    if env:
        container["env"] = [{"name": name, "value": "/var/lib/inferops/snapshots/inference/qwen/p0/qwen-p0-0"}
                            for name in env]
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace},
                "spec": {"containers": [container]}}
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    if runtime_class:
        manifest["spec"]["runtimeClassName"] = runtime_class
    if init_env:
        manifest["spec"]["initContainers"] = [{"name": "init", "env": [{"name": name} for name in init_env]}]
    if ephemeral_env:
        manifest["spec"]["ephemeralContainers"] = [{"name": "debug", "env": [{"name": name} for name in ephemeral_env]}]
    return manifest


def evaluate(expression, activation):
    return CEL.program(CEL.compile(expression)).evaluate(activation)


def admit(obj, operation="CREATE", old=None, policy=None):
    """(admitted, messages): the policy's variables in order, then each validation, then the message of each one
    that failed -- what the API server does with a ValidatingAdmissionPolicy whose binding denies."""
    policy = policy or POLICY
    activation = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
                  "request": celpy.json_to_cel({"namespace": obj["metadata"]["namespace"], "operation": operation})}
    variables = {}
    for variable in policy["spec"]["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    messages = []
    for validation in policy["spec"]["validations"]:
        result = evaluate(validation["expression"], activation)
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            messages.append(str(evaluate(validation["messageExpression"], activation)))
    return not messages, messages


def test_the_policy_and_its_binding_carry_the_layout_names():
    assert [POLICY["kind"], BINDING["kind"]] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert POLICY["apiVersion"] == BINDING["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert POLICY["metadata"]["name"] == BINDING["metadata"]["name"] == BINDING["spec"]["policyName"] == \
        layout.K8S_ADMISSION_POLICY
    assert BINDING["spec"]["validationActions"] == ["Deny"] and "matchResources" not in BINDING["spec"]
    assert POLICY["spec"]["failurePolicy"] == "Fail"
    assert POLICY["spec"]["matchConstraints"] == {"resourceRules": [{
        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
        "resources": ["pods", "pods/ephemeralcontainers"]}]}
    variables = dict((item["name"], item["expression"]) for item in POLICY["spec"]["variables"])
    assert list(evaluate(variables["allowedNamespaces"], {})) == sorted(LISTED)
    assert list(evaluate(variables["runtimeClasses"], {})) == [RUNTIME_CLASS]
    # the restore request's env is layout's, less the engine's own settings (which ask the runtime for nothing)
    assert list(evaluate(variables["restoreEnv"], {})) == [
        env for _key, _annotation, env in layout.RESTORE_REQUEST_KEYS if env and env not in OWN_SETTINGS_ENV]
    assert layout.ENV_RESTORE_FROM in admission.RESTORE_ENV and layout.ENV_RESTORE_SOURCE in admission.RESTORE_ENV
    assert '"%s"' % layout.RESTORE_ANNOTATION_PREFIX in variables["requestedAnnotations"]
    assert all(annotation.startswith(layout.RESTORE_ANNOTATION_PREFIX) for annotation in REQUEST_ANNOTATIONS)
    for validation in POLICY["spec"]["validations"]:
        assert validation["expression"].startswith("variables.listed || ") and validation["reason"] == "Forbidden"
        assert layout.K8S_ADMISSION_POLICY in validation["message"]


@pytest.mark.parametrize("field, offender, manifest", [
    ("spec.runtimeClassName", RUNTIME_CLASS, pod(runtime_class=RUNTIME_CLASS))] + [
    ("metadata.annotations", annotation, pod(annotations={annotation: "x", "team": "b"}))
    for annotation in REQUEST_ANNOTATIONS + [layout.RESTORE_ANNOTATION_PREFIX + "anything-later"]] + [
    ("spec.containers[].env", env, pod(env=["PATH", env])) for env in admission.RESTORE_ENV] + [
    ("spec.containers[].env", layout.ENV_RESTORE_FROM, pod(init_env=[layout.ENV_RESTORE_FROM]))],
    ids=lambda value: value if isinstance(value, str) else "")
def test_a_pod_of_an_unlisted_namespace_that_asks_for_a_restore_is_denied_naming_the_field(field, offender, manifest):
    admitted, messages = admit(manifest)
    assert not admitted and len(messages) == 1, messages
    assert messages[0].startswith("%s %s: pods of namespace tenant-b may not ask for a snapshot restore" % (
        field, offender)), messages
    assert "admission policy %s lists (k8s_snapshot_admission_namespaces)" % layout.K8S_ADMISSION_POLICY in messages[0]
    # the same pod in a listed namespace is admitted
    listed = copy.deepcopy(manifest)
    listed["metadata"]["namespace"] = "team-a"
    assert admit(listed) == (True, [])


def test_every_field_at_once_is_denied_once_each():
    admitted, messages = admit(pod(annotations={layout.ANNOTATION_RESTORE_FROM: "/x"}, env=[layout.ENV_RESTORE_FROM],
                                   runtime_class=RUNTIME_CLASS))
    assert not admitted
    assert [message.split(" ", 1)[0] for message in messages] == [
        "spec.runtimeClassName", "metadata.annotations", "spec.containers[].env"]


@pytest.mark.parametrize("manifest", [
    pod(),
    pod(runtime_class="gvisor", annotations={"snapshot.inferops.org/status": "completed", "org.other/x": "y"}),
    pod(env=OWN_SETTINGS_ENV + ["INFEROPS_RESTORE_FROM_X", "RESTORE_FROM"]),  # the engine's own settings, other names
    pod(namespace="inference", runtime_class=RUNTIME_CLASS, env=list(admission.RESTORE_ENV),
        annotations=dict((annotation, "x") for annotation in REQUEST_ANNOTATIONS)),
], ids=["plain", "other-runtime-class-and-annotations", "own-settings-env", "listed-namespace"])
def test_a_pod_that_asks_for_no_restore_or_is_in_a_listed_namespace_is_admitted(manifest):
    assert admit(manifest) == (True, [])


def test_an_update_is_denied_only_for_a_restore_annotation_it_adds_or_changes():
    """Spec fields cannot change after creation; an annotation can, at any time (the role sets them on pods of the
    listed namespaces). A pod admitted before the policy existed can still be updated as long as it adds nothing."""
    old = pod(annotations={layout.ANNOTATION_RESTORE_FROM: "/a"}, runtime_class=RUNTIME_CLASS,
              env=[layout.ENV_RESTORE_FROM])
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "b"}
    assert admit(relabelled, "UPDATE", old) == (True, [])
    removed = copy.deepcopy(old)
    del removed["metadata"]["annotations"]
    assert admit(removed, "UPDATE", old) == (True, [])
    changed = copy.deepcopy(old)
    changed["metadata"]["annotations"][layout.ANNOTATION_RESTORE_FROM] = "/b"
    added = copy.deepcopy(relabelled)
    added["metadata"]["annotations"][layout.ANNOTATION_RESTORE_CHECKSUM] = "ab" * 32
    for new, offender in ((changed, layout.ANNOTATION_RESTORE_FROM), (added, layout.ANNOTATION_RESTORE_CHECKSUM)):
        admitted, messages = admit(new, "UPDATE", old)
        assert not admitted and messages[0].startswith("metadata.annotations %s: " % offender), messages
        new["metadata"]["namespace"] = "inference"
        assert admit(new, "UPDATE", dict(old, metadata=dict(old["metadata"], namespace="inference"))) == (True, [])
    # an ephemeral container with a restore env, added to a running pod (an update of pods/ephemeralcontainers)
    debugged = pod(ephemeral_env=[layout.ENV_RESTORE_SOURCE])
    admitted, messages = admit(debugged, "UPDATE", pod())
    assert not admitted and messages[0].startswith("spec.containers[].env %s: " % layout.ENV_RESTORE_SOURCE)


@pytest.mark.parametrize("namespaces, runtime_classes, error", [
    ([], [RUNTIME_CLASS], "namespaces: give a non-empty list of namespace names"),
    (["inference", "Team_B"], [RUNTIME_CLASS], "namespaces[1]: 'Team_B' is not a namespace name"),
    ("inference", [RUNTIME_CLASS], "namespaces: give a non-empty list"),
    (["inference"], [], "runtime_classes: give a non-empty list of RuntimeClass names"),
    (["inference"], ["inferops restore"], "runtime_classes[0]: 'inferops restore' is not a RuntimeClass name"),
    (["inference", 'a"]'], [RUNTIME_CLASS], "namespaces[1]:"),  # nothing reaches the CEL but a checked name
])
def test_bad_names_are_refused_naming_the_field(namespaces, runtime_classes, error):
    with pytest.raises(ParameterError, match=r"^%s" % error.replace("[", r"\[").replace("]", r"\]")):
        admission.objects(namespaces, runtime_classes)


def test_the_filter_gives_the_same_objects_and_fails_as_a_filter():
    take = FilterModule().filters()["admission_policy"]
    assert take(["team-a", "inference", "team-a"], [RUNTIME_CLASS]) == [POLICY, BINDING]
    with pytest.raises(AnsibleFilterError, match=r"namespaces\[0\]: 'A' is not a namespace name"):
        take(["A"], [RUNTIME_CLASS])


def test_the_docs_list_exactly_the_env_the_policy_denies():
    text = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    section = text.split("## Which namespaces may restore: the admission policy")[1].split("\n## ")[0]
    named = set(re.findall(r"`(INFEROPS_[A-Z_]+)`", section.split("The message names")[0]))
    assert named == set(admission.RESTORE_ENV) | {layout.ENV_METADATA_FILE}, named
    assert layout.K8S_ADMISSION_POLICY in section and layout.RESTORE_ANNOTATION_PREFIX + "*" in section

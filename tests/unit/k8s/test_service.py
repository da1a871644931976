"""The Kubernetes side's pure logic (module_utils/k8s/service.py and pods.py): instances, identities, env as the
kubelet resolves it, restore decisions, recreation manifests. The contracts and the client: test_contracts.py."""

import json

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import pods, service as svc

CONFIG = {"enabled": True, "npuSnapshotPath": "/snap/npu/", "hostSnapshotPath": "/snap/host"}


def pod(name, instance="p0", env=None, **extra):
    spec = {"containers": [{"name": "engine", "image": "qwen:1", "env": env or []}], "nodeName": "node-a"}
    spec.update(extra.pop("spec", {}))
    metadata = {"name": name, "namespace": "ns", "uid": "uid-" + name,
                "labels": {"inferops.org/service": "qwen", "inferops.org/instance": instance}}
    metadata.update(extra.pop("metadata", {}))
    return dict({"metadata": metadata, "spec": spec}, **extra)


def test_config_absent_or_disabled_means_off_and_defaults_fill_in():
    assert svc.normalize_config(None)[0] is False and svc.normalize_config({})[0] is False
    enabled, config, why = svc.normalize_config({"enabled": False})
    assert enabled is False and "enabled is false" in why
    enabled, config, why = svc.normalize_config(CONFIG)
    assert enabled and why is None
    assert config["timeoutSeconds"] == 300 and config["minSizeBytes"] == 1024 and config["npuSnapshotPath"] == "/snap/npu"


@pytest.mark.parametrize("bad, field", [
    ({"enabled": True, "hostSnapshotPath": "/h"}, "npuSnapshotPath"),
    (dict(CONFIG, npuSnapshotPath="rel/path"), "npuSnapshotPath"),
    (dict(CONFIG, hostSnapshotPath="/a/../b"), "hostSnapshotPath"),
    (dict(CONFIG, timeoutSeconds=0), "timeoutSeconds"),
    (dict(CONFIG, surprise=1), "surprise"),
    (dict(CONFIG, hostSnapshotPath="/"), "hostSnapshotPath"),
])
def test_invalid_configs_name_the_field(bad, field):
    with pytest.raises(ParameterError) as err:
        svc.normalize_config(bad)
    assert field in err.value.msg


def test_instances_in_natural_order_and_the_first_is_chosen():
    members = [pod("q-p10-0", "p10"), pod("q-p2-1", "p2"), pod("q-p2-0", "p2"), pod("q-x", None)]
    members[-1]["metadata"]["labels"].pop("inferops.org/instance")
    instances, unlabelled = svc.group_instances(members)
    assert list(instances) == ["p2", "p10"] and unlabelled == ["q-x"]
    assert [pods.name(p) for p in instances["p2"]] == ["q-p2-0", "q-p2-1"]
    assert svc.select_instance(instances) == "p2" and svc.select_instance(instances, "p10") == "p10"
    assert svc.select_instance({}) is None
    with pytest.raises(ParameterError, match="no instance 'p3'"):
        svc.select_instance(instances, "p3")


def test_identity_and_paths_keep_pods_apart():
    ident = svc.identity(pod("q-p0-0"), "qwen")
    assert ident == {"namespace": "ns", "service": "qwen", "instance": "p0", "pod": "q-p0-0"}
    assert svc.snapshot_path("/snap/host", ident) == "/snap/host/ns/qwen/p0/q-p0-0"
    assert svc.identity_string(ident) == "ns/qwen/p0/q-p0-0"


def test_env_resolves_like_the_kubelet_without_reading_secrets():
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "ROOT", "value": "/snap"},
           {"name": "VLLM_NPU_SNAPSHOT_PATH", "value": "$(ROOT)/ns/qwen/p0/$(POD_NAME)"},
           {"name": "LITERAL", "value": "$$(ROOT) and $(UNKNOWN)"},
           {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
           {"name": "INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['inferops.org/instance']"}}},
           {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    p = pod("q-p0-0", env=env)
    container = p["spec"]["containers"][0]
    container["envFrom"] = [{"secretRef": {"name": "creds"}}]
    resolved, unresolved = pods.resolve_env(p, container)
    assert resolved["VLLM_NPU_SNAPSHOT_PATH"] == "/snap/ns/qwen/p0/q-p0-0"
    assert resolved["LITERAL"] == "$(ROOT) and $(UNKNOWN)"
    assert resolved["INSTANCE"] == "p0"
    assert "TOKEN" not in resolved and "IP" not in resolved  # secrets are never read; the IP is not known yet
    assert unresolved == ["envFrom:creds", "TOKEN", "IP"]
    p["status"] = {"podIP": "10.0.0.7"}
    assert pods.resolve_env(p, container)[0]["IP"] == "10.0.0.7"


def test_with_env_replaces_or_removes_one_variable():
    container = {"name": "engine", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    added = pods.with_env(container, "A", "9")
    assert added["env"] == [{"name": "B", "value": "2"}, {"name": "A", "value": "9"}]
    assert pods.with_env(container, "B", None)["env"] == [{"name": "A", "value": "1"}]
    assert container["env"][0] == {"name": "A", "value": "1"}  # the original is untouched


def test_recreation_keeps_name_labels_node_and_drops_server_fields():
    original = pod("q-p0-0", metadata={"resourceVersion": "7", "creationTimestamp": "t", "annotations": {"x": "1"},
                                       "ownerReferences": []}, status={"phase": "Running"})
    container = pods.with_env(original["spec"]["containers"][0], layout.ENV_NPU_SNAPSHOT_PATH, "/snap/npu/x")
    new = pods.recreation_manifest(original, 0, container, {"y": "2", "x": None})
    assert new["metadata"]["name"] == "q-p0-0" and new["metadata"]["labels"] == original["metadata"]["labels"]
    assert "uid" not in new["metadata"] and "resourceVersion" not in new["metadata"] and "status" not in new
    assert new["metadata"]["annotations"] == {"y": "2"} and new["spec"]["nodeName"] == "node-a"
    assert new["spec"]["containers"][0]["env"] == [{"name": layout.ENV_NPU_SNAPSHOT_PATH, "value": "/snap/npu/x"}]
    gated = pod("q", spec={"schedulingGates": [{"name": layout.K8S_RESTORE_GATE}]})
    assert "nodeName" not in pods.recreation_manifest(gated, 0, gated["spec"]["containers"][0], {})["spec"]


def test_annotation_changes_only_what_differs_and_are_stamped():
    p = pod("q", metadata={"annotations": {layout.K8S_STATUS: "pending", layout.K8S_NODE: "n"}})
    found = pods.changes(p, {layout.K8S_STATUS: "pending", layout.K8S_NODE: "m", layout.K8S_REASON: None,
                             layout.K8S_CHECKSUM: None})
    assert found.pop(layout.K8S_UPDATED_AT) and found == {layout.K8S_NODE: "m"}
    assert pods.changes(p, {layout.K8S_STATUS: None})[layout.K8S_STATUS] is None
    assert pods.changes(p, {layout.K8S_STATUS: "pending"}) == {}  # nothing to change: no new time either


def test_controller_gate_readiness_and_container_id():
    p = pod("q", metadata={"ownerReferences": [{"kind": "StatefulSet", "name": "qwen", "controller": True}]},
            status={"conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": "engine", "containerID": "docker://abc"}]})
    assert pods.controller(p) == "StatefulSet/qwen" and pods.controller(pod("q")) is None
    assert pods.is_ready(p) and not pods.is_ready(pod("q"))
    assert pods.container_id(p, "engine") == ("docker", "abc") and pods.container_id(pod("q"), "engine") == (None, None)
    assert not pods.gated(p) and pods.gated(pod("q", spec={"schedulingGates": [{"name": layout.K8S_RESTORE_GATE}]}))
    with pytest.raises(ParameterError, match="no container named 'sidecar'"):
        pods.engine_container(p, "sidecar")


IDENT = {"namespace": "ns", "service": "qwen", "instance": "p0", "pod": "q-p0-0"}
ENTRY = {"identity": IDENT, "status": "completed", "node": "node-a", "host_path": "/snap/host/ns/qwen/p0/q-p0-0"}


@pytest.mark.parametrize("entry, verification, expect", [
    (ENTRY, {"valid": True, "reasons": []}, ("/snap/host/ns/qwen/p0/q-p0-0", "node-a", None)),
    (None, None, "no snapshot recorded for ns/qwen/p0/q-p0-0"),
    (dict(ENTRY, status="failed", reason="boom"), None, "the last snapshot generation for this pod failed: boom"),
    (dict(ENTRY, identity=dict(IDENT, instance="p1")), None, "belongs to ns/qwen/p1/q-p0-0"),
    (dict(ENTRY, host_path="/elsewhere"), None, "not at /snap/host/ns/qwen/p0/q-p0-0"),
    (ENTRY, None, "was not verified"),
    (ENTRY, {"valid": False, "reasons": ["image_mismatch: x"]}, "verification failed on node node-a: image_mismatch: x"),
])
def test_restore_decision(entry, verification, expect):
    decision = svc.decide(IDENT, entry, verification, "/snap/host")
    if isinstance(expect, tuple):
        assert decision == expect
    else:
        assert decision[:2] == (None, None) and expect in decision[2]


def test_metadata_holds_the_new_environment():
    p = pod("q", env=[{"name": "GENERATION", "value": "2"}])
    meta = svc.restore_metadata(p, p["spec"]["containers"][0], True, "/snap/host/x")
    assert meta["env"] == {"GENERATION": "2"} and meta["restore_requested"] is True and meta["uid"] == "uid-q"
    json.dumps(meta)

"""The controller-side filters the snapshot roles start with: snapshotConfig validation and the per-host
plan (which instance, which pods, which paths). Bad input must be rejected naming the field."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.snapshot.plugins.filter import snapshot as flt

CONFIG = {"enabled": True, "npuSnapshotPath": "/data/npu/", "hostSnapshotPath": "/data/host"}
SERVICE = {"namespace": "prod", "name": "qwen"}
INSTANCES = [
    {"name": "p0", "pods": [{"name": "qwen-p0-0", "host": "npu-a", "env": {"TOKEN": "s3cret"}},
                            {"name": "qwen-p0-1", "host": "npu-b", "container": "c-p0-1"}]},
    {"name": "p1", "pods": [{"name": "qwen-p1-0"}]},
]
FILTERS = flt.FilterModule().filters()


def test_config_defaults_are_filled_in_and_paths_normalised():
    config = FILTERS["snapshot_config"](CONFIG)
    assert config == dict(CONFIG, npuSnapshotPath="/data/npu", timeoutSeconds=300, minSizeBytes=1024,
                          engine="docker", configured=True)


@pytest.mark.parametrize("config, words", [
    ({"enabled": True, "npuSnapshotPath": "/a"}, "snapshot_config is invalid at (top level)"),
    (dict(CONFIG, hostSnapshotPath="relative"), "at hostSnapshotPath"),
    (dict(CONFIG, timeoutSeconds=0), "at timeoutSeconds"),
    (dict(CONFIG, typo=1), "typo"),
    # a misspelt required key is named as the unknown one, with the key it may have meant
    ({"enabled": True, "npuSnapshotPth": "/a", "hostSnapshotPath": "/b"},
     "snapshot_config: 'npuSnapshotPth' (did you mean 'npuSnapshotPath'?) is not a key of snapshotConfig, whose keys "
     "are enabled, endpoint, engine, hostSnapshotPath, minSizeBytes, npuSnapshotPath, timeoutSeconds"),
    ({"enabled": True, "npu": "/a", "hostSnapshotPath": "/b", "timeout": 3},
     "snapshot_config: 'npu', 'timeout' (did you mean 'timeoutSeconds'?) are not keys of snapshotConfig"),
    (dict(CONFIG, npuSnapshotPath="/data/host"), "separate roots"),
    ("enabled", "expected a mapping"),
])
def test_bad_configs_name_the_field(config, words):
    with pytest.raises(AnsibleFilterError) as info:
        FILTERS["snapshot_config"](config)
    assert words in str(info.value)


def test_no_config_means_off():
    assert FILTERS["snapshot_config"](None) == {"enabled": False, "configured": False}
    plan = FILTERS["snapshot_plan"](INSTANCES, None, SERVICE)
    assert plan["enabled"] is False and plan["configured"] is False
    assert [pod["snapshot_dir"] for pod in plan["pods"]] == [None, None]


def test_first_instance_by_default_and_paths_contain_the_identity():
    plan = FILTERS["snapshot_plan"](INSTANCES, CONFIG, SERVICE)
    assert plan["instance"] == "p0" and plan["timeout"] == 300 and plan["min_size"] == 1024
    first, second = plan["pods"]
    assert first["identity"] == {"namespace": "prod", "service": "qwen", "instance": "p0", "pod": "qwen-p0-0"}
    assert first["snapshot_dir"] == "/data/host/prod/qwen/p0/qwen-p0-0"
    assert first["npu_dir"] == "/data/npu/prod/qwen/p0/qwen-p0-0"
    assert first["inject_env"] == {"VLLM_NPU_SNAPSHOT_PATH": "/data/npu/prod/qwen/p0/qwen-p0-0"}
    assert first["container"] == "qwen-p0-0" and second["container"] == "c-p0-1"
    assert len({pod["snapshot_dir"] for pod in plan["pods"]}) == 2


def test_env_values_never_enter_the_plan():
    plan = FILTERS["snapshot_plan"](INSTANCES, CONFIG, SERVICE)
    assert "s3cret" not in repr(plan)
    pod = plan["pods"][0]
    assert pod["env_keys"] == ["TOKEN"] and pod["index"] == [0, 0]
    assert INSTANCES[pod["index"][0]]["pods"][pod["index"][1]]["env"]["TOKEN"] == "s3cret"


def test_host_and_instance_selection():
    plan = FILTERS["snapshot_plan"](INSTANCES, CONFIG, SERVICE, host="npu-b")
    assert [pod["name"] for pod in plan["pods"]] == ["qwen-p0-1"]
    plan = FILTERS["snapshot_plan"](INSTANCES, CONFIG, SERVICE, instance_name="p1", host="npu-b")
    assert [pod["name"] for pod in plan["pods"]] == ["qwen-p1-0"]  # no host: on every host
    plan = FILTERS["snapshot_plan"](INSTANCES, CONFIG, SERVICE, all_instances=True)
    assert [pod["name"] for pod in plan["pods"]] == ["qwen-p0-0", "qwen-p0-1", "qwen-p1-0"]
    assert plan["pods"][2]["index"] == [1, 0]


def test_a_normalized_config_is_validated_again():
    config = FILTERS["snapshot_config"](CONFIG)
    assert FILTERS["snapshot_plan"](INSTANCES, config, SERVICE)["enabled"]
    with pytest.raises(AnsibleFilterError, match="hostSnapshotPath"):
        FILTERS["snapshot_plan"](INSTANCES, dict(config, hostSnapshotPath="x"), SERVICE)


@pytest.mark.parametrize("instances, service, kwargs, words", [
    ([{"name": "p0", "pods": ["a"]}], SERVICE, {}, "snapshot_instances[0].pods[0]: each pod needs at least a name"),
    (INSTANCES, SERVICE, {"instance_name": "p9"}, "instance_name: no instance named 'p9'"),
    ([], SERVICE, {}, "snapshot_instances: give"),
    ([{"name": "p0", "pods": []}], SERVICE, {}, "snapshot_instances[0].pods: instance 'p0' has no pods"),
    ([{"name": "p0", "pods": [{"name": "a"}, {"name": "a"}]}], SERVICE, {}, "snapshot_instances[0].pods[1].name: pod 'a' appears twice"),
    ([{"name": "p0", "pods": [{"name": "../etc"}]}], SERVICE, {}, "snapshot_instances[0].pods[0].name: '../etc' is not a valid name"),
    ([{"name": "p0", "pods": [{"name": "a", "readyness_url": "x"}]}], SERVICE, {}, "unknown key(s) readyness_url"),
    ([{"name": "p0", "pods": [{"name": "a", "readiness_url": "ftp://x"}]}], SERVICE, {}, "is not an http(s) URL"),
    ([{"name": "p0", "pods": [{"name": "a", "readiness_file": "ready"}]}], SERVICE, {}, "must be an absolute path"),
    ([{"name": "p0", "pods": [{"name": "a"}]}, {"name": "p0", "pods": [{"name": "b"}]}], SERVICE, {}, "instance 'p0' is listed twice"),
    (INSTANCES, {"namespace": "prod"}, {}, "snapshot_service: give at least the service's name"),
    (INSTANCES, {"name": False}, {}, "snapshot_service.name: got the boolean false; quote the name"),
    (INSTANCES, {"name": "qwen", "nmespace": "x"}, {}, "unknown key(s) nmespace"),
])
def test_bad_inventories_name_the_field(instances, service, kwargs, words):
    with pytest.raises(AnsibleFilterError) as info:
        FILTERS["snapshot_plan"](instances, CONFIG, service, **kwargs)
    assert words in str(info.value)

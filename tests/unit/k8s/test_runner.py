"""The k8s modules' logic (module_utils/k8s/runner.py) against a client that stands in for the API server."""

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import runner

from unit.k8s.test_service import CONFIG, pod


class Module:
    check_mode = False

    def __init__(self, **params):
        self.params = dict(dict(namespace="ns", service="qwen", config=CONFIG, instance=None, container=None,
                                service_label=layout.K8S_SERVICE_LABEL, instance_label=layout.K8S_INSTANCE_LABEL,
                                device=True, wait_for="none", wait_pods=None, wait_timeout=30.0, wait_sleep=0.01),
                           **params)


class Cluster:
    """One pod, recreated a moment ago: the kubelet gives it a container (and readiness) on the second look."""

    def __init__(self):
        self.looks = 0

    def current(self):
        self.looks += 1
        if self.looks < 2:
            return pod("qwen-p0-0")
        return pod("qwen-p0-0", status={
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "engine", "containerID": "docker://" + "ab" * 32, "ready": True}]})

    def list_pods(self, namespace, labels=None):
        return [self.current()]

    def get_pod(self, namespace, name):
        return self.current()

    def get_configmap(self, namespace, name):
        return None


def test_pods_info_returns_the_pods_as_they_are_once_every_one_arrived(monkeypatch):
    """A pod recreated just before the wait had no container when first read: what the caller acts on after a wait
    is the pods read after it (the generation role checked a container runtime of None on a loaded machine)."""
    cluster = Cluster()
    monkeypatch.setattr(runner, "connect", lambda params: cluster)
    result = runner.info_logic(Module(wait_for="ready"))
    assert result["waited"]["qwen-p0-0"]["ready"] is True, result["waited"]
    assert [(p["name"], p["ready"], p["container_runtime"]) for p in result["pods"]] == [("qwen-p0-0", True, "docker")]


@pytest.mark.parametrize("logic", [runner.pods_logic, runner.info_logic, runner.status_logic])
@pytest.mark.parametrize("params, field", [
    ({"namespace": "bad ns"}, "namespace"),
    ({"service": "qwen "}, "service"),
    ({"service": "a/../b"}, "service"),
    ({"wait_timeout": float("nan")}, "wait_timeout"),
    ({"wait_timeout": float("inf")}, "wait_timeout"),
    ({"wait_timeout": -1.0}, "wait_timeout"),
    ({"wait_sleep": -1.0}, "wait_sleep"),
    ({"wait_sleep": 0.0}, "wait_sleep"),
    ({"wait_sleep": float("nan")}, "wait_sleep"),
])
def test_the_modules_own_options_are_checked_before_it_connects(monkeypatch, logic, params, field):
    def connect(params):
        raise AssertionError("connected to the API before the options were checked")
    monkeypatch.setattr(runner, "connect", connect)
    with pytest.raises(ParameterError, match="^%s: " % field) as raised:
        logic(Module(wait_for="ready", **params))
    assert raised.value.result["field"] == field


def test_a_wait_timeout_of_0_is_one_look():
    runner.check_params(Module(wait_timeout=0.0).params)

"""The module factory's shared checks (plugins/module_utils/_module.py), before anything runs."""

import json

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import commands
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.containerd_cli import ContainerdCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.runc_cli import RuncCli

from .core.clients.test_containerd_cli import CID, record, runc_options
from .core.test_clients import FakeRunner


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), float("-inf"), 1e400])
def test_positive_refuses_what_is_no_number_of_seconds_naming_the_option(value):
    with pytest.raises(ParameterError, match=r"^generation_lease: must be a positive number of seconds, got ") as raised:
        _module.positive({"timeout": 5.0, "generation_lease": value}, "timeout", "generation_lease")
    assert raised.value.result["field"] == "generation_lease"


def test_positive_accepts_a_finite_positive_number_or_nothing():
    _module.positive({"timeout": 0.001, "generation_lease": None}, "timeout", "generation_lease", "absent")


@pytest.mark.parametrize("params, field", [({"min_size": -1}, "min_size"), ({"workers": 0}, "workers"),
                                           ({"min_size": 0, "workers": -2}, "workers")])
def test_sizes_refuse_a_negative_min_size_and_fewer_than_one_worker(params, field):
    with pytest.raises(ParameterError, match="^%s: must be" % field) as raised:
        _module.sizes(params)
    assert raised.value.result["field"] == field


def test_sizes_accept_the_defaults_and_the_bounds():
    _module.sizes({"min_size": 0, "workers": 1})
    _module.sizes({"min_size": 1024, "workers": None})


class _Module:
    def __init__(self, **params):
        self.params = dict(dict(pid=None, container=None, endpoint=None, endpoint_paths=None,
                                agent_socket_dir="/run/inferops", timeout=90.0, docker_cli="/nonexistent/docker"),
                           **params)


@pytest.mark.parametrize("container", ["", "  "])
def test_an_empty_container_is_refused_naming_container_not_pid(container):
    with pytest.raises(ParameterError, match="^container: empty; give the name or id") as raised:
        _module.control_client(_Module(container=container))
    assert raised.value.result["field"] == "container"


def test_a_pods_container_on_containerd_is_found_through_that_nodes_containerd(monkeypatch, tmp_path):
    """container: containerd://<id> (as the kubelet reports it) is asked of containerd on containerd_address, and its
    pid is runc's state on the root containerd names for the pod's handler; a Docker name still goes to docker."""
    socket = str(tmp_path / "containerd.sock")
    ctr = [ContainerdCli().executable, "--address", socket, "--namespace", "k8s.io"]
    runner = FakeRunner([
        (ctr + ["containers", "info", CID], (0, json.dumps(record(options=runc_options(root="/run/n/runc"))), "")),
        ([RuncCli().executable, "--root", "/run/n/runc/k8s.io", "state", CID], (0, json.dumps(
            {"id": CID, "pid": 777, "status": "running", "bundle": "/b"}), "")),
        (["/nonexistent/docker"], (1, "", "Error: No such container: " + CID))])
    monkeypatch.setattr(commands.DEFAULT, "run", runner.run)
    params = _Module(container="containerd://" + CID, containerd_address=socket).params
    assert _module.container_pid(params) == 777
    assert runner.calls[0][:len(ctr)] == ctr
    with pytest.raises(ParameterError, match="^container: no container named '%s' on this host" % CID):
        _module.container_pid(_Module(container=CID).params)  # an id alone is a Docker container's
    assert runner.calls[-1][0] == "/nonexistent/docker"

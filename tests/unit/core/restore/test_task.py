"""snapshot_restore method=auto: the node's restore-on-create runtime whenever it can restore the snapshot.

dockerd is stubbed (the process boundary); the runtime's wrapper and settings are real files in the form the
snapshot_node role writes them."""

import json

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import task


class Docker:
    """What dockerd would answer: its runtimes and the containers that exist."""

    def __init__(self, runtimes, containers=None):
        self._runtimes, self.containers = runtimes, containers or {}

    def runtimes(self):
        return self._runtimes

    def container_id(self, name):
        return name if name in self.containers else None

    def inspect_container(self, name):
        return {"HostConfig": {"Runtime": self.containers[name]}}


@pytest.fixture
def node(tmp_path):
    lib = tmp_path / "lib dir"
    lib.mkdir()
    (lib / "runtime.json").write_text(json.dumps({"snapshot_roots": [str(tmp_path / "snapshots")]}))
    wrapper = tmp_path / "inferops-restore-runtime"
    wrapper.write_text("#!/bin/sh\nRUNC=/usr/bin/runc\nLIB='%s'\nexec true\n" % lib)  # `quote` of a path with a space
    return {"inferops-restore": {"path": str(wrapper)}, "runc": {"path": "runc"}}, tmp_path


def choose(docker, snapshot_dir, container="engine-0", limit=1 << 30):
    return task.choose_method({"runtime_name": "inferops-restore", "container": container,
                               "docker_path_max_bytes": limit}, snapshot_dir, docker)


def test_the_runtime_when_it_is_installed_and_its_roots_hold_the_snapshot(node):
    runtimes, base = node
    method, why = choose(Docker(runtimes), str(base / "snapshots" / "ns" / "svc" / "p0" / "pod"))
    assert method == "runtime" and "installed" in why


@pytest.mark.parametrize("case, reason", [
    ("outside the roots", "below none of the runtime inferops-restore's snapshot roots"),
    ("not installed", "dockerd has no runtime inferops-restore; the snapshot_node role installs it"),
    ("settings unreadable", "cannot be read"),
    ("container made otherwise", "created with the runtime runc, not inferops-restore"),
])
def test_docker_otherwise_saying_why(node, case, reason):
    runtimes, base = node
    snapshot_dir = str(base / "snapshots" / "ns" / "svc" / "p0" / "pod")
    containers = {}
    if case == "outside the roots":
        snapshot_dir = str(base / "snapshots-elsewhere" / "ns" / "svc" / "p0" / "pod")  # a prefix is not a parent
    elif case == "not installed":
        runtimes = {"runc": runtimes["runc"]}
    elif case == "settings unreadable":
        (base / "lib dir" / "runtime.json").write_text("{not json")
    else:
        containers = {"engine-0": "runc"}
    method, why = choose(Docker(runtimes, containers), snapshot_dir)
    assert method == "docker" and reason in why, why


def test_an_existing_container_made_with_the_runtime_goes_to_it(node):
    runtimes, base = node
    method, _why = choose(Docker(runtimes, {"engine-0": "inferops-restore"}), "/elsewhere/ns/svc/p0/pod")
    assert method == "runtime"


@pytest.mark.parametrize("limit, method", [(1 << 20, "docker"), (4096, "cold"), (0, "cold")])
def test_without_the_runtime_docker_only_below_the_size_where_it_beats_a_cold_start(node, limit, method):
    runtimes, base = node
    snapshot_dir = base / "elsewhere" / "ns" / "svc" / "p0" / "pod"
    (snapshot_dir / "host" / "criu").mkdir(parents=True)
    (snapshot_dir / "host" / "criu" / "pages-1.img").write_bytes(b"x" * 8192)
    chosen, why = choose(Docker({"runc": runtimes["runc"]}), str(snapshot_dir), limit=limit)
    assert chosen == method, why
    assert "dockerd has no runtime inferops-restore" in why
    if method == "cold":
        assert why.startswith("docker_path_slower_than_cold: ") and "0 MiB" in why and "snapshot_node" in why


def options(tmp_path, **changes):
    """snapshot_restore's parameters as its argument spec gives them (defaults), for a docker restore."""
    params = {"engine": "docker", "container": "engine-0", "method": "auto", "cold_start": None,
              "cold_start_log": None, "timeout": 120.0, "health_timeout": 600.0, "health_url": None,
              "metadata_path": "/run/inferops-snapshot/metadata.json", "docker_path_max_bytes": 1 << 30,
              "runtime_name": "inferops-restore", "generations_file": "/var/lib/inferops/state/generations.json",
              "env": {"TOKEN": "s3cret-value"}, "stage_dir": None, "source": None,
              "identity": {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "pod"},
              "snapshot_dir": str(tmp_path / "snapshots" / "ns" / "svc" / "p0" / "pod")}
    params.update(changes)
    return params


def test_the_options_as_given_by_default_pass(tmp_path):
    assert task.check_options(options(tmp_path)) == str(tmp_path / "snapshots" / "ns" / "svc" / "p0" / "pod")
    assert task.check_options(options(tmp_path, docker_path_max_bytes=0, env={}))  # 0: never the Docker path


@pytest.mark.parametrize("changes, field", [
    ({"docker_path_max_bytes": -1}, "docker_path_max_bytes"),
    ({"container": ""}, "container"),
    ({"runtime_name": ""}, "runtime_name"),
    ({"runtime_name": " "}, "runtime_name"),
    ({"generations_file": "state/generations.json"}, "generations_file"),
    ({"generations_file": "/var/lib/inferops/state/"}, "generations_file"),
    ({"env": {"A=B": "s3cret-value"}}, "env"),
    ({"env": {"": "s3cret-value"}}, "env"),
    ({"env": {"A\nB": "s3cret-value"}}, "env"),
])
def test_an_option_that_cannot_work_is_refused_naming_it(tmp_path, changes, field):
    with pytest.raises(ParameterError, match="^%s: " % field) as raised:
        task.check_options(options(tmp_path, **changes))
    assert raised.value.result["field"] == field
    assert "s3cret" not in raised.value.msg, "an env value is never repeated"
    assert not (tmp_path / "snapshots").exists()

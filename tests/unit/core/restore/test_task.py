"""snapshot_restore method=auto: the node's restore-on-create runtime whenever it can restore the snapshot.

dockerd is stubbed (the process boundary); the runtime's wrapper and settings are real files in the form the
snapshot_node role writes them."""

import json

import pytest

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

"""Freshness across nodes on the real dockerd + CRIU: two nodes share one snapshot store -- two state roots on this
host, each with its own record of restored generations, both trusting the controller's key as the roles install it.

The controller (host_checkpoint's action plugin, the snapshot_signing_key it makes) signs two generations of one pod
and, with each, its statement that it is the latest. Node A restores the newer one. A writer of the store puts the
older generation back whole. Node B, which never restored the pod, refuses it -- the controller's statement names the
newer generation (rollback:) -- and starts the container cold; node A refuses it from its own mark; check mode says
the same and records nothing. The refresh (snapshot_refresh: the key stays on the controller) signs the statement
again from the controller's record of what it published, not from what the rolled-back store shows; with the newer
generation back in place node B restores it."""

import os
import shutil

import pytest

from _runtime_helpers import WarmEngine
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, signature, statement, status
from conftest import WorkloadContainer, docker, reset_device, run_module

PROMPT = "fresh on every node"


@pytest.fixture(scope="module")
def taken(docker_env, tmp_path_factory):
    """Two signed generations of one pod in the shared store (the older kept aside, as a writer of the store could).
    Containers are created from the very image the snapshots were taken from: the shared tag may move meanwhile."""
    base = tmp_path_factory.mktemp("fresh-nodes")
    controller = run_module("snapshot_signing_key", {"path": str(base / "controller")})
    assert controller["key_id"], controller
    with WarmEngine(docker_env, base, "fresh", [PROMPT]) as engine:
        identity = {"namespace": "fresh", "service": "nodes", "instance": "p0", "pod": "fresh-%s" % engine.tag}
        snap = str(base / "store" / "fresh" / "nodes" / "p0" / identity["pod"])
        first = engine.take(snap, identity, signing_key=controller["private_key"])
        aside = str(base / "older-generation")
        shutil.copytree(snap, aside)
        second = engine.take(snap, identity, signing_key=controller["private_key"])
        newer = str(base / "newer-generation")
        shutil.copytree(snap, newer)
    yield dict(base=base, controller=controller, identity=identity, snap=snap, aside=aside, newer=newer, first=first,
               second=second, device_dir=engine.device_dir, image=engine.image, port=engine.container.port,
               expected=engine.expected[0], tag=engine.tag)


def node_restore(t, node, label, check=False, refused=False):
    """snapshot_restore (method docker) on ``node``: its own record of generations, the controller's key trusted.
    Where the snapshot is to be ``refused`` the container is created first, as an orchestrator would: a cold start
    needs it (a container is recreated from a snapshot's record only when the snapshot is merely stale)."""
    name = "fresh-%s-%s" % (t["tag"], label)
    reset_device(t["device_dir"])
    if refused:
        WorkloadContainer(name, t["image"], t["device_dir"], t["port"]).create()
    try:
        result = run_module("snapshot_restore", {
            "method": "docker", "snapshot_dir": t["snap"], "identity": t["identity"], "container": name,
            "health_url": "http://127.0.0.1:%d/health" % t["port"], "health_timeout": 120,
            "trusted_keys": [t["controller"]["public_key"]], "env": {"POD_IP": "10.1.1.1"},
            "generations_file": str(t["base"] / node / "state" / "generations.json")}, check=check)
        if not check:
            assert WorkloadContainer(name, t["image"], t["device_dir"], t["port"]).generate(PROMPT) == t["expected"]
        return result
    finally:
        docker("rm", "-f", name, check=False)


def put_back(t, source):
    """The store's snapshot replaced whole by ``source``, the unsigned status record rewritten to match it."""
    shutil.rmtree(t["snap"])
    shutil.copytree(source, t["snap"])
    status.update(t["snap"], "completed", checksum=hashing.fingerprint(t["snap"]))


def test_an_older_generation_put_back_is_refused_on_a_node_that_never_restored_it(taken):
    t = taken
    assert t["second"]["generation"] > t["first"]["generation"]
    trusted = signature.load_public_keys([t["controller"]["public_key"]])
    latest, refused = statement.check(statement.read(t["snap"]), t["identity"], trusted)
    assert refused is None and latest["generation"] == t["second"]["generation"], refused
    assert latest["fingerprint"] == hashing.fingerprint(t["snap"])
    assert latest["until"] - latest["issued"] == layout.LATEST_VALIDITY, "expiry on by default: a week"

    on_a = node_restore(t, "node-a", "a-new")
    assert on_a["restored"] is True and on_a["verify"]["authenticated"] is True, on_a

    put_back(t, t["aside"])
    older = "rollback: the snapshot is generation %d of %s" % (t["first"]["generation"],
                                                               layout.identity_string(t["identity"]))
    checked = node_restore(t, "node-b", "b-check", check=True)
    assert checked["restored"] is False and checked["reason"].startswith(older), checked
    assert not (t["base"] / "node-b").exists(), "check mode records nothing"
    on_b = node_restore(t, "node-b", "b-old", refused=True)
    assert on_b["restored"] is False and on_b["reason"].startswith(older), on_b
    assert "the controller's statement of %s names generation %d as the latest" % (
        latest["issued_at"], t["second"]["generation"]) in on_b["reason"], on_b["reason"]
    again_a = node_restore(t, "node-a", "a-old", refused=True)
    assert again_a["restored"] is False and again_a["reason"].startswith(older), again_a
    assert "this node has already restored generation %d" % t["second"]["generation"] in again_a["reason"]

    # The refresh: the controller's record says what it published, whatever the store shows now.
    refreshed = run_module("snapshot_refresh", {"root": str(t["base"] / "store"),
                                                "signing_key": t["controller"]["private_key"], "validity": 3600})
    assert refreshed["changed"] and refreshed["refreshed"] == [{
        "identity": layout.identity_string(t["identity"]), "generation": t["second"]["generation"],
        "source": "ledger", "expires": refreshed["refreshed"][0]["expires"]}], refreshed
    restated, refused = statement.check(statement.read(t["snap"]), t["identity"], trusted)
    assert refused is None and restated["generation"] == t["second"]["generation"]
    assert restated["until"] - restated["issued"] == 3600 and restated["issued"] >= latest["issued"]
    assert node_restore(t, "node-c", "c-old", refused=True)["reason"].startswith(older), "still refused after the refresh"

    put_back(t, t["newer"])
    on_b = node_restore(t, "node-b", "b-new")
    assert on_b["restored"] is True, on_b


def test_a_missing_statement_on_a_node_with_trusted_keys_is_a_cold_start_that_says_how_to_fix_it(taken):
    t = taken
    kept = statement.read(t["snap"])
    os.unlink(layout.latest_path(t["snap"]))
    try:
        result = node_restore(t, "node-d", "d-none", refused=True)
        assert result["restored"] is False and result["reason"].startswith(
            "stale: there is no statement of the latest generation of %s" % layout.identity_string(t["identity"])), \
            result
        assert "playbooks/refresh.yml" in result["reason"]
    finally:
        statement.write(t["snap"], kept)

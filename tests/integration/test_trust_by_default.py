"""Secure by default, fresh and scoped, attacked on the real dockerd + CRIU.

A node set up by the snapshot_node role as an operator would -- the controller's signing key (made on first use by
snapshot_signing_key) trusted, an encryption key given -- restores a snapshot host_checkpoint took and its action
plugin signed on the controller, and then, through a plain ``docker run --runtime``, refuses with its reason:

- an older, validly signed generation of the same pod put back in place, the status record rewritten (rollback:);
- a plaintext forgery (unsigned:, unencrypted:), and -- where the operator opted out of signatures but kept the
  encryption key -- a plaintext one still (unencrypted:);
- a snapshot signed by a trusted key outside the identities it may sign for (signature_untrusted:);
- the encrypted page image of an older generation spliced into a newer one, sealed again around it, where decrypting
  is the only content check (decrypt_failed:);
- the plaintext forgery again, with the node's settings gone, cut short or open to others (settings_unreadable:).

Each refusal is a cold start: the container serves, warmed up again. The generations come from the signer's ledger
beside the controller's key; the high-water mark is the node's own file (snapshot_node_generations_file)."""

import json
import os
import shutil

import pytest

from _runtime_helpers import WarmEngine, installed_runtime
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, manifest, seal, status
from conftest import WorkloadContainer, docker, reset_device, run_module

PROMPT = "fresh and signed"


def identity(namespace, pod):
    return {"namespace": namespace, "service": "trust", "instance": "p0", "pod": pod}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The controller's key pair, made on first use by the module the roles run; a second team's key; an AES key."""
    base = tmp_path_factory.mktemp("trust-keys")
    made = run_module("snapshot_signing_key", {"path": str(base / "controller")})
    assert made["changed"] and made["key_id"] and made["public_key"].startswith("-----BEGIN PUBLIC KEY"), made
    again = run_module("snapshot_signing_key", {"path": str(base / "controller")})
    assert not again["changed"] and again["key_id"] == made["key_id"], again
    team = run_module("snapshot_signing_key", {"path": str(base / "team-b")})
    aes = base / "snapshot.key"
    aes.write_bytes(os.urandom(32))
    os.chmod(aes, 0o600)
    return dict(base=base, controller=made, team=team, aes=aes)


@pytest.fixture(scope="module")
def node(docker_env, keys, tmp_path_factory):
    """The runtime as the role installs it by default, given an encryption key: signatures and encryption required."""
    with installed_runtime(tmp_path_factory.mktemp("trust-node"), snapshot_node_trust_controller_key=True,
                           snapshot_node_keys_dir=str(keys["base"] / "controller"),
                           snapshot_node_encryption_keys=[str(keys["aes"])]) as n:
        yield n


@pytest.fixture(scope="module")
def taken(node, keys, docker_env, tmp_path_factory):
    """One warmed-up engine and the snapshots the attacks start from, taken as the roles take them."""
    base = tmp_path_factory.mktemp("trust-snaps")
    with WarmEngine(docker_env, base, "trust", [PROMPT]) as engine:

        def take(namespace, pod, signing_key=None, encrypted=True):
            snap = str(node.roots / namespace / "trust" / "p0" / pod)
            args = {}
            if signing_key:
                args["signing_key"] = signing_key
            if encrypted:
                args["encryption_key"] = str(keys["aes"])
            return snap, engine.take(snap, identity(namespace, pod), **args)

        pod = "p-%s" % engine.tag
        signed = keys["controller"]["private_key"]
        old, first = take("tenant-a", pod, signed)
        aside = str(base / "older-generation")
        shutil.copytree(old, aside)  # what a writer of the store kept of the older generation
        new, second = take("tenant-a", pod, signed)
        forged, _plain = take("tenant-a", pod + "-plain", encrypted=False)
        teams, by_team = take("tenant-a", pod + "-team", keys["team"]["private_key"])
        spliced_old, _g1 = take("tenant-a", pod + "-splice", encrypted=True)
        spliced_aside = str(base / "splice-older")
        shutil.copytree(spliced_old, spliced_aside)
        spliced, _g2 = take("tenant-a", pod + "-splice", encrypted=True)
    yield dict(device_dir=engine.device_dir, image=docker_env, port=engine.container.port, expected=engine.expected[0],
               tag=engine.tag, first=first, second=second, new=new, aside=aside, forged=forged, teams=teams,
               by_team=by_team, spliced=spliced, spliced_aside=spliced_aside)


def restore(node, t, snap, label, log=None):
    """A plain `docker run --runtime` of the recreated container, as an orchestrator would; (its log record, the
    container), the container serving (restored, or warmed up again). ``log``: the runtime's log file, when it is
    not the node's (settings it cannot read name none)."""
    name = "trust-%s-%s" % (t["tag"], label)
    c = WorkloadContainer(name, t["image"], t["device_dir"], t["port"], INFEROPS_RESTORE_FROM=snap,
                          INFEROPS_RESTORE_IDENTITY="/".join(snap.split("/")[-4:]))
    reset_device(t["device_dir"])
    docker("run", "-d", "--runtime", node.name, *c.create_args())
    try:
        c.wait_ready()
        assert c.generate(PROMPT) == t["expected"]
        container_id = docker("inspect", "--format", "{{.Id}}", name)
        if log is None:
            return node.log_records(container_id)[-1]
        with open(log) as handle:
            return [record for record in map(json.loads, handle) if record.get("event") == "restore"
                    and record.get("container") == container_id][-1]
    finally:
        docker("rm", "-f", name, check=False)


def settings(node, **changes):
    """Rewrite the runtime's settings; returns the previous ones."""
    path = node.lib_dir / "runtime.json"
    before = json.loads(path.read_text())
    path.write_text(json.dumps(dict(before, **changes)))
    return before


def test_the_role_trusts_the_controllers_key_and_requires_signatures_and_encryption_by_default(node, keys):
    config = json.loads((node.lib_dir / "runtime.json").read_text())
    installed = node.lib_dir / "keys" / "controller.pub"
    assert config["trusted_keys"] == [str(installed)] and installed.read_text() == keys["controller"]["public_key"]
    assert config["require_signature"] is None and config["require_encryption"] is None  # on: keys are configured
    assert config["generations_file"] == str(node.base / "state" / "generations.json")


def test_a_signed_generation_restores_and_an_older_one_put_back_is_refused_as_a_rollback(node, taken, keys):
    t = taken
    assert t["second"]["generation"] > t["first"]["generation"], (t["first"]["generation"], t["second"]["generation"])
    assert t["second"]["signed_by"] == t["first"]["signed_by"] == keys["controller"]["key_id"]
    record = restore(node, t, t["new"], "new")
    assert record["outcome"] == "restored" and record["authenticated"] is True, record
    assert "warning" not in record

    # The older generation put back whole, and the unsigned status record rewritten to match it.
    shutil.rmtree(t["new"])
    shutil.copytree(t["aside"], t["new"])
    status.update(t["new"], "completed", checksum=hashing.fingerprint(t["new"]))
    verified = run_module("snapshot_verify", {"snapshot_dir": t["new"], "identity": identity("tenant-a", os.path.basename(
        t["new"])), "trusted_keys": [keys["controller"]["public_key"]]})
    assert verified["valid"] and verified["authenticated"], verified  # genuine: only the node knows it is old
    record = restore(node, t, t["new"], "old")
    assert record["outcome"] == "cold" and record["reason"].startswith("rollback: the snapshot is generation %d"
                                                                       % t["first"]["generation"]), record
    assert "has already restored generation %d" % t["second"]["generation"] in record["reason"]


def test_a_plaintext_forgery_is_refused_on_a_node_with_an_encryption_key(node, taken):
    t = taken
    record = restore(node, t, t["forged"], "forged")  # the default: the controller's key trusted
    assert record["outcome"] == "cold" and record["reason"].startswith("unsigned:"), record
    before = settings(node, trusted_keys=[])  # the node of the issue: an encryption key and nothing else
    try:
        record = restore(node, t, t["forged"], "forged-keyonly")
        assert record["outcome"] == "cold" and record["reason"].startswith("unsigned: this host restores only signed"), \
            record
        assert "unencrypted: this host restores only encrypted snapshots" in record["reason"]
        settings(node, trusted_keys=[], require_signature=False)  # the operator opted out of signatures, not encryption
        record = restore(node, t, t["forged"], "forged-nosig")
        assert record["outcome"] == "cold" and record["reason"].startswith("unencrypted:"), record
    finally:
        settings(node, **before)


def test_a_snapshot_signed_by_a_trusted_key_outside_its_identities_is_refused(node, taken, keys):
    t = taken
    assert t["by_team"]["signed_by"] == keys["team"]["key_id"]
    team_key = str(keys["base"] / "team-b" / layout.SIGNING_PUBLIC_FILE)
    before = json.loads((node.lib_dir / "runtime.json").read_text())
    settings(node, trusted_keys=before["trusted_keys"] + [{"key": team_key, "identities": ["tenant-b/*"]}])
    try:
        record = restore(node, t, t["teams"], "team")
        assert record["outcome"] == "cold", record
        assert record["reason"].startswith("signature_untrusted: signed by key %s, which this host trusts only for "
                                           "tenant-b/*, not for tenant-a/trust/p0/" % keys["team"]["key_id"]), record
    finally:
        settings(node, **before)


def test_an_older_generations_page_image_spliced_into_a_newer_one_does_not_decrypt(node, taken):
    """No signature and no fingerprint from outside the store: decrypting is the content check (the page images are
    not hashed). A writer of the store puts the older generation's encrypted page image -- the same key, the same
    path -- in place of the newer one's and seals the snapshot again; its chunks are bound to their generation."""
    t = taken
    images = os.path.join(t["spliced"], layout.IMAGES_DIR)
    pages = max((f for f in os.listdir(images) if f.startswith("pages-")),
                key=lambda f: os.path.getsize(os.path.join(images, f)))
    recorded = manifest.load_manifest(t["spliced"])
    staging = layout.staging_dir(t["spliced"])
    shutil.copytree(t["spliced"], staging)
    shutil.copyfile(os.path.join(t["spliced_aside"], layout.IMAGES_DIR, pages), os.path.join(staging, layout.IMAGES_DIR,
                                                                                             pages))
    seal.seal(staging, {k: v for k, v in recorded.items() if k not in ("files", "total_bytes", "schema_version")})
    seal.publish(staging, t["spliced"])
    status.update(t["spliced"], "completed", checksum=hashing.fingerprint(t["spliced"]))
    before = settings(node, trusted_keys=[], require_signature=False)
    try:
        record = restore(node, t, t["spliced"], "splice")
        assert record["outcome"] == "cold" and record["reason"].startswith(
            "decrypt_failed: chunk 0 of host/criu/%s does not authenticate" % pages), record
        assert "host/criu/%s" % pages in record["verify"]["authenticated_by_decryption"]
    finally:
        settings(node, **before)


@pytest.mark.parametrize("case", ["missing", "truncated", "0644"])
def test_settings_the_runtime_cannot_trust_are_a_cold_start_never_a_restore_without_their_keys(node, taken, case):
    """runtime.json gone: the runtime took its defaults, which trust no key, and restored the plaintext forgery
    unsigned. Cut short: every restoring create failed with a traceback and the container never started. Readable by
    others: it may hold keys as text. Each is now a cold start with settings_unreadable:, the container serving; where
    nothing of the file can be trusted, the runtime logs to its default log."""
    t, path = taken, node.lib_dir / "runtime.json"
    kept = path.read_bytes()
    log = None if case == "0644" else layout.RUNTIME_LOG
    try:
        if case == "missing":
            path.unlink()
        elif case == "truncated":
            path.write_bytes(kept[:len(kept) // 2])
        else:
            path.chmod(0o644)
        record = restore(node, t, t["forged"], "settings-%s" % case, log=log)
    finally:
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(kept)
        path.chmod(0o600)
    assert record["outcome"] == "cold" and record["reason"].startswith("settings_unreadable: %s " % path), record
    assert record["verify"]["valid"] is None, "nothing of the snapshot was read"

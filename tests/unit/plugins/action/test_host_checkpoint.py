"""Signed on the controller: the node's sealed snapshot goes up, the signature comes down, and nothing
is published unsigned in between -- the publish and abort phases of host_checkpoint, and what the action plugin
checks before it signs. Real sealing, claims, status records and Ed25519 keys; no CRIU (the seal phase's checkpoint
is the integration tests': test_trust_by_default, test_trust)."""

import hashlib
import json
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ansible_collections.inferops.snapshot.plugins.action import host_checkpoint as action
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim, task
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import (freshness, hashing, manifest, seal,
                                                                                   signature, statement, status)

IDENTITY = {"namespace": "tenant-a", "service": "qwen", "instance": "p0", "pod": "qwen-0"}
GENERATION_ID = "gen-under-test"


def sealed(tmp_path, generation=1700000000):
    """What the seal phase leaves: the sealed staging directory, the claim held, the status record generating."""
    snap = str(tmp_path / "store" / "tenant-a" / "qwen" / "p0" / "qwen-0")
    staging = layout.staging_dir(snap)
    os.makedirs(os.path.join(staging, "host", "criu"))
    with open(os.path.join(staging, "host", "criu", "pages-1.img"), "wb") as handle:
        handle.write(os.urandom(4096))
    seal.seal(staging, {"identity": IDENTITY, "generation": generation, "created_at": "2026-11-29T12:00:00Z",
                        "engine": {"name": "docker"}, "runtime": {"name": "ascend-acl", "version": None}, "devices": []})
    claim.take(snap, GENERATION_ID)
    status.update(snap, "generating", identity=IDENTITY, generation_id=GENERATION_ID)
    return snap, staging


def params(snap, **signing):
    return {"snapshot_dir": snap, "identity": IDENTITY, "timeout": 60.0, "generation_id": GENERATION_ID,
            "generation_lease": 180.0, "docker_cli": "docker", "runc_root": "/run/runc", "controller_signing": signing}


def to_sign(staging):
    return {name: open(os.path.join(staging, rel), encoding="utf-8").read()
            for name, rel in (("checksums", layout.CHECKSUMS), ("manifest", layout.MANIFEST))}


def test_the_signature_sent_down_is_written_and_the_snapshot_published_under_the_claim(tmp_path):
    snap, staging = sealed(tmp_path)
    key = Ed25519PrivateKey.generate()
    document = signature.document(to_sign(staging)["checksums"].encode(), key)
    result = task.host_checkpoint(params(snap, phase="publish", signature=json.dumps(document)))
    assert result["status"] == "completed" and result["signed_by"] == signature.key_id(key.public_key()), result
    assert result["generation"] == 1700000000 and not os.path.exists(staging)
    trusted = signature.load_public_keys([signature.public_pem(key)])
    valid, reasons, details = manifest.verify(snap, expect={"identity": IDENTITY}, trusted=trusted)
    assert valid and details["authenticated"], reasons
    assert status.read(snap)["status"] == "completed" and status.read(snap)["checksum"] == hashing.fingerprint(snap)
    assert claim.read(snap) is None, "the claim held since the seal phase is released"


def test_a_signature_of_another_list_publishes_nothing_and_the_generation_fails(tmp_path):
    snap, staging = sealed(tmp_path)
    key = Ed25519PrivateKey.generate()
    document = signature.document(b"another checksum list\n", key)
    with pytest.raises(ParameterError, match="controller_signing: the controller's signature cannot be used: the "
                                             "signature is not of this checksum.sha256"):
        task.host_checkpoint(params(snap, phase="publish", signature=json.dumps(document)))
    assert not os.path.exists(snap) and not os.path.exists(staging)
    assert status.read(snap)["status"] == "failed" and claim.read(snap) is None


def test_a_refused_signature_removes_the_sealed_snapshot_and_records_why(tmp_path):
    snap, staging = sealed(tmp_path)
    result = task.host_checkpoint(params(snap, phase="abort", reason="the manifest is of tenant-b/..."))
    assert result["status"] == "failed" and result["cleaned"] == [staging] and not os.path.exists(staging)
    assert status.read(snap)["reason"] == ("signing_refused: the controller did not sign the sealed snapshot: the "
                                           "manifest is of tenant-b/...")
    assert claim.read(snap) is None and not os.path.exists(snap)


def test_a_signing_key_that_reaches_the_node_is_refused_naming_it(tmp_path):
    snap, _staging = sealed(tmp_path)
    with pytest.raises(ParameterError, match="signing_key: is read on the controller by host_checkpoint's action "
                                             "plugin, which signs there, and is never sent to the node"):
        task.host_checkpoint(dict(params(snap), signing_key="-----BEGIN PRIVATE KEY-----"))


@pytest.mark.parametrize("name, value", [("generation_lease", -3600.0), ("generation_lease", float("inf")),
                                         ("generation_lease", float("nan")), ("timeout", float("inf")),
                                         ("max_age", float("inf"))])
def test_a_time_that_is_no_positive_number_of_seconds_is_refused_before_anything_is_taken(tmp_path, name, value):
    snap = str(tmp_path / "store" / "tenant-a" / "qwen" / "p0" / "qwen-0")
    options = dict(params(snap), controller_signing=None, **{name: value})
    with pytest.raises(ParameterError, match="^%s: must be a positive number of seconds" % name):
        task.host_checkpoint(options)
    assert not os.path.exists(str(tmp_path / "store"))


def test_the_controller_signs_only_the_manifest_listed_of_the_tasks_identity_and_generation(tmp_path):
    _snap, staging = sealed(tmp_path, generation=42)
    good = to_sign(staging)
    assert action.to_sign_problem(good, IDENTITY, 42, None) is None
    assert action.to_sign_problem(good, dict(IDENTITY, namespace="tenant-b"), 42, None) == \
        "the manifest is of tenant-a/qwen/p0/qwen-0, and the task asked for tenant-b/qwen/p0/qwen-0"
    assert action.to_sign_problem(good, IDENTITY, 43, None).startswith("the manifest carries generation 42")
    assert action.to_sign_problem(good, IDENTITY, 42, "2026-12-31T00:00:00Z").startswith("the manifest carries")
    swapped = dict(good, manifest=good["manifest"].replace("tenant-a", "tenant-b"))  # a manifest not in the list
    assert action.to_sign_problem(swapped, dict(IDENTITY, namespace="tenant-b"), 42, None) == \
        "the manifest the node sent is not the one its checksum.sha256 lists"
    assert action.to_sign_problem({"checksums": "x"}, IDENTITY, 42, None).startswith("the node sent no checksum list")
    assert hashlib.sha256(good["manifest"].encode()).hexdigest() in good["checksums"]


def test_the_ledger_sits_beside_a_key_file_and_in_the_key_directory_for_a_key_given_as_text(tmp_path):
    assert action.ledger_beside(str(tmp_path / "keys" / "team.pem")) == str(tmp_path / "keys" / "generations.json")
    assert action.ledger_beside("-----BEGIN PRIVATE KEY-----\n...") == "~/.inferops/keys/generations.json"
    assert action.identity_problem({"namespace": "a"}).startswith("identity: expected a dict with the keys namespace")


def test_the_controllers_key_pair_is_made_once_private_to_its_user(tmp_path):
    made = signature.key_pair(str(tmp_path / "keys"))
    assert made["created"] and oct(os.stat(made["private_key"]).st_mode & 0o777) == "0o600"
    assert oct(os.stat(str(tmp_path / "keys")).st_mode & 0o777) == "0o700"
    again = signature.key_pair(str(tmp_path / "keys"))
    assert not again["created"] and again["key_id"] == made["key_id"] and again["public_key"] == made["public_key"]
    predicted = signature.key_pair(str(tmp_path / "none"), create=False)  # check mode: a stand-in, never written
    assert predicted["created"] and predicted["key_id"] != made["key_id"] and not (tmp_path / "none").exists()
    os.chmod(str(tmp_path / "keys"), 0o755)
    with pytest.raises(ParameterError, match="path: .* must be a directory of this user's"):
        signature.key_pair(str(tmp_path / "keys"))


class _Task:
    check_mode = False


def plugin_run(tmp_path, check_mode=False, **task_args):
    """The action plugin's run with a signing key, its module runs recorded instead of made: (result, module runs)."""
    key_file = tmp_path / "keys" / "sign.pem"
    if not key_file.exists():
        key_file.parent.mkdir()
        key_file.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        key_file.chmod(0o600)
    runs = []
    plugin = action.ActionModule.__new__(action.ActionModule)
    plugin._task = _Task()
    plugin._task.check_mode = check_mode
    plugin._execute_module = lambda module_name, module_args, task_vars: runs.append(module_args) or {
        "failed": True, "msg": "the module ran"}
    args = dict({"container": "c", "snapshot_dir": "/var/lib/inferops/snapshots/a/b/c/p", "identity": IDENTITY},
                **task_args)
    ledger = args.pop("signing_ledger", None) or action.ledger_beside(str(key_file))
    return plugin._run(args, str(key_file), ledger, {}), runs


@pytest.mark.parametrize("check_mode", [False, True])
@pytest.mark.parametrize("task_args, message", [
    ({"identity": dict(IDENTITY, namespace="a/../x")}, "identity is invalid at namespace: "),
    ({"identity": dict(IDENTITY, pod="bad pod")}, "identity is invalid at pod: "),
    ({"max_age": "abc"}, "max_age: must be a positive number of seconds, got 'abc'"),
    ({"max_age": -1}, "max_age: must be a positive number of seconds, got -1"),
    ({"max_age": float("inf")}, "max_age: must be a positive number of seconds, got inf"),
    ({"max_age": "nan"}, "max_age: must be a positive number of seconds, got 'nan'"),
    ({"generation_lease": -3600}, "generation_lease: must be a positive number of seconds, got -3600"),
    ({"timeout": "inf"}, "timeout: must be a positive number of seconds, got 'inf'"),
    ({"signing_ledger": "relledger/gen.json"}, "signing_ledger: 'relledger/gen.json' is not an absolute path"),
])
def test_the_options_the_plugin_uses_are_checked_before_a_generation_is_taken(
        tmp_path, monkeypatch, check_mode, task_args, message):
    monkeypatch.chdir(str(tmp_path))
    result, runs = plugin_run(tmp_path, check_mode=check_mode, **task_args)
    assert result["failed"] and result["msg"].startswith(message), result
    assert runs == [], "the module never ran"
    assert sorted(os.listdir(str(tmp_path / "keys"))) == ["sign.pem"], "the signer's ledger is untouched"
    assert sorted(os.listdir(str(tmp_path))) == ["keys"]


def test_valid_options_take_a_generation_and_run_the_seal_phase(tmp_path):
    result, runs = plugin_run(tmp_path, max_age=3600)
    assert result == {"failed": True, "msg": "the module ran"}
    assert runs[0]["controller_signing"]["phase"] == "seal" and runs[0]["controller_signing"]["expires"]
    assert os.path.exists(str(tmp_path / "keys" / "generations.json"))


def test_the_statement_of_the_latest_generation_is_written_once_the_snapshot_is_published(tmp_path):
    key = Ed25519PrivateKey.generate()
    for base, generation, published in ((tmp_path / "wrong", 1700000001, False), (tmp_path / "right", 1700000000, True)):
        snap, staging = sealed(base)
        checksums = to_sign(staging)["checksums"].encode()
        latest = statement.make(IDENTITY, generation, hashlib.sha256(checksums).hexdigest(), key)
        options = params(snap, phase="publish", signature=json.dumps(signature.document(checksums, key)),
                         statement=latest.decode())
        if not published:
            with pytest.raises(ParameterError, match="controller_signing: the statement names generation 1700000001"):
                task.host_checkpoint(options)
            assert not os.path.exists(snap) and statement.read(snap) is None, "nothing published, nothing stated"
            continue
        assert task.host_checkpoint(options)["status"] == "completed"
        trusted = signature.load_public_keys([signature.public_pem(key)])
        document, refused = statement.check(statement.read(snap), IDENTITY, trusted)
        assert refused is None and document["generation"] == 1700000000
        assert document["fingerprint"] == hashing.fingerprint(snap)


def test_the_plugin_sends_the_statement_down_with_the_signature_and_records_the_generation_published(tmp_path):
    """The seal phase stood in for (no CRIU here), the publish phase the real one."""
    snap = str(tmp_path / "store" / "tenant-a" / "qwen" / "p0" / "qwen-0")
    _result, _runs = plugin_run(tmp_path)  # the key file, made once
    key_file = str(tmp_path / "keys" / "sign.pem")
    runs = []

    def execute(module_name, module_args, task_vars):
        runs.append(module_args)
        signing = module_args["controller_signing"]
        if signing["phase"] == "seal":
            _snap, staging = sealed(tmp_path, generation=signing["generation"])
            return {"status": "sealed", "changed": True, "generation_id": GENERATION_ID, "to_sign": to_sign(staging)}
        return task.host_checkpoint(dict(params(snap), controller_signing=signing))
    plugin = action.ActionModule.__new__(action.ActionModule)
    plugin._task = _Task()
    plugin._execute_module = execute
    ledger = action.ledger_beside(key_file)
    result = plugin._run({"container": "c", "snapshot_dir": snap, "identity": IDENTITY, "statement_validity": 600},
                         key_file, ledger, {})
    assert result["status"] == "completed" and "warnings" not in result, result
    key = signature.load_private_key(key_file)
    document, refused = statement.check(statement.read(snap), IDENTITY, signature.load_public_keys([key_file]))
    assert refused is None and document["generation"] == result["generation"]
    assert document["until"] - document["issued"] == 600 and document["key_id"] == signature.key_id(key.public_key())
    recorded = freshness.SignerLedger(ledger).read()["tenant-a/qwen/p0/qwen-0"]["published"]
    assert recorded == {"generation": result["generation"], "fingerprint": hashing.fingerprint(snap)}

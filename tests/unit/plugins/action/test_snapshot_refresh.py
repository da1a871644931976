"""snapshot_refresh's action plugin: the statements of the latest generations signed again on the controller, from
what the store sends up and the signer's own record -- the node side is the real one (core/node/refresh.py), called
where Ansible would run the module. Real keys, ledgers and files."""

import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ansible_collections.inferops.snapshot.plugins.action import snapshot_refresh as action
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import refresh
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import freshness, signature, statement

IDENTITY = {"namespace": "tenant-a", "service": "qwen", "instance": "p0", "pod": "qwen-0"}


class _Task:
    check_mode = False


def controller(tmp_path):
    key = Ed25519PrivateKey.generate()
    path = tmp_path / "keys" / layout.SIGNING_KEY_FILE
    path.parent.mkdir(mode=0o700)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return key, str(path)


def run(key_file, root, check_mode=False, **extra):
    """The plugin's run, its module runs made by the node side in this process: (result, module runs)."""
    runs = []

    def execute(module_name, module_args, task_vars):
        runs.append(dict(module_args))
        try:
            return refresh.refresh(dict({"statements": None}, **module_args), check_mode)
        except SnapshotError as exc:
            return {"failed": True, "msg": exc.msg}
    plugin = action.ActionModule.__new__(action.ActionModule)
    plugin._task = _Task()
    plugin._task.check_mode = check_mode
    plugin._execute_module = execute
    return plugin._run(dict({"root": root, "signing_key": key_file}, **extra), {}), runs


def test_the_refresh_signs_again_what_the_controller_published_even_over_a_store_rolled_back(tmp_path):
    key, key_file = controller(tmp_path)
    root = str(tmp_path / "store")
    snap = layout.snapshot_dir(root, IDENTITY)
    os.makedirs(os.path.dirname(snap))
    ledger = freshness.SignerLedger(os.path.join(os.path.dirname(key_file), layout.SIGNER_LEDGER_FILE))
    ledger.published(IDENTITY, 200, "c" * 64)
    statement.write(snap, statement.make(IDENTITY, 100, "b" * 64, key, now=1))  # an old statement put back
    before = statement.read(snap)
    preview, runs = run(key_file, root, check_mode=True)
    assert preview["changed"] and preview["refreshed"][0]["generation"] == 200 and len(runs) == 1
    assert statement.read(snap) == before, "check mode signs and writes nothing"
    result, runs = run(key_file, root, validity=3600)
    assert "signing_key" not in runs[0] and "signing_key" not in runs[1], "the key never goes to the host"
    assert result["changed"] and result["refreshed"] == [{
        "identity": "tenant-a/qwen/p0/qwen-0", "generation": 200, "source": "ledger",
        "expires": result["refreshed"][0]["expires"]}], result
    trusted = signature.load_public_keys([signature.public_pem(key)])
    document, refused = statement.check(statement.read(snap), IDENTITY, trusted)
    assert refused is None and document["generation"] == 200 and document["fingerprint"] == "c" * 64
    assert document["until"] - document["issued"] == 3600


def test_a_refresh_without_its_key_or_with_a_bad_validity_signs_nothing(tmp_path):
    _key, key_file = controller(tmp_path)
    result, runs = run(key_file, str(tmp_path / "store"), validity=-1)
    assert result["failed"] and result["msg"].startswith("validity: must be a positive number of seconds, got -1")
    result, runs = run(str(tmp_path / "keys" / "missing.pem"), str(tmp_path / "store"))
    assert result["failed"] and result["msg"].startswith("signing_key: cannot read the key file"), result
    assert runs == []
    result, runs = run(key_file, str(tmp_path / "store"), statements=[])
    assert result["failed"] and result["msg"].startswith("statements: set by snapshot_refresh's action plugin only")


def test_an_identity_nothing_vouches_for_is_left_alone_and_named(tmp_path):
    _key, key_file = controller(tmp_path)
    root = str(tmp_path / "store")
    snap = layout.snapshot_dir(root, IDENTITY)
    os.makedirs(os.path.dirname(snap))
    statement.write(snap, statement.make(IDENTITY, 100, "b" * 64, Ed25519PrivateKey.generate()))  # not our key
    before = statement.read(snap)
    result, runs = run(key_file, root)
    assert not result["changed"] and result["refreshed"] == [] and len(runs) == 1
    assert result["unvouched"][0]["identity"] == "tenant-a/qwen/p0/qwen-0" and statement.read(snap) == before

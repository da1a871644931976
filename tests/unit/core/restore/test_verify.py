"""Secure by default and keys scoped to identities: what a host requires, which identities a
trusted key may sign and an encryption key decrypt, and the refusals, before anything of the images is read.

Real Ed25519 and AES keys, real sealing and verification; the only fake is an attempt's fields."""

import shutil
import types

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import pipeline, stages, task, verify
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.attempt import Fallback, Trust, new_attempt
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import (encryption, hashing, manifest, seal,
                                                                                   signature, statement)

from unit.core.restore.test_cache import Fake

IDENTITY = {"namespace": "tenant-a", "service": "qwen", "instance": "p0", "pod": "qwen-0"}


def fields(**extra):
    return dict({"identity": IDENTITY, "generation": 1700000000, "created_at": "2026-11-29T12:00:00Z",
                 "image": {"id": "sha256:" + "ab" * 32}, "engine": {"name": "docker", "criu_version": "4.2.1"},
                 "runtime": {"name": "ascend-acl", "version": None}, "devices": [0]}, **extra)


def snapshot(root, key):
    final = root / "store" / "tenant-a" / "qwen" / "p0" / "qwen-0"
    staging = final.parent / ".qwen-0.partial"
    (staging / "host" / "criu").mkdir(parents=True)
    (staging / "host" / "criu" / "pages-1.img").write_bytes(b"x" * 20000)
    (staging / "host" / "criu" / "inventory.img").write_bytes(b"inv")
    seal.seal(str(staging), fields(), signing_key=key)
    seal.publish(str(staging), str(final))
    return str(final)


@pytest.mark.parametrize("trusted, keys, asked, wanted", [
    ([], [], (None, None), (False, False)),             # no key: nothing required (and a restore warns)
    (["k"], [], (None, None), (True, False)),           # a trusted key: signatures required
    ([], ["e"], (None, None), (True, True)),            # an encryption key: both (any key requires a signature)
    (["k"], ["e"], (False, None), (False, True)),       # turned off explicitly
    ([], [], (True, True), (True, True)),
])
def test_any_key_configured_requires_a_signature_and_an_encryption_key_requires_encryption(trusted, keys, asked,
                                                                                           wanted):
    assert verify.requirements(trusted, keys, *asked) == wanted


def test_a_required_signature_without_a_key_to_check_it_is_a_parameter_error_of_the_restore():
    with pytest.raises(ParameterError, match="require_signature: is on because encryption_keys are given"):
        task.requirements({"trusted_keys": [], "encryption_keys": ["k" * 44], "require_signature": None})
    with pytest.raises(ParameterError, match="require_signature: is true, but no trusted_keys"):
        task.requirements({"trusted_keys": [], "encryption_keys": [], "require_signature": True})
    assert task.requirements({"trusted_keys": [], "encryption_keys": ["k"], "require_signature": False}) == (False, True)


def test_what_a_host_refuses_of_a_verified_manifest():
    def reasons(recorded, authenticated=False, trusted=None, sig=False, enc=False):
        return verify.trust_reasons(dict(fields(files=[]), **recorded), authenticated, trusted, sig, enc, now=0)
    assert reasons({}) == []
    assert reasons({}, sig=True)[0].startswith("unsigned: this host restores only signed snapshots")
    assert reasons({}, sig=True, trusted={"k": 1}) == [], "with trusted keys verify() refused it already"
    assert reasons({}, enc=True)[0].startswith("unencrypted: this host restores only encrypted snapshots")
    v1 = {"encryption": {"algorithm": "aes-256-gcm-chunked", "chunk_bytes": 1, "key_id": "0" * 16, "files": []}}
    assert reasons(v1)[0].startswith("encryption_format: the snapshot is encrypted as aes-256-gcm-chunked")
    mixed = {"encryption": encryption.describe(b"k" * 32, ["host/criu/pages-1.img"]),
             "files": [{"path": "host/criu/pages-1.img", "size": 1, "sha256": "0" * 64},
                       {"path": "host/container.json", "size": 1, "sha256": "0" * 64}]}
    assert reasons(mixed, enc=True) == ["unencrypted: host/container.json of an encrypted snapshot is stored in the "
                                        "clear"], "a plaintext container record planted beside the ciphertext"
    assert reasons({"expires": "1970-01-01T00:00:00Z"})[0].startswith("expired: ")


def test_an_unauthenticated_restore_warns_only_where_nothing_is_required():
    assert verify.unauthenticated_warning({"authenticated": False}, False).startswith("unauthenticated: this host "
                                                                                      "trusts no signing key")
    assert verify.unauthenticated_warning({"authenticated": True}, False) is None
    assert verify.unauthenticated_warning({"authenticated": False}, True) is None  # refused, not restored


def test_a_module_restore_nothing_authenticated_says_so_in_its_warnings():
    warnings = []
    attempt = types.SimpleNamespace(reason=None, check_mode=False, verdict={"authenticated": False},
                                    require_signature=False, restored=True, watch=types.SimpleNamespace(durations={}),
                                    details={}, device_actions=None)
    task._result(attempt, {}, warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith("unauthenticated: "), warnings


def test_a_trusted_key_signs_only_the_identities_the_node_allows_it_refused_before_the_images_are_read(tmp_path,
                                                                                                       monkeypatch):
    team = Ed25519PrivateKey.generate()
    snap = snapshot(tmp_path, team)
    allowed = signature.load_public_keys([{"key": signature.public_pem(team), "identities": ["tenant-a/qwen"]}])
    valid, reasons, details = manifest.verify(snap, expect={"identity": IDENTITY}, trusted=allowed)
    assert valid and details["authenticated"], reasons
    other = signature.load_public_keys([{"key": signature.public_pem(team), "identities": ["tenant-b", "tenant-a/llama"]}])
    monkeypatch.setattr(hashing, "hash_tree", lambda *a, **k: pytest.fail("the images were read"))
    valid, reasons, details = manifest.verify(snap, expect={"identity": IDENTITY}, trusted=other)
    key = signature.key_id(team.public_key())
    assert not valid and not details["authenticated"] and reasons == [
        "signature_untrusted: signed by key %s, which this host trusts only for tenant-b/*, tenant-a/llama, not for "
        "tenant-a/qwen/p0/qwen-0 (the identities of trusted_keys)" % key]
    both = signature.load_public_keys([signature.public_pem(team),
                                       {"key": signature.public_pem(team), "identities": ["tenant-b"]}])
    assert both.allows(key, IDENTITY), "the same key also given alone: every identity"


@pytest.mark.parametrize("entry, message", [
    ({"key": "x"}, r"trusted_keys\[0\].identities: a non-empty list"),
    ({"key": "x", "identities": ["a/b/c"]}, r"'a/b/c' is not a namespace/service pattern"),
    ({"key": "x", "identities": ["a"], "scope": 1}, r"trusted_keys\[0\]: give a key .* got a dict with the keys"),
    (["x"], r"trusted_keys\[0\]: give a key .* got a list"),
])
def test_a_malformed_policy_entry_is_refused_naming_it(entry, message):
    with pytest.raises(ParameterError, match=message):
        signature.load_public_keys([entry])


def test_an_encryption_key_decrypts_only_the_identities_it_is_given_for():
    key = b"\x01" * 32
    keys = encryption.load_keys([{"key": key.hex(), "identities": ["tenant-b/*"]}])
    attempt = types.SimpleNamespace(keys=keys, manifest=dict(fields(), encryption=encryption.describe(key, [])))
    with pytest.raises(Fallback) as refused:
        stages._check_key(attempt)
    assert refused.value.reason.startswith("encrypted: the snapshot is encrypted with key %s, which this host holds only "
                                           "for tenant-b/*, not for tenant-a/qwen/p0/qwen-0" % encryption.key_id(key))
    attempt.keys = encryption.load_keys([{"key": key.hex(), "identities": ["tenant-a/qwen"]}])
    assert stages._check_key(attempt) is None


# -- freshness: the controller's statement of the latest generation, checked in the verification of every path ---

def generation_of(root, key, number):
    """Generation ``number`` of the pod, signed by ``key``, published in the store below ``root`` (replacing one)."""
    final = root / "store" / "tenant-a" / "qwen" / "p0" / "qwen-0"
    staging = final.parent / ".qwen-0.partial"
    (staging / "host" / "criu").mkdir(parents=True)
    (staging / "host" / "criu" / "pages-1.img").write_bytes(b"x" * 20000 + str(number).encode())
    (staging / "host" / "criu" / "inventory.img").write_bytes(b"inv")
    seal.seal(str(staging), fields(generation=number), signing_key=key)
    aside = root / ("generation-%d" % number)
    if final.exists():
        shutil.rmtree(str(final))
    seal.publish(str(staging), str(final))
    shutil.copytree(str(final), str(aside))  # what a writer of the store keeps of it
    return str(final), str(aside)


class Restorable(Fake):
    """Restores nothing, says which snapshot it would have: the verification is the real one."""

    def __init__(self):
        super(Restorable, self).__init__()
        self.identity = IDENTITY


def restore_on(node, snap, trusted_key_file, check_mode=False):
    """A restore of ``snap`` on a node whose state root is ``node``, as the module and the runtime build it."""
    settings = {"generations_file": str(node / "state" / "generations.json"), "trusted_keys": [trusted_key_file]}
    attempt = new_attempt(snap, 30, settings, Trust.load(settings), device_restore=False, check_mode=check_mode)
    return pipeline.run(Restorable(), attempt)


def test_an_older_generation_put_back_is_refused_on_a_node_that_never_restored_it_check_mode_too(tmp_path):
    key = Ed25519PrivateKey.generate()
    public = tmp_path / "controller.pub"
    public.write_text(signature.public_pem(key))
    first, first_aside = generation_of(tmp_path, key, 100)
    second, _aside = generation_of(tmp_path, key, 200)
    unstated = restore_on(tmp_path / "node-a", second, str(public))
    assert not unstated.restored and unstated.reason.startswith("stale: there is no statement of the latest "
                                                                "generation of tenant-a/qwen/p0/qwen-0"), unstated.reason
    statement.write(second, statement.make(IDENTITY, 200, hashing.fingerprint(second), key))
    assert restore_on(tmp_path / "node-a", second, str(public)).restored, "node A restores the latest"
    shutil.rmtree(second)
    shutil.copytree(first_aside, second)  # the older generation put back in the shared store
    for check_mode in (True, False):
        attempt = restore_on(tmp_path / "node-b", second, str(public), check_mode=check_mode)
        assert not attempt.restored and attempt.reason.startswith(
            "rollback: the snapshot is generation 100 of tenant-a/qwen/p0/qwen-0, and the controller's statement of "), \
            (check_mode, attempt.reason)
    assert not (tmp_path / "node-b" / "state").exists(), "node B recorded nothing"
    assert restore_on(tmp_path / "node-a", second, str(public)).reason.startswith(
        "rollback: the snapshot is generation 100 of tenant-a/qwen/p0/qwen-0, and this node has already restored "
        "generation 200")


def test_a_containers_snapshot_is_one_kind_whether_docker_or_containerd_took_it():
    """runc checkpoints an OCI container the same way under dockerd and under containerd's CRI: either container path
    restores it (the world comparison says whether the new container fits); a bare process is another kind."""
    for taken, engine in (("containerd", "docker"), ("docker", "containerd"), ("containerd", "containerd")):
        assert verify.engine_reason({"engine": {"name": taken}}, engine) is None, (taken, engine)
    reason = verify.engine_reason({"engine": {"name": "containerd"}}, "criu")
    assert reason.startswith("engine_mismatch: snapshot was taken with engine containerd (a container of a pod on "
                             "containerd: restore it into a container"), reason
    assert verify.engine_reason({"engine": {"name": "criu"}}, "containerd").startswith("engine_mismatch:")

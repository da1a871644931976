"""Authenticity: a snapshot is trusted only when signed by a trusted key; every forgery tried is refused.

Real files, real Ed25519 keys (the cryptography library), the real sealing and verification."""

import json
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, manifest, seal, signature

IDENTITY = {"namespace": "default", "service": "svc", "instance": "p0", "pod": "pod-a"}
MARKER = b"the engine's secret weights"


def pem_private(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def pem_public(key):
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def fields():
    return {"identity": IDENTITY, "created_at": "2026-11-29T12:00:00Z", "image": {"id": "sha256:" + "ab" * 32},
            "engine": {"name": "docker", "criu_version": "4.2.1"}, "runtime": {"name": "ascend-acl", "version": None},
            "devices": [0]}


def snapshot(root, key=None):
    final = root / "store" / "default" / "svc" / "p0" / "pod-a"
    staging = final.parent / ".pod-a.partial"
    (staging / "host" / "criu").mkdir(parents=True)
    (staging / "host" / "criu" / "pages-1.img").write_bytes(b"x" * 5000 + MARKER + b"y" * 5000)
    (staging / "host" / "criu" / "inventory.img").write_bytes(b"inv")
    seal.seal(str(staging), fields(), signing_key=key)
    seal.publish(str(staging), str(final))
    return final


def check(final, trusted):
    return manifest.verify(str(final), expect={"identity": IDENTITY}, trusted=trusted)


@pytest.fixture
def keys():
    ours, theirs = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    return ours, theirs, signature.load_public_keys([pem_public(ours)])


def test_a_signed_snapshot_is_authenticated_and_an_unsigned_one_refused_where_keys_are_trusted(tmp_path, keys):
    ours, _theirs, trusted = keys
    signed = snapshot(tmp_path / "a", ours)
    valid, reasons, details = check(signed, trusted)
    assert valid and reasons == [] and details["authenticated"] is True
    assert details["key_id"] == signature.key_id(ours.public_key())
    unsigned = snapshot(tmp_path / "b")
    valid, reasons, details = check(unsigned, trusted)
    assert not valid and reasons[0].startswith("unsigned:") and details["authenticated"] is False
    # without trusted keys: valid as before, and says it is not authenticated
    valid, reasons, details = check(unsigned, {})
    assert valid and details["authenticated"] is False


def rewrite_consistently(final, new_pages, key=None):
    """The attack of change the memory, then make checksum.sha256 and the manifest match."""
    pages = final / "host" / "criu" / "pages-1.img"
    pages.write_bytes(new_pages)
    staging = final.parent / ".pod-a.partial"
    os.rename(final, staging)
    os.unlink(staging / layout.SIGNATURE) if (staging / layout.SIGNATURE).exists() else None
    recorded = json.loads((staging / layout.MANIFEST).read_text())
    seal.seal(str(staging), {k: v for k, v in recorded.items() if k not in ("files", "total_bytes", "schema_version")},
              signing_key=key)
    seal.publish(str(staging), str(final))


@pytest.mark.parametrize("resign", ["none", "other key"])
def test_a_consistent_rewrite_is_refused_unsigned_or_resigned_by_another_key(tmp_path, keys, resign):
    ours, theirs, trusted = keys
    final = snapshot(tmp_path, ours)
    rewrite_consistently(final, b"x" * 5000 + b"attacker's code here!!!!!!" + b"y" * 5000,
                         key=theirs if resign == "other key" else None)
    assert manifest.verify(str(final), expect={"identity": IDENTITY})[0], "without keys the rewrite passes: the point"
    valid, reasons, _details = check(final, trusted)
    assert not valid
    assert reasons[0].startswith("unsigned:" if resign == "none" else "signature_untrusted:"), reasons


def test_the_status_records_fingerprint_is_compared(tmp_path, keys):
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status
    final = snapshot(tmp_path)
    status.update(str(final), "completed", checksum=hashing.fingerprint(str(final)))
    rewrite_consistently(final, b"z" * 10000)
    valid, reasons, _details = manifest.verify(str(final))
    assert not valid and any(r.startswith("checksum_mismatch: the status record says") for r in reasons), reasons
    valid, reasons, _details = manifest.verify(str(snapshot(tmp_path / "k")), expect={"checksum": "0" * 64})
    assert not valid and reasons[0].startswith("checksum_mismatch: the snapshot was recorded as " + "0" * 64)


@pytest.mark.parametrize("target", [layout.CHECKSUMS, layout.MANIFEST, layout.SIGNATURE])
def test_a_flipped_byte_anywhere_in_the_signed_files_is_refused(tmp_path, keys, target):
    ours, _theirs, trusted = keys
    final = snapshot(tmp_path, ours)
    path = final / target
    data = bytearray(path.read_bytes())
    for index in range(0, len(data), max(1, len(data) // 40)):  # forty positions spread over the file
        flipped = bytearray(data)
        flipped[index] ^= 0x01
        path.write_bytes(bytes(flipped))
        valid, reasons, _details = check(final, trusted)
        assert not valid, (target, index, reasons)
    path.write_bytes(bytes(data))
    assert check(final, trusted)[0]


def test_a_flipped_newline_in_the_checksum_list_is_refused_even_without_keys(tmp_path):
    final = snapshot(tmp_path)
    path = final / layout.CHECKSUMS
    text = path.read_bytes()
    for variant in (text.replace(b"\n", b"\r\n", 1), text.replace(b"  ", b" *", 1), text + b"\n", text[:-1],
                    text.replace(b"\n", b"\n\n", 1)):
        path.write_bytes(variant)
        valid, reasons, _details = manifest.verify(str(final))
        assert not valid and reasons[0].startswith("checksum_unreadable:"), (variant[:80], reasons)


def test_keys_are_checked_before_anything_is_signed(tmp_path, keys):
    ours, _theirs, _trusted = keys
    key_file = tmp_path / "signing.pem"
    key_file.write_text(pem_private(ours))
    os.chmod(key_file, 0o644)
    with pytest.raises(ParameterError, match="has mode 644; a private key must be 0600"):
        signature.load_private_key(str(key_file))
    os.chmod(key_file, 0o600)
    assert signature.load_private_key(str(key_file)).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw) == ours.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    in_store = tmp_path / "store" / "k.pem"
    in_store.parent.mkdir()
    in_store.write_text(pem_private(ours))
    os.chmod(in_store, 0o600)
    with pytest.raises(ParameterError, match="lies in the snapshot store"):
        signature.load_private_key(str(in_store), snapshot_dir=str(tmp_path / "store/default/svc/p0/pod-a"))
    with pytest.raises(ParameterError, match="trusted_keys\\[0\\]: not a PEM Ed25519 key"):
        signature.load_public_keys(["-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n"])
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600


def test_rotation_trusts_several_keys_at_once(tmp_path, keys):
    ours, theirs, _trusted = keys
    both = signature.load_public_keys([pem_public(ours), pem_public(theirs)])
    assert check(snapshot(tmp_path / "a", ours), both)[0] and check(snapshot(tmp_path / "b", theirs), both)[0]


@pytest.mark.parametrize("key_id", [["x"], {"a": 1}, 7, None])
def test_a_signature_document_with_a_key_id_of_another_type_is_invalid_not_a_crash(tmp_path, keys, key_id):
    ours, _theirs, trusted = keys
    final = snapshot(tmp_path, ours)
    path = final / layout.SIGNATURE
    document = json.loads(path.read_bytes())
    document["key_id"] = key_id
    path.write_bytes(signature.encode(document))  # canonical, as a writer of the store would make it
    valid, reasons, _details = check(final, trusted)
    assert not valid and reasons[0].startswith("signature_invalid: ") and "key_id" in reasons[0], reasons


@pytest.mark.parametrize("value", [
    "MC4CAQAwBQYDK2VwBCIEIFl9Vdn7IUHxfBD/+ph7CFGasNf4CuO4LHHc2jHWYHOf",  # PKCS#8 base64 without its -----BEGIN line
    "/C4CAQAwBQYDK2VwBCIEIFl9Vdn7IUHxfBD/+ph7CFGasNf4CuO4LHHc2jHWYHOf",  # base64 may start with "/"
    "MC4CAQAwBQYDK2VwBCIEIFl9Vdn7IUHxfBD/+ph7\n  CFGasNf4CuO4LHHc2jHWYHOf\n",  # a YAML-folded Vault value
])
def test_a_key_given_without_its_pem_armour_is_refused_without_repeating_any_of_it(value):
    """Host_checkpoint's signing_key is no_log, but Ansible masks only the whole value, and its action plugin's result
    is not masked at all: not one piece of a key may reach a message."""
    with pytest.raises(ParameterError) as error:
        signature.load_private_key(value)
    assert error.value.msg.startswith("signing_key: neither a PEM key (-----BEGIN ...) nor "), error.value.msg
    assert "not repeated" in error.value.msg
    pieces = [value.strip()[start:start + 8] for start in range(0, len(value.strip()) - 8, 4)]
    assert not [piece for piece in pieces if piece in error.value.msg], error.value.msg


def test_a_missing_key_file_is_still_named(tmp_path):
    missing = str(tmp_path / "keys" / "signing.pem")
    with pytest.raises(ParameterError, match="signing_key: cannot read the key file %s: " % missing):
        signature.load_private_key(missing)


@pytest.mark.parametrize("mode", [0o1777, 0o755, 0o750, 0o711])
@pytest.mark.parametrize("check_mode", [False, True])
def test_an_existing_key_directory_others_can_reach_is_refused_and_never_changed(tmp_path, mode, check_mode):
    """Path: /tmp or ~ given by mistake was made 0700 (and /tmp with it) before the check could see its mode."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(str(shared), mode)
    with pytest.raises(ParameterError) as error:
        signature.key_pair(str(shared), create=not check_mode)
    assert error.value.msg == (
        "path: %s must be a directory of this user's (uid %d) that nobody else can read or write (mode 0700); it has "
        "mode %o: chmod 0700 it, or give a path that does not exist yet (it is made 0700). An existing directory is "
        "never changed" % (shared, os.geteuid(), mode)), error.value.msg
    assert stat.S_IMODE(os.stat(str(shared)).st_mode) == mode and os.listdir(str(shared)) == []


@pytest.mark.parametrize("check_mode", [False, True])
def test_an_existing_key_directory_of_another_user_is_refused_and_never_changed(tmp_path, check_mode):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chmod(str(theirs), 0o755)
    os.chown(str(theirs), os.geteuid() + 1000, os.getegid())
    with pytest.raises(ParameterError, match=r"^path: %s must be a directory of this user's \(uid %d\) .*; it is uid "
                                             r"%d's: give a directory of this user's, or give a path that does not exist"
                                             % (theirs, os.geteuid(), os.geteuid() + 1000)):
        signature.key_pair(str(theirs), create=not check_mode)
    st = os.stat(str(theirs))
    assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == os.geteuid() + 1000 and os.listdir(str(theirs)) == []


def test_a_missing_key_directory_is_made_0700_and_an_existing_private_one_used_as_it_is(tmp_path):
    made = signature.key_pair(str(tmp_path / "a" / "keys"))
    assert made["created"] and stat.S_IMODE(os.stat(str(tmp_path / "a" / "keys")).st_mode) == 0o700
    own = tmp_path / "own"
    own.mkdir()
    os.chmod(str(own), 0o700)
    assert signature.key_pair(str(own), create=False)["created"], "check mode: would make the key, makes nothing"
    assert os.listdir(str(own)) == []
    assert signature.key_pair(str(own))["created"] and stat.S_IMODE(os.stat(str(own)).st_mode) == 0o700


def test_check_mode_stands_in_a_key_nothing_is_signed_by_for_one_it_would_make(tmp_path):
    """A restore in check mode then requires signatures as the run will, with a key no snapshot is signed by: a fresh
    controller (an AWX job's new container) predicts the run's signature_untrusted instead of 'would restore'."""
    own = tmp_path / "own"
    own.mkdir()
    os.chmod(str(own), 0o700)
    predicted = signature.key_pair(str(own), create=False)
    assert predicted["created"] and predicted["public_key"].startswith("-----BEGIN PUBLIC KEY-----")
    assert list(signature.load_public_keys([predicted["public_key"]])) == [predicted["key_id"]] and os.listdir(str(own)) == []
    made = signature.key_pair(str(own))
    assert made["key_id"] != predicted["key_id"], "the stand-in must be no key the run makes or any snapshot has"


def test_check_mode_writes_no_public_half(tmp_path):
    made = signature.key_pair(str(tmp_path / "keys"))
    os.unlink(made["public_key_path"])
    predicted = signature.key_pair(str(tmp_path / "keys"), create=False)
    assert predicted["created"] and predicted["key_id"] == made["key_id"]
    assert not os.path.exists(made["public_key_path"]), "check mode wrote the public key"
    assert signature.key_pair(str(tmp_path / "keys"))["created"] and os.path.exists(made["public_key_path"])


@pytest.mark.parametrize("path, words", [
    ("", "path: give the absolute path of a directory on the controller for the signing key (default "
         "~/.inferops/keys), got an empty string"),
    (["/tmp/keys"], "path: give the absolute path of a directory on the controller for the signing key (default "
                    "~/.inferops/keys), got a list"),
    (7, "path: give the absolute path of a directory on the controller for the signing key (default "
        "~/.inferops/keys), got a number"),
    ("relkeys", "path: 'relkeys' is relative (to wherever ansible was started); give an absolute path, or one that "
                "starts with ~"),
    ("{tmp}/keys\x00x", "path: the path contains a NUL byte; give the directory's path without it"),
    ("{tmp}/afile", "path: {tmp}/afile must be a directory of this user's"),
    ("{tmp}/afile/keys", "path: {tmp}/afile/keys cannot be made: {tmp}/afile is not a directory; give another path"),
])
@pytest.mark.parametrize("check_mode", [False, True])
def test_a_key_directory_that_cannot_be_one_is_refused_naming_path_and_nothing_is_made(
        tmp_path, monkeypatch, path, words, check_mode):
    monkeypatch.chdir(str(tmp_path))
    (tmp_path / "afile").write_text("not a directory")
    if isinstance(path, str):
        path = path.format(tmp=tmp_path)
    before = sorted(os.listdir(str(tmp_path)))
    with pytest.raises(ParameterError) as error:
        signature.key_pair(path, create=not check_mode)
    assert error.value.msg.startswith(words.format(tmp=tmp_path)), error.value.msg
    assert error.value.result.get("field") == "path"
    assert sorted(os.listdir(str(tmp_path))) == before and (tmp_path / "afile").read_text() == "not a directory"

"""Encryption at rest: chunked AES-256-GCM round-trips, and every change to a ciphertext, a wrong key, a
swapped or dropped chunk fails to authenticate. Real files, the real cryptography library."""

import base64
import os

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core import encryption
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import ParameterError

REL = "host/criu/pages-1.img"


@pytest.fixture
def files(tmp_path):
    plain = tmp_path / "plain"
    plain.write_bytes(os.urandom(3 * 1024 + 17) + b"SECRET_TOKEN=hunter2" + os.urandom(1000))
    return plain, tmp_path / "cipher", tmp_path / "out"


def test_round_trip_in_parallel_chunks_and_no_plaintext_in_the_ciphertext(files):
    plain, cipher, out = files
    key = os.urandom(32)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        size = encryption.encrypt_file(key, str(plain), str(cipher), REL, chunk_bytes=1024, pool=pool)
        encryption.decrypt_file({encryption.key_id(key): key}, str(cipher), str(out), REL, pool=pool)
    assert out.read_bytes() == plain.read_bytes() and size == cipher.stat().st_size
    assert b"hunter2" not in cipher.read_bytes() and oct(cipher.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap", "other file", "wrong key"])
def test_any_change_or_the_wrong_key_fails_to_authenticate(files, damage):
    plain, cipher, out = files
    key = os.urandom(32)
    encryption.encrypt_file(key, str(plain), str(cipher), REL, chunk_bytes=1024)
    data = bytearray(cipher.read_bytes())
    keys = {encryption.key_id(key): key}
    rel = REL
    header, block = encryption.HEADER.size, 1024 + encryption.TAG_BYTES
    if damage == "flip":
        data[header + block + 5] ^= 0x01
    elif damage == "truncate":
        data = data[:header + 2 * block] + data[header + 3 * block:]  # a whole chunk dropped
        data[20:28] = (len(data) - header - 0).to_bytes(8, "little")  # ... and the size in the header made to fit
    elif damage == "swap":
        data[header:header + block], data[header + block:header + 2 * block] = \
            data[header + block:header + 2 * block], data[header:header + block]
    elif damage == "other file":
        rel = "host/criu/pages-2.img"  # the same bytes read as another file
    elif damage == "wrong key":
        other = os.urandom(32)
        keys = {encryption.key_id(other): other}
    cipher.write_bytes(bytes(data))
    with pytest.raises(encryption.DecryptError, match="decrypt_failed:"):
        encryption.decrypt_file(keys, str(cipher), str(out), rel)


def test_keys_come_as_base64_hex_or_a_private_file_and_nothing_else(tmp_path):
    key = os.urandom(32)
    assert encryption.load_key(base64.b64encode(key).decode()) == key
    assert encryption.load_key(key.hex()) == key
    path = tmp_path / "key"
    path.write_bytes(key)
    os.chmod(path, 0o644)
    with pytest.raises(ParameterError, match="must be owned by root and mode 0600"):
        encryption.load_key(str(path))
    os.chmod(path, 0o600)
    assert encryption.load_key(str(path)) == key
    with pytest.raises(ParameterError, match="encryption_key: not a 256-bit key"):
        encryption.load_key("c2hvcnQ=")
    store = tmp_path / "store"
    (store / "ns").mkdir(parents=True)
    inside = store / "ns" / "key"
    inside.write_bytes(key)
    os.chmod(inside, 0o600)
    with pytest.raises(ParameterError, match="lies in the snapshot store"):
        encryption.load_key(str(inside), snapshot_dir=str(store / "ns" / "svc" / "p0" / "pod"))


def test_what_is_encrypted():
    assert encryption.encrypts("host/criu/pages-1.img") and encryption.encrypts("host/container.json")
    assert encryption.encrypts("canary.json")
    assert not encryption.encrypts("manifest.json") and not encryption.encrypts("device/device.json")

"""Encryption at rest: chunked AES-256-GCM round-trips, and every change to a ciphertext, a wrong key, a
swapped or dropped chunk fails to authenticate. Real files, the real cryptography library."""

import base64
import os

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import encryption

REL = "host/criu/pages-1.img"
IDENTITY = {"namespace": "team-a", "service": "qwen", "instance": "p0", "pod": "qwen-0"}
BOUND = encryption.Binding(IDENTITY, 7)   # what every chunk of this test's snapshot is bound to


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
        size = encryption.encrypt_file(key, str(plain), str(cipher), REL, BOUND, chunk_bytes=1024, pool=pool)
        encryption.decrypt_file({encryption.key_id(key): key}, str(cipher), str(out), REL, BOUND, pool=pool)
    assert out.read_bytes() == plain.read_bytes() and size == cipher.stat().st_size
    assert b"hunter2" not in cipher.read_bytes() and oct(cipher.stat().st_mode & 0o777) == "0o600"


def test_each_chunk_is_plain_aes_256_gcm_under_the_identitys_hkdf_key_with_its_place_as_associated_data(files):
    """The format does not depend on the cipher API that wrote it: every chunk opens with the AEAD class, under the
    key HKDF-SHA256 derives for the snapshot's identity and generation, its identity, generation, path and place as
    associated data."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    plain, cipher, _out = files
    key = os.urandom(32)
    encryption.encrypt_file(key, str(plain), str(cipher), REL, BOUND, chunk_bytes=1024)
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"inferops.snapshot encryption v2",
                   info=b"file key\nteam-a/qwen/p0/qwen-0\n7").derive(key)
    data = cipher.read_bytes()
    assert data[:8] == b"IOSENC\x02\x00"
    _magic, prefix, chunk_bytes, size = encryption.HEADER.unpack(data[:encryption.HEADER.size])
    plan = encryption._chunks(size, chunk_bytes)
    opened, at = b"", encryption.HEADER.size
    for index, _offset, length in plan:
        block = data[at:at + length + encryption.TAG_BYTES]
        aad = b"inferops.snapshot/v2\nteam-a/qwen/p0/qwen-0\n7\n" + REL.encode() + index.to_bytes(4, "little") + \
            bytes([index == len(plan) - 1])
        opened += AESGCM(derived).decrypt(prefix + index.to_bytes(4, "little"), block, aad)
        at += len(block)
    assert opened == plain.read_bytes() and at == len(data)


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap", "other file", "wrong key", "other generation",
                                    "other pod", "other namespace"])
def test_any_change_the_wrong_key_or_another_snapshots_binding_fails_to_authenticate(files, damage):
    """The same bytes read as another file, another generation of the same pod, another pod or another namespace's:
    the chunk was bound to its own, and does not authenticate (the splice of 5)."""
    plain, cipher, out = files
    key = os.urandom(32)
    encryption.encrypt_file(key, str(plain), str(cipher), REL, BOUND, chunk_bytes=1024)
    data = bytearray(cipher.read_bytes())
    keys = {encryption.key_id(key): key}
    rel, binding = REL, BOUND
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
    elif damage == "other generation":
        binding = encryption.Binding(IDENTITY, 8)
    elif damage == "other pod":
        binding = encryption.Binding(dict(IDENTITY, pod="qwen-1"), 7)
    elif damage == "other namespace":
        binding = encryption.Binding(dict(IDENTITY, namespace="team-b"), 7)
    cipher.write_bytes(bytes(data))
    with pytest.raises(encryption.DecryptError, match="decrypt_failed:"):
        encryption.decrypt_file(keys, str(cipher), str(out), rel, binding)
    with pytest.raises(encryption.DecryptError, match="decrypt_failed:"):
        encryption.decrypt_bytes(keys, bytes(data), rel, binding)


def test_a_file_of_format_1_is_refused_by_name_not_decrypted(files):
    """Format 1 bound a chunk to its path only: a file in it is refused, naming the format, whatever key."""
    plain, cipher, out = files
    key = os.urandom(32)
    encryption.encrypt_file(key, str(plain), str(cipher), REL, BOUND, chunk_bytes=1024)
    data = bytearray(cipher.read_bytes())
    data[:8] = b"IOSENC\x01\x00"
    cipher.write_bytes(bytes(data))
    with pytest.raises(encryption.DecryptError, match="decrypt_failed: .* encryption format 1"):
        encryption.decrypt_file({encryption.key_id(key): key}, str(cipher), str(out), REL, BOUND)
    assert encryption.format_reason({"algorithm": "aes-256-gcm-chunked"}).startswith("encryption_format: ")
    assert encryption.format_reason(encryption.describe(key, [REL])) is None


def test_a_failing_chunk_stops_the_file_with_no_worker_left_behind(files, monkeypatch):
    """A chunk that does not authenticate ends the file's decryption; every chunk already submitted has
    ended before the error reaches the caller, so none writes to a file the caller then removes."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    plain, cipher, out = files
    key = os.urandom(32)
    encryption.encrypt_file(key, str(plain), str(cipher), REL, BOUND, chunk_bytes=1024)
    data = bytearray(cipher.read_bytes())
    data[encryption.HEADER.size + 3] ^= 0x01  # the first chunk
    cipher.write_bytes(bytes(data))
    real, active, lock = encryption._write_all, [0], threading.Lock()

    def slow_write(fd, view, offset=None):
        with lock:
            active[0] += 1
        try:
            time.sleep(0.3)
            real(fd, view, offset)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(encryption, "_write_all", slow_write)
    with ThreadPoolExecutor(4) as pool:
        with pytest.raises(encryption.DecryptError, match="chunk 0 of"):
            encryption.decrypt_file({encryption.key_id(key): key}, str(cipher), str(out), REL, BOUND, pool=pool)
        assert active[0] == 0, "a worker still writes after decrypt_file returned"


def test_a_header_rewritten_to_promise_a_huge_file_is_refused_before_anything_is_built_from_it(files):
    """The header is authenticated only with its first chunk: one rewritten in place (same length) to promise 2**40
    bytes in 1-byte chunks must be refused by the file's length, not by building a trillion-entry plan first."""
    import resource
    plain, cipher, out = files
    key = os.urandom(32)
    encryption.encrypt_file(key, str(plain), str(cipher), REL, BOUND, chunk_bytes=1024)
    data = bytearray(cipher.read_bytes())
    magic, prefix, _chunk, _size = encryption.HEADER.unpack(bytes(data[:encryption.HEADER.size]))
    data[:encryption.HEADER.size] = encryption.HEADER.pack(magic, prefix, 1, 2 ** 40)
    cipher.write_bytes(bytes(data))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (used + (2 << 30), hard))  # a plan of 2**40 chunks fails here, not passes
    try:
        with pytest.raises(encryption.DecryptError, match="header promises"):
            encryption.decrypt_file({encryption.key_id(key): key}, str(cipher), str(out), REL, BOUND)
        with pytest.raises(encryption.DecryptError, match="header promises"):
            encryption.decrypt_bytes({encryption.key_id(key): key}, bytes(data), REL, BOUND)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


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


def test_a_base64_key_that_starts_with_a_slash_is_a_key_and_never_echoed(tmp_path):
    """One random key in 64 has a base64 form starting with "/": it must not be taken for a path (and put in the
    message of a missing file)."""
    keys = [k for k in (os.urandom(32) for _draw in range(4000)) if base64.b64encode(k).startswith(b"/")][:20]
    assert keys, "no key with a leading slash in 4000 draws"
    for key in keys:
        assert encryption.load_key(base64.b64encode(key).decode()) == key
    text = "/" + base64.b64encode(os.urandom(32)).decode()[1:-1]  # a key without its "=": neither key nor file
    with pytest.raises(ParameterError) as raised:
        encryption.load_key(text)
    assert "neither a 256-bit key" in raised.value.msg and text not in raised.value.msg
    with pytest.raises(ParameterError, match="cannot read the key file /etc/inferops/no-such.key"):
        encryption.load_key("/etc/inferops/no-such.key")  # a path that cannot be a key is named
    named = tmp_path / "key"
    named.write_text(base64.b64encode(keys[0]).decode() + "\n")
    os.chmod(named, 0o600)
    assert encryption.load_key(str(named)) == keys[0], "a file of base64 text still works"


def test_what_is_encrypted():
    assert encryption.encrypts("host/criu/pages-1.img") and encryption.encrypts("host/container.json")
    assert encryption.encrypts("canary.json")
    assert not encryption.encrypts("manifest.json") and not encryption.encrypts("device/device.json")


def test_the_ciphertext_is_hashed_as_it_is_written_whole_and_per_chunk(tmp_path):
    """Host_checkpoint takes sealing's digests of the ciphertext from encryption's own buffers (seal.WrittenDigest)
    instead of reading it back: they are those of the finished files, whole and per chunk of the chunk index
    (chunks that straddle encryption's)."""
    import hashlib
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import seal
    source, target = tmp_path / "plain", tmp_path / "sealed"
    (source / "host" / "criu").mkdir(parents=True)
    (source / REL).write_bytes(os.urandom(9 * 1024 * 1024 + 5))
    (source / "canary.json").write_bytes(b"{}")
    step = 3 * 1024 * 1024 + 7
    digests = encryption.encrypt_tree(os.urandom(32), str(source), str(target), [REL, "canary.json"], BOUND,
                                      workers=2, digest=lambda: seal.WrittenDigest(chunk_bytes=step, depth=2))
    for rel in (REL, "canary.json"):
        data = (target / rel).read_bytes()
        size, digest, chunks = digests[rel]
        assert size == len(data) and digest == hashlib.sha256(data).hexdigest()
        assert chunks == [hashlib.sha256(data[i:i + step]).hexdigest() for i in range(0, len(data), step)]


def test_hashing_as_written_reuses_the_buffers_and_a_failure_ends_its_threads(tmp_path, monkeypatch):
    """Memory stays bounded: a buffer comes back once written and hashed, so a big file takes no more fresh
    buffers than the pipeline holds (not one per chunk); a failure mid-file leaves no digest thread behind."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import seal
    plain = tmp_path / "plain"
    plain.write_bytes(os.urandom(9 * 1024 * 1024))
    fresh = []
    taken = encryption._Buffers.take

    def counting_take(buffers):
        with buffers._lock:
            fresh.append(not buffers._free)
        return taken(buffers)
    monkeypatch.setattr(encryption._Buffers, "take", counting_take)
    with ThreadPoolExecutor(2) as pool:
        digest = seal.WrittenDigest(depth=2)
        encryption.encrypt_file(os.urandom(32), str(plain), str(tmp_path / "cipher"), REL, BOUND,
                                chunk_bytes=64 * 1024, pool=pool, digest=digest)
        digest.finish()
    assert len(fresh) == 2 * 144 and fresh.count(True) <= 30, fresh.count(True)

    sealed = encryption._seal
    calls = []

    def failing_seal(*args):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the disk went away")
        return sealed(*args)
    monkeypatch.setattr(encryption, "_seal", failing_seal)
    with pytest.raises(OSError, match="went away"):
        encryption.encrypt_tree(os.urandom(32), str(tmp_path), str(tmp_path / "again"), ["plain"], BOUND, workers=2,
                                digest=lambda: seal.WrittenDigest(depth=2))
    assert not [t for t in threading.enumerate() if t.name == "inferops-digest"]


def test_the_written_digest_hands_every_buffer_back_once_both_digests_have_it_also_when_aborted():
    import hashlib
    import threading
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import seal
    data = os.urandom(5 * 1000 + 3)
    digest = seal.WrittenDigest(chunk_bytes=1024, depth=1)
    back = []
    lock = threading.Lock()

    def handed(index):
        def done():
            with lock:
                back.append(index)
        return done
    for index, start in enumerate(range(0, len(data), 700)):
        digest.feed(memoryview(data)[start:start + 700], handed(index))
    assert digest.finish() == (len(data), hashlib.sha256(data).hexdigest(),
                               [hashlib.sha256(data[i:i + 1024]).hexdigest() for i in range(0, len(data), 1024)])
    assert sorted(back) == list(range(8))
    aborted, back[:] = seal.WrittenDigest(chunk_bytes=1024, depth=1), []
    aborted.feed(memoryview(data), handed(0))
    aborted.abort()
    assert back == [0]

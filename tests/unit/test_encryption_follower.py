"""Encrypting while CRIU writes (encryption.Follower): a file written in pieces, at any pace and of any size,
comes out as the ciphertext encrypt_file would give (it decrypts to the same bytes, each chunk in its place and
the last one marked), front to back so that seal.Follower hashes it as it grows; a file that shrinks is left to
be encrypted afterwards, an abort leaves nothing. And the format: the plaintext size follows from the file's,
the first format is still read."""

import hashlib
import os
import struct
import threading
import time

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core import encryption, seal

CHUNK = 64 * 1024
REL = "host/criu/pages-1.img"


def writer(path, data, pieces, pause=0.002):
    """Append ``data`` to ``path`` in ``pieces`` (sizes), as CRIU does: front to back, never going back."""
    def run():
        with open(path, "wb") as handle:
            at = 0
            for size in pieces:
                handle.write(data[at:at + size])
                handle.flush()
                at += size
                time.sleep(pause)
            handle.write(data[at:])
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def layout_dirs(tmp_path):
    source, target = tmp_path / "plain" / "host" / "criu", tmp_path / "store" / "host" / "criu"
    source.mkdir(parents=True)
    target.mkdir(parents=True)
    return source, target


def decrypt(key, target, out):
    encryption.decrypt_file({encryption.key_id(key): key}, str(target / "pages-1.img"), str(out), REL)
    return out.read_bytes()


@pytest.mark.parametrize("size, pieces", [
    (10 * CHUNK, [CHUNK] * 10),                     # whole chunks only: the last whole one is the last
    (10 * CHUNK + 17, [1000] * 300),                # small writes across chunk borders, then a tail
    (3 * CHUNK + 1, [3 * CHUNK]),                   # one byte beyond the held chunk, written after a pause
    (CHUNK // 2 + 3 * CHUNK, []),                   # all at once
])
def test_a_file_written_in_pieces_is_encrypted_as_it_grows_and_decrypts_to_the_same_bytes(tmp_path, size, pieces):
    key = os.urandom(32)
    source, target = layout_dirs(tmp_path)
    data = os.urandom(size)
    follower = encryption.Follower(key, str(source), str(target), prefix="host/criu", min_size=1,
                                   chunk_bytes=CHUNK, poll=0.001).start()
    thread = writer(str(source / "pages-1.img"), data, pieces)
    thread.join()
    assert follower.finish() == {REL}
    stored = (target / "pages-1.img")
    assert oct(stored.stat().st_mode & 0o777) == "0o600"
    assert stored.stat().st_size == encryption.HEADER.size + size + len(encryption._chunks(size, CHUNK)) * 16
    assert decrypt(key, target, tmp_path / "out") == data
    magic, _prefix, chunk_bytes, recorded = encryption.HEADER.unpack(stored.read_bytes()[:encryption.HEADER.size])
    assert (magic, chunk_bytes, recorded) == (encryption.MAGIC, CHUNK, 0)


def test_the_ciphertext_grows_front_to_back_so_its_digests_are_taken_while_it_is_written(tmp_path):
    key = os.urandom(32)
    source, target = layout_dirs(tmp_path)
    data = os.urandom(40 * CHUNK + 5)
    hashing = seal.Follower(str(target), prefix="host/criu", min_size=CHUNK, chunk_bytes=4 * CHUNK, workers=2,
                            poll=0.001).start()
    follower = encryption.Follower(key, str(source), str(target), prefix="host/criu", min_size=1,
                                   chunk_bytes=CHUNK, poll=0.001).start()
    writer(str(source / "pages-1.img"), data, [7000] * 400, pause=0.0005).join()
    assert follower.finish() == {REL}
    size, digest, chunks = hashing.finish()[REL]
    stored = (target / "pages-1.img").read_bytes()
    assert size == len(stored) and digest == hashlib.sha256(stored).hexdigest()
    assert len(chunks) == (len(stored) + 4 * CHUNK - 1) // (4 * CHUNK)
    assert decrypt(key, target, tmp_path / "out") == data


def test_small_files_are_left_to_encrypt_tree_and_a_file_that_shrinks_is_given_up(tmp_path):
    key = os.urandom(32)
    source, target = layout_dirs(tmp_path)
    follower = encryption.Follower(key, str(source), str(target), prefix="host/criu", min_size=4 * CHUNK,
                                   chunk_bytes=CHUNK, poll=0.001).start()
    (source / "core-1.img").write_bytes(b"small")
    path = source / "pages-1.img"
    path.write_bytes(os.urandom(6 * CHUNK))
    time.sleep(0.2)
    os.truncate(str(path), CHUNK)  # not what CRIU does: the follower must not publish a half
    assert follower.finish() == set()
    assert sorted(os.listdir(str(target))) == [], "nothing of the shrunk file is left in the store"


def test_abort_stops_and_removes_what_was_written(tmp_path):
    key = os.urandom(32)
    source, target = layout_dirs(tmp_path)
    follower = encryption.Follower(key, str(source), str(target), prefix="host/criu", min_size=1,
                                   chunk_bytes=CHUNK, poll=0.001).start()
    with open(str(source / "pages-1.img"), "wb") as handle:
        handle.write(os.urandom(5 * CHUNK))
        handle.flush()
        time.sleep(0.2)
        follower.abort()
    assert os.listdir(str(target)) == []


def test_the_plaintext_size_follows_from_the_file_and_a_cut_or_grown_file_is_refused(tmp_path):
    for size in (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK):
        stored = encryption.HEADER.size + size + len(encryption._chunks(size, CHUNK)) * encryption.TAG_BYTES
        assert encryption._plaintext_size(stored, CHUNK) == size
    assert encryption._plaintext_size(encryption.HEADER.size + 15, CHUNK) is None  # shorter than a tag
    # a whole chunk plus a bare tag: no plaintext encrypts to that (a last chunk is empty only when alone)
    assert encryption._plaintext_size(encryption.HEADER.size + CHUNK + 2 * encryption.TAG_BYTES, CHUNK) is None
    key = os.urandom(32)
    plain, cipher = tmp_path / "plain", tmp_path / "cipher"
    plain.write_bytes(os.urandom(3 * CHUNK + 9))
    encryption.encrypt_file(key, str(plain), str(cipher), REL, chunk_bytes=CHUNK)
    whole = cipher.read_bytes()
    for damaged in (whole[:-1], whole + b"\0", whole[:-(CHUNK + 9 + 32)] + whole[-(9 + 16):]):
        cipher.write_bytes(damaged)
        out = tmp_path / ("out-%d" % len(damaged))
        with pytest.raises(encryption.DecryptError, match="decrypt_failed:"):
            encryption.decrypt_file({encryption.key_id(key): key}, str(cipher), str(out), REL)


def test_files_of_the_first_format_are_still_read(tmp_path):
    """Snapshots encrypted before the format carried no size (MAGIC_V1: the size in the header) restore as before."""
    key = os.urandom(32)
    plain, cipher = tmp_path / "plain", tmp_path / "cipher"
    data = os.urandom(2 * CHUNK + 100)
    plain.write_bytes(data)
    encryption.encrypt_file(key, str(plain), str(cipher), REL, chunk_bytes=CHUNK)
    stored = bytearray(cipher.read_bytes())
    stored[:encryption.HEADER.size] = struct.pack("<8s8sIQ", encryption.MAGIC_V1, bytes(stored[8:16]), CHUNK, len(data))
    cipher.write_bytes(bytes(stored))
    encryption.decrypt_file({encryption.key_id(key): key}, str(cipher), str(tmp_path / "out"), REL)
    assert (tmp_path / "out").read_bytes() == data
    stored[20:28] = struct.pack("<Q", len(data) + 1)  # a v1 header whose size the file does not have
    cipher.write_bytes(bytes(stored))
    with pytest.raises(encryption.DecryptError, match="decrypt_failed:"):
        encryption.decrypt_file({encryption.key_id(key): key}, str(cipher), str(tmp_path / "out2"), REL)

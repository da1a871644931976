# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Encryption at rest: AES-256-GCM in chunks, so that it streams and runs on every core. PRIVATE.

A snapshot holds the engine's whole memory: weights, users' prompts in the KV cache, its secrets. With
a key, the files that hold process data -- the CRIU images, the container record (the environment)
and the canary -- are stored encrypted; the manifest, the checksums and the signature cover the
ciphertext, so that any node can verify a snapshot without the key, and only a node with the key can
restore it. Plaintext exists only in a private directory (0700, tmpfs by default) while CRIU writes or
reads it, and is removed afterwards, also on failure.

File format 2 (``MAGIC``): ``MAGIC | nonce prefix (8) | chunk size (4) | plaintext size (8)``, then the
chunks, each ``AES-256-GCM(file key, nonce = prefix | chunk index, aad = identity | generation | path | index |
last?)`` with its 16-byte tag. The file key is derived from the configured key for the snapshot's identity and
generation (HKDF-SHA256, ``Binding``), and the associated data binds every chunk to them and to its file and place:
chunks cannot be swapped, reordered, dropped, taken from another file, from another generation of the same pod or
from another pod's snapshot; any change is an authentication failure. Format 1 (the collection before 0.4: chunks
bound to their path only) is refused with the reason ``encryption_format:`` -- take a new snapshot.

Keys are 32 random bytes (``openssl rand 32 > key``, or their base64 or hex): from Ansible Vault as
text, or a root-owned 0600 file outside the snapshot store. Several keys may be configured for
restores (rotation); the manifest names the key a snapshot was encrypted with by its id.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import binascii
import functools
import hashlib
import os
import re
import stat
import struct
import threading
from concurrent.futures import ThreadPoolExecutor, wait

from ..base import layout
from ..base.errors import ParameterError, SnapshotError
from ..linux import fs
from . import keyscope, signature

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    HAS_CRYPTOGRAPHY = True
except ImportError:
    HAS_CRYPTOGRAPHY = False

ALGORITHM = "aes-256-gcm-chunked-v2"   # the manifest's encryption.algorithm: format 2, bound to identity and generation
MAGIC = b"IOSENC\x02\x00"
MAGIC_V1 = b"IOSENC\x01\x00"
HEADER = struct.Struct("<8s8sIQ")
CHUNK_BYTES = 4 * 1024 * 1024
TAG_BYTES = 16
# What is encrypted: everything that holds what the process had in memory or its environment.
ENCRYPTED = (layout.IMAGES_DIR + "/", layout.CONTAINER_RECORD, layout.CANARY)


class DecryptError(SnapshotError):
    """A file could not be decrypted: wrong key, or the ciphertext was changed."""


class Binding(object):
    """What every chunk of a snapshot is bound to besides its file and place: the snapshot's identity and generation
    (the manifest's, which the signature covers). The key that encrypts it is derived for exactly these from the
    configured one (HKDF-SHA256): the same configured key gives every pod and every generation a key of its own."""

    def __init__(self, identity, generation):
        self.identity = layout.identity_string(identity)
        self.generation = int(generation or 0)
        self._context = ("%s\n%d" % (self.identity, self.generation)).encode("utf-8")  # neither holds a newline

    @classmethod
    def of(cls, manifest_):
        return cls(manifest_["identity"], manifest_.get("generation"))

    def key(self, master):
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"inferops.snapshot encryption v2",
                    info=b"file key\n" + self._context).derive(master)

    def aad(self, relpath, index, last):
        # the path is the last variable field, followed by fixed-size ones: no two inputs give the same bytes
        return b"inferops.snapshot/v2\n" + self._context + b"\n" + relpath.encode("utf-8") + \
            struct.pack("<IB", index, 1 if last else 0)


def encrypts(relpath):
    return any(relpath == item or (item.endswith("/") and relpath.startswith(item)) for item in ENCRYPTED)


def key_id(key):
    return hashlib.sha256(b"inferops.snapshot encryption key id\n" + key).hexdigest()[:16]


def _decode_key_text(text):
    """The 32 key bytes that ``text`` spells in hex or base64, or None."""
    for decode in (binascii.unhexlify, lambda value: base64.b64decode(value, validate=True)):
        try:
            key = decode(text.strip())
        except (ValueError, binascii.Error, TypeError):
            continue
        if len(key) == 32:
            return key
    return None


def _may_be_key_text(text):
    return re.match(r"\A(?:[A-Za-z0-9+/]{40,46}={0,2}|[0-9a-fA-F]{60,68})\Z", text.strip()) is not None


def load_key(value, field="encryption_key", snapshot_dir=None):
    """32 key bytes from text (base64 or hex) or the path of a root-owned 0600 file outside the store.

    A base64 key may start with "/" (one in 64 does): text that spells a key and names no file is the key,
    and no message ever repeats text that could be one."""
    if not HAS_CRYPTOGRAPHY:
        raise ParameterError("%s: encrypting snapshots needs the Python library cryptography on this host "
                             "(pip install cryptography, or Debian's python3-cryptography)" % field, field=field)
    spelled = _decode_key_text(value)
    if spelled is not None and not os.path.isfile(value):
        return spelled
    if value.startswith("/"):
        try:
            st = os.stat(value)
            with open(value, "rb") as handle:
                data = handle.read(4096)
        except (IOError, OSError) as exc:
            if _may_be_key_text(value):  # a mistyped key, most likely: never into a message or a log
                raise ParameterError("%s: neither a 256-bit key (32 bytes as hex or base64) nor a readable key file "
                                     "(the value is not repeated here: it may be a key)" % field, field=field)
            raise ParameterError("%s: cannot read the key file %s: %s" % (field, value, exc.strerror or exc),
                                 field=field)
        if st.st_uid not in (0, os.geteuid()) or stat.S_IMODE(st.st_mode) & 0o077:
            raise ParameterError("%s: %s must be owned by root and mode 0600 or 0400 (it is uid %d, mode %o)"
                                 % (field, value, st.st_uid, stat.S_IMODE(st.st_mode)), field=field)
        if snapshot_dir:
            if signature.inside(value, signature.store_root(snapshot_dir)):
                raise ParameterError("%s: %s lies in the snapshot store; keep keys where the store cannot reach them"
                                     % (field, value), field=field)
        if len(data) == 32:
            return data
        key = _decode_key_text(data.decode("ascii", "replace"))
        if key is not None:
            return key
    raise ParameterError("%s: not a 256-bit key: give 32 bytes as hex or base64 (openssl rand -base64 32), or the path "
                         "of a file holding them" % field, field=field)


def load_keys(values, field="encryption_keys"):
    """{key id: key} of the keys a restore may decrypt with (keyscope.Scoped: with the identities each is for; an entry
    is the key, or {key: ..., identities: [namespace/service patterns]})."""
    keys = keyscope.Scoped()
    for index, value in enumerate(values or []):
        item = "%s[%d]" % (field, index)
        text, scope = keyscope.entry(value, item)
        key = load_key(text, item)
        keys[key_id(key)] = key
        keyscope.merge(keys.scopes, key_id(key), scope)
    return keys


def format_reason(described):
    """Why an encrypted snapshot (its manifest's ``encryption``) is not one this collection decrypts, or None."""
    if described and described.get("algorithm") != ALGORITHM:
        return ("encryption_format: the snapshot is encrypted as %s, whose chunks are bound to their path only (not to "
                "the snapshot's identity and generation); this collection restores %s only: take a new snapshot"
                % (described.get("algorithm"), ALGORITHM))
    return None


def cover_reason(manifest_, required):
    """Why a snapshot is not encrypted as this host requires (``required``: require_encryption), or holds a file in the
    clear that an encrypted snapshot keeps encrypted (a plaintext image or container record planted beside the
    ciphertext); None when it is fine."""
    described = manifest_.get("encryption")
    if not described:
        if required:
            return ("unencrypted: this host restores only encrypted snapshots (require_encryption: it has encryption "
                    "keys), and this one is stored in the clear")
        return None
    clear = sorted(item["path"] for item in manifest_["files"]
                   if encrypts(item["path"]) and item["path"] not in described["files"])
    if clear:
        return "unencrypted: %s of an encrypted snapshot %s stored in the clear" % (
            ", ".join(clear[:3]) + (" and %d more" % (len(clear) - 3) if len(clear) > 3 else ""),
            "is" if len(clear) == 1 else "are")
    return None


def _sealed_size(size, chunk_bytes):
    """The length of the encrypted file a header promises, by arithmetic: the header is not authenticated until its
    first chunk is, so nothing is built or allocated from it before the file's real length agrees."""
    return HEADER.size + size + max(1, (size + chunk_bytes - 1) // chunk_bytes) * TAG_BYTES


def _chunks(size, chunk_bytes):
    count = max(1, (size + chunk_bytes - 1) // chunk_bytes)
    return [(index, index * chunk_bytes, min(chunk_bytes, size - index * chunk_bytes)) for index in range(count)]


class _Buffers:
    """Reused chunk buffers. A fresh 4 MiB bytes object per chunk costs more than the cipher: in a worker
    thread glibc serves it from an arena it trims again on free, so every chunk page-faults its buffer in
    anew (measured here: 1.0 GB/s per thread that way, 3.6-7 GB/s into reused buffers)."""

    def __init__(self, size):
        self.size = size
        self._free = []
        self._lock = threading.Lock()

    def take(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        return bytearray(self.size)

    def give(self, buf):
        with self._lock:
            self._free.append(buf)


def _read_exactly(fd, view, offset):
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            return done
        done += n
    return done


def _write_all(fd, view, offset=None):
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        if offset is not None:
            offset += n


# AES-256-GCM through the cipher context's update_into, which writes into the caller's buffer: the AEAD
# class's encrypt()/decrypt() return a new object per chunk (above), and their *_into variants need
# cryptography >= 45 where nodes have their distribution's (Debian 12: 38). The bytes are the same AEAD:
# ciphertext, then the 16-byte tag. update_into needs room for one block more than it writes (SLACK).
SLACK = 15


def _seal(key, nonce, plain, aad, out):
    """AES-GCM of ``plain`` into ``out`` (len(plain) + TAG_BYTES; its buffer SLACK longer than ``plain``)."""
    encryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    encryptor.authenticate_additional_data(aad)
    written = encryptor.update_into(plain, out)
    encryptor.finalize()
    out[written:written + TAG_BYTES] = encryptor.tag


def _open(key, nonce, sealed, aad, out):
    """The plaintext of ``sealed`` (ciphertext + tag) into ``out`` (a buffer SLACK longer); InvalidTag when
    it does not authenticate under ``key``."""
    decryptor = Cipher(algorithms.AES(key), modes.GCM(nonce, bytes(sealed[-TAG_BYTES:]))).decryptor()
    decryptor.authenticate_additional_data(aad)
    written = decryptor.update_into(sealed[:-TAG_BYTES], out)
    decryptor.finalize()
    return written


def encrypt_file(key, source, target, relpath, binding, chunk_bytes=CHUNK_BYTES, pool=None, digest=None):
    """Encrypt ``source`` into ``target`` (0600) with the file key ``binding`` derives from ``key``; returns the
    ciphertext's size.

    The ciphertext is written front to back; the chunks are encrypted in ``pool``, at most a window ahead
    of the writer. ``digest`` (seal.WrittenDigest) is fed every byte written, from the writer's buffers,
    so that sealing need not read the ciphertext back to hash it."""
    prefix = os.urandom(8)
    key = binding.key(key)
    size = os.path.getsize(source)
    plan = _chunks(size, chunk_bytes)
    header = HEADER.pack(MAGIC, prefix, chunk_bytes, size)
    plain_buffers, sealed_buffers = _Buffers(chunk_bytes), _Buffers(chunk_bytes + TAG_BYTES + SLACK)
    fd_in = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fd_out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
    try:
        _write_all(fd_out, memoryview(header))
        if digest is not None:
            digest.feed(memoryview(header), lambda: None)

        def seal_chunk(item):
            index, offset, length = item
            plain, sealed = plain_buffers.take(), sealed_buffers.take()
            try:
                view = memoryview(plain)[:length]
                if _read_exactly(fd_in, view, offset) != length:
                    raise OSError("%s shrank while it was encrypted" % source)
                _seal(key, prefix + struct.pack("<I", index), view,
                      binding.aad(relpath, index, index == len(plan) - 1), memoryview(sealed))
            except BaseException:
                sealed_buffers.give(sealed)
                raise
            finally:
                plain_buffers.give(plain)
            return sealed, length + TAG_BYTES

        written = HEADER.size
        for sealed, length in bounded_map(pool, seal_chunk, plan):
            view = memoryview(sealed)[:length]
            _write_all(fd_out, view)
            if digest is None:
                sealed_buffers.give(sealed)
            else:  # the buffer is reused once the digest's threads have hashed it
                digest.feed(view, functools.partial(sealed_buffers.give, sealed))
            written += length
    finally:
        os.close(fd_in)
        os.close(fd_out)
    return written


def _header(head, relpath):
    """(nonce prefix, chunk bytes, plaintext size) of a file's header; DecryptError when it is none of format 2."""
    if len(head) != HEADER.size:
        raise DecryptError("decrypt_failed: %s is too short to be encrypted" % relpath)
    magic, prefix, chunk_bytes, size = HEADER.unpack(head)
    if magic == MAGIC_V1:
        raise DecryptError("decrypt_failed: %s is in encryption format 1 (chunks bound to their path only), which this "
                           "collection no longer decrypts" % relpath)
    if magic != MAGIC or not 0 < chunk_bytes <= 256 * 1024 * 1024:
        raise DecryptError("decrypt_failed: %s is not a file this collection encrypted" % relpath)
    return prefix, chunk_bytes, size


def decrypt_file(keys, source, target, relpath, binding, pool=None, fd=None):
    """Decrypt ``source`` into ``target`` (0600) with the right one of ``keys`` ({id: key}), the file key ``binding``
    derives from it; DecryptError otherwise.
    ``fd``: read the ciphertext through this descriptor (the one a restore holds: held.Held) instead of the path.

    Each chunk is read, authenticated and written at its place by a worker of ``pool``: the plaintext is
    read only after the whole file is written (CRIU restores from it), so the order does not matter."""
    fd_in = os.dup(fd) if fd is not None else os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        prefix, chunk_bytes, size = _header(os.pread(fd_in, HEADER.size, 0), relpath)
        expected = _sealed_size(size, chunk_bytes)
        if os.fstat(fd_in).st_size != expected:
            raise DecryptError("decrypt_failed: %s has %d bytes, its header promises %d"
                               % (relpath, os.fstat(fd_in).st_size, expected))
        derived = [binding.key(key) for key in keys.values()]
        plan = _chunks(size, chunk_bytes)
        sealed_buffers, plain_buffers = _Buffers(chunk_bytes + TAG_BYTES), _Buffers(chunk_bytes + SLACK)
        fd_out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, fs.FILE_MODE)
        try:
            # At its full size before the chunks land out of order (measured: 2 GiB written into /dev/shm by 2
            # threads in 1.0 s, against 1.2 s as the writes grow it)
            os.ftruncate(fd_out, size)

            def open_chunk(item):
                index, offset, length = item
                sealed, plain = sealed_buffers.take(), plain_buffers.take()
                try:
                    block = memoryview(sealed)[:length + TAG_BYTES]
                    if _read_exactly(fd_in, block, HEADER.size + offset + index * TAG_BYTES) != len(block):
                        raise DecryptError("decrypt_failed: %s shrank while it was decrypted" % relpath)
                    nonce, aad = prefix + struct.pack("<I", index), binding.aad(relpath, index, index == len(plan) - 1)
                    out = memoryview(plain)
                    for key in derived:
                        try:
                            _open(key, nonce, block, aad, out)
                            break
                        except InvalidTag:
                            continue
                    else:
                        raise DecryptError("decrypt_failed: chunk %d of %s does not authenticate (a wrong key, or "
                                           "the ciphertext was changed)" % (index, relpath))
                    _write_all(fd_out, out[:length], offset)
                finally:
                    sealed_buffers.give(sealed)
                    plain_buffers.give(plain)

            for _done in bounded_map(pool, open_chunk, plan):
                pass
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def bounded_map(pool, function, items, window=8):
    """``function`` over ``items`` in order, at most ``window`` ahead of the consumer (memory stays bounded).
    A failure is raised once the calls already submitted have ended: none still uses the caller's files."""
    if pool is None:
        for item in items:
            yield function(item)
        return
    pending = []
    try:
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= window:
                yield pending.pop(0).result()
        while pending:
            yield pending.pop(0).result()
    finally:
        for future in pending:
            future.cancel()
        wait(pending)


def encrypt_tree(key, source_dir, target_dir, relpaths, binding, workers=None, digest=None):
    """Encrypt ``relpaths`` of ``source_dir`` to the same paths below ``target_dir`` (directories 0700).

    With ``digest`` (a factory of seal.WrittenDigest) returns {relpath: (size, sha256, chunk digests)} of
    the ciphertext, hashed as it was written (sealing's ``known``); else {}."""
    digests = {}
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for rel in relpaths:
            fs.ensure_dir(os.path.dirname(os.path.join(target_dir, rel)))
            taking = digest() if digest is not None else None
            try:
                encrypt_file(key, os.path.join(source_dir, rel), os.path.join(target_dir, rel), rel, binding, pool=pool,
                             digest=taking)
            except BaseException:
                if taking is not None:
                    taking.abort()
                raise
            if taking is not None:
                digests[rel] = taking.finish()
    return digests


def decrypt_tree(keys, source_dir, target_dir, relpaths, binding, workers=None, files=None):
    """Decrypt ``relpaths`` of ``source_dir`` into ``target_dir``; ``files``: the descriptors a restore holds
    (held.Held), read instead of the paths."""
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for rel in relpaths:
            fs.ensure_dir(os.path.dirname(os.path.join(target_dir, rel)))
            decrypt_file(keys, os.path.join(source_dir, rel), os.path.join(target_dir, rel), rel, binding, pool=pool,
                         fd=files.fd(rel) if files is not None else None)


def decrypt_bytes(keys, data, relpath, binding):
    """The plaintext of a small encrypted file held in memory (as verified), with the right one of ``keys``;
    DecryptError otherwise. Authenticated chunk by chunk, as decrypt_file does."""
    prefix, chunk_bytes, size = _header(bytes(data[:HEADER.size]), relpath)
    if len(data) != _sealed_size(size, chunk_bytes):
        raise DecryptError("decrypt_failed: %s does not have the size its header promises" % relpath)
    derived = [binding.key(key) for key in keys.values()]
    plan = _chunks(size, chunk_bytes)
    plain = bytearray(size + SLACK)
    for index, offset, length in plan:
        start = HEADER.size + offset + index * TAG_BYTES
        nonce, aad = prefix + struct.pack("<I", index), binding.aad(relpath, index, index == len(plan) - 1)
        for key in derived:
            try:
                _open(key, nonce, memoryview(data)[start:start + length + TAG_BYTES], aad, memoryview(plain)[offset:])
                break
            except InvalidTag:
                continue
        else:
            raise DecryptError("decrypt_failed: chunk %d of %s does not authenticate (a wrong key, or the ciphertext "
                               "was changed)" % (index, relpath))
    return bytes(plain[:size])


def describe(key, relpaths, chunk_bytes=CHUNK_BYTES):
    """The manifest's ``encryption``: which files, how, with which key (by id)."""
    return {"algorithm": ALGORITHM, "chunk_bytes": chunk_bytes, "key_id": key_id(key), "files": sorted(relpaths)}

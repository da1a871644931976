# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who made a snapshot: an Ed25519 signature over its checksum list. PRIVATE to inferops.snapshot.

A restore resumes whatever memory the CRIU images hold, as root: a snapshot rewritten consistently
(images, checksums and manifest changed together) passes every content check. Only a signature by
a key the store cannot reach tells a generated snapshot from a forged one. ``signature.json`` signs
the exact bytes of ``checksum.sha256`` (which hash every file, the manifest included) with the
generating host's private key; a node that restores holds only public keys (several at once, for
rotation). The signature file itself is not in the checksum list it signs.

Keys are PEM: the private key PKCS#8 (``openssl genpkey -algorithm ed25519``), public keys
SubjectPublicKeyInfo (``openssl pkey -pubout``). The ``cryptography`` library does the work; it is
needed only where signing or verification is configured (on nodes: Debian's python3-cryptography).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import json
import os
import re
import stat
import traceback

from ..base import layout
from ..base.errors import ParameterError
from ..linux import fs
from . import keyscope

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    HAS_CRYPTOGRAPHY = True
    CRYPTOGRAPHY_IMPORT_ERROR = None
except ImportError:
    HAS_CRYPTOGRAPHY = False
    CRYPTOGRAPHY_IMPORT_ERROR = traceback.format_exc()

CONTEXT = b"inferops.snapshot signature v1\n"   # what is signed: CONTEXT + the bytes of checksum.sha256
ALGORITHM = "ed25519"


def _require(field):
    if not HAS_CRYPTOGRAPHY:
        raise ParameterError("%s: signing and verifying snapshots needs the Python library cryptography on this "
                             "host (pip install cryptography, or Debian's python3-cryptography)" % field, field=field)


def _may_be_pem_body(text):
    """Whether ``text`` could be the base64 body of a PEM key (40 characters or more of base64, no dot) rather than the
    path of a key file (named like signing.pem)."""
    return re.match(r"\A[A-Za-z0-9+/=\s]{40,}\Z", text) is not None and "." not in text


def _read_key_text(value, field):
    """(PEM bytes, os.stat of its file or None): a key given as PEM text, or as the path of a PEM file
    owned by root (or us)."""
    if value.lstrip().startswith("-----BEGIN"):
        return value.encode(), None
    if not os.path.isabs(value):
        raise ParameterError("%s: neither a PEM key (-----BEGIN ...) nor an absolute path to one (the value is not "
                             "repeated here: it may be a key)" % field, field=field)
    try:
        st = os.stat(value)
        with open(value, "rb") as handle:
            data = handle.read(64 * 1024)
    except (IOError, OSError, ValueError) as exc:  # ValueError: a NUL in the path
        if _may_be_pem_body(value):  # base64 may start with "/": a key pasted without its -----BEGIN line
            raise ParameterError("%s: neither a PEM key (-----BEGIN ...) nor a readable key file (the value is not "
                                 "repeated here: it may be a key)" % field, field=field)
        raise ParameterError("%s: cannot read the key file %s: %s" % (field, value, exc), field=field)
    if st.st_uid not in (0, os.geteuid()):
        raise ParameterError("%s: %s is owned by uid %d; a key must be owned by root" % (field, value, st.st_uid),
                             field=field)
    return data, st


def key_id(public_key):
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_private_key(value, field="signing_key", snapshot_dir=None):
    """The signing key; a file must be 0600 (or 0400) and must not live in the snapshot store."""
    _require(field)
    data, st = _read_key_text(value, field)
    if st is not None:
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise ParameterError("%s: %s has mode %o; a private key must be 0600 or 0400" % (
                field, value, stat.S_IMODE(st.st_mode)), field=field)
        if snapshot_dir and inside(value, store_root(snapshot_dir)):
            raise ParameterError("%s: %s lies in the snapshot store %s; keep the signing key where the store cannot "
                                 "reach it (Ansible Vault, a key file outside the store)"
                                 % (field, value, store_root(snapshot_dir)), field=field)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ParameterError("%s: not a PEM private key without a password: %s" % (field, exc), field=field)
    if not isinstance(key, Ed25519PrivateKey):
        raise ParameterError("%s: the key is not an Ed25519 key (openssl genpkey -algorithm ed25519)" % field,
                             field=field)
    return key


def load_public_keys(values, field="trusted_keys"):
    """{key id: public key} of the trusted keys (keyscope.Scoped: with the identities each may sign). Each entry is a
    PEM text or path (a private key counts as its public half), or {key: ..., identities: [...]} (keyscope.py)."""
    keys = keyscope.Scoped()
    if not values:
        return keys
    _require(field)
    for index, value in enumerate(values):
        item = "%s[%d]" % (field, index)
        text, scope = keyscope.entry(value, item)
        data, _st = _read_key_text(text, item)
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError:
            try:
                key = serialization.load_pem_private_key(data, password=None).public_key()
            except (ValueError, TypeError) as exc:
                raise ParameterError("%s: not a PEM Ed25519 key: %s" % (item, exc), field=item)
        if not isinstance(key, Ed25519PublicKey):
            raise ParameterError("%s: the key is not an Ed25519 key" % item, field=item)
        keys[key_id(key)] = key
        keyscope.merge(keys.scopes, key_id(key), scope)
    return keys


def scope_reason(trusted, key, identity):
    """Why a snapshot of ``identity`` signed by ``key`` (a trusted key id) is refused here: the node's policy lets that
    key sign other identities only. None when it may sign this one."""
    if not trusted or key is None or not hasattr(trusted, "allows") or trusted.allows(key, identity):
        return None
    return ("signature_untrusted: signed by key %s, which this host trusts only for %s, not for %s (the identities of "
            "trusted_keys)" % (key, keyscope.describe(trusted.scope_of(key)), layout.identity_string(identity)))


def public_pem(private_key):
    """The SubjectPublicKeyInfo PEM of ``private_key``'s public half (what nodes are given to trust)."""
    return private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def new_private_pem():
    """A new Ed25519 private key, PKCS#8 PEM without a password (the controller's signing key)."""
    _require("signing_key")
    return Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption())


def key_directory(path):
    """snapshot_signing_key's ``path``, absolute and normalised (``~`` expanded), or a ParameterError naming it."""
    if not isinstance(path, str) or not path:
        raise ParameterError("path: give the absolute path of a directory on the controller for the signing key "
                             "(default %s), got %s" % (layout.CONTROLLER_KEYS_DIR, _kind(path)), field="path")
    if "\x00" in path:
        raise ParameterError("path: the path contains a NUL byte; give the directory's path without it", field="path")
    directory = os.path.expanduser(path)
    if not os.path.isabs(directory):
        raise ParameterError("path: %r is relative (to wherever ansible was started); give an absolute path, or one "
                             "that starts with ~" % path, field="path")
    return os.path.normpath(directory)


def _kind(value):
    if isinstance(value, str):
        return "an empty string"
    for kind, name in ((bool, "a boolean"), (dict, "a dict"), (list, "a list"), (int, "a number"), (float, "a number")):
        if isinstance(value, kind):
            return name
    return "a %s" % type(value).__name__


def _check_key_directory(directory):
    """An existing key directory must be a real directory of this user's that nobody else can read or write. It is
    checked, never changed (it may be ~ or /tmp, given by mistake): ParameterError naming path and the fix."""
    st = os.lstat(directory)
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        what, fix = "it is not a directory (a symbolic link is not followed)", "give a directory of this user's"
    elif st.st_uid != os.geteuid():
        what, fix = "it is uid %d's" % st.st_uid, "give a directory of this user's"
    elif mode & 0o077:
        what, fix = "it has mode %o" % mode, "chmod 0700 it"
    else:
        return
    raise ParameterError("path: %s must be a directory of this user's (uid %d) that nobody else can read or write "
                         "(mode 0700); %s: %s, or give a path that does not exist yet (it is made 0700). An existing "
                         "directory is never changed" % (directory, os.geteuid(), what, fix), field="path")


def _check_missing_directory(directory):
    """A key directory to be made: the nearest existing directory above it must be one."""
    head = os.path.dirname(directory)
    while not os.path.lexists(head):
        head = os.path.dirname(head)
    if not os.path.isdir(head):
        raise ParameterError("path: %s cannot be made: %s is not a directory; give another path" % (directory, head),
                             field="path")


def key_pair(directory, create=True):
    """The controller's signing key pair in ``directory`` (layout.SIGNING_KEY_FILE, 0600, and its public half
    layout.SIGNING_PUBLIC_FILE), made on first use (``create``; without it, nothing is written and a missing key is
    stood in for by one made in memory): {private_key, public_key_path, public_key (PEM), key_id, created}. The directory must be the user's
    own and closed to others: made 0700 when missing, refused (never changed) when it exists and is not."""
    _require("signing_key")
    directory = key_directory(directory)
    private, public = os.path.join(directory, layout.SIGNING_KEY_FILE), os.path.join(directory, layout.SIGNING_PUBLIC_FILE)
    if os.path.lexists(directory):
        _check_key_directory(directory)
    else:
        _check_missing_directory(directory)
        if create:
            fs.ensure_dir(directory)
            _check_key_directory(directory)
    created = False
    if not os.path.lexists(private):
        if not create:  # check mode: the public half of a key made now and never written, as the run's would be --
            # one nothing is signed by yet, so that a restore in check mode requires signatures as the run's will
            key = serialization.load_pem_private_key(new_private_pem(), password=None)
            return {"private_key": private, "public_key_path": public, "public_key": public_pem(key),
                    "key_id": key_id(key.public_key()), "created": True}
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(new_private_pem())
            handle.flush()
            os.fsync(handle.fileno())
        created = True
    key = load_private_key(private, "signing_key")
    text = public_pem(key)
    try:
        with open(public) as handle:
            current = handle.read()
    except (IOError, OSError):
        current = None
    if current != text:
        if create:  # without create (check mode) nothing is written: the public half would be
            fs.write_file_atomic(public, text.encode(), mode=0o644)
        created = True
    return {"private_key": private, "public_key_path": public, "public_key": text,
            "key_id": key_id(key.public_key()), "created": created}


def store_root(snapshot_dir):
    """The snapshot root of ``<root>/<namespace>/<service>/<instance>/<pod>``."""
    root = os.path.normpath(snapshot_dir)
    for _level in layout.IDENTITY_KEYS:
        root = os.path.dirname(root)
    return root


def inside(path, root):
    path, root = os.path.realpath(path), os.path.realpath(root)
    return root != "/" and os.path.commonpath([path, root]) == root


def encode(document):
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def document(checksums, private_key):
    """The signature document of the exact bytes ``checksums`` (a checksum.sha256) by ``private_key``: what sign()
    writes, and what the controller's signer (plugins/action/host_checkpoint.py) sends down to the node."""
    public = private_key.public_key()
    return {"schema_version": 1, "algorithm": ALGORITHM, "key_id": key_id(public),
            "checksums_sha256": hashlib.sha256(checksums).hexdigest(),
            "signature": base64.b64encode(private_key.sign(CONTEXT + checksums)).decode()}


def sign_detached(private_key, data):
    """The base64 Ed25519 signature of ``data`` by ``private_key`` (a statement of the latest generation's)."""
    return base64.b64encode(private_key.sign(data)).decode()


def verify_detached(public_key, signed, data):
    """Whether ``signed`` (base64, in the one form sign_detached writes) is ``public_key``'s signature of ``data``."""
    try:
        raw = base64.b64decode(signed, validate=True)
        if base64.b64encode(raw).decode() != signed:
            return False
        public_key.verify(raw, data)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def sign(directory, private_key):
    """Write signature.json beside checksum.sha256 in ``directory`` (a staging directory)."""
    with open(os.path.join(directory, layout.CHECKSUMS), "rb") as handle:
        checksums = handle.read()
    signed = document(checksums, private_key)
    fs.write_file_atomic(os.path.join(directory, layout.SIGNATURE), encode(signed))
    return signed


def write(directory, signed):
    """Write a signature document made elsewhere (the controller) beside the checksum.sha256 it signs, in ``directory``
    (a staging directory); ValueError when it is not the canonical document of that very list."""
    with open(os.path.join(directory, layout.CHECKSUMS), "rb") as handle:
        checksums = handle.read()
    if not isinstance(signed, dict) or signed.get("checksums_sha256") != hashlib.sha256(checksums).hexdigest():
        raise ValueError("the signature is not of this %s" % layout.CHECKSUMS)
    if set(signed) != {"schema_version", "algorithm", "key_id", "checksums_sha256", "signature"} or \
            signed["algorithm"] != ALGORITHM or signed["schema_version"] != 1:
        raise ValueError("not a signature document")
    fs.write_file_atomic(os.path.join(directory, layout.SIGNATURE), encode(signed))
    return signed


def check(directory, trusted, checksums=None, document=None):
    """(authenticated, reason or None, key id or None) of a published snapshot against ``trusted``
    ({key id: public key}). Without trusted keys nothing is authenticated and nothing is refused.
    ``checksums`` / ``document``: the bytes of checksum.sha256 and signature.json the caller read (and goes on
    using); read here otherwise."""
    path = os.path.join(directory, layout.SIGNATURE)
    if not trusted:
        return False, None, None
    if document is None and (not os.path.isfile(path) or os.path.islink(path)):
        return False, "unsigned: the snapshot has no %s, and this host trusts only signed snapshots" % layout.SIGNATURE, None
    try:
        raw = document
        if raw is None:
            with open(path, "rb") as handle:
                raw = handle.read(64 * 1024)
        document = json.loads(raw.decode("utf-8"))
        if checksums is None:
            with open(os.path.join(directory, layout.CHECKSUMS), "rb") as handle:
                checksums = handle.read()
        signature = base64.b64decode(document["signature"], validate=True)
        claimed = document["key_id"]
        if not isinstance(claimed, str):
            raise ValueError("key_id is a %s, not a key id" % type(claimed).__name__)
        if document.get("algorithm") != ALGORITHM or document.get("schema_version") != 1:
            raise ValueError("algorithm %r / version %r" % (document.get("algorithm"), document.get("schema_version")))
        # Exactly the bytes sign() writes: no other spelling of the same signature is accepted.
        if raw != encode(document) or base64.b64encode(signature).decode() != document["signature"]:
            raise ValueError("not in the canonical form")
        if document.get("checksums_sha256") != hashlib.sha256(checksums).hexdigest():
            raise ValueError("it signs another %s" % layout.CHECKSUMS)
    except (IOError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return False, "signature_invalid: %s is not a valid signature document (%s)" % (layout.SIGNATURE, exc), None
    key = trusted.get(claimed)
    if key is None:
        return False, ("signature_untrusted: signed by key %s, which this host does not trust (trusted: %s)"
                       % (str(claimed)[:16], ", ".join(sorted(trusted)))), str(claimed)[:16]
    try:
        key.verify(signature, CONTEXT + checksums)
    except InvalidSignature:
        return False, "signature_invalid: the signature by key %s does not match %s" % (claimed, layout.CHECKSUMS), claimed
    return True, None, claimed

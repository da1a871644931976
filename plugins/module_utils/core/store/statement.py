# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's signed statement of an identity's latest generation: ``.<pod>.latest.json``. PRIVATE.

A node's high-water mark (freshness.HighWater) says which generation *that node* has restored; a node that never
restored an identity has none, and would take back an older, validly signed snapshot a writer of the store put in
place. The statement closes that gap, as TUF's timestamp role does for a repository: the controller signs

    {identity, generation, fingerprint, issued_at, expires, key_id} + an Ed25519 signature

with each generation it publishes (plugins/action/host_checkpoint.py) and again, with a new time, whenever the
scheduled refresh runs (plugins/action/snapshot_refresh.py, playbooks/refresh.yml). A node that trusts signing keys
restores a snapshot only while a statement signed by a key it trusts for that identity says its generation is the
latest (or older than it: a newer one published before its statement was written), and the statement has not expired.
A store writer can replay an older statement only until it expires (layout.LATEST_VALIDITY), and only on a node whose
own mark is older than it. This file is the document's one home: made, parsed, checked, read and written here.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import hashlib
import json
import os
import re
import time

from ..base import layout
from ..base.errors import ParameterError
from ..linux import fs
from . import manifest, signature, status

CONTEXT = b"inferops.snapshot latest generation v1\n"   # what is signed: CONTEXT + the canonical body
FIELDS = ("schema_version", "identity", "generation", "fingerprint", "issued_at", "expires", "key_id")
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
LIMIT = 64 * 1024
_DIGEST = re.compile(r"\A[0-9a-f]{64}\Z")


def format_time(seconds):
    return time.strftime(TIME_FORMAT, time.gmtime(seconds))


def parse_time(text):
    return calendar.timegm(time.strptime(text, TIME_FORMAT))


def _body(document):
    return CONTEXT + json.dumps({key: document[key] for key in FIELDS}, sort_keys=True, separators=(",", ":")).encode()


def encode(document):
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def make(identity, generation, fingerprint, private_key, validity=layout.LATEST_VALIDITY, now=None):
    """The bytes of a statement, signed by ``private_key`` (the controller's), that ``generation`` (the snapshot whose
    checksum list hashes to ``fingerprint``) is the latest of ``identity``, issued ``now``, good for ``validity`` s."""
    now = int(time.time() if now is None else now)
    document = {"schema_version": 1, "identity": dict((key, identity[key]) for key in layout.IDENTITY_KEYS),
                "generation": int(generation), "fingerprint": fingerprint, "issued_at": format_time(now),
                "expires": format_time(now + int(validity)),
                "key_id": signature.key_id(private_key.public_key())}
    document["signature"] = signature.sign_detached(private_key, _body(document))
    return encode(document)


def parse(data):
    """The statement in ``data`` (bytes) with ``issued`` and ``until`` (seconds since 1970) added; ValueError saying
    what is wrong when it is not one. The signature is not checked here (``check``)."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise ValueError("not JSON: %s" % exc)
    if not isinstance(document, dict) or set(document) != set(FIELDS + ("signature",)):
        raise ValueError("not a statement of the latest generation (it has %s)"
                         % (", ".join(sorted(document)) if isinstance(document, dict) else type(document).__name__))
    identity = document["identity"]
    if document["schema_version"] != 1 or not isinstance(identity, dict) or \
            sorted(identity) != sorted(layout.IDENTITY_KEYS) or not all(isinstance(v, str) for v in identity.values()):
        raise ValueError("schema_version %r or identity %r is not the collection's"
                         % (document["schema_version"], identity))
    if not isinstance(document["generation"], int) or isinstance(document["generation"], bool) or \
            document["generation"] < 0:
        raise ValueError("generation %r is not a number of 0 or more" % (document["generation"],))
    if not isinstance(document["fingerprint"], str) or not _DIGEST.match(document["fingerprint"]):
        raise ValueError("fingerprint %r is not a SHA-256" % (document["fingerprint"],))
    if not isinstance(document["key_id"], str) or not isinstance(document["signature"], str):
        raise ValueError("key_id and signature must be text")
    try:
        document["issued"], document["until"] = parse_time(document["issued_at"]), parse_time(document["expires"])
    except (TypeError, ValueError):
        raise ValueError("issued_at %r or expires %r is not a time like 2026-01-31T12:00:00Z"
                         % (document["issued_at"], document["expires"]))
    return document


def _signed_by(document, keys):
    """Whether ``document`` carries a valid signature by the key it names, one of ``keys`` ({key id: public key})."""
    key = keys.get(document["key_id"])
    return key is not None and signature.verify_detached(key, document["signature"], _body(document))


def check(data, identity, trusted, now=None):
    """(statement, None) when ``data`` (the bytes read, None: no file) is a statement of ``identity`` signed by a key
    this host trusts for it, issued no later than this host's clock allows and not expired; else (None, the reason:
    stale:, statement_invalid:, clock_skew:)."""
    name, now = layout.identity_string(identity), time.time() if now is None else now
    if data is None:
        return None, ("stale: there is no statement of the latest generation of %s (%s); a host that trusts signing "
                      "keys restores a snapshot only while the controller's signed statement names it as current -- "
                      "run the refresh (playbooks/refresh.yml) or generate the snapshot again" % (name, layout.LATEST_SUFFIX))
    try:
        document = parse(data)
    except ValueError as exc:
        return None, "statement_invalid: the statement of the latest generation of %s cannot be used: %s" % (name, exc)
    if document["identity"] != identity:
        return None, "statement_invalid: the statement beside the snapshot of %s is of %s" % (
            name, layout.identity_string(document["identity"]))
    refused = signature.scope_reason(trusted, document["key_id"], identity)
    if document["key_id"] not in trusted or refused:
        return None, "statement_invalid: the statement of the latest generation of %s is signed by key %s, which this " \
                     "host does not trust for it (trusted_keys)" % (name, document["key_id"][:16])
    if not _signed_by(document, trusted):
        return None, "statement_invalid: the signature of the statement of the latest generation of %s does not " \
                     "match it" % name
    if document["issued"] > now + layout.CLOCK_SKEW:
        return None, ("clock_skew: the statement of the latest generation of %s was issued at %s, %d s ahead of this "
                      "host's clock (%s); set the controller's and this host's clocks right (NTP), then run the refresh "
                      "(playbooks/refresh.yml)" % (name, document["issued_at"], document["issued"] - now,
                                                   format_time(now)))
    if document["until"] <= now:
        return None, ("stale: the statement of the latest generation of %s expired at %s (this host's clock says %s): "
                      "nobody signed it again -- schedule the refresh (playbooks/refresh.yml) more often than its "
                      "validity, or generate the snapshot again" % (name, document["expires"], format_time(now)))
    return document, None


def floor_reason(document, recorded, fingerprint):
    """Why a snapshot (its verified manifest ``recorded``, its ``fingerprint``) is not the latest the statement allows:
    older than its generation, or another snapshot of that very generation (rollback:); None when it may be restored."""
    number, name = int(recorded.get("generation") or 0), layout.identity_string(recorded["identity"])
    if number < document["generation"]:
        return ("rollback: the snapshot is generation %d of %s, and the controller's statement of %s names generation "
                "%d as the latest; an older snapshot put back in place is refused -- restore the latest one, or "
                "generate a new one" % (number, name, document["issued_at"], document["generation"]))
    if number == document["generation"] and fingerprint != document["fingerprint"]:
        return ("rollback: the snapshot is generation %d of %s with fingerprint %s, and the controller's statement "
                "names another snapshot of that generation (%s); generate a new one" % (
                    number, name, fingerprint, document["fingerprint"]))
    return None


def read(snapshot_dir):
    """The bytes of the statement beside ``snapshot_dir`` (never through a link, at most LIMIT), or None when there is
    none. A file that is not a regular one or too large reads as garbage, for ``check`` to refuse."""
    try:
        fd = fs.open_regular(layout.latest_path(snapshot_dir))
    except FileNotFoundError:
        return None
    except (IOError, OSError) as exc:
        return ("unreadable: %s" % exc).encode()
    try:
        return fs.read_limited(fd, LIMIT, layout.LATEST_SUFFIX)
    except ValueError as exc:
        return ("unreadable: %s" % exc).encode()
    finally:
        os.close(fd)


def digest(data):
    return hashlib.sha256(data).hexdigest() if data is not None else None


ANY = object()   # write(): replace whatever statement is there (a generation's own, under its claim)


def accepted(text, identity, generation=None, fingerprint=None, field="controller_signing"):
    """The bytes of a statement the controller sent down (with a generation, ``controller_signing``; with the refresh,
    its ``statements``), checked to be one of ``identity`` -- and, given them, of that ``generation`` and
    ``fingerprint`` --; None when none was sent. ParameterError naming ``field`` otherwise. The node holds no trusted
    key here: whoever restores checks the signature."""
    if text is None:
        return None
    try:
        document = parse(text.encode("utf-8") if isinstance(text, str) else text)
    except ValueError as exc:
        raise ParameterError("%s: the statement of the latest generation cannot be used: %s" % (field, exc), field=field)
    wanted = (identity, generation, fingerprint)
    found = (document["identity"], document["generation"] if generation is not None else None,
             document["fingerprint"] if fingerprint is not None else None)
    if found != wanted:
        raise ParameterError("%s: the statement names generation %s (%s) of %s, not %s" % (
            field, document["generation"], document["fingerprint"], layout.identity_string(document["identity"]),
            "this snapshot" if generation is not None else layout.identity_string(identity)), field=field)
    return text.encode("utf-8") if isinstance(text, str) else text


def write(snapshot_dir, data, replaces=ANY):
    """Write the statement ``data`` beside ``snapshot_dir`` under the pod's lock; with ``replaces`` (the digest of the
    statement read before, None: there was none) only when the one there is still that one. Returns whether it was
    written. A refresh that read a statement before a generation wrote its own thus never puts the older one back."""
    path = layout.latest_path(snapshot_dir)
    with status.locked(snapshot_dir):
        if replaces is not ANY and digest(read(snapshot_dir)) != replaces:
            return False
        fs.write_file_atomic(path, data)
    return True


def _published_generation(published, identity, keys):
    """(generation, fingerprint) of a published snapshot ({checksums, signature, manifest}: the texts read from the
    store) signed by one of ``keys``, of ``identity``; None when it is not that."""
    if not published:
        return None
    try:
        checksums = published["checksums"].encode("utf-8")
        authenticated, _why, _key = signature.check("", keys, checksums, published["signature"].encode("utf-8"))
        recorded = published["manifest"].encode("utf-8")
        listed = manifest.parse_checksums(published["checksums"]).get(layout.MANIFEST)
        document = json.loads(recorded.decode("utf-8"))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not authenticated or listed != hashlib.sha256(recorded).hexdigest() or document.get("identity") != identity \
            or not isinstance(document.get("generation"), int):
        return None
    return document["generation"], hashlib.sha256(checksums).hexdigest()


def latest_known(found, ledger_entry, public_keys):
    """What the refresh signs again for one identity of the store: (generation, fingerprint, source) -- the highest of
    the controller's own record of what it published (``ledger_entry``'s ``published``), the statement in the store and
    the published snapshot, each only when signed by one of ``public_keys`` ({key id: key}, the controller's own).
    A store writer can hide the newer facts, never forge one: with the controller's record kept, hiding changes
    nothing. None when nothing can be vouched for."""
    identity, candidates = found["identity"], []
    record = (ledger_entry or {}).get("published")
    if isinstance(record, dict) and isinstance(record.get("generation"), int):
        candidates.append((record["generation"], record.get("fingerprint"), "ledger"))
    if found.get("statement") is not None:
        try:
            document = parse(found["statement"].encode("utf-8"))
        except ValueError:
            document = None
        if document and document["identity"] == identity and _signed_by(document, public_keys):
            candidates.append((document["generation"], document["fingerprint"], "statement"))
    published = _published_generation(found.get("published"), identity, public_keys)
    if published:
        candidates.append(published + ("snapshot",))
    candidates = [c for c in candidates if isinstance(c[1], str) and _DIGEST.match(c[1])]
    return max(candidates, key=lambda c: c[0]) if candidates else None

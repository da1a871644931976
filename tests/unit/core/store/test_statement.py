"""The controller's signed statement of an identity's latest generation: bound to its identity, its generation and
its snapshot, signed by a key the node trusts for that identity, refused once expired or when dated beyond the node's
clock; written beside the snapshot without ever putting an older one back over a newer one; and what the refresh
signs again -- the highest generation the controller can vouch for. Real Ed25519 keys and files."""

import hashlib
import json
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import signature, statement

IDENTITY = {"namespace": "tenant-a", "service": "qwen", "instance": "p0", "pod": "qwen-0"}
NOW = statement.parse_time("2026-12-07T16:00:00Z")
DAY = 24 * 3600
FINGERPRINT = "a" * 64


def trusting(*keys, scope=None):
    """What a node trusts: the public halves of ``keys`` (for ``scope`` patterns only, when given)."""
    entries = [signature.public_pem(key) if scope is None else {"key": signature.public_pem(key), "identities": scope}
               for key in keys]
    return signature.load_public_keys(entries)


def made(key, generation=10, identity=None, fingerprint=FINGERPRINT, now=NOW, validity=7 * DAY):
    return statement.make(identity or IDENTITY, generation, fingerprint, key, validity, now)


def test_a_statement_signed_by_a_trusted_key_for_its_identity_is_taken_until_it_expires():
    key = Ed25519PrivateKey.generate()
    data = made(key)
    document, refused = statement.check(data, IDENTITY, trusting(key), now=NOW + DAY)
    assert refused is None and document["generation"] == 10 and document["fingerprint"] == FINGERPRINT
    assert document["issued_at"] == "2026-12-07T16:00:00Z" and document["expires"] == "2026-12-14T16:00:00Z"
    assert data == statement.encode(json.loads(data)), "written in the one form encode() gives"
    document, refused = statement.check(data, IDENTITY, trusting(key), now=NOW + 7 * DAY)
    assert document is None and refused.startswith(
        "stale: the statement of the latest generation of tenant-a/qwen/p0/qwen-0 expired at 2026-12-14T16:00:00Z "
        "(this host's clock says 2026-12-14T16:00:00Z): nobody signed it again -- schedule the refresh"), refused


def test_no_statement_is_stale_and_says_how_to_get_one():
    document, refused = statement.check(None, IDENTITY, trusting(Ed25519PrivateKey.generate()), now=NOW)
    assert document is None and refused.startswith("stale: there is no statement of the latest generation of "
                                                   "tenant-a/qwen/p0/qwen-0"), refused
    assert "playbooks/refresh.yml" in refused


def test_a_statement_of_another_identity_another_key_or_a_changed_field_is_refused():
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    neighbour = dict(IDENTITY, pod="qwen-1")
    _doc, refused = statement.check(made(key, identity=neighbour), IDENTITY, trusting(key), now=NOW)
    assert refused == ("statement_invalid: the statement beside the snapshot of tenant-a/qwen/p0/qwen-0 is of "
                       "tenant-a/qwen/p0/qwen-1"), refused
    _doc, refused = statement.check(made(other), IDENTITY, trusting(key), now=NOW)
    assert refused.startswith("statement_invalid: the statement of the latest generation of tenant-a/qwen/p0/qwen-0 "
                              "is signed by key %s, which this host does not trust" % signature.key_id(
                                  other.public_key())), refused
    _doc, refused = statement.check(made(key), IDENTITY, trusting(key, scope=["tenant-b/*"]), now=NOW)
    assert refused.startswith("statement_invalid:") and "does not trust for it" in refused, "the key's scope holds"
    raised = json.loads(made(key, generation=10))
    raised["generation"] = 11   # a store writer raising the number of an older statement
    _doc, refused = statement.check(statement.encode(raised), IDENTITY, trusting(key), now=NOW)
    assert refused == ("statement_invalid: the signature of the statement of the latest generation of "
                       "tenant-a/qwen/p0/qwen-0 does not match it")
    for garbage, words in ((b"{", "not JSON"), (b'{"generation": 1}', "not a statement of the latest generation"),
                           (b"unreadable: [Errno 40] Too many levels of symbolic links", "not JSON")):
        _doc, refused = statement.check(garbage, IDENTITY, trusting(key), now=NOW)
        assert refused.startswith("statement_invalid: the statement of the latest generation of "
                                  "tenant-a/qwen/p0/qwen-0 cannot be used: %s" % words), refused


def test_a_statement_dated_beyond_the_nodes_clock_is_refused_a_few_minutes_are_forgiven():
    key = Ed25519PrivateKey.generate()
    ten_years = 10 * 365 * DAY
    _doc, refused = statement.check(made(key, now=NOW + ten_years), IDENTITY, trusting(key), now=NOW)
    assert refused.startswith("clock_skew: the statement of the latest generation of tenant-a/qwen/p0/qwen-0 was "
                              "issued at 2036-12-04T16:00:00Z, %d s ahead of this host's clock" % ten_years), refused
    document, refused = statement.check(made(key, now=NOW + layout.CLOCK_SKEW), IDENTITY, trusting(key), now=NOW)
    assert refused is None and document


def test_the_floor_refuses_an_older_generation_and_another_snapshot_of_the_same_one():
    document = statement.parse(made(Ed25519PrivateKey.generate(), generation=10))
    assert statement.floor_reason(document, dict(identity=IDENTITY, generation=10), FINGERPRINT) is None
    assert statement.floor_reason(document, dict(identity=IDENTITY, generation=11), "b" * 64) is None, \
        "a newer generation published before its statement was written"
    older = statement.floor_reason(document, dict(identity=IDENTITY, generation=9), "b" * 64)
    assert older.startswith("rollback: the snapshot is generation 9 of tenant-a/qwen/p0/qwen-0, and the controller's "
                            "statement of 2026-12-07T16:00:00Z names generation 10 as the latest"), older
    swapped = statement.floor_reason(document, dict(identity=IDENTITY, generation=10), "b" * 64)
    assert swapped.startswith("rollback: the snapshot is generation 10 of tenant-a/qwen/p0/qwen-0 with fingerprint "
                              + "b" * 64), swapped
    assert statement.floor_reason(document, dict(identity=IDENTITY), "b" * 64).startswith(
        "rollback: the snapshot is generation 0"), "no generation: 0"


def test_the_node_writes_only_a_statement_of_its_own_snapshot_sent_with_a_generation():
    key = Ed25519PrivateKey.generate()
    data = made(key, generation=10)
    assert statement.accepted(data.decode(), IDENTITY, 10, FINGERPRINT) == data
    assert statement.accepted(None, IDENTITY, 10, FINGERPRINT) is None
    with pytest.raises(ParameterError, match=r"controller_signing: the statement names generation 10 \(a+\) of "
                                             "tenant-a/qwen/p0/qwen-0, not this snapshot"):
        statement.accepted(data.decode(), IDENTITY, 11, FINGERPRINT)
    with pytest.raises(ParameterError, match="statements.0..statement: the statement names generation 10 .* of "
                                             "tenant-a/qwen/p0/qwen-0, not tenant-b/qwen/p0/qwen-0"):
        statement.accepted(data.decode(), dict(IDENTITY, namespace="tenant-b"), field="statements[0].statement")
    with pytest.raises(ParameterError, match="controller_signing: the statement of the latest generation cannot be "
                                             "used: not JSON"):
        statement.accepted("{", IDENTITY, 10, FINGERPRINT)


def test_a_write_that_read_an_older_statement_never_replaces_a_newer_one(tmp_path):
    key = Ed25519PrivateKey.generate()
    snap = str(tmp_path / "store" / "tenant-a" / "qwen" / "p0" / "qwen-0")
    os.makedirs(os.path.dirname(snap))
    assert statement.read(snap) is None
    first = made(key, generation=10)
    assert statement.write(snap, first, replaces=None), "none was there, none was read"
    read = statement.read(snap)
    assert read == first and oct(os.stat(layout.latest_path(snap)).st_mode & 0o777) == "0o600"
    newer = made(key, generation=11)
    assert statement.write(snap, newer)  # a generation's own, under its claim
    assert not statement.write(snap, made(key, generation=10, now=NOW + DAY), replaces=statement.digest(read))
    assert statement.read(snap) == newer, "the refresh that read generation 10 left generation 11 in place"
    os.unlink(layout.latest_path(snap))
    os.symlink(str(tmp_path / "elsewhere.json"), layout.latest_path(snap))
    _doc, refused = statement.check(statement.read(snap), IDENTITY, trusting(key), now=NOW)
    assert refused.startswith("statement_invalid:"), "a link is never followed"


def published(key, generation, identity=None):
    """What the host sends up of a published snapshot: its checksum list, signature and manifest."""
    identity = identity or IDENTITY
    recorded = json.dumps({"identity": identity, "generation": generation})
    checksums = "%s  %s\n" % (hashlib.sha256(recorded.encode()).hexdigest(), layout.MANIFEST)
    return {"checksums": checksums, "manifest": recorded,
            "signature": signature.encode(signature.document(checksums.encode(), key)).decode()}


def test_the_refresh_vouches_for_the_highest_generation_signed_by_its_own_key():
    key, forger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    own = {signature.key_id(key.public_key()): key.public_key()}
    found = {"identity": IDENTITY, "statement": made(key, generation=10).decode(), "published": published(key, 11)}
    generation, fingerprint, source = statement.latest_known(found, None, own)
    assert (generation, source) == (11, "snapshot") and len(fingerprint) == 64, "published after its statement"
    ledger = {"generation": 13, "published": {"generation": 12, "fingerprint": "c" * 64}}
    assert statement.latest_known(found, ledger, own) == (12, "c" * 64, "ledger"), "the store was rolled back"
    forged = dict(found, statement=made(forger, generation=99).decode(), published=published(forger, 98))
    assert statement.latest_known(forged, None, own) is None, "nothing the controller signed itself"
    other = dict(found, statement=made(key, generation=50, identity=dict(IDENTITY, pod="x")).decode(), published=None)
    assert statement.latest_known(other, None, own) is None, "another identity's statement vouches for nothing here"

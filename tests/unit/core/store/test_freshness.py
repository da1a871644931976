"""Freshness: a snapshot's signed generation only grows per identity, a node refuses one older than it
has restored (rollback:) or than the controller's statement names as the latest (every node, one that never restored
it included), and an expired one (expired:, stale:); a mark from a skewed clock gives way to the next statement; the
counters that keep them are root's alone, on a path nobody else can change.

Real files, real flocks, real Ed25519 keys, real processes racing for the high-water mark."""

import json
import multiprocessing
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import freshness, signature, statement

IDENTITY = {"namespace": "tenant-a", "service": "qwen", "instance": "p0", "pod": "qwen-0"}


def manifest(generation=None, identity=None, **extra):
    recorded = dict(extra, identity=identity or IDENTITY)
    if generation is not None:
        recorded["generation"] = generation
    return recorded


def mark(tmp_path):
    return freshness.HighWater(str(tmp_path / "state" / "generations.json"))


def test_the_next_generation_is_above_the_last_and_never_below_the_clock():
    assert freshness.next_generation(None, now=1000.5) == 1000
    assert freshness.next_generation(1000, now=1000.9) == 1001   # twice in one second: still above
    assert freshness.next_generation(5000, now=1000) == 5001     # a clock behind: the record wins
    assert freshness.next_generation(0, now=2000) == 2000        # a lost record: the clock keeps it above the past
    assert freshness.generation({}) == 0 and freshness.generation(manifest(7)) == 7


def test_an_older_generation_is_a_rollback_the_same_or_a_newer_one_is_admitted_and_raises_the_mark(tmp_path):
    high = mark(tmp_path)
    assert high.admit(manifest(10)) is None
    assert high.admit(manifest(10)) is None, "the same snapshot restores again"
    refused = high.admit(manifest(9))
    assert refused.startswith("rollback: the snapshot is generation 9 of tenant-a/qwen/p0/qwen-0, and this node has "
                              "already restored generation 10 of it"), refused
    assert high.admit(manifest(12)) is None
    assert high.admit(manifest(10)).startswith("rollback: the snapshot is generation 10"), "12 is the mark now"
    assert high.admit(manifest(None)).startswith("rollback: the snapshot is generation 0"), "no generation: 0"
    assert high.admit(manifest(1, identity=dict(IDENTITY, pod="qwen-1"))) is None, "each identity its own mark"
    record = json.loads(open(high.path).read())
    assert record["tenant-a/qwen/p0/qwen-0"]["generation"] == 12 and record["tenant-a/qwen/p0/qwen-1"]["generation"] == 1
    assert oct(os.stat(high.path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(high.path)).st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("damage", ["file mode", "directory writable", "link", "not a record"])
def test_a_record_that_cannot_be_trusted_admits_nothing(tmp_path, damage):
    high = mark(tmp_path)
    assert high.admit(manifest(3)) is None
    if damage == "file mode":
        os.chmod(high.path, 0o644)
    elif damage == "directory writable":
        os.chmod(os.path.dirname(high.path), 0o777)
    elif damage == "link":
        os.rename(high.path, high.path + ".real")
        os.symlink(high.path + ".real", high.path)
    else:
        with open(high.path, "w") as handle:
            handle.write('{"tenant-a/qwen/p0/qwen-0": 3}')
    refused = high.admit(manifest(4))
    assert refused is not None and refused.startswith("generations_unreadable: "), refused


def _admit(path, number, out):
    out.put(freshness.HighWater(path).admit(manifest(number)))


def test_restores_racing_for_the_mark_leave_the_highest_one(tmp_path):
    path = str(tmp_path / "state" / "generations.json")
    numbers = list(range(100, 124))
    out = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=_admit, args=(path, n, out)) for n in numbers]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    answers = [out.get(timeout=10) for _n in numbers]
    assert json.loads(open(path).read())["tenant-a/qwen/p0/qwen-0"]["generation"] == max(numbers)
    assert answers.count(None) >= 1 and all(a is None or a.startswith("rollback:") for a in answers)


def test_an_expired_snapshot_is_refused_by_this_hosts_clock():
    when = freshness.parse_time("2026-12-01T00:00:00Z")
    assert freshness.expires_at(3600, now=when) == "2026-12-01T01:00:00Z"
    assert freshness.expired_reason(manifest(1)) is None, "no expires: never"
    assert freshness.expired_reason(manifest(1, expires="2026-12-01T01:00:00Z"), now=when) is None
    late = freshness.expired_reason(manifest(1, expires="2026-12-01T01:00:00Z"), now=when + 3600)
    assert late.startswith("expired: the snapshot expired at 2026-12-01T01:00:00Z (this host's clock says "
                           "2026-12-01T01:00:00Z)"), late
    assert freshness.expired_reason(manifest(1, expires="soon"), now=when).startswith("expired: the snapshot's expiry")


def test_the_signers_ledger_gives_every_identity_a_growing_number_also_twice_in_a_second(tmp_path):
    ledger = freshness.SignerLedger(str(tmp_path / "keys" / layout.SIGNER_LEDGER_FILE))
    first = ledger.allocate(IDENTITY, now=5000)
    second = ledger.allocate(IDENTITY, now=5000)
    other = ledger.allocate(dict(IDENTITY, pod="qwen-1"), now=5000)
    assert (first, second, other) == (5000, 5001, 5000)
    lost = freshness.SignerLedger(str(tmp_path / "elsewhere" / layout.SIGNER_LEDGER_FILE))
    assert lost.allocate(IDENTITY, now=6000) == 6000 > second, "a lost ledger still counts above the past"


def test_a_record_whose_path_others_can_change_admits_nothing(tmp_path):
    """Every directory on the way to the record is checked, not only its own: a parent others can write (not sticky)
    or a link anywhere on the path and the record cannot be trusted."""
    base = tmp_path / "var"
    high = freshness.HighWater(str(base / "lib" / "state" / "generations.json"))
    assert high.admit(manifest(3)) is None
    os.chmod(str(base), 0o777)
    refused = high.admit(manifest(4))
    assert refused.startswith("generations_unreadable: ") and "%s must be a directory of root's that nobody else " \
        "can write (it is uid 0, mode 777)" % base in refused, refused
    os.chmod(str(base), 0o1777)  # sticky, as /tmp: nobody else can replace what is ours
    assert high.admit(manifest(4)) is None
    os.chmod(str(base), 0o755)
    os.rename(str(base / "lib"), str(tmp_path / "lib-real"))
    os.symlink(str(tmp_path / "lib-real"), str(base / "lib"))
    refused = high.admit(manifest(5))
    assert refused.startswith("generations_unreadable: ") and "%s is a symbolic link" % (base / "lib") in refused, \
        refused


def test_a_check_reads_the_mark_and_writes_nothing(tmp_path):
    high = mark(tmp_path)
    assert high.admit(manifest(10), record=False) is None
    assert not os.path.exists(str(tmp_path / "state")), "a check makes nothing"
    assert high.admit(manifest(10)) is None
    assert high.admit(manifest(9), record=False).startswith("rollback: the snapshot is generation 9")
    assert high.admit(manifest(12), record=False) is None
    assert json.loads(open(high.path).read())["tenant-a/qwen/p0/qwen-0"]["generation"] == 10


# -- the controller's statement and the node's mark ------------------------------------------------------------

KEY = Ed25519PrivateKey.generate()
TRUSTED = signature.load_public_keys([signature.public_pem(KEY)])
NOW = statement.parse_time("2026-12-07T16:00:00Z")


def published(store, number, issued, fingerprint=None):
    """Generation ``number`` of the pod published in the shared ``store``, with the controller's statement issued at
    ``issued``: (snapshot dir, its verified manifest, its fingerprint)."""
    snap = str(store / "tenant-a" / "qwen" / "p0" / "qwen-0")
    os.makedirs(os.path.dirname(snap), exist_ok=True)
    fingerprint = fingerprint or ("%064x" % number)
    statement.write(snap, statement.make(IDENTITY, number, fingerprint, KEY, now=issued))
    return snap, manifest(number), fingerprint


def test_an_older_generation_put_back_after_node_a_restored_the_newer_is_refused_on_node_b(tmp_path):
    store = tmp_path / "shared"
    node_a = freshness.Gate(freshness.HighWater(str(tmp_path / "a" / "generations.json")), now=NOW + 60)
    node_b = freshness.Gate(freshness.HighWater(str(tmp_path / "b" / "generations.json")), now=NOW + 60)
    snap, first, first_print = published(store, 100, NOW - 3600)
    old_statement = statement.read(snap)
    snap, second, second_print = published(store, 200, NOW)
    assert node_a.admit(snap, second, second_print, TRUSTED) is None
    with open(layout.latest_path(snap), "wb") as handle:  # the store put back as it was: snapshot and statement
        handle.write(old_statement)
    refused = node_a.admit(snap, first, first_print, TRUSTED)
    assert refused.startswith("rollback: the snapshot is generation 100 of tenant-a/qwen/p0/qwen-0, and this node has "
                              "already restored generation 200"), "the older statement cannot lift node A's mark"
    statement.write(snap, statement.make(IDENTITY, 200, second_print, KEY, now=NOW))
    refused = node_b.admit(snap, first, first_print, TRUSTED)
    assert refused.startswith("rollback: the snapshot is generation 100 of tenant-a/qwen/p0/qwen-0, and the "
                              "controller's statement of 2026-12-07T16:00:00Z names generation 200"), refused
    assert not os.path.exists(str(tmp_path / "b" / "generations.json")), "nothing recorded for a refused snapshot"
    without_keys = freshness.Gate(freshness.HighWater(str(tmp_path / "c" / "generations.json")), now=NOW + 60)
    assert without_keys.admit(snap, first, first_print, {}) is None, "no trusted key: the node's mark alone, as before"


def test_a_replayed_statement_holds_only_until_it_expires(tmp_path):
    store = tmp_path / "shared"
    snap, first, first_print = published(store, 100, NOW)
    node = freshness.Gate(freshness.HighWater(str(tmp_path / "n" / "generations.json")), now=NOW + 6 * 24 * 3600)
    assert node.admit(snap, first, first_print, TRUSTED) is None
    node.now = NOW + 7 * 24 * 3600
    assert node.admit(snap, first, first_print, TRUSTED).startswith("stale: the statement of the latest generation")


def test_a_mark_pushed_ahead_by_a_fast_clock_gives_way_to_the_next_statement(tmp_path):
    """A controller ten years fast signed generation G+10y and this node, its clock as fast, restored it. Clocks set
    right, the controller's next statement (its ledger lost: generation now) is issued later than the mark's and takes
    its place; an older statement does not."""
    store = tmp_path / "shared"
    ahead = 10 * 365 * 24 * 3600
    snap, skewed, skewed_print = published(store, NOW + ahead, NOW + ahead)
    node = freshness.Gate(freshness.HighWater(str(tmp_path / "n" / "generations.json")), now=NOW + ahead)
    assert node.admit(snap, skewed, skewed_print, TRUSTED) is None
    node.now = NOW + 60   # the clocks set right
    _snap, fixed, fixed_print = published(store, NOW, NOW)
    assert node.admit(snap, fixed, fixed_print, TRUSTED) is None, "the mark from the future gave way"
    record = json.loads(open(node.marks.path).read())["tenant-a/qwen/p0/qwen-0"]
    assert record["generation"] == NOW and record["issued"] == NOW
    _snap, earlier, earlier_print = published(store, NOW - 10, NOW - 10)
    refused = node.admit(snap, earlier, earlier_print, TRUSTED)
    assert refused.startswith("rollback: the snapshot is generation %d of tenant-a/qwen/p0/qwen-0, and this node has "
                              "already restored generation %d" % (NOW - 10, NOW)), refused


def test_a_mark_recorded_before_statements_gives_way_to_the_first_one(tmp_path):
    high = freshness.HighWater(str(tmp_path / "n" / "generations.json"))
    assert high.admit(manifest(5000)) is None   # restored before statements: a mark with no statement's time
    snap, older, older_print = published(tmp_path / "shared", 4000, NOW)
    assert freshness.Gate(high, now=NOW).admit(snap, older, older_print, TRUSTED) is None
    assert json.loads(open(high.path).read())["tenant-a/qwen/p0/qwen-0"]["generation"] == 4000


def test_the_signers_ledger_keeps_what_it_published_beside_what_it_gave_out(tmp_path):
    ledger = freshness.SignerLedger(str(tmp_path / "keys" / layout.SIGNER_LEDGER_FILE))
    number = ledger.allocate(IDENTITY, now=5000)
    assert ledger.published(IDENTITY, number, "f" * 64) is True
    assert ledger.allocate(IDENTITY, now=5000) == 5001, "publishing took no number back"
    entry = ledger.read()["tenant-a/qwen/p0/qwen-0"]
    assert entry["published"] == {"generation": 5000, "fingerprint": "f" * 64} and entry["generation"] == 5001
    assert ledger.published(IDENTITY, 4000, "e" * 64) is False, "an older publish never replaces a newer one"

"""The node side of snapshot_refresh: the store's statements and published snapshots sent up as read, and the
statements the controller signed again written back -- every entry checked before any is written, none over a
statement a generation wrote meanwhile. Real files and keys; the controller's half is test_snapshot_refresh's."""

import json
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError, SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import refresh
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import seal, statement

IDENTITY = {"namespace": "tenant-a", "service": "qwen", "instance": "p0", "pod": "qwen-0"}
KEY = Ed25519PrivateKey.generate()


def store(tmp_path):
    """A store with one published, signed snapshot (qwen-0) and a statement alone (qwen-1, its snapshot removed)."""
    root = tmp_path / "store"
    snap = layout.snapshot_dir(str(root), IDENTITY)
    staging = layout.staging_dir(snap)
    os.makedirs(os.path.join(staging, "host", "criu"))
    with open(os.path.join(staging, "host", "criu", "pages-1.img"), "wb") as handle:
        handle.write(b"x" * 4096)
    seal.seal(staging, {"identity": IDENTITY, "generation": 7, "created_at": "2026-12-07T16:00:00Z",
                        "engine": {"name": "docker"}, "runtime": {"name": "ascend-acl", "version": None},
                        "devices": []}, signing_key=KEY)
    seal.publish(staging, snap)
    gone = dict(IDENTITY, pod="qwen-1")
    statement.write(layout.snapshot_dir(str(root), gone), statement.make(gone, 5, "b" * 64, KEY))
    return str(root), snap


def test_the_survey_sends_up_each_identitys_statement_and_published_snapshot_as_read(tmp_path):
    root, snap = store(tmp_path)
    (tmp_path / "store" / "tenant-a" / "qwen" / "p0" / "not a pod name").mkdir()
    result = refresh.refresh({"root": root, "statements": None})
    found = {item["identity"]["pod"]: item for item in result["found"]}
    assert sorted(found) == ["qwen-0", "qwen-1"] and result["changed"] is False
    assert found["qwen-0"]["statement"] is None and found["qwen-0"]["statement_sha256"] is None
    published = found["qwen-0"]["published"]
    assert json.loads(published["manifest"])["generation"] == 7
    assert published["checksums"] == open(os.path.join(snap, layout.CHECKSUMS)).read()
    assert found["qwen-1"]["published"] is None
    assert found["qwen-1"]["statement_sha256"] == statement.digest(statement.read(layout.snapshot_dir(
        root, dict(IDENTITY, pod="qwen-1"))))


def test_every_statement_is_checked_before_any_is_written(tmp_path):
    root, snap = store(tmp_path)
    good = {"identity": IDENTITY, "statement": statement.make(IDENTITY, 7, "a" * 64, KEY).decode(), "replaces": None}
    for bad, words in ((dict(good, identity=dict(IDENTITY, pod="../x")), "statements[1].identity is invalid at pod"),
                       (dict(good, identity=dict(IDENTITY, pod="qwen-1")), "statements[1].statement: the statement "
                                                                           "names generation 7"),
                       (dict(good, extra=1), "statements[1]: set by snapshot_refresh's action plugin only")):
        with pytest.raises(SnapshotError) as error:
            refresh.refresh({"root": root, "statements": [good, bad]})
        assert words in error.value.msg, (words, error.value.msg)
        assert statement.read(snap) is None, "nothing was written"
    result = refresh.refresh({"root": root, "statements": [good]})
    assert result["written"] == [snap] and result["changed"]
    result = refresh.refresh({"root": root, "statements": [good]})   # it read "none", and there is one now
    assert result["written"] == [] and result["changed_meanwhile"] == [snap] and not result["changed"]


def test_a_signing_key_that_reaches_the_node_is_refused_naming_it(tmp_path):
    with pytest.raises(ParameterError, match="signing_key: is read on the controller by snapshot_refresh's action "
                                             "plugin"):
        refresh.refresh({"root": str(tmp_path), "signing_key": "-----BEGIN PRIVATE KEY-----", "statements": None})

"""Verified snapshots staged ahead (core/restore/cache.py), on the real (shared) dockerd, runc and CRIU with the sample
workload on the simulated NPU: a snapshot staged into the node's cache by the snapshot_stage module comes back
through the restore-on-create runtime without any of its content hashed, with identical answers; a staged copy
changed behind the cache's back (one byte, its mtime put back) is not used -- the snapshot is verified in full
and restored from itself; a copy of a snapshot that was regenerated since is not used either.

The workload's size: INFEROPS_STAGED_DEVICE_MB / INFEROPS_STAGED_HOST_MB (default 32 + 16 MB). The first-answer
seconds of the staged and the unstaged restore are printed (pytest -s), both measured in this one run."""

import json
import os
import shutil

import pytest

from _runtime_helpers import PROMPTS, WarmSnapshot, installed_runtime
from _runtime_helpers import recreated_containers_removed  # noqa: F401  # pylint: disable=unused-import  # the fixture
from conftest import flip_byte_keeping_mtime, run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import cache as stage
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, manifest, seal, status

WARMUP = 4.0
DEVICE_MB = int(os.environ.get("INFEROPS_STAGED_DEVICE_MB", "32"))
HOST_MB = int(os.environ.get("INFEROPS_STAGED_HOST_MB", "16"))


@pytest.fixture(scope="module")
def node(docker_env, tmp_path_factory):
    """The runtime installed through the role with the node's cache set (snapshot_node_stage_dir), removed at the end."""
    base = tmp_path_factory.mktemp("staged-node")
    with installed_runtime(base, snapshot_node_stage_dir=str(base / "stage")) as n:
        n.cache = n.vars["snapshot_node_stage_dir"]
        yield n


@pytest.fixture(scope="module")
def warm(node, docker_env, tmp_path_factory):
    w = WarmSnapshot(node, docker_env, tmp_path_factory.mktemp("staged-warm"), "stg", WARMUP, WORKLOAD_DEVICE_MB=DEVICE_MB,
                     WORKLOAD_HOST_MB=HOST_MB, ACL_SIM_DEVICE_MEM_BYTES="%dM" % (DEVICE_MB + 16))
    yield dict(pod=w.pod, snapshot_dir=w.snapshot_dir, expected=w.expected, info=w.info, restore=w.restore)
    w.remove()


def stage_module(node, warm, check=False):
    return run_module("snapshot_stage", {"snapshot_dir": warm["snapshot_dir"], "stage_dir": node.cache}, check=check)


def restored_record(node, c, warm):
    """The runtime's record of a restore that brought the warmed-up process back with identical answers."""
    assert [c.generate(p) for p in PROMPTS] == warm["expected"], "the device memory was not restored"
    assert c.info()["started_at"] == warm["info"]["started_at"], "not the warmed-up process"
    record = node.log_records(c.id)[-1]
    assert record["outcome"] == "restored" and record["reason"] is None, record
    return record


def test_a_staged_snapshot_is_restored_without_hashing_with_identical_answers(node, warm):
    settings = json.loads((node.lib_dir / "runtime.json").read_text())
    assert settings["stage_dir"] == node.cache, settings
    # unstaged first: the cache is configured and empty -> the snapshot is hashed as always
    c, unstaged = warm["restore"]()
    record = restored_record(node, c, warm)
    assert record["verify"]["staged"] is None and record["verify"]["staged_miss"] == "not staged", record["verify"]
    assert record["verify"]["hashed_bytes"] > DEVICE_MB * 1024 * 1024
    c.remove()

    assert stage_module(node, warm, check=True)["changed"] and not os.path.exists(node.cache), "check mode copies nothing"
    first = stage_module(node, warm)
    assert first["changed"] and first["staged"]["dir"].startswith(node.cache), first
    second = stage_module(node, warm)
    assert second["changed"] is False and second["staged"] == first["staged"], second

    c, staged = warm["restore"]()
    record = restored_record(node, c, warm)
    verify = record["verify"]
    assert verify["checksums"] == "staged" and verify["staged"] == first["staged"], verify
    manifest_bytes = os.lstat(os.path.join(warm["snapshot_dir"], layout.MANIFEST)).st_size
    assert verify["hashed_bytes"] == manifest_bytes, "no content hashed, only the manifest read: %s" % verify
    assert verify["overlapped"] is None, "nothing left to hash while CRIU restores"
    assert record["authenticated"] is False and record["verify"]["valid"]
    c.remove()
    print("\nstaged restore (%d + %d MB): first correct answer %.2f s after docker run staged, %.2f s unstaged; "
          "stages %s; load %s" % (DEVICE_MB, HOST_MB, staged, unstaged, record["durations"], os.getloadavg()))


def pages(directory):
    images = os.path.join(directory, layout.IMAGES_DIR)
    return os.path.join(images, sorted(n for n in os.listdir(images) if n.startswith("pages-"))[0])


def test_a_tampered_staged_copy_is_not_used_the_snapshot_is_verified_in_full(node, warm):
    staged = stage_module(node, warm)["staged"]
    copy_pages = pages(staged["dir"])
    flip_byte_keeping_mtime(copy_pages, 8192)
    c, _seconds = warm["restore"]()
    record = restored_record(node, c, warm)
    verify = record["verify"]
    assert verify["staged"] is None and "ctime_ns" in verify["staged_miss"], verify
    assert verify["hashed_bytes"] > DEVICE_MB * 1024 * 1024, "the snapshot itself was hashed: %s" % verify
    assert not os.path.exists(copy_pages), "the stale copy is dropped"
    c.remove()


def test_a_copy_of_a_snapshot_regenerated_since_is_not_used(node, warm):
    stage_module(node, warm)
    old = hashing.fingerprint(warm["snapshot_dir"])
    # regenerated: the same pod's snapshot sealed again (another manifest, so another fingerprint), published in place
    src = warm["snapshot_dir"]
    staging = layout.staging_dir(src)
    os.makedirs(staging, mode=0o700)
    for rel in manifest.list_files(src):
        if rel in (layout.MANIFEST, layout.CHECKSUMS, layout.SIGNATURE):
            continue
        os.makedirs(os.path.dirname(os.path.join(staging, rel)), mode=0o700, exist_ok=True)
        os.link(os.path.join(src, rel), os.path.join(staging, rel))
    recorded = manifest.load_manifest(src)
    fields = dict((k, v) for k, v in recorded.items() if k not in ("files", "total_bytes", "schema_version"))
    fields["created_at"] = "2030-01-01T00:00:00Z"
    _manifest, digest, _stats = seal.seal(staging, fields)
    aside = src + ".old"
    os.rename(src, aside)
    seal.publish(staging, src)
    status.update(src, "completed", checksum=hashing.fingerprint(src), total_bytes=recorded["total_bytes"])
    assert hashing.fingerprint(src) != old
    try:
        c, _seconds = warm["restore"]()
        record = restored_record(node, c, warm)
        assert record["verify"]["staged"] is None and record["verify"]["staged_miss"] == "not staged", record["verify"]
        found = stage.lookup(node.cache, fingerprint=old)
        assert found is not None, "the old copy is still there, unused"
        found.release()
        restaged = stage_module(node, warm)
        assert restaged["changed"] and restaged["retention"]["dropped"] == [old], restaged
        c.remove()
    finally:
        shutil.rmtree(aside, ignore_errors=True)

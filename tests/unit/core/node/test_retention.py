"""Retention decisions of snapshot_cleanup: what is failed, orphaned or stale, and that nothing in use
(restored from, being generated) is ever chosen. Pure functions over a real directory tree."""

import json
import os
import time

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import retention
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status

NOW = time.time()
POLICY = {"remove": ["failed", "orphaned", "stale"], "max_age": None, "generation_grace": 3600, "known_pods": None}
IMAGE = "sha256:" + "a" * 64


def pod_dir(root, pod, instance="p0"):
    return os.path.join(str(root), "ns", "svc", instance, pod)


def publish(root, pod, created_at=None, image=IMAGE, record="completed"):
    path = pod_dir(root, pod)
    os.makedirs(path)
    manifest = {"identity": {"namespace": "ns", "service": "svc", "instance": "p0", "pod": pod},
                "created_at": created_at or "2026-11-29T12:00:00.000000Z", "image": {"id": image}}
    with open(os.path.join(path, "manifest.json"), "w") as handle:
        json.dump(manifest, handle)
    if record:
        status.update(path, record, checksum="c" * 64)
    return path


def age(path, seconds):
    os.utime(path, (NOW - seconds, NOW - seconds))


def decide(root, npu_root=None, in_use=None, npu_in_use=None, images=None, **policy):
    entries = retention.scan(str(root), NOW)
    npu = retention.scan_npu(str(npu_root)) if npu_root else {}
    return retention.decide(entries, npu, dict(POLICY, **policy), in_use or {}, npu_in_use or {}, images, NOW)


def removed_paths(removals):
    return sorted(os.path.relpath(item["path"], item["path"].split("/ns/")[0]) for item in removals)


def test_failed_generation_goes_with_its_record_and_device_dir(tmp_path):
    root, npu = tmp_path / "host", tmp_path / "npu"
    status.update(pod_dir(root, "a"), "failed", reason="device snapshot failed: 507905")
    os.makedirs(pod_dir(npu, "a"))
    removals, kept = decide(root, npu)
    assert removed_paths(removals) == ["ns/svc/p0/.a.status.json", "ns/svc/p0/a"]
    assert {item["category"] for item in removals} == {"failed"}
    assert "507905" in removals[0]["reason"]
    assert kept == []


def test_completed_snapshot_is_kept_and_stale_ones_go(tmp_path):
    root = tmp_path / "host"
    publish(root, "fresh", created_at=time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(NOW - 60)))
    publish(root, "old", created_at=time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(NOW - 7200)))
    publish(root, "gone-image", image="sha256:" + "b" * 64)
    removals, kept = decide(root, max_age=3600 * 24 * 365 * 10, images={IMAGE})
    assert removed_paths(removals) == ["ns/svc/p0/.gone-image.status.json", "ns/svc/p0/gone-image"]
    assert "no longer on this host" in removals[0]["reason"]
    removals, kept = decide(root, max_age=3600, images=None)
    assert sorted({item["identity"]["pod"] for item in removals}) == ["gone-image", "old"]
    assert [item["identity"]["pod"] for item in kept] == ["fresh"]
    removals, kept = decide(root, max_age=3600, images=None, remove=["failed"])
    assert removals == [] and len(kept) == 3


def test_in_use_snapshots_are_never_removed(tmp_path):
    root = tmp_path / "host"
    path = publish(root, "restored", image="sha256:" + "b" * 64)
    status.update(path, "failed", reason="verify after publish failed")
    removals, kept = decide(root, in_use={path: "container restored"}, images={IMAGE}, max_age=1)
    assert removals == []
    assert kept[0]["reason"] == "in use: container restored was restored from it"


def test_generation_in_progress_is_left_alone_but_a_crashed_one_is_orphaned(tmp_path):
    root = tmp_path / "host"
    status.update(pod_dir(root, "busy"), "generating", reason="waiting for the warmup")
    os.makedirs(os.path.join(os.path.dirname(pod_dir(root, "busy")), ".busy.partial"))
    removals, kept = decide(root)
    assert removals == [] and kept[0]["reason"].startswith("in use: being generated")
    staging = os.path.join(os.path.dirname(pod_dir(root, "busy")), ".busy.partial")
    age(staging, 7200)
    removals, kept = decide(root, generation_grace=60)
    assert removals == [], "a generating record younger than the grace still means: in progress"
    record_path = layout.status_path(pod_dir(root, "busy"))
    record = json.load(open(record_path))
    record["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(NOW - 7200))
    with open(record_path, "w") as handle:
        json.dump(record, handle)
    removals, kept = decide(root, generation_grace=60)
    assert removed_paths(removals) == ["ns/svc/p0/.busy.partial", "ns/svc/p0/.busy.status.json"]
    assert {item["category"] for item in removals} == {"orphaned"}


def test_leftover_of_a_crashed_regeneration_goes_but_the_published_snapshot_stays(tmp_path):
    root = tmp_path / "host"
    publish(root, "a")
    leftover = os.path.join(os.path.dirname(pod_dir(root, "a")), ".a.old.4242")
    os.makedirs(leftover)
    age(leftover, 7200)
    removals, kept = decide(root, images={IMAGE})
    assert removed_paths(removals) == ["ns/svc/p0/.a.old.4242"]
    assert kept[0]["identity"]["pod"] == "a" and kept[0]["published"]


def test_record_of_a_deleted_snapshot_and_lonely_device_dirs_are_orphaned(tmp_path):
    root, npu = tmp_path / "host", tmp_path / "npu"
    path = publish(root, "deleted")
    os.rename(path, str(tmp_path / "elsewhere"))
    os.makedirs(pod_dir(npu, "lonely"))
    os.makedirs(pod_dir(npu, "engine"))
    removals, kept = decide(root, npu, npu_in_use={pod_dir(npu, "engine"): "container engine"})
    assert removed_paths(removals) == ["ns/svc/p0/.deleted.status.json", "ns/svc/p0/lonely"]
    assert "snapshot is gone" in removals[0]["reason"]
    assert [item["reason"] for item in kept] == ["in use: container engine engine records its device snapshot here"]


def test_unlisted_pods_of_a_known_service_are_orphaned_other_services_untouched(tmp_path):
    root = tmp_path / "host"
    publish(root, "current")
    publish(root, "scaled-away")
    other = os.path.join(str(root), "ns", "other-svc", "p0", "x")
    os.makedirs(other)
    known = [{"namespace": "ns", "service": "svc", "instance": "p0", "pod": "current"}]
    removals, kept = decide(root, known_pods=known, images={IMAGE})
    assert removed_paths(removals) == ["ns/svc/p0/.scaled-away.status.json", "ns/svc/p0/scaled-away"]
    assert sorted(item["identity"]["pod"] for item in kept) == ["current", "x"]


def test_symlinks_are_never_followed_or_removed(tmp_path):
    root = tmp_path / "host"
    target = tmp_path / "precious"
    target.mkdir()
    os.makedirs(os.path.dirname(pod_dir(root, "x")))
    os.symlink(str(target), os.path.join(os.path.dirname(pod_dir(root, "x")), ".evil.partial"))
    removals, kept = decide(root)
    assert removals == [] and kept == []


def test_policy_errors_name_the_field():
    with pytest.raises(ParameterError, match="remove: unknown category expired"):
        retention.check_policy(["expired"], None, 10, None)
    with pytest.raises(ParameterError, match="max_age: must be a positive"):
        retention.check_policy([], 0, 10, None)
    with pytest.raises(ParameterError, match=r"known_pods\[0\]: give namespace, service, instance and pod \(missing pod\)"):
        retention.check_policy([], None, 10, [{"namespace": "a", "service": "b", "instance": "c"}])


@pytest.mark.parametrize("pod, field", [
    ({"namespace": "ns", "service": "svc", "instance": "p0", "pod": "current "}, r"known_pods\[1\]\.pod"),
    ({"namespace": 1, "service": "svc", "instance": "p0", "pod": "x"}, r"known_pods\[1\]\.namespace"),
    ({"namespace": "ns", "service": ["svc"], "instance": "p0", "pod": "x"}, r"known_pods\[1\]\.service"),
    ({"namespace": "ns", "service": "svc", "instance": "p0", "pod": "x", "extra": "y"}, r"known_pods\[1\]"),
])
def test_known_pods_are_checked_as_identities(pod, field):
    good = {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "current"}
    with pytest.raises(ParameterError, match="^%s: " % field) as caught:
        retention.check_policy([], None, 10, [good, pod])
    assert caught.value.result["field"] == field.replace("\\", "")


def test_container_facts_expose_one_env_value_only(tmp_path):
    meta = tmp_path / "4242" / "root" / "run" / "inferops-snapshot"
    meta.mkdir(parents=True)
    (meta / "metadata.json").write_text(json.dumps({"restored": True, "snapshot_dir": "/s/ns/svc/p0/a//",
                                                    "env": {"TOKEN": "s3cret"}}))
    info = {"Id": "abc", "Name": "/a", "Image": IMAGE, "State": {"Running": True, "Pid": 4242, "Status": "running"},
            "Config": {"Image": "img", "Env": ["TOKEN=s3cret", "VLLM_NPU_SNAPSHOT_PATH=/n/ns/svc/p0/a/"]}}
    facts = retention.container_facts(info, proc=str(tmp_path))
    assert facts["npu_snapshot_path"] == "/n/ns/svc/p0/a" and facts["restored_from"] == "/s/ns/svc/p0/a"
    assert "s3cret" not in repr(facts)


def test_a_live_claim_keeps_the_pod_and_a_lapsed_one_goes_with_it(tmp_path):
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
    root = tmp_path / "host"
    status.update(pod_dir(root, "a"), "failed", reason="host snapshot failed")
    claim.take(pod_dir(root, "a"), "run-a", lease=3600)  # expires long after NOW... in real time too
    removals, kept = decide(root, remove=["failed"])
    assert removals == [] and kept[0]["reason"].startswith("in use: being generated (generation run-a")
    claim.take(pod_dir(root, "a"), "run-a", lease=1, now=0)  # lapsed long ago
    removals, kept = decide(root, remove=["failed"])
    assert removed_paths(removals) == ["ns/svc/p0/.a.generation.json", "ns/svc/p0/.a.status.json"], removals

"""--diff of the modules that change files or containers (plugins/module_utils/_diff.py): what cleanup removes, what a
restore recreates, what a checkpoint writes, what staging copies and what a canary records -- from the module's own
result, so the diff and the result agree; a run that changed nothing shows no difference. The modules' attributes
say so (diff_mode: full)."""

from conftest import REPO
from ansible_collections.inferops.snapshot.plugins.module_utils import _diff
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout

from unit.project.test_docs import gen

SNAP = "/var/lib/inferops/snapshots/default/qwen/p0/qwen-p0-0"


def lines(text):
    return text.splitlines()


def test_cleanup_lists_each_path_it_removes_with_why():
    result = {"removed": [
        {"path": "/s/default/qwen/p1/qwen-p1-0", "kind": "snapshot", "category": "stale", "reason": "older than 3600 s"},
        {"path": "/s/default/qwen/p0/.qwen-p0-0.status.json", "kind": "status", "category": "failed",
         "reason": "generation failed: boom"}],
        "work_dirs_removed": ["/tmp/inferops-dump-77"]}
    diff = _diff.cleanup({"root": "/s"}, result)
    assert lines(diff["before"]) == [
        "/s/default/qwen/p0/.qwen-p0-0.status.json  (failed status: generation failed: boom)",
        "/s/default/qwen/p1/qwen-p1-0  (stale snapshot: older than 3600 s)",
        "/tmp/inferops-dump-77  (the CRIU work dir of a killed checkpoint or restore)"]
    assert diff["after"] == "" and diff["before_header"] == "/s before the cleanup"
    nothing = _diff.cleanup({"root": "/s"}, {"removed": []})
    assert nothing["before"] == nothing["after"] == ""
    put = _diff.cleanup({"root": "/s"}, {"removed": [], "put_back": [{"path": "/s/a/b/c/p", "from": "/s/a/b/c/.p.old.7"}]})
    assert lines(put["before"]) == ["/s/a/b/c/.p.old.7  (a snapshot a killed publish left aside)"]
    assert lines(put["after"]) == ["/s/a/b/c/p  (put back from /s/a/b/c/.p.old.7)"]


PARAMS = {"container": "qwen-p0-0", "engine": "docker", "metadata_path": "/run/inferops-snapshot/metadata.json",
          "env": {"POD_IP": "10.0.0.12"}}


def test_restore_says_what_it_recreated_and_from_what():
    result = {"changed": True, "snapshot_dir": SNAP, "restored": True, "reason": None, "created": True,
              "container_id": "a" * 64, "method": "runtime", "device_actions": ["restore", "unlock"],
              "metadata_env_keys": ["POD_IP"]}
    diff = _diff.restore(PARAMS, result)
    assert lines(diff["before"]) == ["container qwen-p0-0: absent"]
    assert lines(diff["after"]) == [
        "container qwen-p0-0: restored from %s (method runtime), device: restore, unlock" % SNAP,
        "container qwen-p0-0: created from the snapshot's record",
        "container qwen-p0-0: wrote /run/inferops-snapshot/metadata.json (env POD_IP)"]
    assert "10.0.0.12" not in diff["after"], "values never appear, names only"


def test_restore_of_a_stopped_container_that_starts_cold_says_why():
    result = {"changed": True, "snapshot_dir": SNAP, "restored": False, "created": False, "container_id": "b" * 64,
              "reason": "checksum_mismatch: host/criu/pages-1.img"}
    diff = _diff.restore(PARAMS, result)
    assert lines(diff["before"]) == ["container qwen-p0-0: stopped"]
    assert lines(diff["after"]) == ["container qwen-p0-0: started cold: checksum_mismatch: host/criu/pages-1.img"]


def test_restore_in_check_mode_says_what_would_happen_and_a_running_container_shows_nothing():
    check = _diff.restore(PARAMS, {"changed": True, "snapshot_dir": SNAP, "restored": True, "reason": None})
    assert lines(check["before"]) == ["container qwen-p0-0: not running"]
    assert lines(check["after"])[0] == "container qwen-p0-0: would be restored from %s" % SNAP
    assert check["after_header"].endswith("(check mode)")
    running = _diff.restore(PARAMS, {"changed": False, "snapshot_dir": SNAP, "restored": None})
    assert running["before"] == running["after"]


def test_checkpoint_lists_the_files_it_published_and_the_status_record(tmp_path):
    snapshot = tmp_path / "default" / "qwen" / "p0" / "qwen-p0-0"
    (snapshot / "host").mkdir(parents=True)
    (snapshot / "checksum.sha256").write_text("%s  host/criu/pages-1.img\n%s  manifest.json\n" % ("0" * 64, "1" * 64))
    result = {"changed": True, "snapshot_dir": str(snapshot), "status": "completed", "checksum": "c" * 64,
              "files": 2, "total_bytes": 4096, "replaced_because": ["image_mismatch: another image"]}
    diff = _diff.checkpoint({"snapshot_dir": str(snapshot)}, result)
    assert lines(diff["before"]) == ["%s/  (published; replaced because: image_mismatch: another image)" % snapshot]
    assert lines(diff["after"]) == [
        "%s/  (published: 2 files, 4096 bytes, checksum %s)" % (snapshot, "c" * 64),
        "%s/checksum.sha256" % snapshot, "%s/host/criu/pages-1.img" % snapshot, "%s/manifest.json" % snapshot,
        "%s/.qwen-p0-0.status.json: completed" % snapshot.parent]
    check = _diff.checkpoint({"snapshot_dir": str(snapshot)}, {"changed": True, "snapshot_dir": str(snapshot)})
    assert lines(check["after"])[0] == "%s/  (would be published)" % snapshot
    kept = _diff.checkpoint({"snapshot_dir": str(snapshot)}, {"changed": False, "status": "completed"})
    assert kept["before"] == kept["after"]


def test_stage_and_canary_show_what_they_write():
    staged = _diff.stage({}, {"changed": True, "snapshot_dir": SNAP, "stage_dir": "/c", "entry": "/c/ab12",
                              "bytes": 10, "reason": "not staged", "staged": None})
    copy = layout.stage_content("/c/ab12")
    assert lines(staged["after"]) == ["%s  (a verified copy of %s, 10 bytes; not staged)" % (copy, SNAP)]
    canary = _diff.canary(None, {"request": {"url": "http://127.0.0.1/x"}, "answer": {"status": 200}}, "/p/canary.json")
    assert canary["before"] == "" and '"status": 200' in canary["after"]


def test_every_module_that_writes_files_or_containers_supports_diff_mode():
    through_diff = {"host_checkpoint", "snapshot_restore", "snapshot_cleanup", "snapshot_stage", "snapshot_canary",
                    "snapshot_node_files"}
    own_diff = {"snapshot_status", "npu_snapshot_backup", "npu_snapshot_lock", "k8s_snapshot_pods", "k8s_snapshot_status",
                "snapshot_node_containerd"}
    for path in sorted((REPO / "plugins" / "modules").glob("*.py")):
        support = gen.read_module(str(path))["doc"]["attributes"]["diff_mode"]["support"]
        assert support == ("full" if path.stem in through_diff | own_diff else "none"), path.stem
        assert ("_diff." in path.read_text()) == (path.stem in through_diff), path.stem

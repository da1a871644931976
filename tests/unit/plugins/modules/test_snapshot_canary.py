"""Snapshot_canary's headers are no_log: a header's value -- an engine's bearer token -- never reaches a
task result, a failure's message or the invocation; only canary.json (0600) keeps it, to ask again at a restore.
The real module through ansible, against the sample workload."""

import json
import os
import stat

from conftest import run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout

SECRET = "Bearer s3cr3t-canary-token-4f1d"
IDENTITY = {"namespace": "default", "service": "canary", "instance": "p0", "pod": "canary-0"}


def test_a_headers_value_is_kept_in_canary_json_and_never_in_a_result(workload, tmp_path):
    snapshot_dir = str(tmp_path / "snapshots" / "default" / "canary" / "p0" / "canary-0")
    args = {"pid": workload.pid, "snapshot_dir": snapshot_dir, "identity": IDENTITY, "compare": "json:answer",
            "url": workload.url + "/v1/generate?prompt=canary", "headers": {"Authorization": SECRET}}
    recorded = run_module("snapshot_canary", args, extra_env={"ANSIBLE_VERBOSITY": "3"})  # the invocation shown
    assert recorded["changed"] and recorded["answer"]["status"] == 200, recorded
    assert SECRET not in json.dumps(recorded) and "s3cr3t" not in json.dumps(recorded)
    assert recorded["invocation"]["module_args"]["headers"] == {"Authorization": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"}
    canary = os.path.join(layout.staging_dir(snapshot_dir), layout.CANARY)
    assert stat.S_IMODE(os.stat(canary).st_mode) == 0o600
    with open(canary) as handle:
        assert json.load(handle)["request"]["headers"] == {"Authorization": SECRET}, "asked again at every restore"
    refused = run_module("snapshot_canary", dict(args, url=workload.url + "/no-such-path"))
    assert refused["failed"] and "HTTP 404" in refused["msg"], refused
    assert SECRET not in json.dumps(refused)


def test_a_pods_container_on_containerd_is_found_through_that_containerd(tmp_path):
    """containerd://<id> (a pod's containerID on a containerd node) is looked up on containerd_address, not in
    Docker: the lookup on a socket that is not there fails naming it, before anything is asked or written."""
    snapshot_dir = str(tmp_path / "snapshots" / "default" / "canary" / "p0" / "canary-0")
    missing = str(tmp_path / "no-containerd.sock")
    refused = run_module("snapshot_canary", {"container": "containerd://" + "0" * 64, "containerd_address": missing,
                                             "snapshot_dir": snapshot_dir, "identity": IDENTITY,
                                             "url": "http://127.0.0.1:8000/v1/generate?prompt=canary"})
    assert refused["failed"] and refused["msg"].startswith("ctr containers info %s failed" % ("0" * 64)), refused
    assert missing in refused["msg"] and "docker" not in refused["msg"].lower(), refused
    assert not os.path.lexists(str(tmp_path / "snapshots")), "nothing written"

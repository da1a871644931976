"""Bad input to a module is a clear error naming the option and its form, before anything is created:
an ``identity`` given as a string -- ansible-core's own check used to fail first with "dictionary
requested, could not parse JSON or key=value", naming no option -- on every module that takes one, through the
real AnsiballZ and argument spec. And an option that is wrong is refused before a generation claim is written (a
failed task left one holding the pod for generation_lease)."""

import json
import os
import stat

import pytest

from conftest import run_module

MODULES = {
    "host_checkpoint": {"container": "nothing-here", "snapshot_dir": "/var/lib/inferops/snapshots/a/b/c/d"},
    "npu_snapshot_backup": {"container": "nothing-here", "snapshot_dir": "/var/lib/inferops/snapshots/a/b/c/d"},
    "snapshot_canary": {"container": "nothing-here", "snapshot_dir": "/var/lib/inferops/snapshots/a/b/c/d",
                        "url": "http://127.0.0.1:1/x"},
    "snapshot_info": {"snapshot_dir": "/var/lib/inferops/snapshots/a/b/c/d"},
    "snapshot_restore": {"container": "nothing-here", "snapshot_dir": "/var/lib/inferops/snapshots/a/b/c/d"},
    "snapshot_status": {"snapshot_dir": "/var/lib/inferops/snapshots/a/b/c/d"},
    "snapshot_verify": {"snapshot_dir": "/var/lib/inferops/snapshots/a/b/c/d"},
}


@pytest.mark.parametrize("module", sorted(MODULES))
@pytest.mark.parametrize("identity, shown", [("acc-pod", "the string"), (["acc", "pod"], "a list")])
def test_an_identity_that_is_no_dict_is_refused_naming_identity_and_its_form(module, identity, shown, tmp_path):
    result = run_module(module, dict(MODULES[module], identity=identity), tmp_dir=tmp_path)
    assert result["failed"], result
    assert result["msg"] == ("identity: expected a dict with the keys namespace, service, instance, pod (for example "
                             "{namespace: default, service: qwen, instance: p0, pod: qwen-0}), got %s %r"
                             % (shown, identity)), result["msg"]


@pytest.mark.parametrize("check", [False, True])
def test_snapshot_signing_key_refuses_an_existing_directory_others_can_reach_and_never_changes_it(tmp_path, check):
    """``path: /tmp`` (or ``~``) was made 0700 before anything looked at it; --check said it would succeed."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(str(shared), 0o1777)
    result = run_module("snapshot_signing_key", {"path": str(shared)}, check=check, tmp_dir=tmp_path)
    assert result["failed"] and result["msg"].startswith("path: %s must be a directory of this user's" % shared), result
    assert "it has mode 1777: chmod 0700 it" in result["msg"], result["msg"]
    assert stat.S_IMODE(os.stat(str(shared)).st_mode) == 0o1777 and os.listdir(str(shared)) == []


@pytest.mark.parametrize("path, words", [
    (["/tmp/keys"], "path: give the absolute path of a directory on the controller for the signing key"),
    ("", "path: give the absolute path of a directory on the controller for the signing key"),
    ("{tmp}/keys\u0000x", "path: the path contains a NUL byte"),
    ("{tmp}/afile", "path: {tmp}/afile must be a directory of this user's"),
])
@pytest.mark.parametrize("check", [False, True])
def test_snapshot_signing_key_refuses_a_path_that_cannot_be_its_directory_naming_path(tmp_path, path, words, check):
    (tmp_path / "afile").write_text("not a directory")
    if isinstance(path, str):
        path = path.format(tmp=tmp_path)
    result = run_module("snapshot_signing_key", {"path": path}, check=check, tmp_dir=tmp_path)
    assert result["failed"] and result["msg"].startswith(words.format(tmp=tmp_path)), result
    assert sorted(os.listdir(str(tmp_path))) == ["afile"], "nothing was made"


@pytest.mark.parametrize("args, words", [
    ({"headers": {"Authorization": "Bearer s3cr3tTOKENvalue42\n"}},
     "headers: the value of Authorization must be one line of text"),
    ({"method": "GET /x HTTP/1.1\r\nX: y"}, "method: 'GET /x HTTP/1.1\\r\\nX: y' is not an HTTP method"),
    ({"url": "http://127.0.0.1:abc/x"}, "url: 'http://127.0.0.1:abc/x' is not a URL that can be asked"),
])
def test_snapshot_canary_refuses_a_request_it_cannot_send_naming_the_option_and_repeating_no_header(
        tmp_path, args, words):
    """These were "unexpected error in inferops.snapshot.snapshot_canary: Invalid header value b'Bearer ...\\n'"."""
    snapshot_dir = str(tmp_path / "store" / "a" / "b" / "c" / "d")
    result = run_module("snapshot_canary", dict({"container": "nothing-here", "snapshot_dir": snapshot_dir,
                                                 "url": "http://127.0.0.1:1/x", "headers": {"Authorization": "x"}},
                                                **args), tmp_dir=tmp_path)
    assert result["failed"] and result["msg"].startswith(words), result
    assert "s3cr3t" not in json.dumps(result) and not os.path.exists(str(tmp_path / "store"))


IDENTITY = {"namespace": "ns", "service": "svc", "instance": "i0", "pod": "pod0"}


@pytest.mark.parametrize("module, args, message", [
    ("npu_snapshot_backup", {"pid": 1, "timeout": -1}, "timeout: must be a positive number of seconds"),
    ("npu_snapshot_backup", {"endpoint": "ftp://x"}, "endpoint: 'ftp://x' is neither"),
    ("snapshot_status", {"status": "generating", "extra_paths": ["/var/lib/inferops/x/pod0"]},
     "extra_paths: only used with status=failed"),
    ("snapshot_status", {"status": "generating", "checksum": "abc"}, "checksum: 'abc' is not a SHA-256"),
    ("snapshot_status", {"status": "generating", "generation_lease": -3600},
     "generation_lease: must be a positive number of seconds"),
    ("snapshot_status", {"status": "generating", "generation_lease": "inf"},
     "generation_lease: must be a positive number of seconds"),
    ("npu_snapshot_backup", {"pid": 1, "generation_lease": "nan"}, "generation_lease: must be a positive number"),
    ("npu_snapshot_backup", {"pid": 1, "timeout": "inf"}, "timeout: must be a positive number of seconds"),
    ("snapshot_canary", {"pid": 1, "url": "http://127.0.0.1:1/x", "generation_lease": "inf"},
     "generation_lease: must be a positive number of seconds"),
])
def test_a_bad_option_is_refused_before_the_generation_claim_is_written(module, args, message, tmp_path):
    store = tmp_path / "store"
    args = dict(args, snapshot_dir=str(store / "ns" / "svc" / "i0" / "pod0"), identity=IDENTITY, generation_id="g1")
    result = run_module(module, args, tmp_dir=tmp_path)
    assert result["failed"] and result["msg"].startswith(message), result
    assert not store.exists(), "no claim (nor its directories) left holding the pod: %s" % list(store.rglob("*"))


SNAPSHOT = {"snapshot_dir": "/var/lib/inferops/snapshots/ns/svc/i0/pod0", "identity": IDENTITY}


@pytest.mark.parametrize("module, args, message", [
    ("snapshot_info", dict(SNAPSHOT, min_size=-1), "min_size: must be 0 or more bytes, got -1"),
    ("snapshot_info", dict(SNAPSHOT, workers=0), "workers: must be at least 1, got 0"),
    ("snapshot_restore", dict(SNAPSHOT, container="engine-0", min_size=-5), "min_size: must be 0 or more bytes"),
    ("snapshot_restore", dict(SNAPSHOT, container="engine-0", workers=0), "workers: must be at least 1, got 0"),
    ("snapshot_restore", dict(SNAPSHOT, container=""), "container: empty"),
    ("npu_snapshot_lock", {"state": "locked", "container": ""}, "container: empty"),
])
def test_the_same_option_is_refused_alike_by_every_module_in_check_mode(module, args, message, tmp_path):
    result = run_module(module, args, check=True, tmp_dir=tmp_path)
    assert result["failed"] and result["msg"].startswith(message), result

"""Unit tests of the ctypes ACL binding (plugins/module_utils/core/agent/acl.py): no simulator needed."""
import importlib.util
import pickle
import subprocess
import sys

import pytest

from conftest import MODULE_UTILS

ACL_PY = MODULE_UTILS / "core" / "agent" / "acl.py"
_SPEC = importlib.util.spec_from_file_location("inferops_acl_under_test", ACL_PY)
acl = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = acl
_SPEC.loader.exec_module(acl)

SNAPSHOT_CODES = {
    507905: "ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT",
    507906: "ACL_ERROR_SNAPSHOT_LOCK_FAILED",
    507907: "ACL_ERROR_SNAPSHOT_UNLOCK_FAILED",
    507908: "ACL_ERROR_SNAPSHOT_BACKUP_FAILED",
    507909: "ACL_ERROR_SNAPSHOT_RESTORE_FAILED",
    507912: "ACL_ERROR_SNAPSHOT_CALLBACK_FAILED",
    507913: "ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED",
}


# ---------------------------------------------------------------- error table

def test_error_table_has_the_snapshot_and_common_codes():
    assert acl.ERRORS[0][0] == "ACL_SUCCESS"
    assert acl.ERRORS[100000][0] == "ACL_ERROR_INVALID_PARAM"
    assert "cross-process" in acl.ERRORS[100000][1]
    for code, name in SNAPSHOT_CODES.items():
        assert acl.ERRORS[code][0] == name
        assert acl.ERRORS[code][1]
    for code in (107001, 107002, 207001, 507033):
        assert code in acl.ERRORS
    for code, (name, message) in acl.ERRORS.items():
        assert isinstance(code, int) and name.startswith("ACL_") and message


def test_describe_error():
    assert acl.describe_error(507905) == (
        "507905 ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT: lock timed out waiting for background threads to park"
    )
    assert acl.describe_error(507909).startswith("507909 ACL_ERROR_SNAPSHOT_RESTORE_FAILED: restore failed")
    assert acl.describe_error(123456) == "123456 ACL_ERROR_UNKNOWN: unknown ACL error code"


def test_acl_error_fields_and_message():
    err = acl.AclError(507905, "aclrtSnapShotProcessLock")
    assert err.code == 507905
    assert err.name == "ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT"
    assert err.function == "aclrtSnapShotProcessLock"
    assert str(err) == (
        "aclrtSnapShotProcessLock failed: 507905 ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT: "
        "lock timed out waiting for background threads to park"
    )
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.code, copy.function, str(copy)) == (err.code, err.function, str(err))
    unknown = acl.AclError(42, "aclrtMalloc")
    assert unknown.name == "ACL_ERROR_UNKNOWN" and "42" in str(unknown)


def test_enums():
    assert [s.name for s in acl.SnapshotStage] == [
        "LOCK_PRE", "BACKUP_PRE", "BACKUP_POST", "RESTORE_PRE", "RESTORE_POST", "UNLOCK_POST"]
    assert [int(s) for s in acl.SnapshotStage] == [0, 1, 2, 3, 4, 5]
    assert [s.name for s in acl.ProcessState] == ["RUNNING", "LOCKED", "BACKED_UP"]
    assert (acl.MEMCPY_HOST_TO_HOST, acl.MEMCPY_HOST_TO_DEVICE, acl.MEMCPY_DEVICE_TO_HOST,
            acl.MEMCPY_DEVICE_TO_DEVICE) == (0, 1, 2, 3)


def test_module_has_no_ansible_dependency():
    source = ACL_PY.read_text()
    assert "import ansible" not in source and "from ansible" not in source
    header = source.split('"""', 1)[0]
    assert "PRIVATE to the inferops.snapshot collection" in header


# ---------------------------------------------------------------- library resolution

def _lib(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_resolve_prefers_explicit_path(tmp_path):
    explicit = _lib(tmp_path / "custom" / "libascendcl.so")
    home = tmp_path / "home"
    _lib(home / "lib64" / "libascendcl.so")
    assert acl.resolve_library(str(explicit), {"ASCEND_HOME_PATH": str(home)}) == str(explicit)


def test_resolve_explicit_directory(tmp_path):
    lib = _lib(tmp_path / "dir" / "libascendcl.so")
    assert acl.resolve_library(str(tmp_path / "dir"), {}) == str(lib)


def test_resolve_explicit_missing_does_not_fall_back(tmp_path):
    home = tmp_path / "home"
    _lib(home / "lib64" / "libascendcl.so")
    missing = tmp_path / "nope" / "libascendcl.so"
    with pytest.raises(acl.AclLibraryError) as exc:
        acl.resolve_library(str(missing), {"ASCEND_HOME_PATH": str(home)})
    assert str(missing) in str(exc.value)
    assert str(home) not in str(exc.value)


def test_resolve_ascend_home_lib64_then_runtime_lib64(tmp_path):
    home = tmp_path / "home"
    default = _lib(tmp_path / "default" / "libascendcl.so")
    runtime = _lib(home / "runtime" / "lib64" / "libascendcl.so")
    env = {"ASCEND_HOME_PATH": str(home)}
    assert acl.resolve_library(None, env, defaults=(str(default),)) == str(runtime)
    lib64 = _lib(home / "lib64" / "libascendcl.so")
    assert acl.resolve_library(None, env, defaults=(str(default),)) == str(lib64)


def test_resolve_falls_back_to_defaults_in_order(tmp_path):
    first = tmp_path / "toolkit" / "lib64" / "libascendcl.so"
    second = _lib(tmp_path / "cann" / "lib64" / "libascendcl.so")
    defaults = (str(first), str(second))
    assert acl.resolve_library(None, {"ASCEND_HOME_PATH": str(tmp_path / "empty")}, defaults=defaults) == str(second)
    _lib(first)
    assert acl.resolve_library(None, {}, defaults=defaults) == str(first)


def test_default_search_order():
    paths = acl.candidate_paths(None, {"ASCEND_HOME_PATH": "/opt/cann"})
    assert paths == [
        "/opt/cann/lib64/libascendcl.so",
        "/opt/cann/runtime/lib64/libascendcl.so",
        "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so",
        "/usr/local/Ascend/cann/lib64/libascendcl.so",
    ]
    assert acl.candidate_paths(None, {})[0] == "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so"


def test_missing_library_names_every_path_tried(tmp_path):
    home = tmp_path / "home"
    defaults = (str(tmp_path / "d1" / "libascendcl.so"), str(tmp_path / "d2" / "libascendcl.so"))
    with pytest.raises(acl.AclLibraryError) as exc:
        acl.resolve_library(None, {"ASCEND_HOME_PATH": str(home)}, defaults=defaults)
    message = str(exc.value)
    for path in [home / "lib64" / "libascendcl.so", home / "runtime" / "lib64" / "libascendcl.so", *defaults]:
        assert str(path) in message
    assert "ASCEND_HOME_PATH" in message and "INFEROPS_ACL_LIBRARY" in message and "--library" in message


def test_runtime_with_missing_library_raises_library_error(tmp_path):
    with pytest.raises(acl.AclLibraryError) as exc:
        acl.AclRuntime(str(tmp_path / "absent" / "libascendcl.so"))
    assert "absent" in str(exc.value)


def test_runtime_with_unloadable_file(tmp_path):
    bogus = tmp_path / "libascendcl.so"
    bogus.write_text("not an ELF file")
    with pytest.raises(acl.AclLibraryError) as exc:
        acl.AclRuntime(str(bogus))
    assert "cannot load" in str(exc.value)


def _build_so(tmp_path, name, functions):
    src = tmp_path / (name + ".c")
    src.write_text("".join("int %s(void) { return 0; }\n" % f for f in functions))
    out = tmp_path / name / "libascendcl.so"
    out.parent.mkdir()
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def test_library_without_snapshot_api(tmp_path):
    lib = _build_so(tmp_path, "old_cann", ["aclInit"])
    with pytest.raises(acl.AclLibraryError) as exc:
        acl.AclRuntime(str(lib))
    message = str(exc.value)
    assert "this CANN version has no snapshot API" in message
    assert "CANN 9.x" in message
    assert "missing: " + ", ".join(acl.SNAPSHOT_SYMBOLS) in message
    assert str(lib) in message


def test_library_with_snapshot_api_but_missing_other_calls(tmp_path):
    lib = _build_so(tmp_path, "partial", list(acl.SNAPSHOT_SYMBOLS) + ["aclInit"])
    with pytest.raises(acl.AclLibraryError) as exc:
        acl.AclRuntime(str(lib))
    assert "no snapshot API" not in str(exc.value)
    assert "aclrtMalloc" in str(exc.value)

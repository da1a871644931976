# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# PRIVATE to the inferops.snapshot collection: the ctypes binding to Ascend's libascendcl used by
# the collection's in-process agent and sample workload. Not a public API; it may change without
# notice. Pure standard library and no Ansible imports, so it also runs as a plain file copied
# next to its siblings inside a container.
#
# The snapshot API must be called from inside the process being snapshotted: the runtime
# rejects any pid but the caller's own, and there is no public call that reports the snapshot
# state, so the caller tracks it (AclRuntime.state).
"""ctypes binding to libascendcl (device setup, memory, and the CANN 9.x snapshot API).

PRIVATE to the inferops.snapshot collection.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import enum
import os
import threading

__all__ = [
    "ACL_SUCCESS",
    "ERRORS",
    "AclError",
    "AclLibraryError",
    "AclRuntime",
    "DEVICE_MEMORY",
    "LIBRARY_NAME",
    "MEMCPY_DEVICE_TO_DEVICE",
    "MEMCPY_DEVICE_TO_HOST",
    "MEMCPY_HOST_TO_DEVICE",
    "MEMCPY_HOST_TO_HOST",
    "MemcpyKind",
    "ProcessState",
    "SNAPSHOT_ARGS_SYMBOLS",
    "SNAPSHOT_SYMBOLS",
    "SnapshotStage",
    "candidate_paths",
    "describe_error",
    "resolve_library",
]

LIBRARY_NAME = "libascendcl.so"
ACL_SUCCESS = 0

# code -> (symbolic name as in CANN's headers, readable message)
ERRORS = {
    0: ("ACL_SUCCESS", "success"),
    100000: (
        "ACL_ERROR_INVALID_PARAM",
        "invalid parameter (snapshot calls: pid must be the calling process's pid, cross-process "
        "operation is not supported; reserve must be NULL; args NULL, or flags 0 or 1 where the runtime takes "
        "args)",
    ),
    100001: ("ACL_ERROR_UNINITIALIZE", "ACL is not initialized (call aclInit first)"),
    100002: ("ACL_ERROR_REPEAT_INITIALIZE", "ACL is already initialized"),
    100003: ("ACL_ERROR_INVALID_FILE", "the aclInit configuration file is missing or invalid"),
    100037: ("ACL_ERROR_REPEAT_FINALIZE", "ACL is already finalized (or was never initialized)"),
    107000: ("ACL_ERROR_RT_PARAM_INVALID", "invalid runtime parameter (e.g. unregistering a callback that is not registered)"),
    107001: ("ACL_ERROR_RT_INVALID_DEVICEID", "invalid device id"),
    107002: ("ACL_ERROR_RT_CONTEXT_NULL", "no current device/context in the calling thread (call aclrtSetDevice in this thread)"),
    207000: (
        "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
        "feature not supported (e.g. this chip or runtime does not support process snapshots, or the driver lacks "
        "the process device-memory snapshot the args shape needs)",
    ),
    207001: ("ACL_ERROR_RT_MEMORY_ALLOCATION", "device memory allocation failed (out of memory)"),
    507033: ("ACL_ERROR_RT_DEV_SETUP_ERROR", "device setup failed (device busy: held by another process, or not available)"),
    507899: ("ACL_ERROR_RT_DRV_INTERNAL_ERROR", "driver internal error"),
    507905: ("ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT", "lock timed out waiting for background threads to park"),
    507906: ("ACL_ERROR_SNAPSHOT_LOCK_FAILED", "lock failed: the process is not in the RUNNING state"),
    507907: ("ACL_ERROR_SNAPSHOT_UNLOCK_FAILED", "unlock failed: the process is not LOCKED or BACKED_UP (or threads did not resume)"),
    507908: ("ACL_ERROR_SNAPSHOT_BACKUP_FAILED", "backup failed: the process is not LOCKED, or device memory could not be copied"),
    507909: (
        "ACL_ERROR_SNAPSHOT_RESTORE_FAILED",
        "restore failed: the process is not BACKED_UP, or the device could not be re-opened "
        "(busy, different or smaller device), or the runtime/driver API versions differ from the backup's",
    ),
    507910: ("ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "host memory is already registered"),
    507911: ("ACL_ERROR_HOST_MEMORY_NOT_REGISTERED", "host memory is not registered"),
    507912: ("ACL_ERROR_SNAPSHOT_CALLBACK_FAILED", "a snapshot stage callback returned an error"),
    507913: (
        "ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED",
        "snapshot callback registration failed (already registered for this stage, NULL callback or invalid stage)",
    ),
}


def describe_error(code):
    """'507905 ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT: lock timed out ...' for any integer code."""
    code = int(code)
    name, message = ERRORS.get(code, ("ACL_ERROR_UNKNOWN", "unknown ACL error code"))
    return "%d %s: %s" % (code, name, message)


class AclError(Exception):
    """A libascendcl call returned a non-zero aclError."""

    def __init__(self, code, function):
        self.code = int(code)
        self.function = function
        self.name, self.message = ERRORS.get(self.code, ("ACL_ERROR_UNKNOWN", "unknown ACL error code"))
        super().__init__("%s failed: %s" % (function, describe_error(self.code)))

    def __reduce__(self):
        return (self.__class__, (self.code, self.function))


class AclLibraryError(Exception):
    """libascendcl cannot be found or loaded, or lacks the snapshot API."""


class SnapshotStage(enum.IntEnum):
    """aclrtSnapShotStage."""

    LOCK_PRE = 0
    BACKUP_PRE = 1
    BACKUP_POST = 2
    RESTORE_PRE = 3
    RESTORE_POST = 4
    UNLOCK_POST = 5


class ProcessState(enum.Enum):
    """Snapshot state of the process, as tracked by the caller (the runtime has no public getter)."""

    RUNNING = "RUNNING"
    LOCKED = "LOCKED"
    BACKED_UP = "BACKED_UP"


class MemcpyKind(enum.IntEnum):
    """aclrtMemcpyKind."""

    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3


MEMCPY_HOST_TO_HOST = MemcpyKind.HOST_TO_HOST
MEMCPY_HOST_TO_DEVICE = MemcpyKind.HOST_TO_DEVICE
MEMCPY_DEVICE_TO_HOST = MemcpyKind.DEVICE_TO_HOST
MEMCPY_DEVICE_TO_DEVICE = MemcpyKind.DEVICE_TO_DEVICE

SNAPSHOT_SYMBOLS = (
    "aclrtSnapShotProcessLock",
    "aclrtSnapShotProcessBackup",
    "aclrtSnapShotProcessRestore",
    "aclrtSnapShotProcessUnlock",
    "aclrtSnapShotCallbackRegister",
    "aclrtSnapShotCallbackUnregister",
)

# The args shape of Backup/Restore goes through these runtime entry points (hicann/runtime
# docs/zh/design/features/snapshot.md, 3: "ACL 参数非空时通过 rtSnapShotProcessBackupWithArgs /
# rtSnapShotProcessRestoreWithArgs 承接"): a library that resolves them takes args; one that does not has only the
# older no-argument shape, where a non-NULL args pointer is refused (or worse: an older runtime may not check it).
SNAPSHOT_ARGS_SYMBOLS = ("rtSnapShotProcessBackupWithArgs", "rtSnapShotProcessRestoreWithArgs")
# backupFlags / restoreFlags: 0 = device memory tagged required only, 1 = required and optional.
DEVICE_MEMORY = {"required": 0, "required_and_optional": 1}
API_ARGS = "args"
API_LEGACY = "legacy"

DEFAULT_LIBRARY_PATHS = (
    "/usr/local/Ascend/ascend-toolkit/latest/lib64/" + LIBRARY_NAME,
    "/usr/local/Ascend/cann/lib64/" + LIBRARY_NAME,
)


def candidate_paths(explicit=None, environ=None, defaults=DEFAULT_LIBRARY_PATHS):
    """The paths resolve_library tries, in order. An explicit directory means DIR/libascendcl.so."""
    environ = os.environ if environ is None else environ
    if explicit:
        explicit = os.fspath(explicit)
        if os.path.isdir(explicit):
            explicit = os.path.join(explicit, LIBRARY_NAME)
        return [explicit]
    paths = []
    home = environ.get("ASCEND_HOME_PATH")
    if home:
        paths.append(os.path.join(home, "lib64", LIBRARY_NAME))
        paths.append(os.path.join(home, "runtime", "lib64", LIBRARY_NAME))
    paths.extend(defaults)
    return paths


def resolve_library(explicit=None, environ=None, defaults=DEFAULT_LIBRARY_PATHS):
    """Path of libascendcl.so: explicit path (file or directory) > $ASCEND_HOME_PATH/lib64 >
    $ASCEND_HOME_PATH/runtime/lib64 > the CANN toolkit defaults. environ defaults to os.environ.
    Raises AclLibraryError naming every path tried. An explicit path is never silently replaced
    by another one."""
    tried = candidate_paths(explicit, environ, defaults)
    for path in tried:
        if os.path.isfile(path):
            return path
    if explicit:
        hint = "check the explicit library path (the agent's --library option or INFEROPS_ACL_LIBRARY)"
    else:
        hint = (
            "give the path explicitly (the agent's --library option or INFEROPS_ACL_LIBRARY), or set "
            "ASCEND_HOME_PATH to the CANN installation "
            "(e.g. source /usr/local/Ascend/ascend-toolkit/set_env.sh)"
        )
    raise AclLibraryError("%s not found; tried: %s; %s" % (LIBRARY_NAME, ", ".join(tried), hint))


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_int32, ctypes.c_void_p)


class SnapshotArgs(ctypes.Structure):
    """aclrtSnapShotBackupArgs {uint32_t backupFlags; char reserved[60]} (RestoreArgs: restoreFlags)."""

    _fields_ = [("flags", ctypes.c_uint32), ("reserved", ctypes.c_char * 60)]


_I32P = ctypes.POINTER(ctypes.c_int32)
_PROTOTYPES = {
    # name: (restype, argtypes)
    "aclInit": (ctypes.c_int, [ctypes.c_char_p]),
    "aclFinalize": (ctypes.c_int, []),
    "aclrtSetDevice": (ctypes.c_int, [ctypes.c_int32]),
    "aclrtResetDevice": (ctypes.c_int, [ctypes.c_int32]),
    "aclrtGetDevice": (ctypes.c_int, [_I32P]),
    "aclrtGetDeviceCount": (ctypes.c_int, [ctypes.POINTER(ctypes.c_uint32)]),
    "aclrtMalloc": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]),
    "aclrtFree": (ctypes.c_int, [ctypes.c_void_p]),
    "aclrtMemcpy": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
    "aclrtGetMemInfo": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
    "aclrtGetVersion": (ctypes.c_int, [_I32P, _I32P, _I32P]),
    "aclrtSynchronizeDevice": (ctypes.c_int, []),
    "aclrtSnapShotProcessLock": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "aclrtSnapShotProcessBackup": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "aclrtSnapShotProcessRestore": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "aclrtSnapShotProcessUnlock": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "aclrtSnapShotCallbackRegister": (ctypes.c_int, [ctypes.c_int, _CALLBACK, ctypes.c_void_p]),
    "aclrtSnapShotCallbackUnregister": (ctypes.c_int, [ctypes.c_int, _CALLBACK]),
}


class AclRuntime:
    """libascendcl loaded with RTLD_GLOBAL (the same path in the same process is the one library
    instance an inference engine uses). Every non-zero return raises AclError."""

    def __init__(self, library_path=None):
        self.path = resolve_library(library_path)
        try:
            self.lib = ctypes.CDLL(self.path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise AclLibraryError("cannot load %s: %s" % (self.path, exc)) from exc
        missing_snapshot = [name for name in SNAPSHOT_SYMBOLS if not hasattr(self.lib, name)]
        if missing_snapshot:
            raise AclLibraryError(
                "%s: this CANN version has no snapshot API: need a CANN runtime that exports "
                "aclrtSnapShotProcessLock/Backup/Restore/Unlock (CANN 9.x); missing: %s"
                % (self.path, ", ".join(missing_snapshot))
            )
        missing = [name for name in _PROTOTYPES if not hasattr(self.lib, name)]
        if missing:
            raise AclLibraryError("%s is not a usable libascendcl; missing: %s" % (self.path, ", ".join(missing)))
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(self.lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        self._lock = threading.Lock()
        self._device_refs = {}
        self._thunks = {}  # python callable -> CFUNCTYPE object; kept for the process lifetime
        self._user_data = {}  # int key passed as the C args pointer -> python object
        self._registrations = {}  # (stage, fn) -> key
        self._next_key = 1
        self.state = ProcessState.RUNNING
        self.last_callback_error = None
        self.snapshot_api = API_ARGS if all(hasattr(self.lib, name) for name in SNAPSHOT_ARGS_SYMBOLS) else API_LEGACY
        self.backup_device_memory = None  # what the last backup asked for (None: NULL args, the older flow)

    # ------------------------------------------------------------------ helpers
    def _check(self, function, code):
        if code != ACL_SUCCESS:
            raise AclError(code, function)

    def _call(self, function, *args):
        self._check(function, getattr(self.lib, function)(*args))

    @property
    def devices_in_use(self):
        """Device ids set through this binding and not reset."""
        with self._lock:
            return {dev for dev, refs in self._device_refs.items() if refs > 0}

    # ------------------------------------------------------------------ init / devices
    def init(self, config=None):
        self._call("aclInit", None if config is None else os.fsencode(config))

    def finalize(self):
        self._call("aclFinalize")
        with self._lock:
            self._device_refs.clear()

    def set_device(self, device_id):
        self._call("aclrtSetDevice", int(device_id))
        with self._lock:
            self._device_refs[int(device_id)] = self._device_refs.get(int(device_id), 0) + 1

    def reset_device(self, device_id):
        self._call("aclrtResetDevice", int(device_id))
        with self._lock:
            refs = self._device_refs.get(int(device_id), 0) - 1
            if refs > 0:
                self._device_refs[int(device_id)] = refs
            else:
                self._device_refs.pop(int(device_id), None)

    def get_device(self):
        dev = ctypes.c_int32()
        self._call("aclrtGetDevice", ctypes.byref(dev))
        return dev.value

    def device_count(self):
        count = ctypes.c_uint32()
        self._call("aclrtGetDeviceCount", ctypes.byref(count))
        return count.value

    def synchronize_device(self):
        self._call("aclrtSynchronizeDevice")

    # ------------------------------------------------------------------ memory
    def malloc(self, size, policy=0):
        ptr = ctypes.c_void_p()
        self._call("aclrtMalloc", ctypes.byref(ptr), int(size), int(policy))
        return ptr.value

    def free(self, dev_ptr):
        self._call("aclrtFree", ctypes.c_void_p(dev_ptr))

    def memcpy_to_device(self, dev_ptr, data):
        view = memoryview(data).cast("B")
        size = view.nbytes
        if size == 0:
            return
        if view.readonly:
            buf = ctypes.c_char_p(view.tobytes() if not isinstance(data, bytes) else data)
            src = ctypes.cast(buf, ctypes.c_void_p)
        else:
            buf = (ctypes.c_char * size).from_buffer(view)
            src = ctypes.cast(buf, ctypes.c_void_p)
        self._call("aclrtMemcpy", ctypes.c_void_p(dev_ptr), size, src, size, int(MemcpyKind.HOST_TO_DEVICE))

    def memcpy_from_device(self, dev_ptr, size):
        size = int(size)
        if size == 0:
            return b""
        buf = ctypes.create_string_buffer(size)
        self._call("aclrtMemcpy", ctypes.cast(buf, ctypes.c_void_p), size, ctypes.c_void_p(dev_ptr), size,
                   int(MemcpyKind.DEVICE_TO_HOST))
        return buf.raw

    def mem_info(self, attr=0):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._call("aclrtGetMemInfo", int(attr), ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def version(self):
        major, minor, patch = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
        self._call("aclrtGetVersion", ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
        return "%d.%d.%d" % (major.value, minor.value, patch.value)

    def api_versions(self):
        """{"runtime": rtGetRuntimeVersion, "driver": halGetAPIVersion}: what the args shape records at backup and
        compares at restore; None where the library does not resolve the call (or it fails)."""
        found = {}
        for key, name, ctype in (("runtime", "rtGetRuntimeVersion", ctypes.c_uint32),
                                 ("driver", "halGetAPIVersion", ctypes.c_int)):
            value = ctype()
            fn = getattr(self.lib, name, None)
            found[key] = None
            if fn is not None:
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.POINTER(ctype)]
                if fn(ctypes.byref(value)) == ACL_SUCCESS:
                    found[key] = int(value.value)
        return found

    # ------------------------------------------------------------------ snapshot
    def _args_for(self, device_memory):
        """The args pointer for Backup/Restore: NULL (the older flow) or flags; AclLibraryError when it cannot be
        honoured by this library's shape."""
        if device_memory is None:
            return None
        if device_memory not in DEVICE_MEMORY:
            raise AclLibraryError("device_memory must be one of %s, not %r" % (", ".join(DEVICE_MEMORY), device_memory))
        if self.snapshot_api != API_ARGS:
            if device_memory == "required":
                return None  # the older flow hands the driver 0 (required) itself
            raise AclLibraryError(
                "%s has the older snapshot API without arguments (it resolves no %s): it cannot back up optional "
                "device memory; use device_memory=required" % (self.path, " or ".join(SNAPSHOT_ARGS_SYMBOLS)))
        return ctypes.byref(SnapshotArgs(DEVICE_MEMORY[device_memory]))

    def _snapshot(self, function, pid, on_success, on_failure=None, args=None):
        pid = os.getpid() if pid is None else int(pid)
        code = getattr(self.lib, function)(pid, args)
        if code != ACL_SUCCESS:
            if on_failure is not None:
                new_state = on_failure(code)
                if new_state is not None:
                    self.state = new_state
            raise AclError(code, function)
        self.state = on_success

    def snapshot_lock(self, pid=None):
        # A lock that timed out waiting for background threads is reverted to RUNNING; every
        # other failure leaves the state as it was.
        def failed(code):
            return ProcessState.RUNNING if code == 507905 else None

        self._snapshot("aclrtSnapShotProcessLock", pid, ProcessState.LOCKED, failed)

    def snapshot_backup(self, pid=None, device_memory=None):
        """Backup. ``device_memory`` (``required`` or ``required_and_optional``): with the args shape, the flags the
        runtime gets, and its driver feature check and version record; None: the older flow (NULL args) where the
        library has only that shape, ``required`` where it takes args."""
        if device_memory is None and self.snapshot_api == API_ARGS:
            device_memory = "required"
        args = self._args_for(device_memory)
        self._snapshot("aclrtSnapShotProcessBackup", pid, ProcessState.BACKED_UP, args=args)
        self.backup_device_memory = device_memory if args is not None else None

    def snapshot_restore(self, pid=None):
        """Restore with what the backup used: its flags (and so the runtime's feature and version checks) when it
        took args, NULL when it did not."""
        args = self._args_for(self.backup_device_memory)
        self._snapshot("aclrtSnapShotProcessRestore", pid, ProcessState.LOCKED, args=args)

    def snapshot_unlock(self, pid=None):
        # UNLOCK_POST callbacks run after the state is already RUNNING.
        def failed(code):
            return ProcessState.RUNNING if code == 507912 else None

        self._snapshot("aclrtSnapShotProcessUnlock", pid, ProcessState.RUNNING, failed)

    def _thunk_for(self, fn):
        thunk = self._thunks.get(fn)
        if thunk is None:
            def trampoline(device_id, key, _fn=fn):
                try:
                    result = _fn(device_id, self._user_data.get(key))
                    return 0 if result is None else int(result) & 0xFFFFFFFF
                except BaseException as exc:  # pylint: disable=broad-except  # never unwind into C
                    self.last_callback_error = exc
                    return 1

            thunk = _CALLBACK(trampoline)
            self._thunks[fn] = thunk
        return thunk

    def register_callback(self, stage, fn, user_data=None):
        """fn(device_id, user_data) -> int (0 = success) is called at `stage` once per device in
        use. Registering the same fn twice for one stage fails (507913), as in the runtime."""
        stage = SnapshotStage(stage)
        with self._lock:
            thunk = self._thunk_for(fn)
            key = self._next_key
            self._next_key += 1
            self._user_data[key] = user_data
        code = self.lib.aclrtSnapShotCallbackRegister(int(stage), thunk, ctypes.c_void_p(key))
        with self._lock:
            if code != ACL_SUCCESS:
                self._user_data.pop(key, None)
            else:
                self._registrations[(stage, fn)] = key
        self._check("aclrtSnapShotCallbackRegister", code)

    def unregister_callback(self, stage, fn):
        stage = SnapshotStage(stage)
        with self._lock:
            thunk = self._thunks.get(fn)
        if thunk is None:
            thunk = self._thunk_for(fn)  # unknown to this binding: let the runtime refuse it
        self._check("aclrtSnapShotCallbackUnregister", self.lib.aclrtSnapShotCallbackUnregister(int(stage), thunk))
        with self._lock:
            key = self._registrations.pop((stage, fn), None)
            if key is not None:
                self._user_data.pop(key, None)

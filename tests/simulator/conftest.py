"""Fixtures for the ACL snapshot simulator tests.

The simulator keeps process-global state (like the real runtime), so every scenario runs in a
fresh Python subprocess that loads the production binding (plugins/module_utils/core/agent/acl.py) against
the simulator built once per session. Each test gets its own device directory.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIM_DIR = ROOT / "tests" / "simulator"
sys.path.insert(0, str(SIM_DIR))
import aclsim_ctl  # noqa: E402  pylint: disable=wrong-import-position
AGENT_DIR = ROOT / "plugins" / "module_utils" / "core" / "agent"
RESULT_MARK = "@@RESULT@@"

PRELUDE = r'''
import ctypes, json, os, subprocess, sys, threading, time
sys.path.insert(0, {module_utils!r})
sys.path.insert(0, {sim_dir!r})
import acl as _acl
import aclsim_ctl as ctl
from acl import AclError, SnapshotStage, ProcessState

LIB = {lib!r}
rt = _acl.AclRuntime(LIB)
sim = rt.lib
sim.aclsimGetState.restype = ctypes.c_int
sim.aclsimGetBackupBytes.restype = ctypes.c_uint64
sim.aclsimGetBlockedThreadCount.restype = ctypes.c_uint32
sim.aclsimDeviceReset.argtypes = [ctypes.c_int32]
for _n in ("aclsimBackgroundThreadRegister", "aclsimBackgroundThreadWaitIfLocked",
           "aclsimBackgroundThreadUnregister"):
    getattr(sim, _n).argtypes = [ctypes.c_char_p]
    getattr(sim, _n).restype = None
class CopyStats(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("devices", ctypes.c_int32), ("bytes", ctypes.c_uint64),
                ("copySeconds", ctypes.c_double), ("modelledSeconds", ctypes.c_double),
                ("totalSeconds", ctypes.c_double), ("gbps", ctypes.c_double)]
sim.aclsimGetLastCopy.argtypes = [ctypes.POINTER(CopyStats)]

def last_copy():
    """aclsimGetLastCopy as a dict: kind (0 none, 1 backup, 2 restore), devices, bytes, seconds."""
    stats = CopyStats()
    assert sim.aclsimGetLastCopy(ctypes.byref(stats)) == 0
    return dict((name, getattr(stats, name)) for name, _type in CopyStats._fields_)

def timed(fn, *args):
    t0 = time.monotonic()
    fn(*args)
    return time.monotonic() - t0

def device_mapping(dev):
    """smaps fields (kB) of this process's mapping of device `dev`'s file."""
    path = os.path.join(DEV_DIR, "device%d" % dev)
    fields, inside = dict(), False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            inside = line.rstrip("\n").endswith(path) or line.rstrip("\n").endswith(path + " (deleted)")
        elif inside and head[0].endswith(":") and len(head) >= 2 and head[1].isdigit():
            fields[head[0][:-1]] = int(head[1])
    return fields

DEV_DIR = os.environ["ACL_SIM_DEVICE_DIR"]
CTL = os.path.join({sim_dir!r}, "aclsim_ctl.py")

if len(sys.argv) == 3 and sys.argv[1] == "--hold":
    # helper mode: another simulator process that holds a device until stdin closes
    rt.set_device(int(sys.argv[2]))
    print("held", flush=True)
    sys.stdin.read()
    sys.exit(0)

def state():
    return sim.aclsimGetState()

def code(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
        return 0
    except AclError as exc:
        return exc.code

def hold_device(dev):
    """Start another simulator process holding device `dev`; close its stdin to release."""
    p = subprocess.Popen([sys.executable, __file__, "--hold", str(dev)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    assert line == "held", line
    return p

def release(p):
    p.stdin.close()
    p.wait(timeout=30)

def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.005)
    return pred()

RESULT = {{}}
'''

EPILOGUE = '''
print({mark!r} + json.dumps(RESULT), flush=True)
'''


class ScenarioResult:
    def __init__(self, proc, result):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.result = result

    def __getitem__(self, key):
        return self.result[key]


class Simulator:
    """Runs scenario scripts against the simulator in fresh subprocesses."""

    def __init__(self, lib, tmp_path):
        self.lib = str(lib)
        self.tmp_path = tmp_path
        self.device_dir = tmp_path / "devices"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ACL_SIM_")}
        self.env.update({
            "ACL_SIM_DEVICE_DIR": str(self.device_dir),
            # its devices' nodes, which the runtime opens and holds (as /dev/davinci<N> on an NPU node)
            "ACL_SIM_DEVICE_NODES": aclsim_ctl.install(8, str(self.device_dir))["nodes"],
            "ACL_SIM_DEVICE_MEM_BYTES": str(64 << 20),
            "PYTHONDONTWRITEBYTECODE": "1",
        })
        self._count = 0

    def device_path(self, dev):
        return self.device_dir / ("device%d" % dev)

    def write(self, body):
        self._count += 1
        path = self.tmp_path / ("scenario_%d.py" % self._count)
        path.write_text(
            PRELUDE.format(module_utils=str(AGENT_DIR), sim_dir=str(SIM_DIR), lib=self.lib)
            + textwrap.dedent(body)
            + EPILOGUE.format(mark=RESULT_MARK)
        )
        return path

    def run(self, body, env=None, timeout=60, check=True):
        path = self.write(body)
        full_env = dict(self.env)
        full_env.update(env or {})
        for k, v in list(full_env.items()):
            if v is None:
                del full_env[k]
        proc = subprocess.run([sys.executable, str(path)], env=full_env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        result = None
        for line in proc.stdout.splitlines():
            if line.startswith(RESULT_MARK):
                result = json.loads(line[len(RESULT_MARK):])
        if check and (proc.returncode != 0 or result is None):
            raise AssertionError(
                "scenario failed (rc=%s)\n--- stdout\n%s\n--- stderr\n%s" % (proc.returncode, proc.stdout, proc.stderr)
            )
        return ScenarioResult(proc, result)


@pytest.fixture(scope="session")
def simulator_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("aclsim-build")
    proc = subprocess.run(["sh", str(SIM_DIR / "build.sh"), str(out)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lib = out / "libascendcl.so"
    assert lib.is_file()
    return lib


@pytest.fixture
def sim(simulator_lib, tmp_path):
    simulator = Simulator(simulator_lib, tmp_path)
    yield simulator
    aclsim_ctl.uninstall(str(simulator.device_dir))


@pytest.fixture
def legacy_sim(simulator_lib, tmp_path):
    """The simulator built as an older runtime whose snapshot calls take no arguments."""
    simulator = Simulator(simulator_lib.parent / "legacy-api" / "libascendcl.so", tmp_path)
    yield simulator
    aclsim_ctl.uninstall(str(simulator.device_dir))

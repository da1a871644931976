"""The simulator's cost model (docs/simulator.md "The cost model"): device memory allocated once, when
the device is created, and copies between host and device that take bytes / ACL_SIM_COPY_GBPS.

These tests check the model's contract (what is allocated when, how long a copy is made to take, the
knob's values), with tolerances for a shared machine; they make no claim about how fast anything is.
"""
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SIM_DIR = Path(__file__).resolve().parent
MIB = 1 << 20
SLACK = 1.5  # seconds a loaded 2-core machine may add to a paced copy


def test_backup_and_restore_take_the_modelled_time(sim):
    r = sim.run('''
        rt.set_device(0)
        n = 32 << 20
        p = rt.malloc(n)
        data = os.urandom(n)
        rt.memcpy_to_device(p, data)
        rt.snapshot_lock()
        RESULT["backup_s"] = timed(rt.snapshot_backup)
        RESULT["backup"] = last_copy()
        ctl.reset(0)
        RESULT["restore_s"] = timed(rt.snapshot_restore)
        RESULT["restore"] = last_copy()
        rt.snapshot_unlock()
        RESULT["same"] = rt.memcpy_from_device(p, n) == data
    ''', env={"ACL_SIM_COPY_GBPS": "0.25"})
    modelled = (32 << 20) / 0.25e9  # 0.134 s
    for kind, name in ((1, "backup"), (2, "restore")):
        stats = r[name]
        assert stats["kind"] == kind and stats["devices"] == 1 and stats["bytes"] == 32 << 20
        assert stats["gbps"] == 0.25
        assert abs(stats["modelledSeconds"] - modelled) < 1e-9
        assert stats["totalSeconds"] >= modelled          # the host copy was faster: paced to the model
        assert stats["copySeconds"] <= stats["totalSeconds"]
        assert modelled <= r[name + "_s"] < modelled + SLACK
    assert r["same"] is True


def test_host_device_memcpy_is_paced_and_host_to_host_is_not(sim):
    r = sim.run('''
        rt.set_device(0)
        n = 8 << 20
        p = rt.malloc(n)
        data = os.urandom(n)
        RESULT["h2d_s"] = timed(rt.memcpy_to_device, p, data)
        RESULT["d2h_s"] = timed(rt.memcpy_from_device, p, n)
        a = ctypes.create_string_buffer(n)
        b = ctypes.create_string_buffer(n)
        t0 = time.monotonic()
        RESULT["h2h_rc"] = sim.aclrtMemcpy(a, n, b, n, 0)
        RESULT["h2h_s"] = time.monotonic() - t0
        RESULT["same"] = rt.memcpy_from_device(p, n) == data
        RESULT["last"] = last_copy()["kind"]
    ''', env={"ACL_SIM_COPY_GBPS": "0.25"})
    modelled = (8 << 20) / 0.25e9  # 0.034 s
    assert modelled <= r["h2d_s"] < modelled + SLACK
    assert modelled <= r["d2h_s"] < modelled + SLACK
    assert r["h2h_rc"] == 0 and r["h2h_s"] < modelled  # host memory only: nothing crosses the link
    assert r["same"] is True
    assert r["last"] == 0  # aclsimGetLastCopy reports backups and restores only


@pytest.mark.parametrize("value, gbps", [("0", 0.0), ("12.5", 12.5), ("fast", 25.0), ("", 25.0), (None, 25.0),
                                         ("-3", 0.0), ("1e9", 100000.0)])
def test_copy_bandwidth_knob(sim, value, gbps):
    r = sim.run('''
        rt.set_device(0)
        p = rt.malloc(4 << 20)
        rt.snapshot_lock(); rt.snapshot_backup()
        RESULT["backup"] = last_copy()
        rt.snapshot_restore(); rt.snapshot_unlock()
    ''', env={"ACL_SIM_COPY_GBPS": value})
    stats = r["backup"]
    assert stats["gbps"] == gbps
    if gbps:
        assert abs(stats["modelledSeconds"] - (4 << 20) / (gbps * 1e9)) < 1e-12
    else:  # not modelled: the copy takes what the host's memcpy takes
        assert stats["modelledSeconds"] == 0 and stats["totalSeconds"] - stats["copySeconds"] < SLACK


@pytest.fixture
def shm_sim(sim):
    """The simulator with its devices on tmpfs (/dev/shm), where device memory is RAM, as in the demo
    and the benchmark."""
    # a machine without /dev/shm cannot run the demo or the bench either: say so, never skip
    assert os.path.isdir("/dev/shm"), "no /dev/shm: mount a tmpfs there (the demo and the benchmark need it too)"
    directory = Path("/dev/shm") / ("inferops-simtest-%s" % uuid.uuid4().hex[:8])
    sim.device_dir = directory
    sim.env["ACL_SIM_DEVICE_DIR"] = str(directory)
    yield sim
    shutil.rmtree(directory, ignore_errors=True)


def test_device_memory_is_allocated_once_when_the_device_is_created(shm_sim):
    sim = shm_sim
    first = sim.run('''
        rt.set_device(0)
        st = os.stat(os.path.join(DEV_DIR, "device0"))
        RESULT["allocated"] = st.st_blocks * 512
        p = rt.malloc(32 << 20)
        rt.memcpy_to_device(p, b"\\x11" * (32 << 20))
        RESULT["mapping"] = device_mapping(0)
        rt.snapshot_lock(); rt.snapshot_backup()
        ctl.reset(0)                                   # pod deleted: wiped, allocated again
        RESULT["allocated_after_reset"] = os.stat(os.path.join(DEV_DIR, "device0")).st_blocks * 512
        sys.stderr.write("@@restore@@\\n"); sys.stderr.flush()
        rt.snapshot_restore(); rt.snapshot_unlock()
        RESULT["same"] = rt.memcpy_from_device(p, 32 << 20) == b"\\x11" * (32 << 20)
    ''', env={"ACL_SIM_LOG": "2"})
    assert first["allocated"] >= 64 * MIB          # all of it, at the first open
    assert first["allocated_after_reset"] >= 64 * MIB
    assert first["same"] is True
    created = [line for line in first.stderr.splitlines() if "bytes of device memory allocated" in line]
    assert len(created) == 1 and "device 0: 67108864 bytes" in created[0]
    # the restore after the reset copied into memory the device already held
    assert "allocated" not in first.stderr.split("@@restore@@", 1)[1]
    # 2 MiB pages where the kernel could gather them; it says so when it could not
    if "2 MiB pages: yes" in created[0]:
        assert first["mapping"].get("ShmemPmdMapped", 0) >= 32 * 1024
    else:
        assert "2 MiB pages: no" in created[0] or "2 MiB pages: partly" in created[0]

    again = sim.run('rt.set_device(0); RESULT["ok"] = True', env={"ACL_SIM_LOG": "2"})
    assert again["ok"] and "allocated" not in again.stderr  # an existing device is not allocated again


@pytest.mark.parametrize("mode", ["pages", "none"])
def test_preallocation_modes(shm_sim, mode):
    r = shm_sim.run('''
        rt.set_device(0)
        RESULT["allocated"] = os.stat(os.path.join(DEV_DIR, "device0")).st_blocks * 512
        p = rt.malloc(8 << 20)
        rt.memcpy_to_device(p, b"\\x22" * (8 << 20))
        RESULT["mapping"] = device_mapping(0)
        rt.snapshot_lock(); rt.snapshot_backup()
        ctl.reset(0)
        RESULT["after_reset"] = os.stat(os.path.join(DEV_DIR, "device0")).st_blocks * 512 if os.path.exists(
            os.path.join(DEV_DIR, "device0")) else None
        rt.snapshot_restore(); rt.snapshot_unlock()
        RESULT["same"] = rt.memcpy_from_device(p, 8 << 20) == b"\\x22" * (8 << 20)
    ''', env={"ACL_SIM_DEVICE_PREALLOC": mode, "ACL_SIM_LOG": "2"})
    assert r["same"] is True
    assert r["mapping"].get("ShmemPmdMapped", 0) == 0  # 4 KiB pages only
    if mode == "pages":
        assert r["allocated"] >= 64 * MIB and r["after_reset"] >= 64 * MIB
        assert "2 MiB pages: not asked" in r.stderr
    else:  # the old model: a sparse file, pages on first use; a reset removes the file
        assert r["allocated"] < 8 * MIB and r["after_reset"] is None
        assert "allocated in" not in r.stderr


def test_aclsim_ctl_create_installs_a_device_ahead_of_its_first_use(shm_sim):
    env = dict(shm_sim.env)
    out = subprocess.run([sys.executable, str(SIM_DIR / "aclsim_ctl.py"), "create", "0", "32M"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("created ")
    st = os.stat(shm_sim.device_dir / "device0")
    assert st.st_size == 32 * MIB and st.st_blocks * 512 >= 32 * MIB
    out = subprocess.run([sys.executable, str(SIM_DIR / "aclsim_ctl.py"), "create", "0", "32M"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("exists ")
    r = shm_sim.run('''
        rt.set_device(0)
        p = rt.malloc(4096)
        RESULT["zeros"] = rt.memcpy_from_device(p, 4096) == bytes(4096)
    ''', env={"ACL_SIM_DEVICE_MEM_BYTES": "32M", "ACL_SIM_LOG": "2"})
    assert r["zeros"] is True and "allocated in" not in r.stderr  # the simulator found it ready

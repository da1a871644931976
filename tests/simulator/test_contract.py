"""The simulator enforces the CANN snapshot runtime contract (through the production binding)."""
import os
import subprocess
import sys
from pathlib import Path

SIM_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(SIM_DIR))
import aclsim_ctl  # noqa: E402

INVALID_PARAM = 100000
LOCK_TIMEOUT = 507905
LOCK_FAILED = 507906
UNLOCK_FAILED = 507907
BACKUP_FAILED = 507908
RESTORE_FAILED = 507909
CALLBACK_FAILED = 507912
REGISTER_FAILED = 507913
RUNNING, LOCKED, BACKED_UP = 0, 1, 2


# ---------------------------------------------------------------- pid / reserved arguments

def test_foreign_pid_is_refused_by_all_four_calls(sim):
    r = sim.run('''
        other = os.getppid()
        calls = (rt.snapshot_lock, rt.snapshot_backup, rt.snapshot_restore, rt.snapshot_unlock)
        RESULT["running"] = [code(f, pid=other) for f in calls]
        RESULT["state_running"] = state()
        rt.snapshot_lock()
        RESULT["locked"] = [code(f, pid=other) for f in calls]
        RESULT["state_locked"] = state()
        rt.snapshot_backup()
        RESULT["backed_up"] = [code(f, pid=other) for f in calls]
        RESULT["state_backed_up"] = state()
        RESULT["pid_1"] = code(rt.snapshot_unlock, pid=1)
        rt.snapshot_unlock()
        RESULT["final"] = state()
    ''')
    assert r["running"] == [INVALID_PARAM] * 4
    assert r["state_running"] == RUNNING
    assert r["locked"] == [INVALID_PARAM] * 4
    assert r["state_locked"] == LOCKED
    assert r["backed_up"] == [INVALID_PARAM] * 4
    assert r["state_backed_up"] == BACKED_UP
    assert r["pid_1"] == INVALID_PARAM
    assert r["final"] == RUNNING
    assert "pid must be current process pid, cross-process operation is not supported" in r.stderr


def test_non_null_reserve_is_refused_and_args_must_hold_flags_0_or_1(sim):
    r = sim.run('''
        pid = os.getpid()
        junk = ctypes.c_void_p(0x1000)
        bad = ctypes.byref(_acl.SnapshotArgs(2))
        RESULT["lock"] = sim.aclrtSnapShotProcessLock(pid, junk)
        RESULT["s0"] = state()
        rt.snapshot_lock()
        RESULT["backup"] = sim.aclrtSnapShotProcessBackup(pid, bad)
        RESULT["unlock_locked"] = sim.aclrtSnapShotProcessUnlock(pid, junk)
        RESULT["s1"] = state()
        rt.snapshot_backup()
        RESULT["restore"] = sim.aclrtSnapShotProcessRestore(pid, bad)
        RESULT["unlock_backed_up"] = sim.aclrtSnapShotProcessUnlock(pid, junk)
        RESULT["s2"] = state()
        RESULT["null_ok"] = sim.aclrtSnapShotProcessRestore(pid, None)
        RESULT["s3"] = state()
        rt.snapshot_unlock()
    ''')
    assert [r["lock"], r["backup"], r["unlock_locked"], r["restore"], r["unlock_backed_up"]] == [INVALID_PARAM] * 5
    assert (r["s0"], r["s1"], r["s2"]) == (RUNNING, LOCKED, BACKED_UP)
    assert r["null_ok"] == 0 and r["s3"] == LOCKED
    assert "reserved parameter and must be nullptr" in r.stderr
    assert "invalid flags 2: 0 (required) or 1 (required and optional)" in r.stderr


def test_the_older_shape_refuses_any_args(legacy_sim):
    r = legacy_sim.run('''
        pid = os.getpid()
        junk = ctypes.c_void_p(0x1000)
        RESULT["api"] = rt.snapshot_api
        rt.snapshot_lock()
        RESULT["backup"] = sim.aclrtSnapShotProcessBackup(pid, junk)
        rt.snapshot_backup()
        RESULT["restore"] = sim.aclrtSnapShotProcessRestore(pid, junk)
        RESULT["null_ok"] = sim.aclrtSnapShotProcessRestore(pid, None)
        rt.snapshot_unlock()
    ''')
    assert r["api"] == "legacy"
    assert r["backup"] == r["restore"] == INVALID_PARAM and r["null_ok"] == 0
    assert "args is a reserved parameter and must be nullptr" in r.stderr


# ---------------------------------------------------------------- state machine

def test_every_illegal_transition_fails_with_its_code_and_keeps_the_state(sim):
    r = sim.run('''
        def probe(names):
            out = {}
            for name in names:
                before = state()
                out[name] = [code(getattr(rt, "snapshot_" + name)), before, state()]
            return out
        RESULT["running"] = probe(["backup", "restore", "unlock"])
        rt.snapshot_lock()
        RESULT["locked"] = probe(["lock", "restore"])
        rt.snapshot_backup()
        RESULT["backed_up"] = probe(["lock", "backup"])
        rt.snapshot_restore()
        RESULT["restored"] = probe(["lock", "restore"])
        rt.snapshot_unlock()
        RESULT["again_running"] = probe(["unlock", "backup"])
        RESULT["tracked"] = rt.state.value
    ''')
    assert r["running"] == {"backup": [BACKUP_FAILED, 0, 0], "restore": [RESTORE_FAILED, 0, 0],
                            "unlock": [UNLOCK_FAILED, 0, 0]}
    assert r["locked"] == {"lock": [LOCK_FAILED, 1, 1], "restore": [RESTORE_FAILED, 1, 1]}
    assert r["backed_up"] == {"lock": [LOCK_FAILED, 2, 2], "backup": [BACKUP_FAILED, 2, 2]}
    assert r["restored"] == {"lock": [LOCK_FAILED, 1, 1], "restore": [RESTORE_FAILED, 1, 1]}
    assert r["again_running"] == {"unlock": [UNLOCK_FAILED, 0, 0], "backup": [BACKUP_FAILED, 0, 0]}
    assert r["tracked"] == "RUNNING"
    assert "current state is not the running state, current state is LOCKED" in r.stderr


def test_unlock_directly_from_locked_and_from_backed_up(sim):
    r = sim.run('''
        rt.set_device(0)
        p = rt.malloc(4096)
        rt.memcpy_to_device(p, b"k" * 4096)
        rt.snapshot_lock(); RESULT["a"] = state(); rt.snapshot_unlock(); RESULT["b"] = state()
        rt.snapshot_lock(); rt.snapshot_backup(); RESULT["c"] = state(); rt.snapshot_unlock()
        RESULT["d"] = state()
        RESULT["data"] = rt.memcpy_from_device(p, 4096) == b"k" * 4096
        RESULT["malloc_after"] = rt.malloc(512) > p
    ''')
    assert (r["a"], r["b"], r["c"], r["d"]) == (LOCKED, RUNNING, BACKED_UP, RUNNING)
    assert r["data"] is True  # no reset in between: the device file still holds the data
    assert r["malloc_after"] is True


def test_full_cycle_keeps_device_data(sim):
    r = sim.run('''
        import hashlib
        rt.init()
        rt.set_device(0)
        sizes = [1 << 20, 1000, 4096, 3]
        bufs = [(rt.malloc(n), os.urandom(n)) for n in sizes]
        for i, (ptr, data) in enumerate(bufs):
            # bytes, bytearray (writable buffer) and a read-only memoryview are all accepted
            rt.memcpy_to_device(ptr, [data, bytearray(data), memoryview(data)][i % 3])
        free_before = rt.mem_info()[0]
        states = [state()]
        rt.snapshot_lock(); states.append(state())
        rt.snapshot_backup(); states.append(state())
        RESULT["backup_bytes"] = sim.aclsimGetBackupBytes()
        rt.snapshot_restore(); states.append(state())
        rt.snapshot_unlock(); states.append(state())
        RESULT["states"] = states
        RESULT["tracked"] = rt.state.value
        RESULT["same"] = [rt.memcpy_from_device(ptr, len(data)) == data for ptr, data in bufs]
        RESULT["free_same"] = rt.mem_info()[0] == free_before
        RESULT["aligned"] = [ptr % 512 == 0 for ptr, _ in bufs]
        RESULT["in_use"] = sorted(rt.devices_in_use)
        rt.reset_device(0)
        rt.finalize()
    ''')
    assert r["states"] == [RUNNING, LOCKED, BACKED_UP, LOCKED, RUNNING]
    assert r["tracked"] == "RUNNING"
    assert r["same"] == [True, True, True, True]
    assert r["backup_bytes"] == (1 << 20) + 1024 + 4096 + 512
    assert r["free_same"] is True
    assert all(r["aligned"])
    assert r["in_use"] == [0]


# ---------------------------------------------------------------- blocking while locked

def test_lock_blocks_resource_calls_until_unlock_but_not_queries(sim):
    r = sim.run('''
        rt.set_device(0)
        p = rt.malloc(4096)
        spare = rt.malloc(512)
        fence = rt.malloc(512)   # bounds the hole left by freeing `spare`
        ready = threading.Barrier(5)
        go = threading.Event()
        done = {}
        def worker(name, fn):
            rt.set_device(0)          # the current device is per thread, as on the NPU
            ready.wait()
            go.wait()
            fn()
            done[name] = time.monotonic()
        jobs = {
            "malloc": lambda: rt.malloc(8192),  # cannot land in spare's hole
            "memcpy": lambda: rt.memcpy_to_device(p, b"after-unlock"),
            "free": lambda: rt.free(spare),
            "set_device": lambda: rt.set_device(1),
        }
        threads = [threading.Thread(target=worker, args=item, daemon=True) for item in jobs.items()]
        for t in threads:
            t.start()
        ready.wait()
        rt.snapshot_lock()
        go.set()
        RESULT["all_blocked"] = wait_for(lambda: sim.aclsimGetBlockedThreadCount() == 4)
        q0 = time.monotonic()
        RESULT["queries"] = [rt.get_device(), rt.device_count(), rt.version(), rt.mem_info()[1]]
        rt.synchronize_device()
        RESULT["query_s"] = time.monotonic() - q0
        time.sleep(0.5)
        RESULT["returned_while_locked"] = sorted(done)
        rt.snapshot_backup()
        time.sleep(0.2)
        RESULT["returned_while_backed_up"] = sorted(done)
        rt.snapshot_restore()
        time.sleep(0.2)
        RESULT["returned_after_restore"] = sorted(done)
        RESULT["blocked_before_unlock"] = sim.aclsimGetBlockedThreadCount()
        t_unlock = time.monotonic()
        rt.snapshot_unlock()
        for t in threads:
            t.join(10)
        RESULT["returned_after_unlock"] = sorted(done)
        RESULT["latency_after_unlock"] = max(done.values()) - t_unlock
        RESULT["blocked_after"] = sim.aclsimGetBlockedThreadCount()
        RESULT["data"] = rt.memcpy_from_device(p, 12).decode()
        RESULT["spare_freed"] = code(rt.free, spare)
    ''')
    assert r["all_blocked"] is True
    assert r["queries"] == [0, 8, "9.1.0", 64 << 20]
    assert r["query_s"] < 0.5
    assert r["returned_while_locked"] == []
    assert r["returned_while_backed_up"] == []
    assert r["returned_after_restore"] == []
    assert r["blocked_before_unlock"] == 4
    assert r["returned_after_unlock"] == ["free", "malloc", "memcpy", "set_device"]
    assert 0 <= r["latency_after_unlock"] < 2.0
    assert r["blocked_after"] == 0
    assert r["data"] == "after-unlock"
    assert r["spare_freed"] == INVALID_PARAM  # the blocked free really ran after unlock


def test_snapshot_calls_themselves_do_not_block(sim):
    r = sim.run('''
        rt.set_device(0)
        rt.snapshot_lock()
        t0 = time.monotonic()
        RESULT["codes"] = [code(rt.snapshot_lock), code(rt.snapshot_restore)]
        rt.snapshot_backup(); rt.snapshot_restore(); rt.snapshot_unlock()
        RESULT["elapsed"] = time.monotonic() - t0
    ''')
    assert r["codes"] == [LOCK_FAILED, RESTORE_FAILED]
    assert r["elapsed"] < 2.0


# ---------------------------------------------------------------- background threads

def test_background_thread_that_never_parks_times_out(sim):
    r = sim.run('''
        rt.set_device(0)
        sim.aclsimBackgroundThreadRegister(b"never-parks")
        late = {}
        max_blocked = [0]
        def late_caller():
            rt.set_device(0)
            time.sleep(0.1)         # arrives while lock() is waiting for the background thread
            t0 = time.monotonic()
            rt.malloc(512)
            late["blocked_s"] = time.monotonic() - t0
        def watcher():
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                max_blocked[0] = max(max_blocked[0], sim.aclsimGetBlockedThreadCount())
                time.sleep(0.005)
        threads = [threading.Thread(target=late_caller), threading.Thread(target=watcher)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        RESULT["code"] = code(rt.snapshot_lock)
        RESULT["elapsed"] = time.monotonic() - t0
        RESULT["state"] = state()
        RESULT["tracked"] = rt.state.value
        for t in threads:
            t.join(10)
        RESULT["late"] = late
        RESULT["max_blocked"] = max_blocked[0]
        RESULT["malloc_now"] = rt.malloc(512) > 0
    ''', env={"ACL_SIM_LOCK_TIMEOUT_MS": "600"})
    assert r["code"] == LOCK_TIMEOUT
    assert 0.55 <= r["elapsed"] < 3.0
    assert r["state"] == RUNNING
    assert r["tracked"] == "RUNNING"
    assert r["max_blocked"] == 1                 # the late caller was blocked by the lock...
    assert 0.3 <= r["late"]["blocked_s"] < 3.0   # ...and woken when the lock reverted
    assert r["malloc_now"] is True
    assert "Timeout: only 0/1 background threads locked" in r.stderr


def test_parking_background_thread_lets_lock_succeed(sim):
    r = sim.run('''
        def bg_loop(name, ticks, stop, park):
            sim.aclsimBackgroundThreadRegister(name)
            registered.release()
            while not stop.is_set():
                if park:
                    sim.aclsimBackgroundThreadWaitIfLocked(name)
                ticks[0] += 1
                time.sleep(0.01)
            sim.aclsimBackgroundThreadUnregister(name)
        registered = threading.Semaphore(0)
        stop = threading.Event()
        ticks = [0]
        t = threading.Thread(target=bg_loop, args=(b"bg-park", ticks, stop, True))
        t.start(); registered.acquire()
        t0 = time.monotonic()
        rt.snapshot_lock()
        RESULT["lock_s"] = time.monotonic() - t0
        RESULT["state"] = state()
        n1 = ticks[0]; time.sleep(0.3); n2 = ticks[0]
        RESULT["parked_progress"] = n2 - n1
        rt.snapshot_unlock()
        time.sleep(0.3)
        RESULT["resumed_progress"] = ticks[0] - n2

        # one thread parks, a second registered thread never does -> 1/2 and the first resumes
        stop2 = threading.Event(); ticks2 = [0]
        t2 = threading.Thread(target=bg_loop, args=(b"bg-lazy", ticks2, stop2, False))
        t2.start(); registered.acquire()
        RESULT["timeout_code"] = code(rt.snapshot_lock)
        RESULT["state_after_timeout"] = state()
        n3 = ticks[0]; time.sleep(0.3)
        RESULT["resumed_after_timeout"] = ticks[0] - n3
        stop.set(); stop2.set(); t.join(5); t2.join(5)
        RESULT["lock_after_unregister"] = code(rt.snapshot_lock)
        rt.snapshot_unlock()
    ''', env={"ACL_SIM_LOCK_TIMEOUT_MS": "500"})
    assert r["lock_s"] < 0.4
    assert r["state"] == LOCKED
    assert r["parked_progress"] <= 1
    assert r["resumed_progress"] >= 5
    assert r["timeout_code"] == LOCK_TIMEOUT
    assert r["state_after_timeout"] == RUNNING
    assert r["resumed_after_timeout"] >= 5
    assert r["lock_after_unregister"] == 0
    assert "Timeout: only 1/2 background threads locked" in r.stderr


# ---------------------------------------------------------------- callbacks

def test_callbacks_fire_per_stage_and_device_in_order_with_user_data(sim):
    r = sim.run('''
        calls = []
        def make(tag):
            def cb(device_id, user_data):
                calls.append([tag, device_id, user_data, state()])
                return 0
            return cb
        for stage in SnapshotStage:
            rt.register_callback(stage, make(stage.name), user_data="ud-" + stage.name)
        rt.register_callback(SnapshotStage.LOCK_PRE, make("LOCK_PRE#2"), user_data={"k": 1})
        rt.snapshot_lock(); rt.snapshot_unlock()
        RESULT["without_device"] = list(calls)
        del calls[:]
        rt.set_device(1)
        rt.set_device(0)
        rt.snapshot_lock(); rt.snapshot_backup(); rt.snapshot_restore(); rt.snapshot_unlock()
        RESULT["calls"] = calls
    ''')
    assert r["without_device"] == []  # the runtime calls back once per open device
    expected = []
    for tag, ud, st in [("LOCK_PRE", "ud-LOCK_PRE", RUNNING)]:
        expected += [[tag, 0, ud, st], [tag, 1, ud, st]]
    expected += [["LOCK_PRE#2", 0, {"k": 1}, RUNNING], ["LOCK_PRE#2", 1, {"k": 1}, RUNNING]]
    for tag, st in [("BACKUP_PRE", LOCKED), ("BACKUP_POST", LOCKED), ("RESTORE_PRE", BACKED_UP),
                    ("RESTORE_POST", BACKED_UP), ("UNLOCK_POST", RUNNING)]:
        expected += [[tag, 0, "ud-" + tag, st], [tag, 1, "ud-" + tag, st]]
    assert r["calls"] == expected


def test_failing_callbacks_fail_the_call(sim):
    r = sim.run('''
        rt.set_device(0)
        p = rt.malloc(4096)
        rt.memcpy_to_device(p, b"v" * 4096)
        fail = lambda dev, ud: 7
        out = {}

        rt.register_callback(SnapshotStage.LOCK_PRE, fail)
        out["lock"] = [code(rt.snapshot_lock), state(), rt.state.value]
        rt.unregister_callback(SnapshotStage.LOCK_PRE, fail)
        rt.snapshot_lock()

        rt.register_callback(SnapshotStage.BACKUP_PRE, fail)
        out["backup_pre"] = [code(rt.snapshot_backup), state(), ctl.is_busy(0)]
        rt.unregister_callback(SnapshotStage.BACKUP_PRE, fail)

        rt.register_callback(SnapshotStage.BACKUP_POST, fail)
        out["backup_post"] = [code(rt.snapshot_backup), state(), ctl.is_busy(0)]
        rt.unregister_callback(SnapshotStage.BACKUP_POST, fail)
        rt.snapshot_backup()

        def boom(dev, ud):
            raise RuntimeError("restore hook exploded")
        rt.register_callback(SnapshotStage.RESTORE_PRE, boom)
        out["restore_pre"] = [code(rt.snapshot_restore), state()]
        out["last_error"] = repr(rt.last_callback_error)
        rt.unregister_callback(SnapshotStage.RESTORE_PRE, boom)
        rt.snapshot_restore()

        rt.register_callback(SnapshotStage.UNLOCK_POST, fail)
        out["unlock_post"] = [code(rt.snapshot_unlock), state(), rt.state.value]
        out["data"] = rt.memcpy_from_device(p, 4096) == b"v" * 4096
        RESULT.update(out)
    ''')
    assert r["lock"] == [CALLBACK_FAILED, RUNNING, "RUNNING"]
    assert r["backup_pre"] == [CALLBACK_FAILED, LOCKED, True]
    assert r["backup_post"] == [CALLBACK_FAILED, LOCKED, True]  # backup undone: device held again
    assert r["restore_pre"] == [CALLBACK_FAILED, BACKED_UP]
    assert "restore hook exploded" in r["last_error"]
    # UNLOCK_POST runs after the transition, as in the runtime: the call fails, the state is RUNNING
    assert r["unlock_post"] == [CALLBACK_FAILED, RUNNING, "RUNNING"]
    assert r["data"] is True
    assert "snapshot call back func execution failed" in r.stderr


def test_callback_registration_errors(sim):
    r = sim.run('''
        cb = lambda dev, ud: 0
        out = {}
        rt.register_callback(SnapshotStage.BACKUP_PRE, cb)
        out["duplicate"] = code(rt.register_callback, SnapshotStage.BACKUP_PRE, cb)
        out["other_stage"] = code(rt.register_callback, SnapshotStage.BACKUP_POST, cb)
        thunk = rt._thunks[cb]
        out["bad_stage_6"] = sim.aclrtSnapShotCallbackRegister(6, thunk, None)
        out["bad_stage_neg"] = sim.aclrtSnapShotCallbackRegister(-1, thunk, None)
        out["null_cb"] = sim.aclrtSnapShotCallbackRegister(0, _acl._CALLBACK(), None)
        out["unregister_unknown"] = code(rt.unregister_callback, SnapshotStage.LOCK_PRE, cb)
        out["unregister"] = code(rt.unregister_callback, SnapshotStage.BACKUP_PRE, cb)
        out["unregister_twice"] = code(rt.unregister_callback, SnapshotStage.BACKUP_PRE, cb)
        out["register_again"] = code(rt.register_callback, SnapshotStage.BACKUP_PRE, cb)
        RESULT.update(out)
    ''')
    assert r.result == {
        "duplicate": REGISTER_FAILED, "other_stage": 0, "bad_stage_6": REGISTER_FAILED,
        "bad_stage_neg": REGISTER_FAILED, "null_cb": REGISTER_FAILED, "unregister_unknown": 107000,
        "unregister": 0, "unregister_twice": 107000, "register_again": 0,
    }
    assert "has been registered in the ACL_RT_SNAPSHOT_BACKUP_PRE phase" in r.stderr


def test_snapshot_call_from_inside_a_callback_is_refused(sim):
    r = sim.run('''
        rt.set_device(0)
        inner = []
        def nested(dev, ud):
            inner.append(code(rt.snapshot_unlock))
            return 0
        rt.register_callback(SnapshotStage.BACKUP_PRE, nested)
        rt.snapshot_lock()
        rt.snapshot_backup()
        RESULT["inner"] = inner
        RESULT["state"] = state()
        rt.snapshot_unlock()
    ''', timeout=30)
    assert r["inner"] == [UNLOCK_FAILED]
    assert r["state"] == BACKED_UP


# ---------------------------------------------------------------- device memory outside the process

def test_device_memory_lives_outside_the_process(sim):
    r = sim.run('''
        rt.set_device(0)
        first = rt.malloc(4096)
        ptr = rt.malloc(4096)
        payload = os.urandom(4096)
        rt.memcpy_to_device(ptr, payload)
        dev, off = ctl.device_offset(ptr)
        maps = []
        for line in open("/proc/self/maps"):
            lo, hi = line.split()[0].split("-")
            maps.append((int(lo, 16), int(hi, 16), line.split()[-1]))
        RESULT.update(ptr=ptr, dev=dev, off=off, payload=payload.hex(),
                      mapped_as=[os.path.basename(path) for lo, hi, path in maps if lo <= ptr < hi],
                      busy_seen_by_other_process=subprocess.run([sys.executable, CTL, "busy", "0"],
                                                                capture_output=True).returncode == 0,
                      dir_mode=oct(os.stat(DEV_DIR).st_mode & 0o777))
    ''')
    assert r["ptr"] == 0x100000000000 + 4096 and r["dev"] == 0 and r["off"] == 4096
    # as with SVM, the pointer lies in the range the driver maps (a mapping of the manager past its end, which any
    # host access faults on), never in the device memory itself
    assert r["mapped_as"] == ["davinci_manager"], r["mapped_as"]
    assert r["busy_seen_by_other_process"] is True
    assert r["dir_mode"] == "0o700"
    # the process is gone; its device memory is still in the device file
    path = sim.device_path(0)
    before = path.stat()
    assert before.st_size == 64 << 20
    assert before.st_blocks * 512 >= 64 << 20  # allocated whole when the device was created
    os.environ["ACL_SIM_DEVICE_DIR"] = str(sim.device_dir)
    try:
        assert aclsim_ctl.peek(0, 4096, 4096).hex() == r["payload"]
        assert aclsim_ctl.is_busy(0) is False
        subprocess.run([sys.executable, str(SIM_DIR / "aclsim_ctl.py"), "reset", "0"], check=True,
                       env=sim.env)
        after = path.stat()  # wiped: a new zeroed device of the same size, its memory allocated again
        assert after.st_size == 64 << 20 and after.st_blocks * 512 >= 64 << 20
        assert aclsim_ctl.peek(0, 4096, 4096) == bytes(4096)
        assert sorted(os.listdir(sim.device_dir)) == ["device0", "nodes.json"]  # nodes.json: its driver's record
    finally:
        del os.environ["ACL_SIM_DEVICE_DIR"]
    r2 = sim.run('''
        rt.set_device(0)
        rt.malloc(4096)
        ptr = rt.malloc(4096)
        RESULT["after_reset"] = rt.memcpy_from_device(ptr, 4096) == bytes(4096)
    ''')
    assert r2["after_reset"] is True


def test_backup_reset_restore_gives_the_original_bytes(sim):
    r = sim.run('''
        rt.set_device(0)
        rt.set_device(1)
        rt.set_device(0)
        n = 1 << 20
        p0 = rt.malloc(n); d0 = os.urandom(n); rt.memcpy_to_device(p0, d0)
        t1 = {}
        def on_dev1():
            rt.set_device(1)
            t1["p"] = rt.malloc(5000); t1["d"] = os.urandom(5000); rt.memcpy_to_device(t1["p"], t1["d"])
        th = threading.Thread(target=on_dev1); th.start(); th.join()
        rt.snapshot_lock()
        RESULT["busy_locked"] = [ctl.is_busy(0), ctl.is_busy(1)]
        rt.snapshot_backup()
        RESULT["busy_backed_up"] = [ctl.is_busy(0), ctl.is_busy(1)]
        RESULT["backup_bytes"] = sim.aclsimGetBackupBytes()
        ctl.reset(0)                                  # pod deleted: device memory gone
        RESULT["reset_c"] = sim.aclsimDeviceReset(1)  # same through the simulator export
        RESULT["files_after_reset"] = sorted(os.listdir(DEV_DIR))
        RESULT["allocated_after_reset"] = [os.stat(os.path.join(DEV_DIR, "device%d" % d)).st_blocks * 512 >= 64 << 20
                                           for d in (0, 1)]
        RESULT["zeros_after_reset"] = [ctl.peek(0, 0, n) == bytes(n), ctl.peek(1, 0, 5000) == bytes(5000)]
        rt.snapshot_restore()
        RESULT["busy_restored"] = [ctl.is_busy(0), ctl.is_busy(1)]
        rt.snapshot_unlock()
        RESULT["same0"] = rt.memcpy_from_device(p0, n) == d0
        RESULT["same1"] = rt.memcpy_from_device(t1["p"], 5000) == t1["d"]
        RESULT["file0"] = ctl.peek(0, 0, n) == d0
    ''')
    assert r["busy_locked"] == [True, True]
    assert r["busy_backed_up"] == [False, False]  # backup released the devices
    assert r["backup_bytes"] == (1 << 20) + 5120
    assert r["reset_c"] == 0
    assert r["files_after_reset"] == ["device0", "device1", "nodes.json"]  # the devices stay, their memory is wiped
    assert r["allocated_after_reset"] == [True, True] and r["zeros_after_reset"] == [True, True]
    assert r["busy_restored"] == [True, True]
    assert r["same0"] is True and r["same1"] is True and r["file0"] is True


def test_backup_reset_unlock_without_restore_gives_zeros(sim):
    r = sim.run('''
        rt.set_device(0)
        n = 65536
        p = rt.malloc(n); rt.memcpy_to_device(p, b"\\x5a" * n)
        rt.snapshot_lock(); rt.snapshot_backup()
        sim.aclsimDeviceReset(0)
        rt.snapshot_unlock()
        got = rt.memcpy_from_device(p, n)
        RESULT["zeros"] = got == bytes(n)
        RESULT["first"] = got[:4].hex()
        RESULT["state"] = state()
    ''')
    assert r["zeros"] is True and r["first"] == "00000000"
    assert r["state"] == RUNNING


def test_restore_while_another_process_holds_the_device_fails(sim):
    r = sim.run('''
        rt.set_device(0)
        p = rt.malloc(8192); data = os.urandom(8192); rt.memcpy_to_device(p, data)
        rt.snapshot_lock(); rt.snapshot_backup()
        holder = hold_device(0)            # another simulator process grabs the released device
        RESULT["restore_busy"] = code(rt.snapshot_restore)
        RESULT["state_busy"] = state()
        RESULT["unlock_busy"] = code(rt.snapshot_unlock)
        RESULT["state_unlock_busy"] = state()
        release(holder)
        rt.snapshot_restore()
        RESULT["state"] = state()
        rt.snapshot_unlock()
        RESULT["same"] = rt.memcpy_from_device(p, 8192) == data
    ''')
    assert r["restore_busy"] == RESTORE_FAILED
    assert r["state_busy"] == BACKED_UP
    assert r["unlock_busy"] == UNLOCK_FAILED and r["state_unlock_busy"] == BACKED_UP
    assert r["state"] == LOCKED
    assert r["same"] is True
    assert "device 0 is busy" in r.stderr


def test_restore_onto_a_smaller_device_fails(sim):
    r = sim.run('''
        rt.set_device(0)
        p = rt.malloc(40 << 20)
        rt.snapshot_lock(); rt.snapshot_backup()
        os.environ["ACL_SIM_DEVICE_MEM_BYTES"] = str(16 << 20)   # "a different device"
        RESULT["restore"] = code(rt.snapshot_restore)
        RESULT["state"] = state()
        os.environ["ACL_SIM_DEVICE_MEM_BYTES"] = str(64 << 20)
        RESULT["retry"] = code(rt.snapshot_restore)
        rt.snapshot_unlock()
    ''')
    assert r["restore"] == RESTORE_FAILED and r["state"] == BACKED_UP and r["retry"] == 0


def test_set_device_fails_while_another_process_holds_it(sim):
    r = sim.run('''
        holder = hold_device(0)
        RESULT["busy"] = code(rt.set_device, 0)
        RESULT["other"] = code(rt.set_device, 1)
        release(holder)
        RESULT["after_release"] = code(rt.set_device, 0)
        RESULT["in_use"] = sorted(rt.devices_in_use)
    ''')
    assert r["busy"] == 507033
    assert r["other"] == 0
    assert r["after_release"] == 0
    assert r["in_use"] == [0, 1]


# ---------------------------------------------------------------- device nodes, held as a real process holds them

HELD = '''
def held():
    """{node: [open flags of each descriptor on it]} and {node: mappings of it} of this process's NPU files."""
    fds, maps = {}, {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        name = os.path.basename(target)
        if name.startswith("davinci") or name in ("npu_device_cust", "devmm_svm", "hisi_hdc"):
            flags = int(open("/proc/self/fdinfo/" + fd).read().split("flags:")[1].split()[0], 8)
            fds.setdefault(name, []).append(flags & (os.O_ACCMODE | os.O_SYNC | os.O_PATH))
    svm = 0
    for line in open("/proc/self/maps"):
        name = os.path.basename(line.split()[-1])
        if name.startswith("davinci") or name in ("npu_device_cust", "devmm_svm", "hisi_hdc"):
            maps[name] = maps.get(name, 0) + 1
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            svm += hi - lo if 0x100000000000 <= lo < 0x180000000000 else 0
    return dict((k, sorted(v)) for k, v in fds.items()), maps, svm
'''
HELD = "\n".join("        " + line if line else line for line in HELD.splitlines()) + "\n"  # as the bodies below
RDWR_SYNC = os.O_RDWR | os.O_SYNC


def test_the_device_files_are_held_as_the_hal_holds_them_through_the_backup_until_the_restores_host_close(sim):
    """The HAL opens davinci_manager read-write once per sub-module (svm and tsdrv, tsdrv_mmap per chip O_SYNC; dms
    without), devmm_svm and hisi_hdc; it reaches the chip through the manager (no descriptor on davinci<N>); it maps
    8 TB of SVM segments from 0x100000000000 and a queue and a doorbell per stream. All of it stays through the
    backup; the restore lets go of it all and opens it again (halDeviceClose(DEV_CLOSE_HOST_USER))."""
    r = sim.run(HELD + '''
        RESULT["before"] = held()
        rt.set_device(0)
        RESULT["running"] = held()
        npu_fds = lambda: sorted(fd for fd in os.listdir("/proc/self/fd") if "/dev/" in os.path.realpath(
            "/proc/self/fd/" + fd))
        first = npu_fds()
        rt.snapshot_lock()
        rt.snapshot_backup()
        RESULT["backed_up"] = held()
        RESULT["same_after_backup"] = npu_fds() == first
        rt.snapshot_restore()
        RESULT["restored"] = held()
        rt.snapshot_unlock()
        RESULT["unlocked"] = held()
        os.unlink(os.path.join(os.environ["ACL_SIM_DEVICE_NODES"], "davinci1"))  # a chip the node lacks
        RESULT["no_node"] = code(rt.set_device, 1)
        rt.reset_device(0)
        RESULT["reset"] = held()
    ''', env={"ACL_SIM_STREAMS": "20"})
    assert r["before"] == [{}, {}, 0]
    fds = {"davinci_manager": sorted([RDWR_SYNC, RDWR_SYNC, RDWR_SYNC, os.O_RDWR]), "devmm_svm": [RDWR_SYNC],
           "hisi_hdc": [os.O_RDWR]}
    maps = {"davinci_manager": 1 + 256 + 2 * 20}  # its first pages, the SVM segments, a queue and a doorbell a stream
    for stage in ("running", "backed_up", "restored", "unlocked"):
        assert r[stage] == [fds, maps, 8 << 40], (stage, r[stage])  # as on hardware: CRIU needs a plugin for all
    assert r["same_after_backup"] is True
    assert r["no_node"] == 507033 and "no device node" in r.stderr
    assert r["reset"] == [{}, {}, 0], "a process that released its devices holds nothing of them"


def test_the_hal_falls_back_to_npu_device_cust_where_the_manager_is_not_accessible(sim, tmp_path):
    nodes = tmp_path / "cust-nodes"
    nodes.mkdir()
    installed = sim.env["ACL_SIM_DEVICE_NODES"]
    for name in os.listdir(installed):
        st = os.lstat(os.path.join(installed, name))
        target = "npu_device_cust" if name == "davinci_manager" else name
        os.mknod(str(nodes / target), st.st_mode, st.st_rdev)
    r = sim.run(HELD + '''
        rt.set_device(0)
        RESULT["running"] = held()
    ''', env={"ACL_SIM_DEVICE_NODES": str(nodes)})
    fds, maps, _svm = r["running"]
    assert "davinci_manager" not in fds and len(fds["npu_device_cust"]) == 4 and maps["npu_device_cust"] > 256


def test_halgetapiversion_is_a_constant_of_the_driver_library_the_process_maps(sim, simulator_lib):
    script = '''
        rt.set_device(0)
        RESULT["versions"] = rt.api_versions()
        RESULT["mapped"] = sorted(set(line.split()[-1] for line in open("/proc/self/maps") if "libascend_hal" in line))
    '''
    node, upgraded = simulator_lib.parent / "driver", simulator_lib.parent / "driver-upgrade"
    now = sim.run(script, env={"ACL_SIM_DRIVER_DIR": str(node)})
    later = sim.run(script, env={"ACL_SIM_DRIVER_DIR": str(upgraded)})
    assert now["versions"]["driver"] == 500 and now["mapped"] == [str(node / "libascend_hal.so")]
    assert later["versions"]["driver"] == 501 and later["mapped"] == [str(upgraded / "libascend_hal.so")]
    assert (upgraded / "libascend_hal.so").stat().st_size != (node / "libascend_hal.so").stat().st_size
    subprocess.run([sys.executable, str(SIM_DIR / "aclsim_ctl.py"), "driver", "api_version=777"], env=sim.env,
                   check=True, capture_output=True)
    without = sim.run(script, env={"ACL_SIM_DRIVER_DIR": str(sim.tmp_path / "no-driver")})
    assert without["versions"]["driver"] == 777 and without["mapped"] == [], "no library: driver.conf stands in"


def test_without_an_installed_driver_the_runtime_finds_no_device(sim, tmp_path):
    r = sim.run('RESULT["rc"] = code(rt.set_device, 0)', env={"ACL_SIM_DEVICE_NODES": str(tmp_path / "no-driver")})
    assert r["rc"] == 507033 and "install the simulated driver" in r.stderr


# ---------------------------------------------------------------- ordinary calls

def test_thread_without_current_device_and_memory_errors(sim):
    r = sim.run('''
        rt.set_device(0)
        p = rt.malloc(1000)
        other = {}
        def no_device():
            other["malloc"] = code(rt.malloc, 16)
            other["get_device"] = code(rt.get_device)
            other["mem_info"] = code(rt.mem_info)
            other["d2h"] = code(rt.memcpy_from_device, p, 4)
        th = threading.Thread(target=no_device); th.start(); th.join()
        out = {"other_thread": other}
        out["past_end"] = code(rt.memcpy_to_device, p, b"x" * 1025)
        out["inside_padding"] = code(rt.memcpy_to_device, p, b"x" * 1024)
        out["host_as_device"] = code(rt.memcpy_from_device, 0x7f0000001000, 4)
        buf = ctypes.create_string_buffer(8)
        out["device_as_host"] = sim.aclrtMemcpy(ctypes.c_void_p(p), 8, buf, 8, 0)
        out["count_gt_destmax"] = sim.aclrtMemcpy(ctypes.c_void_p(p), 4, buf, 8, 1)
        out["bad_kind"] = sim.aclrtMemcpy(buf, 8, buf, 8, 9)
        out["zero_size"] = code(rt.malloc, 0)
        out["oom"] = code(rt.malloc, 65 << 20)
        out["bad_device"] = code(rt.set_device, 8)
        out["free_inner"] = code(rt.free, p + 512)
        free0 = rt.mem_info()[0]
        rt.free(p)
        out["freed"] = rt.mem_info()[0] - free0
        out["double_free"] = code(rt.free, p)
        out["reuse"] = rt.malloc(700) == p
        out["reset_unset"] = code(rt.reset_device, 3)
        RESULT.update(out)
    ''')
    assert r["other_thread"] == {"malloc": 107002, "get_device": 107002, "mem_info": 107002, "d2h": 107002}
    assert r["past_end"] == INVALID_PARAM
    assert r["inside_padding"] == 0
    assert r["host_as_device"] == INVALID_PARAM
    assert r["device_as_host"] == INVALID_PARAM
    assert r["count_gt_destmax"] == INVALID_PARAM
    assert r["bad_kind"] == INVALID_PARAM
    assert r["zero_size"] == INVALID_PARAM
    assert r["oom"] == 207001
    assert r["bad_device"] == 107001
    assert r["free_inner"] == INVALID_PARAM
    assert r["freed"] == 1024
    assert r["double_free"] == INVALID_PARAM
    assert r["reuse"] is True
    assert r["reset_unset"] == INVALID_PARAM


def test_version_meminfo_and_defaults(sim):
    r = sim.run('''
        rt.set_device(2)
        RESULT["version"] = rt.version()
        free0, total = rt.mem_info()
        rt.malloc(1000)
        RESULT["total"] = total
        RESULT["delta"] = free0 - rt.mem_info()[0]
        RESULT["hbm"] = rt.mem_info(1)[1]
        RESULT["count"] = rt.device_count()
        st = os.stat(os.path.join(DEV_DIR, "device2"))
        RESULT["size"] = st.st_size
        RESULT["allocated"] = st.st_blocks * 512
        RESULT["gbps"] = last_copy()["gbps"]
    ''', env={"ACL_SIM_DEVICE_MEM_BYTES": None, "ACL_SIM_VERSION": "9.2.1", "ACL_SIM_DEVICE_COUNT": "4",
              "ACL_SIM_DEVICE_PREALLOC": "none"})
    assert r["version"] == "9.2.1"
    assert r["total"] == 1 << 30 and r["hbm"] == 1 << 30 and r["size"] == 1 << 30
    assert r["allocated"] < 16 << 20  # ACL_SIM_DEVICE_PREALLOC=none: a sparse file
    assert r["gbps"] == 0  # no copy yet
    assert r["delta"] == 1024
    assert r["count"] == 4
    r2 = sim.run('RESULT["v"] = rt.version(); RESULT["bad"] = code(rt.set_device, 8)')
    assert r2["v"] == "9.1.0" and r2["bad"] == 107001


def test_init_and_finalize(sim):
    r = sim.run('''
        out = {"missing_config": code(rt.init, "/nonexistent/acl.json")}
        out["finalize_first"] = code(rt.finalize)
        rt.init()
        out["again"] = code(rt.init)
        rt.set_device(0)
        out["busy_before"] = ctl.is_busy(0)
        rt.finalize()
        out["busy_after"] = ctl.is_busy(0)
        out["in_use"] = sorted(rt.devices_in_use)
        out["get_device"] = code(rt.get_device)
        RESULT.update(out)
    ''')
    assert r.result == {"missing_config": 100003, "finalize_first": 100037, "again": 100002,
                        "busy_before": True, "busy_after": False, "in_use": [], "get_device": 107002}


def test_exit_while_locked_force_unlocks(sim):
    r = sim.run('''
        rt.set_device(0)
        def blocked():
            rt.set_device(0)
            rt.malloc(512)
        rt.snapshot_lock()
        threading.Thread(target=blocked, daemon=True).start()
        RESULT["blocked"] = wait_for(lambda: sim.aclsimGetBlockedThreadCount() == 1)
    ''', timeout=30)
    assert r.rc == 0
    assert r["blocked"] is True
    assert "forcing state transition from LOCKED to RUNNING" in r.stderr


def test_a_container_is_given_what_the_ascend_docker_runtime_gives_it(tmp_path):
    """docker run --device for the chip, the manager (or, selected, its fallback npu_device_cust), devmm_svm and
    hisi_hdc, at /dev as the Ascend Docker Runtime mounts them; the node-wide ones are drivers' character devices."""
    directory = tmp_path / "npu"
    directory.mkdir()
    try:
        plain = aclsim_ctl.docker_args((0,), str(directory))
        cust = aclsim_ctl.docker_args((0,), str(directory), cust=True)
        record = aclsim_ctl.installed(str(directory))
    finally:
        aclsim_ctl.uninstall(str(directory))

    def inside(args):
        return sorted(arg.split(":")[-1] for arg in args if arg != "--device")
    assert inside(plain) == ["/dev/davinci0", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    assert inside(cust) == ["/dev/davinci0", "/dev/devmm_svm", "/dev/hisi_hdc", "/dev/npu_device_cust"]
    assert "%s:/dev/npu_device_cust" % record["manager_node"] in cust
    for name, (major, minor) in aclsim_ctl.NODE_WIDE.items():
        assert "%s:/dev/%s" % (record["node_wide"][name], name) in plain and major == 10 and minor not in (200, 235)

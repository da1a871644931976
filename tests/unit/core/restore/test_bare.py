"""Pure logic of the bare-process restore (engine criu): CRIU's pstree image, engine and pid checks,
what runs from a snapshot. Real files and the real /proc; the CRIU round trip is in
tests/integration/test_bare_process_restore.py."""

import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import criu_image, protobuf_varint as varint

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import CommandError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import proc as proc_facts
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import bare, verify
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import criu_images, metadata, status


def pstree_entry(pid, ppid, threads, packed=False, extra=b""):
    body = b"\x08" + varint(pid) + b"\x10" + varint(ppid) + b"\x18" + varint(pid) + b"\x20" + varint(pid)
    if packed:
        inner = b"".join(varint(t) for t in threads)
        body += b"\x2a" + varint(len(inner)) + inner
    else:
        body += b"".join(b"\x28" + varint(t) for t in threads)
    return body + extra


def write_pstree(directory, entries, common=True):
    return criu_image(directory, criu_images.PSTREE_IMAGE, criu_images.PSTREE_MAGIC, entries, common)


@pytest.mark.parametrize("packed", [False, True])
def test_read_pstree_root_first_with_threads(tmp_path, packed):
    images = write_pstree(tmp_path / "host" / "criu", [
        pstree_entry(70001, 1, [70001, 70002, 300000], packed=packed, extra=b"\x35\x00\x00\x00\x00"),
        pstree_entry(70010, 70001, [70010])])
    assert criu_images.read_pstree(str(images)) == [(70001, [70001, 70002, 300000]), (70010, [70010])]


def test_read_pstree_without_common_magic(tmp_path):
    images = write_pstree(tmp_path, [pstree_entry(5, 1, [5])], common=False)
    assert criu_images.read_pstree(str(images)) == [(5, [5])]


@pytest.mark.parametrize("data, message", [
    (b"\x19\x43\x56\x54", "too short"),
    (struct.pack("<II", criu_images.IMG_COMMON_MAGIC, 0x12345678), "not CRIU's pstree magic"),
    (struct.pack("<III", criu_images.IMG_COMMON_MAGIC, criu_images.PSTREE_MAGIC, 40) + b"\x08\x05", "truncated"),
    (struct.pack("<II", criu_images.IMG_COMMON_MAGIC, criu_images.PSTREE_MAGIC), "holds no process"),
    (struct.pack("<III", criu_images.IMG_COMMON_MAGIC, criu_images.PSTREE_MAGIC, 2) + b"\x10\x01", "without a pid"),
])
def test_read_pstree_rejects_what_it_does_not_know(tmp_path, data, message):
    (tmp_path / criu_images.PSTREE_IMAGE).write_bytes(data)
    with pytest.raises(ValueError, match=message):
        criu_images.read_pstree(str(tmp_path))


def test_engine_reason_names_the_engine_to_use():
    assert verify.engine_reason({"engine": {"name": "criu"}}, "criu") is None
    assert verify.engine_reason(None, "criu") is None  # an invalid manifest has its own reasons
    reason = verify.engine_reason({"engine": {"name": "docker"}}, "criu")
    assert reason.startswith("engine_mismatch: snapshot was taken with engine docker") and "engine=docker" in reason
    assert "restore it with engine=criu" in verify.engine_reason({"engine": {"name": "criu"}}, "docker")


def test_obstacle_reports_taken_pids_and_unreadable_images(tmp_path):
    snap = tmp_path / "pod-a"
    assert bare.obstacle(str(snap / "host" / "criu"))[1].startswith("host_images_unreadable:")
    me = os.getpid()
    write_pstree(snap / "host" / "criu", [pstree_entry(me, 1, [me])])
    tree, reason = bare.obstacle(str(snap / "host" / "criu"))
    assert tree == [(me, [me])]
    assert reason.startswith("pid_in_use:") and "%d (" % me in reason and "is already in use" in reason
    free = free_pid()
    write_pstree(snap / "host" / "criu", [pstree_entry(free, 1, [free])])
    assert bare.obstacle(str(snap / "host" / "criu")) == ([(free, [free])], None)


def free_pid():
    pid_max = int(open("/proc/sys/kernel/pid_max").read())
    for pid in range(pid_max - 1, 1, -1):
        if not os.path.exists("/proc/%d" % pid):
            return pid
    raise AssertionError("no free pid")


def test_what_runs_from_a_snapshot_is_known_by_pid_and_start_time(tmp_path):
    snap = str(tmp_path / "default" / "svc" / "p0" / "pod-a")
    assert bare.running_from_snapshot(snap) is None
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = status.restore_entry("criu", "cold", "missing: no snapshot", pid=proc.pid,
                                     pid_start_time=proc_facts.start_time(proc.pid), durations={"cold_start": 0.1})
        status.update(snap, restore=entry)
        assert bare.running_from_snapshot(snap)["pid"] == proc.pid
        assert status.read(snap)["last_restore"]["outcome"] == "cold"
        # same pid, another process (a later start time): not ours
        status.update(snap, restore=dict(entry, pid_start_time=entry["pid_start_time"] - 1))
        assert bare.running_from_snapshot(snap) is None
        status.update(snap, restore=entry)
        assert proc_facts.stop(proc.pid, entry["pid_start_time"] + 1) is False  # never kill a process that is not ours
        assert proc_facts.alive(proc.pid)
        assert proc_facts.stop(proc.pid, entry["pid_start_time"]) is True
    finally:
        proc.kill()
        proc.wait()
    assert bare.running_from_snapshot(snap) is None


def test_metadata_file_holds_the_new_environment(tmp_path):
    path = tmp_path / "meta" / "metadata.json"
    doc = metadata.document({"B": "2", "A": "1"}, False, "/snap", "snapshot_restore", "missing: x", engine="criu", pid=7)
    metadata.write_host(str(path), doc)
    assert metadata.env_keys(doc) == ["A", "B"]
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(path.parent).st_mode & 0o777 == 0o700
    data = json.loads(path.read_text())
    assert data["env"] == {"A": "1", "B": "2"} and data["restored"] is False and data["engine"] == "criu"
    assert data["reason"] == "missing: x" and data["schema_version"] == 1


def test_start_detached_runs_in_its_own_session_and_logs(tmp_path):
    log = tmp_path / "cold.log"
    proc = bare.start_detached([sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid())"],
                               dict(os.environ), str(log))
    assert proc.wait(30) == 0
    assert log.read_text().strip() == "True" and os.stat(log).st_mode & 0o777 == 0o600
    with pytest.raises(CommandError, match="cold_start: could not start"):
        bare.start_detached([str(tmp_path / "nope")], dict(os.environ))

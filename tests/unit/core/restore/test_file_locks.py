"""POSIX file locks after a restore (restore/file_locks.py, the agent's relock, CRIU's filelocks.img).

The engine here is the sample workload under the real agent, holding read locks the way SQLite does
(WORKLOAD_LOCK_DIR). What CRIU would have written is built as CRIU's own image format: the process tree
and the locks held at the checkpoint, one of which the process does not hold now -- what a restore that
dropped it leaves. The restore with the real CRIU is in tests/integration/test_bare_process_restore.py.
"""

import fcntl
import os
import re
import subprocess
import sys

import pytest

from conftest import criu_image, posix_locks, protobuf_varint

from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import launcher, protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import file_locks
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import criu_images

DB_SHARED = 1073741826  # where the workload's read lock on cache.db starts (SQLite's SHARED range)


def _message(*fields):
    return b"".join(protobuf_varint(number << 3) + protobuf_varint(value) for number, value in fields)


def checkpoint_images(directory, root, locks, flock=None):
    """pstree.img with ``root`` and filelocks.img with ``locks`` [(pid, fd, type, start, len)] (+ one flock)."""
    root_entry = _message((1, root), (2, 0), (3, root), (4, root), (5, root))
    criu_image(directory, criu_images.PSTREE_IMAGE, criu_images.PSTREE_MAGIC, [root_entry])
    entries = [_message((1, criu_images.FL_POSIX), (2, criu_images.F_RDLCK if kind == "read" else criu_images.F_WRLCK), (3, pid),
                        (4, fd), (5, start), (6, length)) for pid, fd, kind, start, length in locks]
    if flock:
        entries.append(_message((1, 2), (2, criu_images.F_WRLCK), (3, root), (4, flock), (5, 0), (6, 0)))
    criu_image(directory, criu_images.FILE_LOCKS_IMAGE, criu_images.FILE_LOCKS_MAGIC, entries)
    return str(directory)


def test_the_lock_image_reader_keeps_posix_locks_only_and_knows_its_format(tmp_path):
    images = checkpoint_images(tmp_path, 7, [(7, 3, "read", DB_SHARED, 510), (7, 4, "write", 120, 0)], flock=5)
    assert criu_images.read_posix_locks(images) == [
        {"pid": 7, "fd": 3, "type": "read", "start": DB_SHARED, "len": 510},
        {"pid": 7, "fd": 4, "type": "write", "start": 120, "len": 0}]
    os.unlink(os.path.join(images, criu_images.FILE_LOCKS_IMAGE))
    assert criu_images.read_posix_locks(images) == []  # CRIU writes none when nothing was locked
    criu_image(tmp_path, criu_images.FILE_LOCKS_IMAGE, criu_images.PSTREE_MAGIC, [])
    with pytest.raises(ValueError, match="filelocks.img has magic 0x50273030, not CRIU's file locks magic"):
        criu_images.read_posix_locks(images)
    criu_image(tmp_path, criu_images.FILE_LOCKS_IMAGE, criu_images.FILE_LOCKS_MAGIC, [_message((1, 1), (2, 0), (3, 7))])
    with pytest.raises(ValueError, match="without all of flag, type, pid, fd, start and len"):
        criu_images.read_posix_locks(images)


@pytest.mark.parametrize("locks, error", [
    (None, "field 'locks': expected a list of 1 to 256 locks"),
    ([], "field 'locks': expected a list of 1 to 256 locks"),
    ([{"fd": 3, "type": "read", "start": 0}], "field 'locks\\[0\\]': expected exactly fd, type, start and len"),
    ([{"fd": -1, "type": "read", "start": 0, "len": 1}], "must be integers >= 0"),
    ([{"fd": True, "type": "read", "start": 0, "len": 1}], "must be integers >= 0"),
    ([{"fd": 3, "type": "exclusive", "start": 0, "len": 1}], "field 'locks\\[0\\].type': 'exclusive' is not one of"),
])
def test_a_malformed_relock_is_refused_naming_the_field(locks, error):
    message = {"v": 1, "op": "relock", "timeout": 5}
    if locks is not None:
        message["locks"] = locks
    reply = launcher.Controller().handle(message)
    assert reply["ok"] is False and reply["error"]["kind"] == "bad_request", reply
    assert re.search(error, reply["error"]["message"]), reply["error"]["message"]
    with pytest.raises(protocol.ProtocolError, match="only relock takes locks, not 'lock'"):
        protocol.parse_request({"v": 1, "op": "lock", "locks": [{"fd": 3, "type": "read", "start": 0, "len": 1}]})


@pytest.fixture
def engine(workload_factory, tmp_path):
    """The workload under the agent, holding a read lock on cache.db and on cache.db-shm (mapped)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    w = workload_factory(WORKLOAD_WARMUP_SECONDS="0.1", WORKLOAD_LOCK_DIR=str(cache)).start()
    w.wait_ready()
    w.cache = cache
    w.fds = dict((os.readlink("/proc/%d/fd/%s" % (w.pid, fd)), int(fd)) for fd in os.listdir("/proc/%d/fd" % w.pid)
                 if os.readlink("/proc/%d/fd/%s" % (w.pid, fd)).startswith(str(cache)))
    yield w
    w.stop()


def test_the_agent_takes_back_a_dropped_lock_and_the_check_sees_it(engine, tmp_path):
    db = engine.fds[str(engine.cache / "cache.db")]
    held = posix_locks(engine.pid)
    assert len(held) == 2, held
    assert file_locks.held(engine.pid, db) == {("read", DB_SHARED, 510)}
    # the checkpoint held one more: a write lock on the database's first page, which the restore dropped
    images = checkpoint_images(tmp_path / "images", engine.pid, [(engine.pid, db, "read", DB_SHARED, 510),
                                                                 (engine.pid, db, "write", 0, 4096)])
    assert [lock["start"] for lock in file_locks.missing(engine.pid, criu_images.read_posix_locks(images))] == [0]
    done = file_locks.hold_again(images, engine.pid, str(engine.socket_dir), 10)
    assert done == {"checkpointed": 2, "taken_back": 1}
    assert file_locks.held(engine.pid, db) == {("read", DB_SHARED, 510), ("write", 0, 4096)}
    assert len(posix_locks(engine.pid)) == 3 and "took back 1 POSIX file lock(s)" in engine.log()
    assert file_locks.hold_again(images, engine.pid, str(engine.socket_dir), 10) == \
        {"checkpointed": 2, "taken_back": 0}  # all held: nothing asked of the agent


def test_a_lock_another_process_took_meanwhile_is_a_failure_naming_it(engine, tmp_path):
    db = engine.fds[str(engine.cache / "cache.db")]
    images = checkpoint_images(tmp_path / "images", engine.pid, [(engine.pid, db, "write", 0, 4096)])
    other = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'r+b'); "
                              "fcntl.lockf(f, fcntl.LOCK_EX, 4096, 0); print('held', flush=True); sys.stdin.read()",
                              str(engine.cache / "cache.db")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(file_locks.LocksLost, match="the restore dropped 1 of the engine's POSIX file locks "
                                                       "\\(fd %d write 0\\+4096; .*\\) and its agent could not take "
                                                       "them back: relock refused .*held by another process" % db):
            file_locks.hold_again(images, engine.pid, str(engine.socket_dir), 10)
    finally:
        other.stdin.close()
        other.wait(10)
    assert len(posix_locks(engine.pid)) == 2  # nothing half taken


def test_without_an_agent_or_in_another_process_a_lost_lock_is_a_failure(engine, tmp_path):
    db = engine.fds[str(engine.cache / "cache.db")]
    images = checkpoint_images(tmp_path / "images", engine.pid, [(engine.pid, db, "write", 0, 4096)])
    with pytest.raises(file_locks.LocksLost, match="its agent could not take them back: the agent socket .* did "
                                                   "not happen within 0.5 s"):
        file_locks.hold_again(images, engine.pid, str(tmp_path / "no-agent-here"), 0.5)
    images = checkpoint_images(tmp_path / "images", engine.pid, [(engine.pid + 100000, 3, "read", 0, 1)])
    with pytest.raises(file_locks.LocksLost, match="process\\(es\\) %d of the restored tree lost POSIX file locks"
                                                   % (engine.pid + 100000)):
        file_locks.hold_again(images, engine.pid, str(engine.socket_dir), 10)


def test_the_agent_refuses_a_descriptor_that_is_not_open(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    fd = os.open(str(path), os.O_RDWR)
    try:
        controller = launcher.Controller()
        reply = controller.handle({"v": 1, "op": "relock", "timeout": 5,
                                   "locks": [{"fd": fd, "type": "write", "start": 10, "len": 5},
                                             {"fd": 9999, "type": "read", "start": 0, "len": 1}]})
        assert reply["ok"] is False and reply["error"]["kind"] == "file_lock", reply
        assert reply["error"]["message"] == "1 of 2 lock(s) not taken: fd 9999 read lock at 0+1: Bad file descriptor"
        assert file_locks.held(os.getpid(), fd) == {("write", 10, 5)}  # the other one is kept
        fcntl.lockf(fd, fcntl.LOCK_UN, 5, 10)
    finally:
        os.close(fd)

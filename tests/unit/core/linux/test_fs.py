"""linux/fs.py: files and folders as the collection writes and reads them -- atomic records, private folders, bounded
reads that refuse what a writer of the store may have put in place of a file -- and the one folder lock."""

import errno
import os
import stat
import subprocess
import sys
import threading

import pytest

from conftest import COLLECTIONS

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import fs
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import container_record, status


def _holder(path, shared=False):
    """Another process holding the folder's lock until its stdin closes."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import fs\n"
            "fd = fs.locked_fd(%r, shared=%r); print('held', flush=True); sys.stdin.read()"
            % (str(COLLECTIONS), str(path), shared))
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             universal_newlines=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_an_exclusive_lock_held_elsewhere_is_busy_at_once_without_waiting(tmp_path):
    child = _holder(tmp_path)
    try:
        with pytest.raises(fs.LockBusy) as caught:
            fs.locked_fd(str(tmp_path), wait=False)
        assert caught.value.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        with pytest.raises(fs.LockBusy):
            fs.locked_fd(str(tmp_path), shared=True, wait=False)
    finally:
        child.communicate("")
    os.close(fs.locked_fd(str(tmp_path), wait=False))  # released with its holder


def test_shared_locks_share_and_keep_an_exclusive_one_out(tmp_path):
    child = _holder(tmp_path, shared=True)
    try:
        os.close(fs.locked_fd(str(tmp_path), shared=True, wait=False))
        with pytest.raises(fs.LockBusy):
            fs.locked_fd(str(tmp_path), wait=False)
    finally:
        child.kill()
        child.wait()
    os.close(fs.locked_fd(str(tmp_path), wait=False))  # a killed holder's lock is gone with it


def test_a_folder_is_never_locked_through_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError) as caught:
        fs.locked_fd(str(tmp_path / "link"))
    assert not isinstance(caught.value, fs.LockBusy) and caught.value.errno in (errno.ELOOP, errno.ENOTDIR)


def test_the_with_form_holds_the_lock_for_its_block_and_makes_a_lock_file_when_told(tmp_path):
    lock = tmp_path / "counters.lock"
    with fs.locked(str(lock), flags=os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC):
        assert oct(os.stat(lock).st_mode & 0o777) == "0o600"
        with pytest.raises(fs.LockBusy):
            fs.locked_fd(str(lock), wait=False, flags=os.O_RDWR | os.O_CLOEXEC)
    os.close(fs.locked_fd(str(lock), wait=False, flags=os.O_RDWR | os.O_CLOEXEC))


def test_write_file_atomic_modes_and_no_symlink_following(tmp_path):
    directory = fs.ensure_dir(str(tmp_path / "a" / "b"))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    target = os.path.join(directory, "f.json")
    fs.write_file_atomic(target, b"one")
    fs.write_file_atomic(target, b"two")
    assert open(target, "rb").read() == b"two"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert sorted(os.listdir(directory)) == ["f.json"], "no temporary file may be left behind"


def test_remove_tree_does_not_follow_symlinks(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(keep)
    fs.remove_tree(str(tree))
    assert not tree.exists() and (keep / "precious").exists()


def test_a_store_that_refuses_writes_is_named_with_its_cause_and_its_fix(tmp_path):
    import errno
    target = str(tmp_path / ".pod-a.status.json")
    read_only = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "..pod-a.status.json.tmp.4242"))  # write_file_atomic's
    assert fs.store_error(read_only) == ("cannot write %s: Read-only file system -- the storage it is on is read-only; "
                                         "remount it read-write, or point the snapshot path at writable storage"
                                         % target)
    full = fs.store_error(OSError(errno.ENOSPC, "No space left on device", target))
    assert full.startswith("cannot write %s: No space left on device -- the storage it is on is full; " % target) \
        and "snapshot_cleanup" in full
    assert fs.store_error(OSError(errno.EACCES, "Permission denied", target)) is None


def test_a_file_the_seal_flushes_is_written_without_its_own_fsync(tmp_path, monkeypatch):
    """The container record is written in the staging directory right after the dump; its own fsync would commit
    ext4's journal, which first writes out the page images just written -- inside the engine's lock window. The seal
    flushes every file of the directory instead."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    fs.write_file_atomic(str(tmp_path / "durable"), b"x")
    assert len(synced) == 1
    container_record.write_container_record(str(tmp_path / "staging"),
                                            {"Id": "c" * 64, "Name": "/w", "Image": "sha256:" + "i" * 64})
    assert len(synced) == 1, "the container record is not fsync'd on its own"
    assert (tmp_path / "staging" / "host" / "container.json").read_bytes().startswith(b"{")


def test_ensure_dir_from_many_threads_leaves_the_process_umask_as_it_was(tmp_path):
    """The umask is the whole process's: a helper that set and restored it raced the other threads (two of them
    could leave it at 0077 for good, and every file made meanwhile got its mode from it). The folders are still
    0700, parents included, whatever the umask."""
    def make(worker):
        for index in range(40):
            fs.ensure_dir(str(tmp_path / str(worker) / str(index) / "leaf"))

    saved = os.umask(0o002)
    try:
        threads = [threading.Thread(target=make, args=(worker,)) for worker in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert os.umask(0o002) == 0o002, "ensure_dir changed the process umask"
    finally:
        os.umask(saved)
    modes = set(stat.S_IMODE(os.stat(os.path.join(top, name)).st_mode)
                for top, dirs, _files in os.walk(str(tmp_path)) for name in dirs)
    assert modes == {0o700}, [oct(mode) for mode in modes]


def returns_within(seconds, call):
    """What ``call()`` returned or raised, from a thread that must end within ``seconds`` (a FIFO's open blocks)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except Exception as exc:  # pylint: disable=broad-except  # the test looks at it
            outcome["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "still blocked after %s s" % seconds
    return outcome


@pytest.mark.parametrize("reader", ["open_regular", "hash_range", "mapped_hash_range", "read_document"])
def test_a_fifo_where_a_file_was_expected_is_refused_not_waited_on(tmp_path, reader):
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, mapped
    fifo = str(tmp_path / "pages-1.img")
    os.mkfifo(fifo)
    call = {"open_regular": lambda: fs.open_regular(fifo), "hash_range": lambda: hashing.hash_file(fifo),
            "mapped_hash_range": lambda: mapped.hash_range(fifo), "read_document": lambda: hashing.read_document(fifo)}
    outcome = returns_within(30, call[reader])
    assert isinstance(outcome.get("error"), fs.NotRegularFile), outcome
    assert "is not a regular file" in str(outcome["error"])


def test_an_engine_cannot_hang_the_metadata_read_with_a_fifo_in_its_root(tmp_path):
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import metadata
    (tmp_path / "etc").mkdir()
    os.mkfifo(str(tmp_path / "etc" / "meta.json"))
    root = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert returns_within(30, lambda: metadata.read_in_root(root, "etc/meta.json")) == {"value": None}
    finally:
        os.close(root)


def test_open_regular_gives_a_plain_blocking_descriptor_and_never_follows_a_link(tmp_path):
    (tmp_path / "f").write_bytes(b"data")
    fd = fs.open_regular(str(tmp_path / "f"))
    try:
        import fcntl
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK and os.read(fd, 10) == b"data"
    finally:
        os.close(fd)
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(OSError):
        fs.open_regular(str(tmp_path / "link"))


def test_make_dir_if_missing_makes_private_folders_and_leaves_an_existing_one_as_it_is(tmp_path):
    shared = tmp_path / "shm"
    shared.mkdir()
    shared.chmod(0o1777)
    assert fs.make_dir_if_missing(str(shared)) == str(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    leaf = tmp_path / "missing" / "parent" / "decrypt"
    fs.make_dir_if_missing(str(leaf))
    for folder in (leaf, leaf.parent, leaf.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_list_plain_files_sorts_the_whole_tree_and_refuses_anything_but_files_and_folders(tmp_path):
    (tmp_path / "b.img").write_bytes(b"b")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.img").write_bytes(b"x")
    assert fs.list_plain_files(str(tmp_path)) == ["a/x.img", "b.img"]
    os.mkfifo(str(tmp_path / "a" / "pipe"))
    with pytest.raises(fs.NotRegularFile, match="a/pipe is not a regular file or directory"):
        fs.list_plain_files(str(tmp_path))
    os.unlink(str(tmp_path / "a" / "pipe"))
    os.symlink("/etc", str(tmp_path / "a" / "linked"))
    with pytest.raises(ValueError, match="a/linked"):  # NotRegularFile is a ValueError for the checks that catch that
        fs.list_plain_files(str(tmp_path))


def test_list_plain_files_raises_where_os_walk_would_list_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        fs.list_plain_files(str(tmp_path / "gone"))


def test_a_record_behind_a_link_a_fifo_or_too_large_reads_as_none_without_blocking(tmp_path):
    """A writer of the store replaces a status record: a FIFO would block the reader under the pod's lock, a link to
    /dev/zero would be read until memory ran out. Each reads as no record."""
    good = tmp_path / "good.json"
    good.write_text('{"status": "completed"}')
    assert fs.read_json(str(good)) == {"status": "completed"}
    os.mkfifo(str(tmp_path / "fifo.json"))
    os.symlink("/dev/zero", str(tmp_path / "zero.json"))
    os.symlink(str(good), str(tmp_path / "link.json"))
    (tmp_path / "large.json").write_text('{"a": "%s"}' % ("x" * 2000))
    for name in ("fifo.json", "zero.json", "link.json", "missing.json"):
        assert fs.read_json(str(tmp_path / name)) is None, name
    assert fs.read_json(str(tmp_path / "large.json"), limit=1000) is None
    assert fs.read_json(str(tmp_path / "large.json"))["a"] == "x" * 2000


def test_a_temporary_file_a_killed_writer_left_does_not_fail_the_next_writer_with_its_pid(tmp_path):
    """A writer killed between its open and its rename leaves its temporary file; after a reboot or once pids wrap,
    another process gets its pid. Its writes -- the status record, the claim -- must not fail on that file (audit F4);
    the next generation's claim sweeps such files once their writer is gone."""
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    os.makedirs(os.path.dirname(snap))
    left = ["." + os.path.basename(record(snap)) + ".tmp.%d" % os.getpid()
            for record in (layout.status_path, layout.claim_path)]
    for name in left:
        (tmp_path / "ns" / "svc" / "p0" / name).write_text("half written by a killed writer")
    assert status.update(snap, "generating", generation_id="run-b")["status"] == "generating"
    live = tmp_path / "ns" / "svc" / "p0" / "..pod-a.status.json.tmp.1.0badc0de"  # pid 1 lives: never swept
    live.write_text("")
    old = os.stat(live).st_mtime - fs.TEMP_STALE_AGE - 1
    for name in left:
        os.utime(str(tmp_path / "ns" / "svc" / "p0" / name), (old, old))
    os.utime(str(live), (old, old))
    assert claim.take(snap, "run-b", lease=60)["id"] == "run-b"
    assert sorted(os.listdir(os.path.dirname(snap))) == sorted([live.name, ".pod-a.generation.json",
                                                                ".pod-a.status.json"])
    assert fs.store_error(OSError(30, "Read-only file system", str(tmp_path / "..pod-a.status.json.tmp.7.00ff"))) \
        .startswith("cannot write %s: " % (tmp_path / ".pod-a.status.json"))

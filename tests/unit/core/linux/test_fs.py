"""fs.locked_fd / fs.locked: the one way a folder (or lock file) is locked -- shared or exclusive, waiting or not,
never through a link, released with the fd or the holder's death."""

import errno
import os
import subprocess
import sys

import pytest

from conftest import COLLECTIONS

from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import fs


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

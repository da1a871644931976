"""Where an encrypted snapshot's plaintext lives: a private 0700 directory, nothing left behind by remove(), and
what a killed run left swept by the next one -- never what a live one holds, in another process, nor what is
not a plaintext directory. Real processes, real locks."""

import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import plaintext

from conftest import COLLECTIONS


@pytest.fixture
def shm_parent():
    """A work directory on tmpfs, as /dev/shm is the default."""
    parent = "/dev/shm/inferops-test-plaintext-%d" % os.getpid()
    os.makedirs(parent, 0o700)
    yield parent
    subprocess.call(["rm", "-rf", parent])


def test_a_private_directory_that_remove_takes_away(shm_parent):
    private = plaintext.PrivateDir(shm_parent)
    assert oct(os.stat(private.path).st_mode & 0o777) == "0o700" and os.path.dirname(private.path) == shm_parent
    with open(os.path.join(private.path, "pages-1.img"), "wb") as handle:
        handle.write(b"secret pages")
    private.remove()
    private.remove()  # twice is harmless
    assert os.listdir(shm_parent) == []


def _holder(parent):
    """Another process holding a PrivateDir, until it is killed (as a run killed mid-restore)."""
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import plaintext\n"
            "p = plaintext.PrivateDir(%r); print(p.path, flush=True); time.sleep(600)" % (str(COLLECTIONS), parent))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, universal_newlines=True)
    return child, child.stdout.readline().strip()


def test_a_killed_runs_plaintext_is_swept_by_the_next_one_and_a_live_runs_never(shm_parent):
    child, held = _holder(shm_parent)
    try:
        with open(os.path.join(held, "pages-1.img"), "wb") as handle:
            handle.write(b"secret pages")
        later = time.time() + 2 * plaintext.STALE_AFTER
        assert plaintext.sweep(shm_parent, now=later) == [] and os.path.exists(held), "its owner lives: kept"
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert plaintext.sweep(shm_parent) == [] and os.path.exists(held), "a minute's grace for a fresh one"
        assert plaintext.sweep(shm_parent, now=later) == [held]
        assert not os.path.exists(held)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_the_next_private_dir_sweeps_what_a_killed_run_left(shm_parent):
    child, held = _holder(shm_parent)
    child.kill()
    child.wait()
    old = time.time() - 2 * plaintext.STALE_AFTER
    os.utime(held, (old, old))
    private = plaintext.PrivateDir(shm_parent)
    try:
        assert private.swept == [held] and not os.path.exists(held)
        assert os.listdir(shm_parent) == [os.path.basename(private.path)]
    finally:
        private.remove()


def test_the_sweep_leaves_alone_what_is_not_a_plaintext_directory(shm_parent):
    old = time.time() - 2 * plaintext.STALE_AFTER
    other = os.path.join(shm_parent, "someone-elses")
    os.mkdir(other)
    planted = os.path.join(shm_parent, plaintext.PREFIX + "link")
    os.symlink(other, planted)
    for path in (other, planted):
        os.utime(path, (old, old), follow_symlinks=False)
    assert plaintext.sweep(shm_parent) == []
    assert os.path.isdir(other) and os.path.islink(planted)


def test_a_directory_emptied_through_descriptors_is_removed_only_where_its_path_still_leads_to_it(tmp_path):
    """A restore's view in the store, which a writer may have exchanged for another folder of the same name: remove()
    with the identity of the folder it made takes that one away, never whatever the path leads to now."""
    private = plaintext.PrivateDir(str(tmp_path), prefix=".inferops-view-")
    st = os.stat(private.path)
    private.remove(expect=(st.st_dev, st.st_ino))
    assert os.listdir(str(tmp_path)) == []
    private = plaintext.PrivateDir(str(tmp_path), prefix=".inferops-view-")
    st, path = os.stat(private.path), private.path
    os.rename(path, str(tmp_path / "moved"))
    os.mkdir(path)  # someone else's, at the old name
    private.remove(expect=(st.st_dev, st.st_ino))
    assert sorted(os.listdir(str(tmp_path))) == sorted([os.path.basename(path), "moved"]), "both left alone"
    assert private.path is None

"""core/restore/held.py: a snapshot's files held for one restore -- opened once, leased against writers, shown as the same
inodes or a copy made by the read that verified them, placed where Docker wants them without a path read again."""

import os
import subprocess
import sys

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import held
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, manifest

PAGES = "host/criu/pages-1.img"


@pytest.fixture
def snap(tmp_path):
    root = tmp_path / "snap"
    (root / "host" / "criu").mkdir(parents=True)
    (root / PAGES).write_bytes(b"weights" * 10000)
    (root / "manifest.json").write_bytes(b"{}")
    return str(root)


def no_leases(monkeypatch):
    monkeypatch.setattr(held, "F_SETLEASE", -1)  # as on NFS: fcntl refuses the lease


def test_every_file_is_leased_and_the_view_is_the_same_inodes(snap, tmp_path):
    h = held.Held.open(snap, str(tmp_path))
    try:
        assert h.mode == "leased" and sorted(h.fds) == ["host/criu/pages-1.img", "manifest.json"]
        assert os.stat(os.path.join(h.view, PAGES)).st_ino == os.stat(os.path.join(snap, PAGES)).st_ino
        assert h.broken() == []
    finally:
        h.close()
    assert os.listdir(str(tmp_path)) == ["snap"], "the view is gone"


def test_a_rename_in_the_store_does_not_redirect_the_view(snap, tmp_path):
    h = held.Held.open(snap, str(tmp_path))
    try:
        with open(os.path.join(snap, PAGES + ".new"), "wb") as handle:
            handle.write(b"forged")
        os.rename(os.path.join(snap, PAGES + ".new"), os.path.join(snap, PAGES))
        assert open(os.path.join(h.view, PAGES), "rb").read().startswith(b"weights")
        assert h.broken() == [], "a rename writes nothing into the held inode"
    finally:
        h.close()


def test_opening_a_held_file_for_writing_breaks_its_lease_and_waits_for_the_release(snap, tmp_path):
    h = held.Held.open(snap, str(tmp_path))
    writer = subprocess.Popen([sys.executable, "-c", "import os, sys; os.open(sys.argv[1], os.O_WRONLY)",
                               os.path.join(snap, PAGES)])
    try:
        from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import wait_for
        wait_for(lambda: (bool(h.broken()), h.broken()), 30, 0.01, what="the lease to break")
        assert h.broken() == [PAGES] and writer.poll() is None, "the writer is held off while the restore reads"
    finally:
        h.close()
    assert writer.wait(timeout=30) == 0


def test_a_file_already_open_for_writing_cannot_be_leased_so_it_is_copied(snap, tmp_path):
    fd = os.open(os.path.join(snap, PAGES), os.O_WRONLY)
    try:
        h = held.Held.open(snap, str(tmp_path / "shm"))
    finally:
        os.close(fd)
    try:
        assert h.mode == "copied" and PAGES in h.why_copied
    finally:
        h.close()


def test_where_leases_fail_the_verifying_read_makes_the_copy_the_restore_reads(snap, tmp_path, monkeypatch):
    no_leases(monkeypatch)
    (tmp_path / "shm").mkdir()
    h = held.Held.open(snap, str(tmp_path / "shm"))
    try:
        assert h.mode == "copied" and h.why_copied == PAGES + ": Invalid argument"
        hashes = hashing.hash_tree(snap, sorted(h.fds), files=h)[0]
        with open(os.path.join(snap, PAGES), "r+b") as handle:  # rewritten in place after it was read
            handle.write(b"forged")
        copy = open(os.path.join(h.view, PAGES), "rb").read()
        assert copy.startswith(b"weights") and hashes[PAGES][0] == len(copy)
        assert os.path.realpath(h.view).startswith(str(tmp_path / "shm"))
    finally:
        h.close()
    assert os.listdir(str(tmp_path / "shm")) == []


def test_a_copy_that_would_not_fit_is_refused_before_anything_is_copied(snap, tmp_path, monkeypatch):
    no_leases(monkeypatch)
    monkeypatch.setattr(held.fs, "free_bytes", lambda path: 10)
    with pytest.raises(held.HoldError, match=r"insufficient_space: the restore copies the snapshot's files as it "
                                             r"verifies them \(.*Invalid argument\): .*\(decrypt_dir\)"):
        held.Held.open(snap, str(tmp_path))


def test_a_link_in_the_snapshot_is_refused(snap, tmp_path):
    os.symlink("/etc/shadow", os.path.join(snap, "host", "criu", "core-1.img"))
    with pytest.raises(held.HoldError, match="unsafe_file: host/criu/core-1.img"):
        held.Held.open(snap, str(tmp_path))


def test_a_fifo_in_the_snapshot_is_refused_not_waited_on(snap, tmp_path):
    os.mkfifo(os.path.join(snap, "host", "criu", "pipe.img"))
    with pytest.raises(held.HoldError, match="unsafe_file: host/criu/pipe.img is not a regular file"):
        held.Held.open(snap, str(tmp_path))


@pytest.mark.parametrize("leases", [True, False])
def test_placing_links_the_held_inodes_on_the_same_mount_and_copies_elsewhere(snap, tmp_path, monkeypatch, leases):
    if not leases:
        no_leases(monkeypatch)
    (tmp_path / "shm").mkdir()
    h = held.Held.open(snap, str(tmp_path / "shm"))
    try:
        if not leases:
            hashing.hash_tree(snap, sorted(h.fds), files=h)  # the verification makes the copy
        near, far = tmp_path / "near", "/dev/shm"  # the same mount as the snapshot; another filesystem
        near.mkdir()
        how = h.place("host/criu", str(near))
        assert how == ("hardlink" if leases else "copy")
        same = os.stat(near / "pages-1.img").st_ino == os.stat(os.path.join(snap, PAGES)).st_ino
        assert same is leases
        import tempfile
        other = tempfile.mkdtemp(dir=far)
        try:
            assert h.place("host/criu", other) == "copy"
            assert open(os.path.join(other, "pages-1.img"), "rb").read().startswith(b"weights")
        finally:
            import shutil
            shutil.rmtree(other)
    finally:
        h.close()


def test_the_shared_parent_of_views_and_copies_is_never_changed(snap, tmp_path, monkeypatch):
    parent = tmp_path / "shm"
    parent.mkdir()
    os.chmod(str(parent), 0o1777)  # as /dev/shm: everyone's
    for leases in (True, False):
        if not leases:
            no_leases(monkeypatch)
        h = held.Held.open(snap, str(parent))
        os.listdir(h.view)
        h.close()
        assert oct(os.stat(str(parent)).st_mode & 0o7777) == oct(0o1777)


def test_the_view_is_hard_links_beside_the_snapshot_or_copies_read_through_the_held_descriptors(snap, tmp_path,
                                                                                                monkeypatch):
    h = held.Held.open(snap, str(tmp_path / "shm"))
    try:
        view = h.make_view()
        place = h.view_path
        assert os.path.dirname(place) == os.path.dirname(snap) and os.path.basename(place).startswith(".inferops-view-")
        assert h.linked and os.stat(os.path.join(view, PAGES)).st_ino == os.stat(os.path.join(snap, PAGES)).st_ino
        assert h.summary()["watched"] is True
    finally:
        h.close()
    monkeypatch.setattr(held, "_link_fd", lambda *args: False)  # another mount, a read-only store
    h = held.Held.open(snap, str(tmp_path / "shm"))
    try:
        with open(os.path.join(snap, PAGES + ".new"), "wb") as handle:
            handle.write(b"forged")
        os.rename(os.path.join(snap, PAGES + ".new"), os.path.join(snap, PAGES))
        view = h.make_view()
        assert h.view_path.startswith(str(tmp_path / "shm")) and not h.linked and "no links beside" in h.why_copied
        assert open(os.path.join(view, PAGES), "rb").read().startswith(b"weights"), "read through the held descriptor"
    finally:
        h.close()
    assert [n for n in os.listdir(os.path.dirname(snap)) if n.startswith(".inferops")] == []


def test_a_file_held_then_unlinked_before_the_check_is_still_judged_and_refused(tmp_path):
    """A writer adds a file the dump did not have, lets the restore hold it, and unlinks it before the check lists
    the folder: the held file would be in the view CRIU reads, so the check judges the held files, not a listing."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import seal
    staging, final = tmp_path / "store" / ".pod.partial", tmp_path / "store" / "pod"
    (staging / "host" / "criu").mkdir(parents=True)
    (staging / PAGES).write_bytes(b"weights" * 10000)
    seal.seal(str(staging), {"identity": {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "pod"},
                             "created_at": "2026-12-05T12:00:00Z", "image": None, "engine": {"name": "criu"},
                             "runtime": {"name": "ascend-acl", "version": None}, "devices": []})
    seal.publish(str(staging), str(final))
    extra = final / "host" / "criu" / "seccomp.img"
    extra.write_bytes(b"ATTACKER BYTES")
    h = held.Held.open(str(final), str(tmp_path / "private"))
    try:
        extra.unlink()
        valid, reasons, _details = manifest.verify(str(final), plan=manifest.FULL._replace(files=h))
        assert not valid and "file_unlisted: host/criu/seccomp.img is not covered by checksum.sha256" in reasons, reasons
    finally:
        h.close()


def test_a_file_renamed_into_the_view_after_the_check_is_seen_even_when_put_back(snap, tmp_path):
    """A rename breaks no lease: a writer with root's rights in the store renames its own file over one of the view
    (CRIU would read it), and may put the verified one back afterwards. The kernel tells the watch either way."""
    h = held.Held.open(snap, str(tmp_path / "private"))
    try:
        h.make_view()
        view = h.view_path
        assert h.broken() == []
        target = os.path.join(view, PAGES)
        forged = os.path.join(view, "host", "criu", "forged")
        with open(forged, "wb") as handle:
            handle.write(b"ATTACKER CORE IMAGE")
        saved = os.path.join(view, "saved")
        os.link(target, saved)
        os.rename(forged, target)
        assert open(target, "rb").read() == b"ATTACKER CORE IMAGE"  # what CRIU would read now
        os.rename(saved, target)  # and the verified inode back, before anyone looks
        assert os.stat(target).st_ino == os.stat(os.path.join(snap, PAGES)).st_ino
        broken = h.broken()
        assert broken == ["the view's folder host/criu (forged created, written, closed after writing, renamed away; "
                          "pages-1.img renamed in)", "the view's folder . (saved created, renamed away)"], broken
    finally:
        h.close()


def test_the_view_moved_away_and_back_is_seen(snap, tmp_path):
    h = held.Held.open(snap, str(tmp_path / "private"))
    try:
        h.make_view()
        place = h.view_path
        os.rename(place, place + ".away")
        os.rename(place + ".away", place)
        assert "the view's folder . (the folder moved)" in h.broken()
    finally:
        h.close()


def test_the_store_exchanged_for_a_forged_tree_redirects_no_reader(tmp_path):
    """A writer of the store exchanges the snapshot's <instance> directory with a forged tree (renameat2
    RENAME_EXCHANGE) once the view is sealed, a folder of the same name in it: the path the view had now leads to the
    forged images, but every reader is handed the folder the restore holds (/proc/<pid>/fd/<N>), which went with the
    exchange. What is read is what was verified; and the forged tree's folder is left alone at the end."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import syscalls
    instance, forged = tmp_path / "store" / "ns" / "svc" / "p0", tmp_path / "store" / "ns" / "svc" / "p0-forged"
    (instance / "pod" / "host" / "criu").mkdir(parents=True)
    (instance / "pod" / PAGES).write_bytes(b"weights" * 10000)
    h = held.Held.open(str(instance / "pod"), str(tmp_path / "private"))
    try:
        images = h.images_dir
        assert images.startswith("/proc/%d/fd/" % os.getpid())
        name = os.path.basename(h.view_path)
        (forged / name / "host" / "criu").mkdir(parents=True)
        (forged / name / PAGES).write_bytes(b"ATTACKER PAGES")
        syscalls.exchange(str(instance), str(forged))
        assert open(os.path.join(h.view_path, PAGES), "rb").read() == b"ATTACKER PAGES", "the path leads elsewhere now"
        assert open(os.path.join(images, "pages-1.img"), "rb").read().startswith(b"weights")
        assert open(os.path.join(h.view, PAGES), "rb").read().startswith(b"weights")
        assert h.broken() == [], "harmless: nothing of the view changed"
    finally:
        h.close()
    assert (instance / name / PAGES).read_bytes() == b"ATTACKER PAGES", "the forged folder is not the restore's to remove"
    assert os.listdir(str(forged / name)) == [], "the restore's own view was emptied where the exchange put it"


def test_where_no_watch_can_be_had_the_view_is_a_copy(snap, tmp_path, monkeypatch):
    def refused():
        raise OSError(24, "no inotify instance (Too many open files)")

    monkeypatch.setattr(held.syscalls, "Watch", refused)
    h = held.Held.open(snap, str(tmp_path / "shm"))
    try:
        h.make_view()
        assert not h.linked and h.why_copied.startswith("no watch on a view beside the snapshot (")
        assert h.view_path.startswith(str(tmp_path / "shm"))
        assert open(os.path.join(h.images_dir, "pages-1.img"), "rb").read().startswith(b"weights")
    finally:
        h.close()
    assert [n for n in os.listdir(os.path.dirname(snap)) if n.startswith(".inferops")] == []


def test_a_copy_asked_for_says_why(snap, tmp_path):
    (tmp_path / "shm").mkdir()
    h = held.Held.open(snap, str(tmp_path / "shm"), leases=False, why="the tasks resume by themselves")
    try:
        assert h.mode == "copied" and h.summary()["why_copied"] == "the tasks resume by themselves"
        hashing.hash_tree(snap, sorted(h.fds), files=h)
        assert os.path.realpath(h.images_dir).startswith(str(tmp_path / "shm"))
        assert h.broken() == []
    finally:
        h.close()


def test_a_view_holding_anything_but_what_the_restore_put_there_is_refused(snap, tmp_path):
    h = held.Held.open(snap, str(tmp_path / "private"))
    try:
        with open(os.path.join(h.view, "host", "criu", "seccomp.img"), "wb") as handle:
            handle.write(b"ATTACKER BYTES")
        with pytest.raises(held.HoldError, match="swapped: .* does not hold the verified files alone "
                                                 "\\(host/criu/seccomp.img\\)"):
            h.seal_view()
    finally:
        h.close()


def test_a_folder_of_the_view_replaced_before_the_seal_is_refused(snap, tmp_path):
    h = held.Held.open(snap, str(tmp_path / "private"))
    try:
        h.make_view()
        place = os.path.join(h.view_path, "host", "criu")
        os.rename(place, place + ".old")
        os.mkdir(place, 0o700)
        os.link(os.path.join(place + ".old", "pages-1.img"), os.path.join(place, "pages-1.img"))
        with pytest.raises(held.HoldError, match=r"swapped: .*\(host/criu, host/criu.old\)"):
            h.seal_view()
    finally:
        h.close()


def test_what_the_restore_adds_to_the_view_is_checked_and_watched_too(snap, tmp_path):
    """The node runtime adds a folder of links with one image rewritten (a new pod address): its own changes are
    sealed again; what others changed meanwhile, or change after that, is seen."""
    (tmp_path / "snap" / "host" / "criu" / "core-1.img").write_bytes(b"core")
    h = held.Held.open(snap, str(tmp_path / "private"))
    try:
        h.make_view()
        target = h.images_with("remapped-images", "pages-1.img", b"rewritten")
        assert target.startswith("/proc/%d/fd/" % os.getpid()) and h.broken() == []
        assert open(os.path.join(target, "pages-1.img"), "rb").read() == b"rewritten"
        core = os.path.join(target, "core-1.img")
        assert os.stat(core).st_ino == os.stat(os.path.join(snap, "host", "criu", "core-1.img")).st_ino
        os.unlink(os.path.join(target, "pages-1.img"))
        assert h.broken() == ["the view's folder remapped-images (pages-1.img removed)"]
    finally:
        h.close()


def test_a_change_between_two_seals_is_not_taken_for_the_restores_own(snap, tmp_path):
    h = held.Held.open(snap, str(tmp_path / "private"))
    try:
        h.make_view()
        extra = os.path.join(h.view_path, "host", "criu", "seccomp.img")
        with open(extra, "wb") as handle:
            handle.write(b"ATTACKER BYTES")
        os.unlink(extra)  # gone again before the restore's next seal lists the folder
        h.images_with("remapped-images", "pages-1.img", b"rewritten")
        assert [b for b in h.broken() if b.startswith("the view's folder host/criu (seccomp.img")], h.broken()
    finally:
        h.close()


def test_a_copied_hold_makes_the_rewritten_images_in_its_copy(snap, tmp_path, monkeypatch):
    no_leases(monkeypatch)
    (tmp_path / "shm").mkdir()
    h = held.Held.open(snap, str(tmp_path / "shm"))
    try:
        hashing.hash_tree(snap, sorted(h.fds), files=h)
        target = h.images_with("remapped-images", "core-1.img", b"rewritten")
        assert sorted(os.listdir(target)) == ["core-1.img", "pages-1.img"]
        assert os.path.realpath(target).startswith(str(tmp_path / "shm"))
    finally:
        h.close()
    assert os.listdir(str(tmp_path / "shm")) == []

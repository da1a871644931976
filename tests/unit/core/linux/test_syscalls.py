"""core/linux/syscalls.py: the calls the standard library lacks -- here the inotify watch a restore's view relies on:
it names every change of a held folder's entries as the kernel tells it (no timestamp read), follows the folder
itself wherever its path goes, and says nothing of reads. openat2 and renameat2 are exercised where they are used
(tests/unit/core/store/test_seal_publish.py, tests/unit/core/clients/test_control.py)."""

import os

from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import syscalls


def held(path):
    return os.open(str(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def test_the_watch_names_each_change_of_a_folders_entries_and_no_read(tmp_path):
    folder = tmp_path / "view"
    folder.mkdir()
    (folder / "core-1.img").write_bytes(b"verified")
    fd = held(folder)
    watch = syscalls.Watch()
    try:
        watch.add(fd, "host/criu")
        assert (folder / "core-1.img").read_bytes() == b"verified" and watch.changes() == [], "a read is no change"
        (tmp_path / "forged").write_bytes(b"forged")
        os.rename(str(tmp_path / "forged"), str(folder / "core-1.img"))
        os.rename(str(folder / "core-1.img"), str(folder / "away.img"))
        os.unlink(str(folder / "away.img"))
        with open(str(folder / "new.img"), "wb") as handle:
            handle.write(b"x")
        assert watch.changes() == [("host/criu", "core-1.img", "renamed in"),
                                   ("host/criu", "core-1.img", "renamed away"),
                                   ("host/criu", "away.img", "renamed in"),
                                   ("host/criu", "away.img", "removed"),
                                   ("host/criu", "new.img", "created"),
                                   ("host/criu", "new.img", "written"),
                                   ("host/criu", "new.img", "closed after writing")]
        assert watch.changes() == [], "each change is told once"
    finally:
        watch.close()
        os.close(fd)


def test_the_watch_follows_the_held_folder_not_its_path(tmp_path):
    """Set through /proc/self/fd/N: the folder a descriptor holds, even after its path was exchanged for another."""
    folder, other = tmp_path / "view", tmp_path / "other"
    folder.mkdir()
    other.mkdir()
    fd = held(folder)
    watch = syscalls.Watch()
    try:
        watch.add(fd, ".")
        syscalls.exchange(str(folder), str(other))
        assert watch.changes() == [(".", "", "the folder moved")]
        (tmp_path / "view" / "planted").write_bytes(b"x")  # the path's folder now: not the one watched
        assert watch.changes() == []
        (tmp_path / "other" / "planted").write_bytes(b"x")  # the one watched, where it went
        assert [change[1:] for change in watch.changes()][0] == ("planted", "created")
    finally:
        watch.close()
        os.close(fd)

"""The restore pipeline refuses, before CRIU runs, a restore whose process memory the host does not have."""

import os

from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import fs, mounts, proc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import pipeline
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.attempt import Attempt
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import encryption

from unit.core.restore.test_cache import Fake, make


def meminfo(tmp_path, available_kb):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       24000000 kB\nMemFree:          100000 kB\nMemAvailable:   %8d kB\n" % available_kb)
    return str(path)


def restore(snap):
    driver = Fake()
    return driver, pipeline.run(driver, Attempt(snap, 30, device_restore=False))


def test_a_restore_needing_more_memory_than_available_starts_cold_before_criu(tmp_path, monkeypatch):
    snap = make(tmp_path, size=3 << 20)  # a 3 MiB page image
    monkeypatch.setattr(proc, "MEMINFO", meminfo(tmp_path, 2 * 1024))
    driver, attempt = restore(snap)
    assert not attempt.restored and driver.cold and driver.read_from is None, "CRIU must not have run"
    assert "insufficient_memory" in attempt.reason, attempt.reason
    assert "needs 3 MiB" in attempt.reason and "2 MiB available" in attempt.reason, attempt.reason


def test_enough_memory_or_no_meminfo_restores(tmp_path, monkeypatch):
    snap = make(tmp_path, size=3 << 20)
    monkeypatch.setattr(proc, "MEMINFO", meminfo(tmp_path, 8 * 1024))
    driver, attempt = restore(snap)
    assert attempt.restored and not driver.cold, attempt.reason
    monkeypatch.setattr(proc, "MEMINFO", str(tmp_path / "absent"))  # no /proc: the kernel decides, as before
    assert proc.available_memory() is None
    driver, attempt = restore(snap)
    assert attempt.restored, attempt.reason


def test_available_memory_reads_memavailable(tmp_path):
    assert proc.available_memory(meminfo(tmp_path, 1234)) == 1234 * 1024
    assert proc.available_memory() > 0  # this machine's own


def test_an_encrypted_snapshot_staged_on_tmpfs_needs_room_for_its_plaintext_too(tmp_path, monkeypatch):
    """The plaintext lives on tmpfs until CRIU has read it: memory for both, checked before decrypting."""
    key = os.urandom(32)
    snap = make(tmp_path, size=3 << 20, encryption_key=key)
    monkeypatch.setattr(proc, "MEMINFO", meminfo(tmp_path, 5 * 1024))  # room for the process, not for both
    driver = Fake()
    attempt = pipeline.run(driver, Attempt(snap, 30, device_restore=False,
                                           keys={encryption.key_id(key): key}, decrypt_dir="/dev/shm"))
    assert not attempt.restored and driver.cold and driver.read_from is None, attempt.reason
    assert "insufficient_memory" in attempt.reason and "needs 6 MiB" in attempt.reason, attempt.reason
    assert "decrypt" not in attempt.watch.durations, "refused before anything was decrypted"
    monkeypatch.setattr(proc, "MEMINFO", meminfo(tmp_path, 8 * 1024))
    driver = Fake()
    attempt = pipeline.run(driver, Attempt(snap, 30, device_restore=False,
                                           keys={encryption.key_id(key): key}, decrypt_dir="/dev/shm"))
    assert attempt.restored, attempt.reason


def test_an_encrypted_snapshot_decrypted_to_disk_needs_free_space_there(tmp_path, monkeypatch):
    key = os.urandom(32)
    snap = make(tmp_path, size=3 << 20, encryption_key=key)
    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    monkeypatch.setattr(fs, "free_bytes", lambda path: 1 << 20)
    driver = Fake()
    attempt = pipeline.run(driver, Attempt(snap, 30, device_restore=False,
                                           keys={encryption.key_id(key): key}, decrypt_dir=str(workdir)))
    assert not attempt.restored and driver.cold and "insufficient_space" in attempt.reason, attempt.reason
    assert str(workdir) in attempt.reason and "1 MiB free" in attempt.reason, attempt.reason
    assert not os.listdir(workdir), "nothing was decrypted"


def test_filesystem_type_reads_mountinfo(tmp_path):
    spaced = tmp_path / "with space"
    (spaced / "x").mkdir(parents=True)
    info = tmp_path / "mountinfo"
    info.write_text("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                    "30 22 0:25 / /dev/shm rw shared:2 - tmpfs tmpfs rw\n"
                    "31 22 0:26 / %s rw - ramfs none rw\n" % str(spaced).replace(" ", "\\040"))
    assert mounts.filesystem_type("/dev/shm/a/b", str(info)) == "tmpfs", "a missing path: its nearest parent's"
    assert mounts.is_tmpfs(str(spaced / "x"), str(info)) and not mounts.is_tmpfs("/var/tmp", str(info))
    assert mounts.filesystem_type("/dev/shmx", str(info)) == "ext4", "a prefix of a name is not its mount"
    assert mounts.filesystem_type("/x", str(tmp_path / "absent")) is None


def test_an_encrypted_snapshot_without_its_key_says_so_before_it_says_memory_or_space(tmp_path, monkeypatch):
    """A host without the key could never restore it, whatever room it had: that is the reason, not the room."""
    key = os.urandom(32)
    snap = make(tmp_path, size=3 << 20, encryption_key=key)
    monkeypatch.setattr(proc, "MEMINFO", meminfo(tmp_path, 1024))  # too little memory as well
    monkeypatch.setattr(fs, "free_bytes", lambda path: 1 << 20)  # and too little room to decrypt
    other = os.urandom(32)
    for keys in ({}, {encryption.key_id(other): other}):
        driver = Fake()
        attempt = pipeline.run(driver, Attempt(snap, 30, device_restore=False, keys=keys))
        assert not attempt.restored and driver.cold and driver.read_from is None, attempt.reason
        assert attempt.reason.startswith("encrypted: the snapshot is encrypted with key %s" % encryption.key_id(key)), \
            attempt.reason
        assert "insufficient" not in attempt.reason, attempt.reason

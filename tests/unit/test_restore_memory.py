"""The restore pipeline refuses, before CRIU runs, a restore whose process memory the host does not have."""

from ansible_collections.inferops.snapshot.plugins.module_utils.core import proc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import pipeline

from test_stage import Fake, make


def meminfo(tmp_path, available_kb):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       24000000 kB\nMemFree:          100000 kB\nMemAvailable:   %8d kB\n" % available_kb)
    return str(path)


def restore(snap):
    driver = Fake()
    return driver, pipeline.run(driver, pipeline.Attempt(snap, 30, device_restore=False))


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

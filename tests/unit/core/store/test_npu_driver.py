"""The NPU driver a checkpointed process used: every file it maps from the directory of its libascend_hal.so, read
through its own root and recorded by size and SHA-256; compared with the files this node has where the restored
process will see them (below the new container's mount, or the path itself), a changed, grown or missing one named
with the driver API version of the backup."""

import os

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import digests, npu_driver

DRIVER = "/usr/local/Ascend/driver/lib64"


@pytest.fixture(autouse=True)
def digest_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "cache_dir", str(tmp_path / "digest-cache"))


def process(tmp_path, files, others=("/usr/lib/x86_64-linux-gnu/libc.so.6",)):
    """A fake /proc with process 7 mapping ``files`` ({name: content}) from DRIVER in its own root; the proc root."""
    proc = tmp_path / "proc"
    lib = proc / "7" / "root" / DRIVER.lstrip("/")
    lib.mkdir(parents=True)
    lines = []
    for n, (name, content) in enumerate(sorted(files.items())):
        (lib / name).write_bytes(content)
        lines.append("7f%04x000-7f%04x000 r-xp 00000000 fe:00 %d    %s/%s" % (n, n + 1, 100 + n, DRIVER, name))
    lines += ["7e0000000000-7e0000001000 r--p 00000000 fe:00 9    %s" % path for path in others]
    lines += ["7d0000000000-7d0000001000 rw-s 00000000 00:01 9    /dev/davinci_manager",
              "7c0000000000-7c0000001000 rw-p 00000000 00:00 0    [heap]",
              "7b0000000000-7b0000001000 r--p 00000000 fe:00 9    %s/gone.so (deleted)" % DRIVER]
    (proc / "7" / "maps").write_text("\n".join(lines) + "\n")
    return str(proc)


def test_every_library_mapped_from_the_driver_directory_is_recorded_and_nothing_without_the_hal(tmp_path):
    proc = process(tmp_path, {layout.NPU_DRIVER_LIBRARY: b"hal 500", "libdrvdsmi.so": b"dsmi"})
    record = npu_driver.mapped(7, proc)
    assert record["directory"] == DRIVER and sorted(record["files"]) == [layout.NPU_DRIVER_LIBRARY, "libdrvdsmi.so"]
    assert record["files"][layout.NPU_DRIVER_LIBRARY]["size"] == 7
    assert record["files"]["libdrvdsmi.so"]["sha256"] == digests.digest(
        os.path.join(proc, "7", "root", DRIVER.lstrip("/"), "libdrvdsmi.so"))[0]
    assert npu_driver.mapped(7, process(tmp_path / "other", {"libdrvdsmi.so": b"dsmi"})) is None


def test_the_same_driver_passes_and_an_upgrade_a_changed_or_missing_file_is_named_before_criu(tmp_path):
    record = npu_driver.mapped(7, process(tmp_path, {layout.NPU_DRIVER_LIBRARY: b"hal 500", "libdrvdsmi.so": b"d"}))
    node = tmp_path / "node" / "driver" / "lib64"
    node.mkdir(parents=True)
    (node / layout.NPU_DRIVER_LIBRARY).write_bytes(b"hal 500")
    (node / "libdrvdsmi.so").write_bytes(b"d")
    mounts = [{"destination": DRIVER, "source": str(node)}, {"destination": "/models", "source": "/x"}]
    assert npu_driver.host_directory(DRIVER, mounts) == str(node)
    assert npu_driver.host_directory(DRIVER) == DRIVER, "a bare process: the directory is the host's"
    assert npu_driver.host_directory(DRIVER, mounts[1:]) is None, "no mount holds it: the image's"
    assert npu_driver.changed(record, 500, mounts[1:]) is None, "the image's driver: the world compares the image"
    assert npu_driver.changed(record, 500, mounts) is None
    (node / layout.NPU_DRIVER_LIBRARY).write_bytes(b"hal 501 and more code")  # the driver upgraded
    why = npu_driver.changed(record, 500, mounts)
    assert why.startswith("driver_changed: the NPU driver library %s/%s is not the one the checkpointed process "
                          "mapped (7 bytes, sha256 " % (node, layout.NPU_DRIVER_LIBRARY)), why
    assert "; 21 bytes, sha256 " in why and "(driver API 500 then)" in why
    (node / layout.NPU_DRIVER_LIBRARY).write_bytes(b"hal 500")
    (node / "libdrvdsmi.so").write_bytes(b"e")  # the same size, another content
    assert "libdrvdsmi.so is not the one" in npu_driver.changed(record, 500, mounts)
    (node / "libdrvdsmi.so").unlink()
    assert "it is missing or unreadable here" in npu_driver.changed(record, 500, mounts)
    assert npu_driver.changed(None, 500, mounts) is None, "a snapshot that recorded no driver"

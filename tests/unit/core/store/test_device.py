"""The NPU device files in pure functions: the NPU plugin's image, the check before CRIU runs, the version
refusal, the agent's device_memory field, and the rewrite of the inet sockets' local address in CRIU's files.img."""

import os
import socket
import stat
import struct

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import criu_cli as criu
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import criu_images, device
from conftest import criu_image, protobuf_varint


def plugin_image(directory, lines):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / layout.NPU_PLUGIN_IMAGE).write_text("\n".join([criu_images.NPU_IMAGE_HEADER] + lines) + "\n")
    return directory


def test_the_plugin_image_is_read_back_with_escaped_paths(tmp_path):
    images = plugin_image(tmp_path / "img", ["vma b 7 1 /dev/davinci_manager",
                                             "fd 27 200000 c 120 64 /dev/dav%20inci0",
                                             "fd 28 8000 b 7 1 /dev/davinci_manager"])
    found = criu_images.read_npu_devices(str(images))
    assert found["fds"][0] == {"id": 27, "flags": 0o10000000, "type": "c", "major": 120, "minor": 64,
                               "path": "/dev/dav inci0"}
    assert found["vmas"] == [{"type": "b", "major": 7, "minor": 1, "path": "/dev/davinci_manager"}]
    assert criu_images.read_npu_devices(str(tmp_path)) is None, "no image: the process held no NPU device"


@pytest.mark.parametrize("lines", [["fd x 1 c 1 2 /dev/davinci0"], ["fd 1 1 z 1 2 /dev/davinci0"], ["what 1"]])
def test_a_plugin_image_it_did_not_write_is_refused(tmp_path, lines):
    with pytest.raises(ValueError):
        criu_images.read_npu_devices(str(plugin_image(tmp_path / "img", lines)))
    (tmp_path / "img" / layout.NPU_PLUGIN_IMAGE).write_text("something else\n")
    with pytest.raises(ValueError):
        criu_images.read_npu_devices(str(tmp_path / "img"))


def test_the_plugins_error_line_is_named_as_the_cause():
    log = ("(00.1) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self\n"
           "(00.2) Error (criu/files-ext.c:53): Unable to restore 0x1b\n"
           "(00.2) Error (inferops_npu_plugin.c:412): [inferops-npu-plugin] device /dev/davinci0 (c 120:64): x\n")
    assert "[inferops-npu-plugin] device /dev/davinci0" in criu.first_error_line(log)
    assert "non-regular mapping" in criu.first_error_line(
        "Error (criu/proc_parse.c:118): handle_device_vma plugin failed: No such file or directory\n"
        "Error (criu/proc_parse.c:663): Can't handle non-regular mapping on 7's map 7f00\n")


def test_the_nodes_an_ascend_container_is_given_are_known_by_name():
    assert device.is_npu_node("/dev/davinci0") and device.is_npu_node("/dev/x/davinci12")
    for name in ("davinci_manager", "npu_device_cust", "devmm_svm", "hisi_hdc"):
        assert device.is_npu_node("/dev/" + name) and not device.is_chip_node("/dev/" + name)
    assert device.is_chip_node("/dev/davinci7") and not device.is_chip_node("/dev/davinci\u0667")
    assert not device.is_npu_node("/dev/davinci") and not device.is_npu_node("/dev/davinci0x")
    assert not device.is_npu_node("/dev/loop0") and not device.is_npu_node("/dev/fuse")


def test_targets_come_from_the_containers_configuration(tmp_path):
    spec = {"linux": {"devices": [{"path": "/dev/davinci0", "type": "c", "major": 120, "minor": 128},
                                  {"path": "/dev/davinci_manager", "type": "b", "major": 7, "minor": 3},
                                  {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]}}
    targets = device.targets_from_oci(spec)
    assert targets == {"/dev/davinci0": ("c", 120, 128), "/dev/davinci_manager": ("b", 7, 3)}
    assert device.targets_text(targets) == "/dev/davinci0=c:120:128,/dev/davinci_manager=b:7:3"


@pytest.fixture
def chip(tmp_path):
    """A device node of the simulator's kind (major 120, no driver) and its path."""
    path = tmp_path / "davinci0"
    os.mknod(str(path), stat.S_IFCHR | 0o600, os.makedev(120, 4095))
    return str(path)


def held_by_a_child(open_what, check):
    """``check()``'s answer while a forked child holds what ``open_what()`` opens (it says so on a pipe first), and the
    child's pid. _holders skips only the checking process -- this test's -- so the holder is a child."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child holds it until its parent closes the pipe
        os.close(ready_r)
        os.close(done_w)
        held = open_what()
        os.write(ready_w, b"x")
        os.read(done_r, 1)
        os.close(held)
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        assert os.read(ready_r, 1) == b"x", "the child could not open what it was to hold"
        return check(), pid
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def test_a_device_another_process_holds_is_named_before_criu_runs(tmp_path, chip, plugin_dir):
    images = plugin_image(tmp_path / "img", ["fd 27 200000 c 120 1 %s" % chip])

    def check():
        return device.devices_unavailable(str(images), plugin_dirs=[plugin_dir])
    assert check() is None
    why, pid = held_by_a_child(lambda: os.open(chip, os.O_PATH), check)
    assert why and why.startswith("device_busy: %s (c 120:4095 on this node) is held by pid %d" % (chip, pid)), why


def test_a_process_holding_the_manager_holds_the_chips_beside_it_and_a_process_with_no_chip_fd_is_checked(
        tmp_path, chip, plugin_dir):
    """The HAL reaches a chip through davinci_manager and an ioctl: the checkpointed process may hold no chip fd (its
    chips are davinci<N> beside its manager, N its devices), and a holder may hold only the manager."""
    manager = tmp_path / layout.NPU_MANAGER
    os.mknod(str(manager), stat.S_IFCHR | 0o666, os.makedev(1, 3))  # opens harmlessly, as /dev/null
    images = plugin_image(tmp_path / "img", ["fd 27 109002 c 1 3 %s" % manager])
    assert device.chips_used(criu_images.read_npu_devices(str(images)), [0, 3]) == [
        str(tmp_path / "davinci0"), str(tmp_path / "davinci3")]
    assert device.chips_used(criu_images.read_npu_devices(str(images))) == [], "no devices: no chip reached"

    def check():
        return device.devices_unavailable(str(images), plugin_dirs=[plugin_dir], part={"devices": [0]})
    assert check() is None
    why, pid = held_by_a_child(lambda: os.open(str(manager), os.O_RDWR | os.O_SYNC), check)
    assert why and why.startswith("device_busy: %s (c 120:4095 on this node) is held by pid %d (" % (chip, pid)), why
    assert ") through %s; " % manager in why, why
    other = tmp_path / "elsewhere"
    other.mkdir()
    os.mknod(str(other / layout.NPU_MANAGER), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(str(other / "davinci0"), stat.S_IFCHR | 0o666, os.makedev(120, 77))  # another NPU's chip
    why, _pid = held_by_a_child(lambda: os.open(str(other / layout.NPU_MANAGER), os.O_RDWR), check)
    assert why is None, "a process whose manager reaches other chips holds none of these"
    os.mknod(str(other / "davinci1"), stat.S_IFCHR | 0o666, os.makedev(120, 4095))  # and now this one too
    why, pid = held_by_a_child(lambda: os.open(str(other / layout.NPU_MANAGER), os.O_RDWR), check)
    assert why and "is held by pid %d (" % pid in why and ") through %s; " % (other / layout.NPU_MANAGER) in why, why


@pytest.fixture
def plugin_dir(tmp_path):
    path = tmp_path / "plugins"
    path.mkdir()
    (path / layout.NPU_PLUGIN_FILE).write_bytes(b"")
    return str(path)


def test_no_plugin_a_missing_device_and_the_node_wide_nodes(tmp_path, chip, plugin_dir):
    images = plugin_image(tmp_path / "img", ["fd 27 200000 c 120 1 /dev/davinci0", "fd 28 8000 b 7 1 /x/davinci_manager",
                                             "fd 29 109002 c 1 3 /x/devmm_svm", "fd 30 8002 c 1 3 /x/hisi_hdc"])
    why = device.devices_unavailable(str(images), plugin_dirs=[str(tmp_path)])
    assert why.startswith("npu_plugin_missing: the checkpointed process holds NPU device files (/dev/davinci0, "), why
    why = device.devices_unavailable(str(images), targets={}, plugin_dirs=[plugin_dir])
    assert why.startswith("device_missing: the checkpointed process held /dev/davinci0, and the new container"), why
    # the manager, devmm_svm and hisi_hdc are every NPU process's: never checked, never missing
    assert device.devices_unavailable(str(images), targets={"/dev/davinci0": ("c", 120, 4095)},
                                      plugin_dirs=[plugin_dir]) is None


def test_a_restore_under_other_versions_is_refused_only_for_the_args_shape():
    recorded = {"snapshot_api": {"api": "args", "device_memory": "required", "runtime_api_version": 1,
                                 "driver_api_version": 500}}
    same = {"snapshot": {"api": "args", "api_versions": {"runtime": 1, "driver": 500}}}
    other = {"snapshot": {"api": "args", "api_versions": {"runtime": 1, "driver": 501}}}
    assert device.version_mismatch(recorded, same) is None
    why = device.version_mismatch(recorded, other)
    assert why.startswith("device_version_mismatch: driver API 500 at the backup, 501 now"), why
    legacy = {"snapshot_api": dict(recorded["snapshot_api"], api="legacy")}
    assert device.version_mismatch(legacy, other) is None and device.version_mismatch(None, other) is None
    assert device.snapshot_facts({}) == {"api": None, "device_memory": None, "runtime_api_version": None,
                                         "driver_api_version": None}, "an agent that predates the record"


def test_device_memory_is_a_backups_optional_field_sent_only_when_not_the_default():
    assert "device_memory" not in protocol.make_request(protocol.OP_BACKUP, device_memory="required")
    request = protocol.make_request(protocol.OP_BACKUP, device_memory="required_and_optional")
    assert protocol.parse_request(request) == (protocol.OP_BACKUP, 60.0)
    assert protocol.parse_device_memory(request) == "required_and_optional"
    for wrong in (dict(request, device_memory="all"), dict(request, op=protocol.OP_LOCK)):
        with pytest.raises(protocol.ProtocolError, match="device_memory"):
            protocol.parse_request(wrong)


# -- the pod's new address ---------------------------------------------------------------------------------------

def words(address):
    return list(struct.unpack("<%dI" % (len(address) // 4), address))


def inet_entry(file_id, family, src, dst=b"", state=10, port=8000):
    """A FileEntry of type INETSK as CRIU writes it (the fields the rewrite reads, and some it must keep)."""
    sk = protobuf_varint(1 << 3) + protobuf_varint(file_id) + protobuf_varint(2 << 3) + protobuf_varint(99)
    sk += protobuf_varint(3 << 3) + protobuf_varint(family) + protobuf_varint(6 << 3) + protobuf_varint(state)
    sk += protobuf_varint(7 << 3) + protobuf_varint(port)
    for w in words(src):
        sk += protobuf_varint(11 << 3) + protobuf_varint(w)
    for w in words(dst):
        sk += protobuf_varint(12 << 3) + protobuf_varint(w)
    sk += protobuf_varint(14 << 3 | 2) + protobuf_varint(2) + b"\x08\x01"  # opts: a submessage kept as it is
    return (protobuf_varint(1 << 3) + protobuf_varint(criu_images.FD_TYPE_INETSK) + protobuf_varint(2 << 3)
            + protobuf_varint(file_id) + protobuf_varint(4 << 3 | 2) + protobuf_varint(len(sk)) + sk)


def mapped(v4):
    return b"\0" * 10 + b"\xff\xff" + socket.inet_aton(v4)


def test_sockets_bound_to_the_old_pod_address_move_to_the_new_one(tmp_path):
    other = protobuf_varint(1 << 3) + protobuf_varint(1) + protobuf_varint(2 << 3) + protobuf_varint(5)  # a REG file
    entries = [other,
               inet_entry(1, criu_images.AF_INET, socket.inet_aton("10.1.2.3")),
               inet_entry(2, criu_images.AF_INET, socket.inet_aton("127.0.0.1")),
               inet_entry(3, criu_images.AF_INET, socket.inet_aton("0.0.0.0")),
               inet_entry(4, criu_images.AF_INET6, mapped("10.1.2.3")),
               inet_entry(5, criu_images.AF_INET, socket.inet_aton("10.1.2.3"), socket.inet_aton("10.1.2.3"), state=7)]
    criu_image(tmp_path, criu_images.FILES_IMAGE, criu_images.FILES_MAGIC, entries)
    data = (tmp_path / criu_images.FILES_IMAGE).read_bytes()
    new, old = criu_images.remap_inet_addresses(data, "10.9.9.200")
    assert old == ["10.1.2.3", "::ffff:10.1.2.3"]
    again, seen = criu_images.remap_inet_addresses(new, "10.9.9.200")
    assert seen == ["10.9.9.200", "::ffff:10.9.9.200"] and again == new, "a second pass finds the new address only"
    expected = [other,
                inet_entry(1, criu_images.AF_INET, socket.inet_aton("10.9.9.200")),
                entries[2], entries[3],
                inet_entry(4, criu_images.AF_INET6, mapped("10.9.9.200")),
                inet_entry(5, criu_images.AF_INET, socket.inet_aton("10.9.9.200"), socket.inet_aton("10.9.9.200"), state=7)]
    criu_image(tmp_path / "expected", criu_images.FILES_IMAGE, criu_images.FILES_MAGIC, expected)
    assert new == (tmp_path / "expected" / criu_images.FILES_IMAGE).read_bytes()


def test_nothing_is_rewritten_without_an_old_pod_address_and_other_images_are_refused(tmp_path):
    criu_image(tmp_path, criu_images.FILES_IMAGE, criu_images.FILES_MAGIC,
               [inet_entry(1, criu_images.AF_INET, socket.inet_aton("0.0.0.0"))])
    data = (tmp_path / criu_images.FILES_IMAGE).read_bytes()
    assert criu_images.remap_inet_addresses(data, "10.0.0.9") == (data, [])
    with pytest.raises(ValueError):
        criu_images.remap_inet_addresses(data, "not-an-address")
    criu_image(tmp_path, "pstree.img", criu_images.PSTREE_MAGIC, [])
    with pytest.raises(ValueError):
        criu_images.remap_inet_addresses((tmp_path / "pstree.img").read_bytes(), "10.0.0.9")

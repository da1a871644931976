"""Tiny control tool for the ACL snapshot simulator's devices (tests, demo and benchmark).

Run it with python3:

  aclsim_ctl.py path   DEV            print the device memory file of DEV
  aclsim_ctl.py reset  DEV            "pod deleted": wipe DEV's memory (zeroed; the device stays, see below)
  aclsim_ctl.py create DEV [SIZE]     install DEV ahead of its first use: a zeroed device of SIZE bytes
                                      (K/M/G suffixes; default ACL_SIM_DEVICE_MEM_BYTES or 1G), memory allocated
  aclsim_ctl.py peek   DEV OFF LEN    print LEN bytes at offset OFF of the device, hex
  aclsim_ctl.py busy   DEV            exit 0 and print "busy" if a process holds DEV, else "free" (exit 1)
  aclsim_ctl.py hold   DEV            hold DEV (exclusive flock, and when installed a descriptor on its node and the
                                      manager) until stdin closes; prints "held"
  aclsim_ctl.py install [COUNT]       install the simulated driver for ACL_SIM_DEVICE_DIR: COUNT (default 8) device
                                      nodes davinci<N> and davinci_manager in a directory of their own (printed),
                                      as an NPU driver makes /dev/davinci<N>; see docs/simulator.md "Device nodes"
  aclsim_ctl.py install --node [COUNT]
                                      install the node's own simulated driver: /dev/davinci0..COUNT-1 and
                                      /dev/davinci_manager, recorded for ACL_SIM_DEVICE_DIR (scripts/env/setup.sh
                                      runs it; nodes of a real NPU driver are never replaced)
  aclsim_ctl.py uninstall             remove what install made for ACL_SIM_DEVICE_DIR
  aclsim_ctl.py nodes                 print the installed node directory of ACL_SIM_DEVICE_DIR
  aclsim_ctl.py docker-args [--cust] [DEV..]
                                      print, as a JSON list, the docker run options that give a container what the
                                      Ascend Docker Runtime gives an NPU container: the devices DEV (default 0),
                                      davinci_manager (with --cust: at /dev/npu_device_cust instead, the HAL's
                                      fallback), devmm_svm and hisi_hdc, each at /dev/<name> (installing the simulated
                                      driver for ACL_SIM_DEVICE_DIR first if needed)
  aclsim_ctl.py driver [api_version=N] [snapshot_feature=0|1]
                                      set (or print) the node's driver: ACL_SIM_DEVICE_DIR/driver.conf

Uses the same environment as the simulator: ACL_SIM_DEVICE_DIR (default /dev/shm/aclsim),
ACL_SIM_DEVICE_PREALLOC (huge, pages or none) and ACL_SIM_DEVICE_MEM_BYTES. A reset removes the
device file and, unless ACL_SIM_DEVICE_PREALLOC is none, puts a zeroed one of the same size in its
place with its memory already allocated, as the simulator's aclsimDeviceReset does: the restore that
follows copies into memory the device holds, as on an NPU, instead of paying for fresh pages.
A device pointer from the simulator is 0x100000000000 + (DEV << 40) + offset.
"""
import contextlib
import ctypes
import fcntl
import json
import os
import stat
import subprocess
import sys
import time

VA_BASE = 0x100000000000
HUGE = 2 << 20
MADV_COLLAPSE = 25


# Device nodes (docs/simulator.md "Device nodes"). Chips are character nodes of a local/experimental major
# (LANANA reserves 120-127 for local use; the kernel never hands them out), so no driver stands behind them and
# the simulator holds them with O_PATH; every installed directory gets a block of NODE_BLOCK minors of its own, so
# that two simulated NPUs never share a number. davinci_manager is a loop block device bound to a small file: the
# one kind of device node this kernel lets a process map that CRIU hands to its plugins as a device mapping.
STATE_DIR = "/run/inferops-aclsim"
NODES_ROOT = "/dev/inferops-aclsim"
CHIP_MAJOR = 120
NODE_BLOCK = 64
MAX_BLOCKS = (1 << 20) // NODE_BLOCK
MANAGER_NODE = "/dev/davinci_manager"
MANAGER_BYTES = 65536
MANAGER_MAGIC = b"ACLSIM-DAVINCI-MANAGER"
NODES_RECORD = "nodes.json"
# The node-wide nodes beside the manager (docs/simulator.md): character devices whose drivers open harmlessly, so
# that the HAL's read-write opens reach a driver and CRIU hands their descriptors to the NPU plugin (misc minors other
# than tun and autofs): devmm_svm is the loop driver's control node, hisi_hdc FUSE's (devices.txt: 10:237, 10:229).
NODE_WIDE = {"devmm_svm": (10, 237), "hisi_hdc": (10, 229)}
MANAGER_CUST = "npu_device_cust"


def device_dir():
    return os.environ.get("ACL_SIM_DEVICE_DIR") or "/dev/shm/aclsim"


@contextlib.contextmanager
def _state_lock():
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _loop_backing(name):
    try:
        with open("/sys/block/%s/loop/backing_file" % name) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _mknod(path, kind, major, minor, mode=0o666):
    try:
        st = os.lstat(path)
        if (st.st_mode & 0o170000) == kind and st.st_rdev == os.makedev(major, minor):
            return
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.mknod(path, kind | mode, os.makedev(major, minor))
    os.chmod(path, mode)


LOOP_MAJOR = 7
LOOP_CONTROL = (10, 237)   # the loop driver's misc minor (Documentation/admin-guide/devices.txt)
LOOP_CTL_GET_FREE = 0x4C82


def _loop_control():
    """/dev/loop-control, made when a fresh machine lacks it (the loop module not loaded yet, or a /dev without
    devtmpfs); a kernel without the loop driver is a clear error."""
    path = "/dev/loop-control"
    if not os.path.exists("/sys/module/loop") and not os.path.exists(path):
        subprocess.run(["modprobe", "loop"], check=False, capture_output=True)
    if not os.path.exists("/sys/module/loop"):
        raise SystemExit("the simulated davinci_manager is a loop device, and this kernel has no loop driver "
                         "(modprobe loop failed): build or load it (CONFIG_BLK_DEV_LOOP)")
    if not os.path.exists(path):
        _mknod(path, stat.S_IFCHR, LOOP_CONTROL[0], LOOP_CONTROL[1], 0o660)
    return path


def _bind_loop(image, tries=5):
    """A free loop device bound to ``image``: its node made where the kernel did not make it (no devtmpfs); another
    process taking the same free device first is tried again."""
    for _attempt in range(tries):
        control = os.open(_loop_control(), os.O_RDWR | os.O_CLOEXEC)
        try:
            number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
        finally:
            os.close(control)
        device = "/dev/loop%d" % number
        if not os.path.exists(device):
            _mknod(device, stat.S_IFBLK, LOOP_MAJOR, number, 0o660)
        bound = subprocess.run(["losetup", device, image], check=False, capture_output=True, text=True)
        if bound.returncode == 0:
            return device
        error = bound.stderr.strip()
    raise SystemExit("cannot bind a loop device to %s: %s" % (image, error))


def manager():
    """The host's davinci_manager: (major, minor) of a loop device bound to STATE_DIR/manager.img, its node made
    at MANAGER_NODE. Idempotent (the binding does not survive a reboot: the next call makes it again). A real NPU
    driver's davinci_manager (a character device) is never replaced."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISCHR(os.lstat(MANAGER_NODE).st_mode):
            raise SystemExit("%s is a character device: a real NPU driver's; the simulated driver is not installed "
                             "over it" % MANAGER_NODE)
    image = os.path.join(STATE_DIR, "manager.img")
    if not os.path.exists(image):
        tmp = image + ".%d" % os.getpid()
        with open(tmp, "wb") as handle:
            handle.write(MANAGER_MAGIC + b"\n" + bytes(MANAGER_BYTES - len(MANAGER_MAGIC) - 1))
        os.rename(tmp, image)
    bound = [name for name in sorted(os.listdir("/sys/block")) if name.startswith("loop")
             and _loop_backing(name) == image]
    device = "/dev/" + bound[0] if bound else _bind_loop(image)
    if not os.path.exists(device):  # bound before, its node gone (a /dev without devtmpfs)
        _mknod(device, stat.S_IFBLK, LOOP_MAJOR, int(bound[0][4:]), 0o660)
    st = os.stat(device)
    _mknod(MANAGER_NODE, stat.S_IFBLK, os.major(st.st_rdev), os.minor(st.st_rdev))
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def _block_of(directory):
    """The block of minors recorded for ``directory`` (allocating one), reclaiming those of directories gone."""
    blocks = os.path.join(STATE_DIR, "blocks")
    os.makedirs(blocks, mode=0o755, exist_ok=True)
    taken = set()
    for entry in os.listdir(blocks):
        if not entry.isdigit():
            continue
        with open(os.path.join(blocks, entry)) as handle:
            owner = handle.read()
        if owner == directory:
            return int(entry)
        if os.path.isdir(owner):
            taken.add(int(entry))
        else:  # its device directory is gone: so is its simulated NPU
            os.unlink(os.path.join(blocks, entry))
            _remove_nodes(os.path.join(NODES_ROOT, entry))
    # block 0 is the node's own /dev/davinci<N> (install --node)
    free = next((number for number in range(1, MAX_BLOCKS) if number not in taken), None)
    if free is None:
        raise SystemExit("no free block of device numbers left in %s" % blocks)
    with open(os.path.join(blocks, str(free)), "w") as handle:
        handle.write(directory)
    return free


def _remove_nodes(nodes, names=None):
    """The nodes ``names`` (default: all) in ``nodes``, and the directory when it is one of NODES_ROOT's."""
    if not os.path.isdir(nodes):
        return
    for name in os.listdir(nodes) if names is None else names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(nodes, name))
    if os.path.dirname(nodes) == NODES_ROOT:
        with contextlib.suppress(OSError):
            os.rmdir(nodes)


def _write_record(directory, record):
    path = os.path.join(directory, NODES_RECORD)
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
    os.rename(path + ".tmp", path)


def install(count=8, directory=None):
    """The simulated driver for ``directory`` (default ACL_SIM_DEVICE_DIR): returns its record (NODES_RECORD in that
    directory)."""
    directory = os.path.realpath(directory or device_dir())
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with _state_lock():
        mgr_major, mgr_minor = manager()
        block = _block_of(directory)
        nodes = os.path.join(NODES_ROOT, str(block))
        os.makedirs(nodes, mode=0o755, exist_ok=True)
        chips = {}
        for dev in range(int(count)):
            minor = block * NODE_BLOCK + dev
            _mknod(os.path.join(nodes, "davinci%d" % dev), stat.S_IFCHR, CHIP_MAJOR, minor)
            chips[str(dev)] = [CHIP_MAJOR, minor]
        _mknod(os.path.join(nodes, "davinci_manager"), stat.S_IFBLK, mgr_major, mgr_minor)
        for name, (major, minor) in NODE_WIDE.items():
            _mknod(os.path.join(nodes, name), stat.S_IFCHR, major, minor)
        record = {"nodes": nodes, "chips": chips, "manager": [mgr_major, mgr_minor], "manager_node": MANAGER_NODE,
                  "node_wide": dict((name, os.path.join(nodes, name)) for name in NODE_WIDE)}
        _write_record(directory, record)
    return record


def install_node(count=8, directory=None):
    """The node's own simulated driver, as an NPU driver's installation makes it: /dev/davinci0..count-1 (block 0
    of the minors) and /dev/davinci_manager, for ACL_SIM_DEVICE_DIR (by default the simulator's default device
    directory, so that the simulator's defaults work on this host). Idempotent; nodes of a real driver (another
    major) are never replaced."""
    directory = os.path.realpath(directory or device_dir())
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with _state_lock():
        mgr_major, mgr_minor = manager()
        chips = {}
        for dev in range(int(count)):
            path = "/dev/davinci%d" % dev
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(path)
                if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) != CHIP_MAJOR:
                    raise SystemExit("%s is not the simulator's (a real NPU driver's?): the simulated driver is not "
                                     "installed over it" % path)
            _mknod(path, stat.S_IFCHR, CHIP_MAJOR, dev)
            chips[str(dev)] = [CHIP_MAJOR, dev]
        for name, (major, minor) in NODE_WIDE.items():
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat("/dev/" + name)
                if st.st_rdev != os.makedev(major, minor):
                    raise SystemExit("/dev/%s is not the simulator's (a real NPU driver's?): the simulated driver is "
                                     "not installed over it" % name)
            _mknod("/dev/" + name, stat.S_IFCHR, major, minor)
        record = {"nodes": "/dev", "chips": chips, "manager": [mgr_major, mgr_minor], "manager_node": MANAGER_NODE,
                  "node_wide": dict((name, "/dev/" + name) for name in NODE_WIDE)}
        _write_record(directory, record)
    return record


def installed(directory=None):
    try:
        with open(os.path.join(directory or device_dir(), NODES_RECORD)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def uninstall(directory=None):
    record = installed(directory)
    directory = os.path.realpath(directory or device_dir())
    with _state_lock():
        if record:
            _remove_nodes(record["nodes"], ["davinci%s" % dev for dev in record["chips"]]
                          + ([] if record["nodes"] == "/dev" else ["davinci_manager"] + list(NODE_WIDE)))
            block = os.path.join(STATE_DIR, "blocks", os.path.basename(record["nodes"]))
            with contextlib.suppress(FileNotFoundError):
                with open(block) as handle:
                    if handle.read() == directory:
                        os.unlink(block)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, NODES_RECORD))


def docker_args(devs=(0,), directory=None, cust=False):
    """docker run options giving a container what the Ascend Docker Runtime gives an NPU container, at /dev/<name> as
    a driver has them (``docker run --device``): devices ``devs``, the manager (``cust``: at /dev/npu_device_cust,
    the HAL's fallback, and no davinci_manager), devmm_svm and hisi_hdc. Installs the simulated driver of
    ACL_SIM_DEVICE_DIR first where it lacks one of them (never installed, installed before devmm_svm and hisi_hdc
    were, or its nodes gone with a reboot)."""
    record = installed(directory)
    top = max(int(dev) for dev in devs) + 1
    wanted = [os.path.join(record["nodes"], "davinci%d" % int(dev)) for dev in devs] if record else []
    wanted += list((record or {}).get("node_wide", {}).values()) or ["/nonexistent"]
    if record is None or not all(os.path.exists(path) for path in wanted + [record["manager_node"]]):
        if record is not None and record["nodes"] == "/dev":
            record = install_node(max(len(record["chips"]), top), directory)
        else:
            record = install(max(8, top), directory)
    args = []
    for dev in devs:
        args += ["--device", "%s/davinci%d:/dev/davinci%d" % (record["nodes"], int(dev), int(dev))]
    args += ["--device", "%s:/dev/%s" % (record["manager_node"], MANAGER_CUST if cust else "davinci_manager")]
    for name, path in sorted(record["node_wide"].items()):
        args += ["--device", "%s:/dev/%s" % (path, name)]
    return args


def driver(settings):
    """Merge key=value settings into ACL_SIM_DEVICE_DIR/driver.conf (the node's driver); returns them all."""
    path = os.path.join(device_dir(), "driver.conf")
    current = {}
    with contextlib.suppress(FileNotFoundError):
        with open(path) as handle:
            current = dict(line.strip().split("=", 1) for line in handle if "=" in line)
    for item in settings:
        key, value = item.split("=", 1)
        if key not in ("api_version", "snapshot_feature"):
            raise SystemExit("driver: unknown setting %r (api_version, snapshot_feature)" % key)
        current[key] = str(int(value))
    os.makedirs(device_dir(), mode=0o700, exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        handle.write("".join("%s=%s\n" % item for item in sorted(current.items())))
    os.rename(path + ".tmp", path)
    return current


def device_path(dev):
    return os.path.join(os.environ.get("ACL_SIM_DEVICE_DIR") or "/dev/shm/aclsim", "device%d" % int(dev))


def device_offset(ptr):
    """(device id, offset) of a simulator device pointer."""
    rel = int(ptr) - VA_BASE
    return rel >> 40, rel & ((1 << 40) - 1)


def prealloc_mode():
    value = os.environ.get("ACL_SIM_DEVICE_PREALLOC") or "huge"
    return {"0": "none", "1": "pages", "2": "huge"}.get(value, value if value in ("none", "pages", "huge") else "huge")


def parse_size(text):
    text = str(text).strip()
    units = {"k": 10, "m": 20, "g": 30}
    shift = 0
    if text[-2:].lower() in ("ib",) or text[-1:] in ("B", "b"):
        text = text.rstrip("Bb").rstrip("iI")
    if text[-1:].lower() in units:
        shift = units[text[-1:].lower()]
        text = text[:-1]
    return int(text) << shift


def _collapse(fd, size):
    """Gather the file's pages into 2 MiB pages (MADV_COLLAPSE on a 2 MiB-aligned shared mapping), as
    the simulator does; True when the kernel did it for the whole file."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    failed = ctypes.c_void_p(-1).value
    span = size + HUGE
    reserve = libc.mmap(None, span, 0, 0x02 | 0x20 | 0x4000, -1, 0)  # PROT_NONE, MAP_PRIVATE|ANONYMOUS|NORESERVE
    if reserve in (None, failed):
        return False
    at = (reserve + HUGE - 1) & ~(HUGE - 1)
    mapped = libc.mmap(at, size, 0x1 | 0x2, 0x01 | 0x10, fd, 0)  # PROT_READ|WRITE, MAP_SHARED|MAP_FIXED
    try:
        return mapped == at and libc.madvise(at, size, MADV_COLLAPSE) == 0
    finally:
        libc.munmap(reserve, span)  # the whole reservation, the shared mapping inside it included


def preallocate(fd, size, mode=None):
    """Allocate the device's memory once (what the simulator does when it creates a device)."""
    mode = mode or prealloc_mode()
    if mode == "none" or size <= 0:
        return None
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        return None
    return _collapse(fd, size) if mode == "huge" else False


def _fresh_device(path, size):
    """A zeroed device file of ``size`` bytes, its memory allocated, put at ``path`` once complete."""
    fresh = os.path.join(os.path.dirname(path), ".%s.reset.%d" % (os.path.basename(path), os.getpid()))
    fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        preallocate(fd, size)
    finally:
        os.close(fd)
    try:
        os.link(fresh, path)
    except FileExistsError:  # someone opened the device meanwhile: theirs is fresh too
        pass
    finally:
        os.unlink(fresh)


def reset(dev):
    """Wipe the device's memory: the file is removed and, unless pre-allocation is off, replaced by
    a zeroed one of the same size whose memory is allocated now (not by the restore that follows)."""
    path = device_path(dev)
    try:
        size = os.stat(path).st_size
        os.unlink(path)
    except FileNotFoundError:
        return
    if size > 0 and prealloc_mode() != "none":
        _fresh_device(path, size)


def create(dev, size=None):
    """Install the device before its first use, as a node has its NPU before any pod: a zeroed
    device whose memory is allocated. An existing device of that size is left alone."""
    if size is None:
        size = parse_size(os.environ.get("ACL_SIM_DEVICE_MEM_BYTES") or "1G")
    path = device_path(dev)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        st = os.stat(path)
        if st.st_size == size and st.st_blocks * 512 >= size:
            return False
        os.unlink(path)
    except FileNotFoundError:
        pass
    _fresh_device(path, size)
    return True


def peek(dev, offset, length):
    with open(device_path(dev), "rb") as f:
        f.seek(int(offset))
        return f.read(int(length))


def is_busy(dev):
    try:
        fd = os.open(device_path(dev), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def main(argv):
    if argv[:2] == ["install", "--node"] and len(argv) <= 3:
        print(install_node(*argv[2:])["nodes"])
        return 0
    if argv[:1] == ["install"] and len(argv) <= 2:
        print(install(*argv[1:])["nodes"])
        return 0
    if argv == ["uninstall"]:
        uninstall()
        return 0
    if argv == ["nodes"]:
        record = installed()
        print(record["nodes"] if record else "")
        return 0 if record else 1
    if argv[:1] == ["docker-args"]:
        cust = argv[1:2] == ["--cust"]
        print(json.dumps(docker_args([int(d) for d in argv[1 + cust:]] or [0], cust=cust)))
        return 0
    if argv[:1] == ["driver"]:
        print(json.dumps(driver(argv[1:]), sort_keys=True))
        return 0
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    cmd, dev = argv[0], int(argv[1])
    if cmd == "path":
        print(device_path(dev))
    elif cmd == "reset":
        reset(dev)
    elif cmd == "create" and len(argv) in (2, 3):
        t0 = time.monotonic()
        made = create(dev, parse_size(argv[2]) if len(argv) == 3 else None)
        print("%s %s in %.3f s" % ("created" if made else "exists", device_path(dev), time.monotonic() - t0))
    elif cmd == "peek" and len(argv) == 4:
        print(peek(dev, int(argv[2], 0), int(argv[3], 0)).hex())
    elif cmd == "busy":
        busy = is_busy(dev)
        print("busy" if busy else "free")
        return 0 if busy else 1
    elif cmd == "hold":
        os.makedirs(os.path.dirname(device_path(dev)), mode=0o700, exist_ok=True)
        fd = os.open(device_path(dev), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        record = installed()
        held = []  # a process using the chip: a descriptor on its node, and the manager opened as the HAL opens it
        if record:
            held.append(os.open(os.path.join(record["nodes"], "davinci%d" % dev), os.O_PATH))
            held.append(os.open(os.path.join(record["nodes"], "davinci_manager"), os.O_RDWR | os.O_SYNC))
        print("held", flush=True)
        sys.stdin.read()
        for descriptor in held:
            os.close(descriptor)
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Tiny control tool for the ACL snapshot simulator's devices (tests, demo and benchmark).

Run it with python3:

  aclsim_ctl.py path   DEV            print the device memory file of DEV
  aclsim_ctl.py reset  DEV            "pod deleted": wipe DEV's memory (zeroed; the device stays, see below)
  aclsim_ctl.py create DEV [SIZE]     install DEV ahead of its first use: a zeroed device of SIZE bytes
                                      (K/M/G suffixes; default ACL_SIM_DEVICE_MEM_BYTES or 1G), memory allocated
  aclsim_ctl.py peek   DEV OFF LEN    print LEN bytes at offset OFF of the device, hex
  aclsim_ctl.py busy   DEV            exit 0 and print "busy" if a process holds DEV, else "free" (exit 1)
  aclsim_ctl.py hold   DEV            hold DEV (exclusive flock) until stdin closes; prints "held"

Uses the same environment as the simulator: ACL_SIM_DEVICE_DIR (default /dev/shm/aclsim),
ACL_SIM_DEVICE_PREALLOC (huge, pages or none) and ACL_SIM_DEVICE_MEM_BYTES. A reset removes the
device file and, unless ACL_SIM_DEVICE_PREALLOC is none, puts a zeroed one of the same size in its
place with its memory already allocated, as the simulator's aclsimDeviceReset does: the restore that
follows copies into memory the device holds, as on an NPU, instead of paying for fresh pages.
A device pointer from the simulator is 0x100000000000 + (DEV << 40) + offset.
"""
import ctypes
import fcntl
import os
import sys
import time

VA_BASE = 0x100000000000
HUGE = 2 << 20
MADV_COLLAPSE = 25


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
        print("held", flush=True)
        sys.stdin.read()
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Tiny control tool for the ACL snapshot simulator's devices (tests and demo).

Run it with python3:

  aclsim_ctl.py path  DEV            print the device memory file of DEV
  aclsim_ctl.py reset DEV            "pod deleted": remove the device file (next open is zeroed)
  aclsim_ctl.py peek  DEV OFF LEN    print LEN bytes at offset OFF of the device, hex
  aclsim_ctl.py busy  DEV            exit 0 and print "busy" if a process holds DEV, else "free" (exit 1)
  aclsim_ctl.py hold  DEV            hold DEV (exclusive flock) until stdin closes; prints "held"

Uses the same environment as the simulator: ACL_SIM_DEVICE_DIR (default /dev/shm/aclsim).
A device pointer from the simulator is 0x100000000000 + (DEV << 40) + offset.
"""
import fcntl
import os
import sys

VA_BASE = 0x100000000000


def device_path(dev):
    return os.path.join(os.environ.get("ACL_SIM_DEVICE_DIR") or "/dev/shm/aclsim", "device%d" % int(dev))


def device_offset(ptr):
    """(device id, offset) of a simulator device pointer."""
    rel = int(ptr) - VA_BASE
    return rel >> 40, rel & ((1 << 40) - 1)


def reset(dev):
    try:
        os.unlink(device_path(dev))
    except FileNotFoundError:
        pass


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

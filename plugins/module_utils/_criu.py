# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for the CRIU binary. PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import shutil
import struct
import tempfile
import time

from ansible_collections.inferops.snapshot.plugins.module_utils import _host as host
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import CommandError, ParameterError, SnapshotTimeout

MINIMUM_VERSION = (4, 2)
PSTREE_IMAGE = "pstree.img"
# criu/include/magic.h: most images start with a common (or service) magic, then their own.
IMG_COMMON_MAGIC = 0x54564319
IMG_SERVICE_MAGIC = 0x55105940
PSTREE_MAGIC = 0x50273030


def parse_version(text):
    """'Version: 4.2.1' -> (4, 2, 1); None when the text holds no version."""
    match = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


class CriuCli:
    def __init__(self, module, executable="criu"):
        self.module = module
        self.executable = module.get_bin_path(executable, required=False)
        self.name = executable

    def run(self, args, check=True):
        if not self.executable:
            raise ParameterError("criu: %r was not found on PATH; install CRIU >= %d.%d (see docs/troubleshooting.md)"
                                 % ((self.name,) + MINIMUM_VERSION))
        cmd = [self.executable] + list(args)
        rc, out, err = self.module.run_command(cmd)
        if check and rc != 0:
            raise CommandError("%s failed (rc=%d): %s" % (" ".join(cmd), rc, (err or out).strip()[-2000:]),
                               cmd=cmd, rc=rc, stdout=out, stderr=err)
        return rc, out, err

    def version(self):
        """The installed version string (e.g. '4.2.1'), or None when CRIU is not installed."""
        if not self.executable:
            return None
        rc, out, err = self.run(["--version"], check=False)
        parsed = parse_version(out + err)
        return ".".join(str(p) for p in parsed) if parsed else None

    def require(self):
        """Fail clearly unless CRIU >= the minimum is installed and `criu check` passes."""
        version = self.version()
        parsed = parse_version("Version: %s" % version) if version else None
        if parsed is None:
            raise ParameterError("criu: not installed or not runnable; install CRIU >= %d.%d" % MINIMUM_VERSION)
        if parsed[:2] < MINIMUM_VERSION:
            raise ParameterError("criu: version %s is too old for this kernel; need >= %d.%d (see "
                                 "docs/troubleshooting.md)" % ((version,) + MINIMUM_VERSION), criu_version=version)
        rc, out, err = self.run(["check"], check=False)
        if rc != 0:
            raise CommandError("criu check failed, so checkpoints cannot work on this host: %s"
                               % (err or out).strip()[-2000:], cmd=[self.executable, "check"], rc=rc,
                               stdout=out, stderr=err, criu_version=version)
        return version

    def restore_detached(self, images_dir, seconds, root_pid=None, clock=time.monotonic, sleep=time.sleep):
        """Restore a bare process tree from ``images_dir``; return the restored root pid.

        A bare process comes back with its original pids, so the old process must be gone first:
        wait for its pid to be free (a killed process may linger a moment as a zombie).
        """
        deadline = clock() + seconds
        while root_pid and os.path.exists("/proc/%d" % root_pid):
            if clock() > deadline:
                raise SnapshotTimeout("pid %d is still in use; a bare process is restored with its original pid, so "
                                      "stop the old process first" % root_pid, pid=root_pid)
            sleep(0.05)
        work = tempfile.mkdtemp(prefix="inferops-restore-")
        pidfile = os.path.join(work, "restored.pid")
        argv = [self.executable or self.name, "restore", "--images-dir", images_dir, "--work-dir", work,
                "--restore-detached", "--tcp-close", "--ext-unix-sk", "--file-locks", "--pidfile", pidfile,
                "--log-file", "restore.log", "-v4"]
        try:
            host.run_timed(self.module, argv, max(1.0, deadline - clock()), "criu restore")
            with open(pidfile) as handle:
                return int(handle.read().strip())
        except (CommandError, SnapshotTimeout) as exc:
            exc.result["criu_log_tail"] = host._tail(os.path.join(work, "restore.log"))
            raise
        finally:
            remove_work_dir(work)


def _varint(data, pos):
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint at byte %d" % pos)
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _pb_fields(message):
    """(field number, wire type, value) of a protobuf message; enough of the wire format for pstree entries."""
    pos = 0
    while pos < len(message):
        key, pos = _varint(message, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(message, pos)
        elif wire == 2:
            length, pos = _varint(message, pos)
            value, pos = message[pos:pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = message[pos:pos + size], pos + size
        else:
            raise ValueError("unsupported protobuf wire type %d" % wire)
        if pos > len(message):
            raise ValueError("truncated protobuf field %d" % number)
        yield number, wire, value


def read_pstree(images_dir):
    """The checkpointed process tree from CRIU's ``pstree.img``: [(pid, [thread ids])], root first.

    A bare process is restored with these very pids and thread ids, so they must be free. Raises
    ValueError (IOError/OSError when the file cannot be read) for an image this parser does not know.
    """
    with open(os.path.join(images_dir, PSTREE_IMAGE), "rb") as handle:
        data = handle.read()
    if len(data) < 8:
        raise ValueError("%s is too short to be a CRIU image" % PSTREE_IMAGE)
    first, second = struct.unpack_from("<II", data, 0)
    magic, pos = (second, 8) if first in (IMG_COMMON_MAGIC, IMG_SERVICE_MAGIC) else (first, 4)
    if magic != PSTREE_MAGIC:
        raise ValueError("%s has magic 0x%08x, not CRIU's pstree magic" % (PSTREE_IMAGE, magic))
    tree = []
    while pos < len(data):
        if pos + 4 > len(data):
            raise ValueError("%s is truncated" % PSTREE_IMAGE)
        size = struct.unpack_from("<I", data, pos)[0]
        message = data[pos + 4:pos + 4 + size]
        if len(message) != size:
            raise ValueError("%s is truncated" % PSTREE_IMAGE)
        pos += 4 + size
        pid, threads = None, []
        for number, wire, value in _pb_fields(message):
            if number == 1 and wire == 0:  # pstree_entry.pid
                pid = value
            elif number == 5 and wire == 0:  # pstree_entry.threads, one by one
                threads.append(value)
            elif number == 5 and wire == 2:  # ... or packed
                offset = 0
                while offset < len(value):
                    tid, offset = _varint(value, offset)
                    threads.append(tid)
        if not pid:
            raise ValueError("%s has an entry without a pid" % PSTREE_IMAGE)
        tree.append((pid, threads))
    if not tree:
        raise ValueError("%s holds no process" % PSTREE_IMAGE)
    return tree


def mounts_below(path, mountinfo="/proc/self/mountinfo"):
    """Mount points at or below ``path`` (a killed CRIU restore can leave its cgroup yard mounted)."""
    prefix = path.rstrip("/") + "/"
    found = []
    with open(mountinfo) as handle:
        for line in handle:
            point = line.split()[4].replace("\\040", " ")
            if point == path.rstrip("/") or point.startswith(prefix):
                found.append(point)
    return found


def remove_work_dir(path):
    """Remove a CRIU work directory, but never through a mount: rmtree there would delete host files."""
    if mounts_below(path):
        return False  # left in place; a later run or the operator unmounts it
    shutil.rmtree(path, ignore_errors=True)
    return True

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for the CRIU binary. PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import shutil
import tempfile
import time

from ansible_collections.inferops.snapshot.plugins.module_utils import _host as host
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import CommandError, ParameterError, SnapshotTimeout

MINIMUM_VERSION = (4, 2)


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

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for the CRIU binary: its runs, its logs, its work dirs, the lazy-pages daemon.
PRIVATE to the inferops.snapshot collection. The images CRIU writes are read by ``core/store/criu_images.py``.

A failed CRIU run (directly, or through runc) keeps its log: ``keep_log`` copies it into
``layout.CRIU_LOG_DIR`` (0600, the newest KEEP_LOGS), and every error names the first CRIU
``Error`` line -- the cause -- and the kept log's path.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

from ..base import layout
from ..base.clock import wait_for
from ..base.errors import CommandError, ParameterError, SnapshotError
from ..linux import fs, mounts, proc
from . import commands

MINIMUM_VERSION = (4, 2)
# CRIU error lines that are not the cause: a harmless early one, and the unwinding after the cause.
NOT_THE_CAUSE = ("rlimit: Can't setup RLIMIT_NOFILE", "Restoring FAILED", "cgroupd: recv req error",
                 "Dumping FAILED", "handle_device_vma plugin failed")  # the next line says which mapping
KEEP_LOGS = 20
LOG_BYTES = 1024 * 1024
# CRIU's options for a process like an inference engine: its sockets, unix peers outside the tree,
# and file locks (llama.cpp's SQLite cache holds one; without it the dump fails).
PROCESS_OPTIONS = ("--tcp-close", "--ext-unix-sk", "--file-locks")


def parse_version(text):
    """'Version: 4.2.1' -> (4, 2, 1); None when the text holds no version."""
    match = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def major(version):
    match = re.match(r"\s*(\d+)", version or "")
    return int(match.group(1)) if match else None


def first_error_line(log_text):
    """The cause in a CRIU log: the NPU plugin's first error (it names the device CRIU then fails on), else the
    first error line that is not known noise or unwinding."""
    if isinstance(log_text, bytes):
        log_text = log_text.decode("utf-8", "replace")
    errors = [line for line in (log_text or "").splitlines()
              if "Error (" in line and not any(noise in line for noise in NOT_THE_CAUSE)]
    for line in [e for e in errors if layout.NPU_PLUGIN_MARKER in e] + errors:
        return line.strip()[:300]
    return None


def read_tail(path, limit=LOG_BYTES):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            return handle.read()
    except (IOError, OSError):
        return b""


def keep_log(log_path, kind, name, log_dir=None, now=time.time, data=None):
    """Keep the CRIU log of a failed ``kind`` (dump, restore) of ``name`` in ``log_dir`` -- the file at ``log_path``,
    or its bytes ``data`` when they were read already; returns (kept path or None, the first error line or None).
    Only the newest KEEP_LOGS are kept."""
    log_dir = log_dir or layout.CRIU_LOG_DIR
    data = read_tail(log_path) if data is None else data[-LOG_BYTES:]
    if not data:
        return None, None
    cause = first_error_line(data)
    try:
        fs.ensure_dir(log_dir)
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80] or "unnamed"
        target = os.path.join(log_dir, "%s.%s.%d.%d.log" % (safe, kind, int(now()), os.getpid()))
        fs.write_file_atomic(target, data)
        logs = sorted((os.path.join(log_dir, entry) for entry in os.listdir(log_dir) if entry.endswith(".log")),
                      key=lambda p: os.lstat(p).st_mtime)
        for old in logs[:-KEEP_LOGS]:
            os.unlink(old)
    except (IOError, OSError, SnapshotError):
        return None, cause
    return target, cause


def failure(exc, log_path, kind, name, log_dir=None, data=None):
    """Turn a failed CRIU/runc command into the error an operator can act on: the cause and the kept log (the file
    at ``log_path``, or its bytes ``data``: a LogCatcher's). The error names the kept copy, never a path that
    containerd may remove with the task (``log_path`` is replaced by it in the command's stderr too)."""
    kept, cause = keep_log(log_path, kind, name, log_dir, data=data)
    detail = cause or (exc.result.get("stderr") or "").strip()[-300:] or "no error line in its log"
    if log_path and kept:
        detail = detail.replace(log_path, kept)
        exc.result["stderr"] = (exc.result.get("stderr") or "").replace(log_path, kept)
    exc.msg = "%s: %s (CRIU log: %s)" % (exc.msg.split(":")[0], detail, kept or "not kept")
    exc.result.update(criu_error=cause, criu_log=kept)
    return exc


NAMED_LOG = re.compile(r"(?:log file:|path=)\s*(/\S+?\.log)\b")


def named_log(text):
    """The CRIU log a runc or containerd error names (``log file: /...``, ``path= /...``), or None."""
    match = NAMED_LOG.search(text or "")
    return match.group(1) if match else None


class LogCatcher(object):
    """Opens a CRIU log as soon as it appears at one of ``paths`` and keeps it open: containerd removes a failed
    restore's task directory, log included, before Docker reports the failure, but the bytes stay readable
    through the descriptor (``read()``) until ``close()``. Watches from a thread for up to ``timeout`` seconds."""

    def __init__(self, paths_, timeout):
        self.paths, self.timeout = list(paths_), timeout
        self.fd = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="inferops-criu-log")
        self._thread.daemon = True

    def start(self):
        self._thread.start()
        return self

    def _open(self):
        if self._stop.is_set():
            return True, None
        for path in self.paths:
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                return True, path
            except OSError:
                continue
        return False, None

    def _watch(self):
        try:
            wait_for(self._open, self.timeout, interval=0.002, what="a CRIU log at %s" % ", ".join(self.paths))
        except SnapshotError:
            pass  # none appeared: there is nothing to keep

    def read(self):
        """The log's bytes (its last LOG_BYTES), or None when it never appeared."""
        self._stop.set()
        self._thread.join()
        if self.fd is None:
            return None
        size = os.fstat(self.fd).st_size
        return os.pread(self.fd, LOG_BYTES, max(0, size - LOG_BYTES))

    def close(self):
        self._stop.set()
        self._thread.join()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class CriuCli:
    def __init__(self, executable="criu", runner=None):
        self.name = executable
        self.executable = shutil.which(executable)
        self.runner = runner or commands.DEFAULT

    def _argv(self, args):
        if not self.executable:
            raise ParameterError("criu: %r was not found on PATH; install CRIU >= %d.%d (see docs/troubleshooting.md)"
                                 % ((self.name,) + MINIMUM_VERSION))
        return [self.executable] + list(args)

    def version(self):
        """The installed version string (e.g. '4.2.1'), or None when CRIU is not installed."""
        if not self.executable:
            return None
        rc, out, err = self.runner.run(self._argv(["--version"]), check=False, timeout=30)
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
        rc, out, err = self.runner.run(self._argv(["check"]), check=False, timeout=60)
        if rc != 0:
            raise CommandError("criu check failed, so checkpoints cannot work on this host: %s"
                               % (err or out).strip()[-2000:], cmd=self._argv(["check"]), rc=rc,
                               stdout=out, stderr=err, criu_version=version)
        return version

    def dump(self, pid, image_dir, leave_running, timeout, work=None):
        """Checkpoint a bare process tree (no container) into ``image_dir`` (``work``: its work dir, made by
        ``make_work_dir``; one of its own by default). The work dir is removed after."""
        work = work or make_work_dir("dump")
        argv = self._argv(["dump", "--tree", str(pid), "--images-dir", image_dir, "--work-dir", work,
                           "--log-file", "dump.log", "-v4"] + list(PROCESS_OPTIONS)
                          + (["--leave-running"] if leave_running else []))
        try:
            self.runner.run(argv, timeout=timeout, what="criu dump of pid %d" % pid)
        except SnapshotError as exc:
            raise failure(exc, os.path.join(work, "dump.log"), "dump", "pid-%d" % pid)
        finally:
            remove_work_dir(work)

    def restore_detached(self, images_dir, timeout, name="bare", leave_stopped=False):
        """Restore a bare process tree from ``images_dir`` (with its recorded pids); return the restored root pid.
        ``leave_stopped``: the tasks stay stopped until they get SIGCONT (proc.continue_tree)."""
        work = make_work_dir("restore")
        pidfile = os.path.join(work, "restored.pid")
        argv = self._argv(["restore", "--images-dir", images_dir, "--work-dir", work, "--restore-detached",
                           "--pidfile", pidfile, "--log-file", "restore.log", "-v4"] + list(PROCESS_OPTIONS)
                          + (["--leave-stopped"] if leave_stopped else []))
        try:
            self.runner.run(argv, timeout=timeout, what="criu restore")
            with open(pidfile) as handle:
                return int(handle.read().strip())
        except SnapshotError as exc:
            raise failure(exc, os.path.join(work, "restore.log"), "restore", name)
        finally:
            remove_work_dir(work)


class LazyPages:
    """A ``criu lazy-pages`` daemon serving a restore's memory through userfaultfd.

    ``criu restore --lazy-pages`` (``runc restore --lazy-pages``) maps the tasks' memory empty and hands
    its userfaultfds to this daemon over ``lazy-pages.socket`` in their shared work directory; the
    restore returns at once and the daemon copies every page in, on a fault first, the rest in the
    background, and exits 0 once all are in. A page the daemon never copied reads as zeros once its
    userfaultfd is gone, so the daemon's exit status is the verdict: anything but 0 before ``done()``
    means the restored memory is incomplete and the tasks must never serve (the caller kills them).
    """

    SOCKET = "lazy-pages.socket"
    LOG = "lazy-pages.log"

    def __init__(self, criu, images_dir, work_dir):
        self.criu, self.images_dir, self.work_dir = criu, images_dir, work_dir
        self.process = None
        self.status = None  # the daemon's exit status once it is known

    def start(self, timeout):
        """Start the daemon and wait until it listens; CommandError when it cannot."""
        argv = self.criu._argv(["lazy-pages", "--images-dir", self.images_dir, "--work-dir", self.work_dir,
                                "--log-file", self.LOG, "-v4"])
        self.process = self.criu.runner.spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, close_fds=True)
        socket_path = os.path.join(self.work_dir, self.SOCKET)

        def listening():
            if os.path.exists(socket_path):
                return True, None
            if self.process.poll() is not None:
                raise CommandError("criu lazy-pages did not start (%s)" % self.failure(), cmd=argv)
            return False, None

        try:
            wait_for(listening, timeout, interval=0.005, what="criu lazy-pages listening on %s" % socket_path)
        except SnapshotError as exc:
            self.stop()
            if isinstance(exc, CommandError):
                raise
            raise CommandError("criu lazy-pages did not listen on %s within %.1f s" % (socket_path, timeout), cmd=argv)
        return self

    def done(self, timeout):
        """Wait until every page is in; True when they are, False when the daemon failed or outlived ``timeout``
        (then it is stopped)."""
        try:
            self.status = self.process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.stop()
            return False
        return self.status == 0

    def died(self, grace=0.0):
        """Whether the daemon ended before every page was in, waiting up to ``grace`` seconds to learn it: the
        restored tasks fault on its holes as soon as its userfaultfd is gone, which can be before its parent
        (this process, through a wrapper such as snapshot_node_criu) sees it exit."""
        if self.process is None or self.status == 0:
            return False
        try:
            status = self.process.wait(timeout=grace) if grace > 0 else self.process.poll()
        except subprocess.TimeoutExpired:
            return False
        return status not in (None, 0)

    def failure(self):
        """What ended the daemon, for a reason: its exit status or signal and its log's first error."""
        status = self.process.poll() if self.process else None
        if status is None:
            told = "still running"
        elif status < 0:
            told = "killed by signal %d" % -status
        else:
            told = "exited %d" % status
        cause = first_error_line(read_tail(os.path.join(self.work_dir, self.LOG)))
        return told + (": %s" % cause if cause else "")

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process is not None:
            self.status = self.process.returncode


# -- work directories ------------------------------------------------------------------------------

# inferops-<kind>-<pid>-<start>-<random>: the process that made it (pid and start time, proc.identity), so that a
# sweep can tell the work dir of a killed run (its maker gone) from one in use. Older ones: inferops-<kind>-<random>.
WORK_PREFIX = "inferops-"
WORK_KINDS = ("dump", "restore")
_WORK_NAME = re.compile(r"\Ainferops-(%s)-(?:(\d+)-(\d+)-)?[a-z0-9_]{8}\Z" % "|".join(WORK_KINDS))  # mkdtemp's 8


def make_work_dir(kind, parent=None):
    """A private (0700) work dir for one CRIU run (runc's --work-path, criu's --work-dir) in the temp dir."""
    pid = os.getpid()
    return tempfile.mkdtemp(prefix="%s%s-%d-%d-" % (WORK_PREFIX, kind, pid, proc.start_time(pid) or 0), dir=parent)


def parse_work_dir(name):
    """(kind, maker pid or None, maker start or None) of a work dir's name; None when it is not one of ours."""
    match = _WORK_NAME.match(name)
    if not match:
        return None
    kind, pid, start = match.groups()
    return kind, int(pid) if pid else None, int(start) if start else None


def mounts_below(path, mountinfo=None):
    """Mount points at or below ``path`` (a killed CRIU restore can leave its cgroup yard mounted)."""
    prefix = path.rstrip("/") + "/"
    return [point for point, _fstype in mounts.mounts(mountinfo)
            if point == path.rstrip("/") or point.startswith(prefix)]


def remove_work_dir(path):
    """Remove a CRIU work directory, but never through a mount: rmtree there would delete host files."""
    if mounts_below(path):
        return False  # left in place; a later run or the operator unmounts it
    shutil.rmtree(path, ignore_errors=True)
    return True

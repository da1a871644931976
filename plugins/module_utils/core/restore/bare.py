# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restore driver: a bare process tree (engine criu, no container). PRIVATE to the inferops.snapshot collection.

A bare process comes back with its original pids, so they must be free; it keeps the environment
it was checkpointed with, so its new environment goes to a metadata file on the host; and with no
container to start cold, the fallback is an operator-given command started detached. What was
started from a snapshot is in the status record (``last_restore``: pid and the kernel's start time
of that pid), which is how a second run knows it is still running.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess

from ..base.clock import wait_for
from ..base.errors import CommandError, ParameterError, SnapshotTimeout
from ..clients import commands
from ..clients.criu_cli import CriuCli
from ..linux import fs, proc
from ..store import manifest, metadata, status
from ..store.criu_images import read_pstree
from . import interrupted
from .attempt import Fallback
from .driver import Driver
from .stages import CACHE, HELD, RESTORE

ENGINE = "criu"
PID_FREE_GRACE = 5.0   # a killed process may linger a moment as a zombie
PID_REAPED_WAIT = 30.0  # a tree killed to be restored again: until its reaper freed its root's pid


def pids_in_use(tree, proc_root="/proc"):
    """'pid N (comm)' for each pid or thread id of the checkpointed tree that exists now (zombies too)."""
    taken = []
    for pid, threads in tree:
        for number in [pid] + [tid for tid in threads if tid != pid]:
            if proc.exists(number, proc_root):
                taken.append("%d (%s)" % (number, proc.comm(number, proc_root) or "?"))
    return taken


def obstacle(images_dir, proc_root="/proc"):
    """(tree, why the verified snapshot's images cannot be restored on this host now, or None when they can)."""
    try:
        tree = read_pstree(images_dir)
    except (IOError, OSError, ValueError) as exc:
        return None, "host_images_unreadable: %s" % exc
    taken = pids_in_use(tree, proc_root)
    if taken:
        return tree, ("pid_in_use: CRIU restores the process tree with its recorded pids, and %s %s already in use "
                      "on this host; stop that process first" % (", ".join(taken[:5]) + (" ..." if len(taken) > 5 else ""),
                                                                 "is" if len(taken) == 1 else "are"))
    return tree, None


def running_from_snapshot(snapshot_dir, proc_root="/proc"):
    """The ``last_restore`` entry of a bare process this collection started from the snapshot, if it still runs."""
    last = (status.read(snapshot_dir) or {}).get("last_restore") or {}
    if last.get("path") != ENGINE or not last.get("pid") or last.get("pid_start_time") is None or \
            last.get("outcome") in (interrupted.RESTORING, interrupted.INTERRUPTED):
        return None
    if not proc.alive(last["pid"], proc_root) or proc.start_time(last["pid"], proc_root) != last["pid_start_time"]:
        return None
    return last


def start_detached(argv, env, log_path=None, runner=None):
    """Start ``argv`` in its own session, stdin from /dev/null, output to ``log_path`` or /dev/null (through the
    runner, the process boundary).

    Returns the Popen object; the process outlives the module (it is reparented when the module exits).
    """
    out = subprocess.DEVNULL
    try:
        if log_path:
            out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, fs.FILE_MODE)
        return (runner or commands.DEFAULT).spawn(argv, stdin=subprocess.DEVNULL, stdout=out,
                                                  stderr=subprocess.STDOUT, env=env, cwd="/", close_fds=True,
                                                  start_new_session=True)
    except (IOError, OSError) as exc:
        raise CommandError("cold_start: could not start %r: %s" % (argv[0], exc), cmd=list(argv))
    finally:
        if out is not subprocess.DEVNULL:
            os.close(out)


class BareProcess(Driver):
    path = ENGINE
    engine = ENGINE
    stages = RESTORE
    verification = manifest.OVERLAPPED  # CRIU leaves the tasks stopped until the page images' verdict
    images_from = (CACHE, HELD)

    def __init__(self, cold_start, cold_start_log=None, criu=None, **wishes):
        super(BareProcess, self).__init__(**wishes)
        self.cold_start_argv = cold_start
        self.cold_start_log = cold_start_log
        self.criu = criu or CriuCli()
        self.cold_proc = None
        self.root_pid = None  # the checkpointed tree's root: CRIU restores it with this pid

    def check(self, attempt):
        tree, why = obstacle(attempt.images_dir)
        if why and tree:  # a process just killed may still be a zombie for a moment
            root = tree[0][0]
            try:
                proc.wait_gone(root, min(PID_FREE_GRACE, attempt.remaining()))
            except Exception:  # still there: say which pids
                pass
            tree, why = obstacle(attempt.images_dir)
        if why:
            raise Fallback(why)
        self.root_pid = tree[0][0] if tree else None

    def prepare(self, attempt):
        doc = metadata.document(self.env, True, attempt.snapshot_dir, "snapshot_restore", engine=ENGINE,
                                restore_nonce=attempt.restore_nonce)
        metadata.write_host(self.metadata_path, doc)
        attempt.details["metadata_env_keys"] = metadata.env_keys(doc)

    def host_restore(self, attempt):
        interrupted.started(self, attempt, pid=self.root_pid)  # a run killed after CRIU leaves a record
        pid = self.criu.restore_detached(attempt.images_dir, attempt.remaining(1.0),
                                         name=self.identity["pod"], leave_stopped=attempt.leave_stopped)
        attempt.pid_start_time = proc.start_time(pid)
        return pid

    def undo(self, attempt):
        if attempt.pid:  # a half-restored process holds the pids and ports a cold start needs
            proc.stop(attempt.pid, attempt.pid_start_time)

    def cold_start(self, attempt):
        if not self.cold_start_argv:
            raise ParameterError("cold_start: %s cannot be restored (%s) and there is no cold_start command to start "
                                 "the process normally; fix the reason or give cold_start"
                                 % (attempt.snapshot_dir or attempt.requested, attempt.reason),
                                 restored=False, reason=attempt.reason, verify=attempt.verdict)
        doc = metadata.document(self.env, False, attempt.snapshot_dir, "snapshot_restore", attempt.reason,
                                engine=ENGINE)
        metadata.write_host(self.metadata_path, doc)
        attempt.details["metadata_env_keys"] = metadata.env_keys(doc)
        env = dict(os.environ)
        env.update(self.env)
        self.cold_proc = start_detached(self.cold_start_argv, env, self.cold_start_log)
        attempt.pid = self.cold_proc.pid
        attempt.pid_start_time = proc.start_time(attempt.pid)

    def take_over(self, found, check_mode):
        """The process tree a run that is gone restored (``found``: its root pid, restored as checkpointed, started
        after that run on this boot): what its engine is now; killed, so that this run restores it from the start
        (its pids are the ones CRIU needs). Returns (what was found, what is done)."""
        pid, runner = found.entry.get("pid"), found.entry.get("runner") or {}
        start = proc.start_time(pid) if pid else None
        if start is None or runner.get("start") is None or start < runner["start"] or \
                runner.get("boot_id") != proc.boot_id():
            return {"process": "pid %s runs nothing that run restored" % pid}, "restores the process from the start"
        if (proc.stat_fields(pid) or ["?"])[0] == "T":  # leave-stopped, and the page images' verdict never came
            engine = {"process": "pid %d stopped: CRIU left it stopped for a verdict that never came, and it never ran"
                      % pid}
        else:
            engine = interrupted.engine_now(pid, self.socket_dir)
        if check_mode:
            return engine, "would kill pid %d and restore the process from the start" % pid
        proc.stop(pid, start)
        try:  # CRIU needs the pid itself: free once the killed tree's reaper (init) has reaped it
            wait_for(lambda: (not proc.exists(pid), "pid %d not reaped yet" % pid), PID_REAPED_WAIT,
                     what="the end of pid %d" % pid)
        except SnapshotTimeout:
            pass  # the restore's check says which pid is taken
        return engine, "killed pid %d and restores the process from the start" % pid

    def exited(self, attempt):
        """Why the started process is gone (for the health wait), or None while it runs."""
        code = self.cold_proc.poll() if self.cold_proc else (None if proc.alive(attempt.pid) else "gone")
        return None if code is None else "process %d exited (%s)" % (attempt.pid, code)

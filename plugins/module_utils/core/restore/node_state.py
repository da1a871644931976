# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the restore-on-create runtime keeps on the node, for the on-create driver and the runtime's other
calls alike. PRIVATE to the inferops.snapshot collection.

``<state_dir>/<id>/`` holds a container's restore (runc's work dir, its pid file) and, once it is restored, the
marker that makes the following ``start`` a no-op; ``<state_dir>/restored-once/<id>`` remembers that a container
of policy ``once`` was restored. The log is one JSON object per line (0600) -- the runtime may never write to
stdout or stderr, which are the container's. Both the runtime (core/node/runtime.py, the argv dispatcher) and
its driver (restore/on_create.py) use one ``NodeState``; neither calls back into the other.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ..base.clock import utc_now
from ..clients import commands, criu_cli
from ..clients.criu_cli import CriuCli
from ..clients.runc_cli import STOP_GRACE
from ..linux import fs, proc

ONCE_DIR = "restored-once"     # <state_dir>/restored-once/<id>: this container id was restored once
RESTORED_FILE = "restored"     # <state_dir>/<id>/restored: the next `start` is a no-op
ONCE_MARKER_DAYS = 30


class Log:
    """One JSON object per line, appended to the runtime's log file (0600). Never raises."""

    def __init__(self, path):
        self.path = path

    def write(self, record):
        try:
            line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
            directory = os.path.dirname(self.path)
            if directory and not os.path.isdir(directory):
                fs.ensure_dir(directory)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except Exception:  # logging must never break a container start
            pass

    def event(self, event, **fields):
        record = {"ts": utc_now(), "event": event, "pid": os.getpid()}
        record.update(fields)
        self.write(record)


class NodeState:
    """The runtime's settings, its runc and CRIU clients, its log and its state directory."""

    def __init__(self, config, runc, log=None, runner=None):
        self.config = config
        self.runc = runc
        self.log = log or Log(config["log_file"])
        self.runner = runner or commands.DEFAULT
        self._criu = None

    @property
    def criu(self):
        """The one CRIU client of a restore (its version, the lazy-pages daemon); made on first use, not on the
        calls that only pass through to runc."""
        if self._criu is None:
            self._criu = CriuCli(self.config["criu"] or "criu")
        return self._criu

    def path(self, *parts):
        return os.path.join(self.config["state_dir"], *parts)

    # -- markers -------------------------------------------------------------------------------------
    def mark_restored(self, container_id, policy):
        """The container runs, restored: its `start` is a no-op, and with policy ``once`` it is not restored again.
        Raises OSError when the markers cannot be written (the restore must then not count)."""
        fs.ensure_dir(self.path(container_id))
        with open(self.path(container_id, RESTORED_FILE), "w"):
            pass
        if policy == "once":
            fs.ensure_dir(self.path(ONCE_DIR))
            with open(self.path(ONCE_DIR, container_id), "w") as handle:
                handle.write(utc_now() + "\n")

    def take_start_marker(self, container_id):
        """True once after a restore of ``container_id`` (its `start` is then a no-op)."""
        marker = self.path(container_id or "-", RESTORED_FILE)
        if container_id and os.path.exists(marker):
            os.unlink(marker)
            return True
        return False

    def restored_once(self, container_id):
        self._prune()
        return os.path.exists(self.path(ONCE_DIR, container_id))

    def _prune(self):
        """Forget once-markers older than ONCE_MARKER_DAYS."""
        directory = self.path(ONCE_DIR)
        try:
            entries = [os.path.join(directory, name) for name in os.listdir(directory)]
        except (IOError, OSError):
            return
        now = time.time()
        for path in entries:
            try:
                if now - os.lstat(path).st_mtime > ONCE_MARKER_DAYS * 86400:
                    os.unlink(path)
            except OSError:
                pass

    # -- cleaning up ---------------------------------------------------------------------------------
    def drop_state(self, container_id):
        path = self.path(container_id)
        if os.path.isdir(path) and not criu_cli.remove_work_dir(path):
            self.log.event("cleanup", container=container_id,
                           action="left %s in place: mounts below it (%s)" % (path, criu_cli.mounts_below(path)))

    def undo_restore(self, container_id):
        """Remove a half-done or rejected restore so that `runc create` of the same id can follow."""
        try:
            with open(os.path.join(self.runc.root, container_id, "state.json")) as handle:
                pid = json.load(handle).get("init_process_pid")
        except (IOError, OSError, ValueError, AttributeError):
            pid = None
        if pid and proc.alive(pid):
            self.runc.kill(container_id, "KILL")
            try:
                proc.wait_gone(pid, STOP_GRACE)
            except Exception:  # still there: runc delete --force below kills it
                pass
        self.runc.delete(container_id, force=True)
        work = self.path(container_id, "work")
        runc_state = os.path.join(self.runc.root, container_id)
        for base in (work, runc_state):
            for point in sorted(criu_cli.mounts_below(base), reverse=True):
                try:
                    rc = self.runner.run(["umount", "-l", point], timeout=30, check=False)[0]
                except Exception as exc:  # cleanup goes on; the log says what was left
                    rc = str(exc)
                self.log.event("cleanup", container=container_id, action="umount -l %s" % point, rc=rc)
        if os.path.isdir(runc_state) and not os.path.exists(os.path.join(runc_state, "state.json")):
            criu_cli.remove_work_dir(runc_state)
        if os.path.lexists(work) and not criu_cli.remove_work_dir(work):
            self.log.event("cleanup", container=container_id, action="left %s in place: mounts below it" % work)

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restoring a bare process tree (engine criu, no container). PRIVATE to the inferops.snapshot collection.

A bare process comes back with its original pids, so they must be free; it keeps the environment
it was checkpointed with, so its new environment goes to a metadata file on the host; and with no
container to start cold, the fallback is an operator-given command started detached. What was
started from a snapshot is recorded in the snapshot's status record (``last_restore``: pid and
the kernel's start time of that pid), which is how a second run knows it is still running.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import signal
import subprocess
import time

from ansible_collections.inferops.snapshot.plugins.module_utils import _criu as criu
from ansible_collections.inferops.snapshot.plugins.module_utils import _host as host
from ansible_collections.inferops.snapshot.plugins.module_utils import _paths as paths
from ansible_collections.inferops.snapshot.plugins.module_utils import _snapshot as snapshot
from ansible_collections.inferops.snapshot.plugins.module_utils._device import utc_now
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import CommandError, SnapshotTimeout

ENGINE = "criu"
ENGINE_HINTS = {"docker": "a Docker container: restore it with engine=docker",
                "criu": "a bare process: restore it with engine=criu"}


def engine_reason(manifest, engine):
    """Why a verified snapshot cannot be restored by ``engine`` (None when it can, or is unknown)."""
    taken = ((manifest or {}).get("engine") or {}).get("name")
    if not taken or taken == engine:
        return None
    return "engine_mismatch: snapshot was taken with engine %s (%s), not %s" % (
        taken, ENGINE_HINTS.get(taken, "another engine"), engine)


def stat_fields(pid, proc="/proc"):
    """Fields of /proc/PID/stat after the command name (state first), or None when there is no such pid."""
    try:
        with open(os.path.join(proc, str(pid), "stat")) as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (IOError, OSError, IndexError):
        return None


def start_time(pid, proc="/proc"):
    """The kernel's start time of ``pid`` (clock ticks since boot): with the pid, names one process."""
    fields = stat_fields(pid, proc)
    return int(fields[19]) if fields and len(fields) > 19 else None


def alive(pid, proc="/proc"):
    fields = stat_fields(pid, proc)
    return bool(fields) and fields[0] not in ("Z", "X")


def comm(pid, proc="/proc"):
    try:
        with open(os.path.join(proc, str(pid), "comm")) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def pids_in_use(tree, proc="/proc"):
    """'pid N (comm)' for each pid or thread id of the checkpointed tree that exists now (zombies too)."""
    taken = []
    for pid, threads in tree:
        for number in [pid] + [tid for tid in threads if tid != pid]:
            if os.path.exists(os.path.join(proc, str(number))):
                taken.append("%d (%s)" % (number, comm(number, proc) or "?"))
    return taken


def obstacle(snapshot_dir, proc="/proc"):
    """Why the verified bare-process snapshot cannot be restored on this host now (None when it can)."""
    try:
        tree = criu.read_pstree(host.images_dir(snapshot_dir))
    except (IOError, OSError, ValueError) as exc:
        return None, "host_images_unreadable: %s" % exc
    taken = pids_in_use(tree, proc)
    if taken:
        return tree, ("pid_in_use: CRIU restores the process tree with its recorded pids, and %s %s already in use "
                      "on this host; stop that process first" % (", ".join(taken[:5]) + (" ..." if len(taken) > 5 else ""),
                                                                 "is" if len(taken) == 1 else "are"))
    return tree, None


def running_from_snapshot(snapshot_dir, proc="/proc"):
    """The ``last_restore`` record of a bare process this collection started from the snapshot, if it still runs."""
    last = (snapshot.read_status(snapshot_dir) or {}).get("last_restore") or {}
    if last.get("engine") != ENGINE or not last.get("pid") or last.get("pid_start_time") is None:
        return None
    if not alive(last["pid"], proc) or start_time(last["pid"], proc) != last["pid_start_time"]:
        return None
    return last


def record(snapshot_dir, outcome, pid, reason=None, durations=None):
    """Remember in the snapshot's status record what runs from it now (also for a cold start)."""
    entry = {"engine": ENGINE, "outcome": outcome, "reason": reason, "pid": pid, "pid_start_time": start_time(pid),
             "durations": dict(durations or {}), "at": utc_now(), "node": os.uname()[1]}
    paths.ensure_dir(os.path.dirname(snapshot_dir.rstrip("/")))
    snapshot.record_restore(snapshot_dir, entry)
    return entry


def write_metadata(path, env, restored, snapshot_dir, pid=None):
    """The new environment, for the engine to read (it keeps the environment it was checkpointed with)."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        paths.ensure_dir(directory)
    metadata = {"env": dict(env), "restored": restored, "snapshot_dir": snapshot_dir, "pid": pid,
                "engine": ENGINE, "written_at": utc_now()}
    paths.write_file_atomic(path, json.dumps(metadata, indent=2, sort_keys=True).encode())
    return sorted(env)


def start_detached(argv, env, log_path=None):
    """Start ``argv`` in its own session, stdin from /dev/null, output to ``log_path`` or /dev/null.

    Returns the Popen object; the process outlives the module (it is reparented when the module exits).
    """
    out = subprocess.DEVNULL
    try:
        if log_path:
            out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, paths.FILE_MODE)
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd="/", close_fds=True, start_new_session=True)
    except (IOError, OSError) as exc:
        raise CommandError("cold_start: could not start %r: %s" % (argv[0], exc), cmd=list(argv))
    finally:
        if out is not subprocess.DEVNULL:
            os.close(out)


def stop(pid, expected_start, seconds=10.0, clock=time.monotonic, sleep=time.sleep):
    """SIGKILL a half-restored process this module started (same pid and start time) and wait until it is gone."""
    if start_time(pid) != expected_start:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    deadline = clock() + seconds
    while alive(pid):
        if clock() > deadline:
            raise SnapshotTimeout("pid %d did not go away after SIGKILL within %.0f s" % (pid, seconds), pid=pid)
        sleep(0.05)
    return True

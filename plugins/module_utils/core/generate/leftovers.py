# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a killed generation leaves behind, and its removal. PRIVATE to the inferops.snapshot collection.

A generation killed with its controller (a cancelled AWX job, the OOM killer, ``kill -9`` of the job's process
group) stops where it was: runc or CRIU may still be dumping (they run in a session of their own, so they outlive
the module), their work dir stays in the temp dir (``inferops-dump-<maker pid>-<its start>-*``,
clients/criu.make_work_dir), and the pod's staging directory holds half a snapshot. ``clean_after`` removes what
the run of a claim left when another run takes the claim over (claim.py); ``sweep_work_dirs`` removes any work dir
whose maker is gone and that no process uses (every generation and snapshot_cleanup call it).

A dump is never cut short while it may still end by itself: a CRIU killed while its parasite code runs in the
engine's threads would leave the engine broken, and one killed before it thawed the container leaves it frozen.
So a lingering runc or CRIU gets LINGER_GRACE seconds to end; only then is it killed, and the container it was
dumping thawed.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import socket
import stat
import tempfile
import time

from ..base import layout
from ..base.clock import wait_for
from ..base.errors import SnapshotTimeout
from ..clients import criu_cli
from ..clients.runc_cli import RuncCli
from ..linux import fs, proc

LINGER_GRACE = 30.0      # seconds a dead run's runc or CRIU may take to end by itself before it is killed
LEGACY_AGE = 600.0       # an older work dir (no maker in its name) is swept once nothing used it for this long


def temp_parents():
    """Where work dirs are made: the temp dir of this process and /tmp (where another environment put them)."""
    found = []
    for parent in (tempfile.gettempdir(), "/tmp"):
        if parent not in found and os.path.isdir(parent):
            found.append(parent)
    return found


def work_dirs(parents=None):
    """[(path, kind, maker pid or None, maker start or None)] of the CRIU work dirs below ``parents``."""
    found = []
    for parent in parents or temp_parents():
        try:
            names = sorted(os.listdir(parent))
        except OSError:
            continue
        for name in names:
            parsed = criu_cli.parse_work_dir(name)
            path = os.path.join(parent, name)
            if parsed and os.path.isdir(path) and not os.path.islink(path):
                found.append((path,) + parsed)
    return found


def _below(target, roots):
    return any(target == root or target.startswith(root.rstrip("/") + "/") for root in roots)


def users(roots, skip=()):
    """Pids of the processes that name one of ``roots`` on their command line (runc --work-path, criu
    --images-dir ...) or have their working dir or an open file below one (criu swrk keeps its log open), and
    every process below them. ``skip``: pids left out (this process and its ancestors)."""
    roots = [os.path.normpath(root) for root in roots if root]
    if not roots:
        return []
    skip = set(skip) | {os.getpid()}
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        pid = int(name)
        words = proc.cmdline(pid)
        if any(_below(word, roots) or _below(word.partition("=")[2], roots) for word in words):  # PATH, --opt=PATH
            found.add(pid)
            continue
        links = []
        try:
            links.append(os.readlink("/proc/%d/cwd" % pid))
            fd_dir = "/proc/%d/fd" % pid
            for fd in os.listdir(fd_dir):
                try:
                    links.append(os.readlink(os.path.join(fd_dir, fd)))
                except OSError:
                    continue
        except OSError:
            continue
        if any(_below(link, roots) for link in links):
            found.add(pid)
    if not found:
        return []
    tree = proc.children()
    below = set()
    for pid in found:
        below.update(proc.descendants(pid, tree))
    return sorted(pid for pid in below - skip if proc.alive(pid))


def _maker_gone(pid, start):
    if pid is None:
        return None
    return not (proc.alive(pid) and proc.start_time(pid) == start)


def sweep_work_dirs(parents=None, now=None, remove=True):
    """Remove the work dirs whose maker is gone and that no process uses (an older one without its maker in its
    name: once untouched for LEGACY_AGE seconds); never through a mount. Returns the removed paths (with
    ``remove=False``, those it would remove)."""
    now = time.time() if now is None else now
    removed = []
    for path, _kind, pid, start in work_dirs(parents):
        gone = _maker_gone(pid, start)
        if gone is False:
            continue
        if gone is None:
            try:
                if now - os.lstat(path).st_mtime < LEGACY_AGE:
                    continue
            except OSError:
                continue
        if users([path]):
            continue  # a dump still writes its log there: the next sweep takes it
        if not remove or criu_cli.remove_work_dir(path):
            removed.append(path)
    return removed


def _ancestors():
    found, pid = [], os.getpid()
    while pid > 1:
        found.append(pid)
        fields = proc.stat_fields(pid)
        if not fields:
            break
        pid = int(fields[1])
    return found


_CONTAINER_ID = re.compile(r"\A[0-9a-f]{64}\Z")


def _own_dir(path):
    """Whether ``path`` is a real directory (not a link) owned by this process's user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def trusted_work(previous):
    """What of a dead run's claim ``previous`` this run may act on, and what it ignores (lines).

    The claim lives in the store, where a writer of the store can forge it: its ``work`` must never name
    what this run kills, removes or thaws. A work dir counts only when it is one of ours by name (made by
    clients/criu.make_work_dir), a real directory of this user, and its maker is provably gone (a live maker's
    dir belongs to a live dump); the container only as a full id with a runc root that is a real directory of
    this user. Nothing from a claim of another host (its dirs are not here)."""
    work = (previous or {}).get("work") or {}
    if not isinstance(work, dict) or not work:
        return {}, []
    held_by = previous.get("holder") if isinstance(previous.get("holder"), dict) else {}
    if held_by.get("host") != socket.gethostname():
        return {}, ["ignored the work its claim names: it ran on another host (%s)" % held_by.get("host")]
    trusted, ignored = {"dirs": []}, []
    dirs = work.get("dirs") if isinstance(work.get("dirs"), list) else []
    for path in dirs:
        parsed = criu_cli.parse_work_dir(os.path.basename(path)) if isinstance(path, str) else None
        if (parsed and os.path.isabs(path) and os.path.normpath(path) == path and _own_dir(path)
                and _maker_gone(parsed[1], parsed[2])):
            trusted["dirs"].append(path)
        else:
            ignored.append("ignored %r, which its claim names as a work dir: not a CRIU work dir of a gone run of "
                           "this node" % (path,))
    container, runc_root = work.get("container_id"), work.get("runc_root") or layout.DOCKER_RUNC_ROOT
    if container is not None:
        if (isinstance(container, str) and _CONTAINER_ID.match(container) and isinstance(runc_root, str)
                and os.path.isabs(runc_root) and _own_dir(runc_root)):
            trusted.update(container_id=container, runc_root=runc_root)
        else:
            ignored.append("ignored the container its claim names: not a container id with a runc root of this node")
    return trusted, ignored


def clean_after(snapshot_dir, previous, grace=LINGER_GRACE, clock=time.monotonic, sleep=time.sleep):
    """Remove what the generation of claim ``previous`` left of the pod at ``snapshot_dir``: its runc or CRIU
    still running (waited for up to ``grace`` seconds, then killed, and the container they dumped thawed), their
    work dirs, the pod's staging dir, and any other work dir whose maker is gone. Only what ``trusted_work``
    accepts of the claim is acted on. Returns what it did, as lines."""
    work, done = trusted_work(previous)
    staging = layout.staging_dir(snapshot_dir)
    roots = [staging] + list(work.get("dirs") or [])
    lingering = users(roots, skip=_ancestors())
    if lingering:
        what = ", ".join("%d (%s)" % (pid, proc.comm(pid)) for pid in lingering)
        try:
            _state, waited = wait_for(lambda: (not any(proc.alive(pid) for pid in lingering), what), grace,
                                      interval=0.05, what="the end of what the dead run left running", clock=clock,
                                      sleep=sleep)
            left = []
        except SnapshotTimeout:
            left = [pid for pid in lingering if proc.alive(pid)]
        if not left:
            done.append("waited %.1f s for the processes it left running to end: %s" % (waited, what))
        else:
            proc.kill_quietly(left)
            for pid in left:
                proc.wait_gone(pid, 10.0)
            done.append("stopped the processes it left running after %.0f s: %s" % (grace, what))
            if work.get("container_id"):
                runc = RuncCli(global_args=["--root", work.get("runc_root") or layout.DOCKER_RUNC_ROOT])
                if runc.status(work["container_id"]) == "paused" and runc.resume(work["container_id"]):
                    done.append("thawed container %s, which its stopped dump had left frozen" % work["container_id"][:12])
    for path in work.get("dirs") or []:
        if criu_cli.remove_work_dir(path):
            done.append("removed its CRIU work dir %s" % path)
    if os.path.lexists(staging):
        fs.remove_tree(staging)
        done.append("removed its staging dir %s" % staging)
    done.extend("removed the CRIU work dir %s (its maker is gone)" % path for path in sweep_work_dirs())
    return done

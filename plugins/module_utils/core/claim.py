# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One generation of a pod's snapshot at a time: the claim. PRIVATE to the inferops.snapshot collection.

A generation spans several tasks (status generating, device backup, host checkpoint, verify), so
the flock a single module holds is not enough. The claim ``.<pod>.generation.json`` names the
generation that owns the pod's staging directory and its status record -- its id (given by the
role, one per run), where it runs and since when -- and a deadline: a claim whose holder was
killed lapses when its lease runs out, so nothing stays locked. While a live claim is another's, a
second generation is refused with the holder's name, and its cleanup removes nothing. Every read
and write of the claim happens under the parent directory's flock (the status record's lock).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket
import threading
import time
import uuid

from . import layout, paths
from .errors import ParameterError
from .status import locked

# Long enough for the gaps between a generation's tasks and for a slow controller; short enough that a
# generation whose controller was killed (an AWX job cancelled) blocks the next one for minutes at most.
# A task that works longer than the lease renews it while it works (Keeper).
DEFAULT_LEASE = 180.0


def new_id():
    return uuid.uuid4().hex


def read(snapshot_dir):
    try:
        with open(layout.claim_path(snapshot_dir)) as handle:
            claim = json.load(handle)
        return claim if isinstance(claim, dict) and claim.get("id") else None
    except (IOError, OSError, ValueError):
        return None


def live_other(snapshot_dir, generation_id, now=None):
    """The claim of another generation that has not lapsed, or None."""
    claim = read(snapshot_dir)
    now = time.time() if now is None else now
    if claim and claim["id"] != generation_id and float(claim.get("expires_at") or 0) > now:
        return claim
    return None


def describe(claim):
    holder = claim.get("holder") or {}
    return "generation %s on %s (pid %s) since %s, its claim runs until %s" % (
        claim.get("id"), holder.get("host"), holder.get("pid"), claim.get("started_at"),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(claim.get("expires_at") or 0))))


def take(snapshot_dir, generation_id, lease=DEFAULT_LEASE, now=None):
    """Claim (or renew the claim on) the pod for ``generation_id``; ParameterError while another holds it."""
    now = time.time() if now is None else now
    paths.ensure_dir(os.path.dirname(snapshot_dir.rstrip("/")))
    with locked(snapshot_dir):
        other = live_other(snapshot_dir, generation_id, now)
        if other:
            raise ParameterError(
                "another generation of this pod's snapshot is in progress: %s. Wait for it to finish, or, if that "
                "run is gone, remove %s (it lapses by itself at that time)" % (describe(other),
                                                                               layout.claim_path(snapshot_dir)),
                generation_in_progress=other)
        mine = read(snapshot_dir)
        claim = {"id": generation_id, "lease": float(lease), "expires_at": now + float(lease),
                 "started_at": (mine or {}).get("started_at") if (mine or {}).get("id") == generation_id
                 else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                 "holder": {"host": socket.gethostname(), "pid": os.getpid()}}
        paths.write_file_atomic(layout.claim_path(snapshot_dir), (json.dumps(claim, sort_keys=True) + "\n").encode())
    return claim


def join(snapshot_dir, generation_id, lease=DEFAULT_LEASE):
    """A task of a generation: renew ``generation_id``'s claim; a task outside any (no id) only makes sure no
    other generation holds the pod. ParameterError naming the holder otherwise."""
    if generation_id:
        return take(snapshot_dir, generation_id, lease)
    other = live_other(snapshot_dir, None)
    if other:
        raise ParameterError("another generation of this pod's snapshot is in progress: %s; give this task its "
                             "generation_id, or wait" % describe(other), generation_in_progress=other)
    return None


def release(snapshot_dir, generation_id):
    """Drop the claim when it is ours (a lapsed or foreign claim is left as it is)."""
    with locked(snapshot_dir):
        claim = read(snapshot_dir)
        if claim and claim["id"] == generation_id:
            os.unlink(layout.claim_path(snapshot_dir))
            return True
    return False


class Keeper:
    """Renews ``generation_id``'s claim every ``lease / 3`` s from a timer thread while one long task works, so
    that the lease need only cover the gaps between tasks. A renewal refused (another generation took a lapsed
    claim) is kept in ``lost``; the task checks it before it publishes anything."""

    def __init__(self, snapshot_dir, generation_id, lease=DEFAULT_LEASE):
        self.snapshot_dir, self.generation_id, self.lease = snapshot_dir, generation_id, float(lease)
        self.lost = None
        self._lock = threading.Lock()
        self._timer = None
        self._stopped = False

    def start(self):
        with self._lock:
            self._schedule()
        return self

    def _schedule(self):
        self._timer = threading.Timer(self.lease / 3.0, self._renew)
        self._timer.name = "inferops-claim-keeper"
        self._timer.daemon = True
        self._timer.start()

    def _renew(self):
        with self._lock:
            if self._stopped:
                return
            try:
                take(self.snapshot_dir, self.generation_id, self.lease)
            except ParameterError as exc:
                self.lost = exc.msg
                return
            except (IOError, OSError):
                pass  # the next renewal may get through
            self._schedule()

    def check(self):
        if self.lost:
            raise ParameterError("this generation lost its claim on the pod while it worked: %s" % self.lost)

    def stop(self):
        with self._lock:
            self._stopped = True
            if self._timer is not None:
                self._timer.cancel()

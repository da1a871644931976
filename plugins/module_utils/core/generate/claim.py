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

The holder is the process that stands for the run on this host (proc.run_anchor: ansible-playbook for a local
connection, the connection's sshd session over SSH), recorded with its start time, the boot id and its pid
namespace (proc.identity). A run on the same host whose claim's holder is provably gone -- its pid free or
another process's, or the host rebooted -- takes the claim over at once instead of waiting for the lease, and
removes what the dead run left (leftovers.clean_after: its runc or CRIU, their work dirs, the staging dir); the
claim it returns says so (``took_over``). A holder that lives, or runs on another host, is never overridden.
A new generation first puts back the last published snapshot where a killed publish left it aside (seal.put_back).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket
import time
import uuid

from ..base import layout
from ..base.clock import Renewer
from ..base.errors import ParameterError
from ..linux import fs, proc
from ..store import seal
from ..store.status import locked
from . import leftovers

# Long enough for the gaps between a generation's tasks and for a slow controller; short enough that a
# generation whose controller was killed (an AWX job cancelled) blocks the next one for minutes at most.
# A task that works longer than the lease renews it while it works (Keeper).
DEFAULT_LEASE = 180.0


def new_id():
    return uuid.uuid4().hex


def read(snapshot_dir):
    claim = fs.read_json(layout.claim_path(snapshot_dir))
    return claim if claim and claim.get("id") else None


def live_other(snapshot_dir, generation_id, now=None):
    """The claim of another generation that has not lapsed, or None."""
    claim = read(snapshot_dir)
    now = time.time() if now is None else now
    if claim and claim["id"] != generation_id and float(claim.get("expires_at") or 0) > now:
        return claim
    return None


CONTROLLERS = ("ansible", "ansible-playbook", "ansible-runner", "ansible-pull")


def holder(previous=None):
    """Who holds a claim taken now: the run's anchor on this host (proc.identity), the host, this task's pid, and
    whether the anchor's end proves the run's: ``kind`` controller (ansible-playbook itself: a local connection),
    or ``kept`` -- the same anchor held the claim in an earlier task of the run (an SSH connection that outlives
    its tasks, as Ansible's ControlPersist keeps it). A connection made for one task ends with the task, while
    its run goes on: its end proves nothing, and such a claim is left to its lease."""
    anchor = proc.identity(proc.run_anchor())
    words = [os.path.basename(word) for word in proc.cmdline(anchor["pid"])[:2]]
    found = dict(anchor, host=socket.gethostname(), task_pid=os.getpid(),
                 kind="controller" if set(words) & set(CONTROLLERS) else "connection")
    previous = previous or {}
    same = (previous.get("pid"), previous.get("start")) == (found["pid"], found["start"])
    found["kept"] = bool(same and (previous.get("kept") or previous.get("task_pid") != found["task_pid"]))
    return found


def ended(claim, now=None):
    """Why another run's ``claim`` no longer holds the pod -- its lease ran out, or its holder is provably gone
    (same host) -- or None while it does."""
    now = time.time() if now is None else now
    if float(claim.get("expires_at") or 0) <= now:
        return "its claim lapsed at %s" % _utc(claim.get("expires_at"))
    held_by = claim.get("holder") or {}
    if held_by.get("host") != socket.gethostname() or not (held_by.get("kind") == "controller" or held_by.get("kept")):
        return None
    gone = proc.gone_reason(held_by)
    return "the run that held it is gone: %s" % gone if gone else None


def describe(claim):
    held_by = claim.get("holder") or {}
    if held_by.get("host") != socket.gethostname():
        where = "on %s (another host: whether that run lives cannot be seen from here; pid %s)" % (
            held_by.get("host"), held_by.get("pid"))
    elif held_by.get("start") is None:
        where = "on %s (pid %s)" % (held_by.get("host"), held_by.get("pid"))
    elif proc.gone_reason(held_by) is None:
        where = "on %s, run by pid %s (%s), which is still running" % (
            held_by.get("host"), held_by.get("pid"), held_by.get("what") or "?")
    else:  # its connection ended with its last task: the run may go on, over a new one
        where = "on %s, last seen through pid %s (%s), a connection that ended with its task" % (
            held_by.get("host"), held_by.get("pid"), held_by.get("what") or "?")
    return "generation %s %s since %s, its claim runs until %s" % (claim.get("id"), where, claim.get("started_at"),
                                                                   _utc(claim.get("expires_at")))


def _utc(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(seconds or 0)))


def take(snapshot_dir, generation_id, lease=DEFAULT_LEASE, now=None, work=None):
    """Claim (or renew the claim on) the pod for ``generation_id``; ParameterError while another holds it. A claim
    whose run is over (``ended``) is taken over, and what that run left is removed: the claim returned then has
    ``took_over`` ({id, holder, why, cleaned}). ``work``: what this run is about to leave should it be killed
    (``dirs`` it hands to runc or CRIU, the ``container_id`` and ``runc_root`` they dump), kept until replaced."""
    now = time.time() if now is None else now
    fs.ensure_dir(os.path.dirname(snapshot_dir.rstrip("/")))
    previous, took_over, put_back = None, None, None
    with locked(snapshot_dir):
        found = read(snapshot_dir)
        mine = found if found and found["id"] == generation_id else None
        if found and not mine:
            why = ended(found, now)
            if why is None:
                raise ParameterError(
                    "another generation of this pod's snapshot is in progress: %s. Wait for it to finish, or, if that "
                    "run is gone, remove %s (it lapses by itself at that time)" % (describe(found),
                                                                                   layout.claim_path(snapshot_dir)),
                    generation_in_progress=found)
            previous = found
            took_over = {"id": found["id"], "holder": found.get("holder"), "why": why}
        if not mine:  # a new generation: first what killed runs left of the pod's records and of its snapshot
            fs.sweep_temp_files(os.path.dirname(layout.claim_path(snapshot_dir)), [os.path.basename(record(
                snapshot_dir)) for record in (layout.status_path, layout.claim_path, layout.restores_path)])
            put_back = seal.put_back(snapshot_dir, locked=False)
        claim = {"id": generation_id, "lease": float(lease), "expires_at": now + float(lease),
                 "started_at": mine.get("started_at") if mine
                 else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                 "holder": holder((mine or {}).get("holder")),
                 "work": work if work is not None else (mine or {}).get("work")}
        fs.write_file_atomic(layout.claim_path(snapshot_dir), (json.dumps(claim, sort_keys=True) + "\n").encode())
    if put_back:
        claim["put_back"] = put_back
    if took_over is not None:  # the claim is ours now: no other run touches the pod while this cleans up
        took_over["cleaned"] = (["put back the last published snapshot from %s, where its killed publish had left it"
                                 % put_back] if put_back else []) + leftovers.clean_after(snapshot_dir, previous)
        claim["took_over"] = took_over
    return claim


def join(snapshot_dir, generation_id, lease=DEFAULT_LEASE):
    """A task of a generation: renew ``generation_id``'s claim; a task outside any (no id) only makes sure no
    other generation holds the pod. ParameterError naming the holder otherwise."""
    if generation_id:
        return take(snapshot_dir, generation_id, lease)
    other = live_other(snapshot_dir, None)
    if other and not ended(other):
        raise ParameterError("another generation of this pod's snapshot is in progress: %s; give this task its "
                             "generation_id, or wait" % describe(other), generation_in_progress=other)
    return None


def release(snapshot_dir, generation_id):
    """Drop the claim when it is ours (a lapsed or foreign claim is left as it is)."""
    if not os.path.isdir(os.path.dirname(snapshot_dir.rstrip("/"))):
        return False  # nothing was ever written for the pod: no claim (a store that refused the first write)
    with locked(snapshot_dir):
        claim = read(snapshot_dir)
        if claim and claim["id"] == generation_id:
            os.unlink(layout.claim_path(snapshot_dir))
            return True
    return False


class Keeper:
    """Renews ``generation_id``'s claim every ``lease / 3`` s (clock.Renewer) while one long task works, so that the
    lease need only cover the gaps between tasks. A renewal refused (another generation took a lapsed claim) is kept
    in ``lost``; the task checks it before it publishes anything."""

    def __init__(self, snapshot_dir, generation_id, lease=DEFAULT_LEASE):
        self.snapshot_dir, self.generation_id, self.lease = snapshot_dir, generation_id, float(lease)
        self.lost = None
        self._renewer = Renewer(self.lease / 3.0, self._renew, "inferops-claim-keeper")

    def start(self):
        self._renewer.start()
        return self

    def _renew(self):
        try:
            take(self.snapshot_dir, self.generation_id, self.lease)
        except ParameterError as exc:
            self.lost = exc.msg
            return False
        except (IOError, OSError):
            pass  # the next renewal may get through
        return True

    def check(self):
        if self.lost:
            raise ParameterError("this generation lost its claim on the pod while it worked: %s" % self.lost)

    def stop(self):
        self._renewer.stop()

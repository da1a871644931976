# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A restore killed mid-way: on record before it could leave anything half-done, and recognised by the next run.
PRIVATE to the inferops.snapshot collection.

A ``snapshot_restore`` run that restores by itself (``docker start --checkpoint``, a bare process) records itself
``restoring`` in the snapshot's status record right before its host restore (``started``): the process that runs it
(proc.identity), its deadline, and what it restores into (the container; the process tree's root pid, which CRIU
restores as it was). Its outcome replaces that entry at the end (status.update, by the same runner). A run killed in
between -- with its controller, after the engine came back and before its device state did -- leaves the entry, and
an engine its agent's restore lease brings back by itself (docs/agent.md). The next run finds the entry (``find``),
tells a run that is gone from one that may still be running (``Found.gone``), asks the engine's agent what it is now
(``engine_now``), and its driver makes way for a restore from the start (``take_over``: the container stopped, the
process tree killed); the entry then says ``interrupted`` with what was found (``close``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import datetime
import os

from ..agent import protocol
from ..base.clock import utc_now
from ..base.errors import SnapshotError
from ..clients.control import AgentSocketClient
from ..linux import proc
from ..store import status

RESTORING = "restoring"      # the entry's outcome while the run restores
INTERRUPTED = "interrupted"  # the run that wrote it ended without an outcome
AGENT_TIMEOUT = 5.0


def started(driver, attempt, **fields):
    """The attempt's ``restoring`` entry, written right before its host restore. Informative like its outcome: a
    store that cannot be written fails nothing (its engine is still covered by its restore lease)."""
    runner = proc.identity(os.getpid())
    attempt.details["runner"] = runner  # the outcome's entry replaces this one (driver.record_attempt)
    until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=attempt.remaining(0.0))
    entry = status.restore_entry(driver.path, RESTORING, runner=runner, **dict(driver.record_fields(attempt), **fields))
    entry["until"] = until.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    try:
        status.update(attempt.snapshot_dir, restore=entry)
    except (IOError, OSError, SnapshotError) as exc:
        attempt.details["record_error"] = str(getattr(exc, "msg", exc))


class Found(collections.namedtuple("Found", "entry gone")):
    """A ``restoring`` entry of another run; ``gone``: why that run is over (None: it may still be restoring)."""

    def describe(self):
        return "the restore started at %s by pid %s" % (self.entry.get("at"), (self.entry.get("runner") or {}).get("pid"))


def find(snapshot_dir, path, matches=lambda entry: True):
    """The newest entry of ``path`` on this node that is still ``restoring`` and ``matches(entry)``, or None."""
    record = status.read(snapshot_dir) or {}
    node = os.uname()[1]
    for entry in reversed(record.get("restores") or []):
        if entry.get("outcome") == RESTORING and entry.get("path") == path and entry.get("node") == node \
                and matches(entry):
            return Found(entry, _gone(entry))
    return None


def _gone(entry):
    """Why the run of ``entry`` is over, or None while it may run: its process is provably gone, or -- where this
    host cannot see it (another pid namespace) -- its deadline passed."""
    runner = entry.get("runner")
    why = proc.gone_reason(runner)
    if why or (runner and runner.get("pidns") == proc.pid_namespace("self") and proc.alive(runner.get("pid"))):
        return why
    if entry.get("until") and utc_now() > entry["until"]:
        return "its deadline passed at %s" % entry["until"]
    return None


def in_progress(found):
    """The reason a run gives when another run is restoring the same engine now (it touches nothing)."""
    return ("%s (%s) is still running: another restore of this snapshot is in progress; nothing was done (run again "
            "once it has ended)" % (found.describe(), (found.entry.get("runner") or {}).get("what") or "?"))


def engine_now(pid, socket_dir):
    """What the agent of the half-restored engine ``pid`` says of it: its state, the lease it holds and who took it,
    what its agent did when a lease ran out, who said it was restored; or why it cannot say."""
    try:
        reply = AgentSocketClient.for_pid(pid, socket_dir).request(protocol.OP_STATE, AGENT_TIMEOUT)
    except SnapshotError as exc:
        return {"agent": "no answer (%s)" % exc.msg}
    lease, abandoned = reply.get("lease") or {}, reply.get("abandoned") or {}
    return {"state": reply.get("state"), "lease": {"by": lease["by"], "remaining_s": lease["remaining_s"]}
            if lease else None, "abandoned": {"lease_by": abandoned.get("lease_by"), "actions": abandoned.get("actions"),
                                              "state": abandoned.get("state")} if abandoned else None,
            "resumed_by": (reply.get("resumed") or {}).get("by")}


def summary(engine):
    """``engine_now``'s fields in words."""
    if "state" not in engine:
        return "its engine's agent gave %s" % engine.get("agent", "no answer")
    if engine.get("abandoned") and engine["abandoned"].get("lease_by") == "restore":
        return "its engine %s after its agent finished the restore itself (%s)" % (
            engine["state"], ", ".join(engine["abandoned"].get("actions") or []) or "nothing to do")
    if engine.get("lease") and engine["lease"]["by"] == "restore":
        return "its engine %s, waiting for a restore path (restore lease, %.1f s left)" % (
            engine["state"], engine["lease"]["remaining_s"])
    return "its engine %s" % engine["state"]


def reason(found, what):
    """The interrupted run's reason: who it was, why it is over, and ``what`` the next run found and does."""
    return "interrupted: %s ended without an outcome (%s); %s" % (found.describe(), found.gone, what)


def close(snapshot_dir, found, what):
    """The entry of the interrupted run says so (``reason``); returns the reason."""
    reason_ = reason(found, what)
    try:
        status.update(snapshot_dir, restore=dict(found.entry, outcome=INTERRUPTED, reason=reason_))
    except (IOError, OSError, SnapshotError):
        pass  # informative: the run's own outcome is what matters now
    return reason_

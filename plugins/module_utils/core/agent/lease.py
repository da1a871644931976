# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lease of a lock or a backup (protocol.py): granted, renewed, and acted on by a watchdog timer when its holder
never comes back -- the agent then restores and unlocks the engine itself. A copy restored from a checkpoint of a
locked engine holds a lease of its own, the restore lease: when no restore path finishes the restore within it,
the agent finishes it (or exits, so that the container starts cold). A mixin of ``controller.Controller``.
PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import threading

from . import protocol
from .process import log, utc


class Leases:
    """The lease half of the Controller: ``_lease_lock`` guards the lease, the watchdog and the record of what it
    did (``_abandoned``); the ACL calls themselves are the Controller's ``_run``."""

    LEASE_RETRY_SECONDS = 5.0   # after an expiry action that failed
    BUSY_RETRY_SECONDS = 0.5    # while a request or a call that outlived its timeout holds the runtime
    RESTORE = "restore"         # the ``by`` of a restore lease
    GAVE_UP_EXIT_CODE = 75      # the process's exit status when a restore lease ends in a cold start (EX_TEMPFAIL)

    def _leased(self, op, timeout, lease, device_memory=None):
        """Run ``op``, taking, keeping or dropping the lease as the protocol says (``_serial`` is held)."""
        if lease is not None and protocol.check_transition(op, self.state):
            self._grant(lease, op)  # before the call: a caller that dies during it is covered too
        reply = self._run(op, timeout, device_memory=device_memory)
        if reply["ok"]:
            if op == protocol.OP_UNLOCK:
                self._drop_lease()
            if op in (protocol.OP_LOCK, protocol.OP_UNLOCK):
                self._abandoned = None
            if lease is not None and op in (protocol.OP_LOCK, protocol.OP_BACKUP):
                self._grant(lease, op)  # counted from the end of the call
            reply.update(self.describe())
        elif self.state == protocol.STATE_RUNNING and reply["error"]["kind"] != protocol.KIND_TIMEOUT:
            self._drop_lease()  # the call ended and nothing is held (a lock that failed)
        return reply

    def _grant(self, seconds, by):
        with self._lease_lock:
            now = self._clock()
            previous = self._lease if by != protocol.OP_LOCK else None  # a lock starts a new holding
            self._lease = {"seconds": float(seconds), "deadline": now + seconds, "taken": now,
                           "granted_at": previous["granted_at"] if previous else utc(self._wall()),
                           "renewed_at": utc(self._wall()), "by": previous["by"] if previous else by,
                           "incarnation": self._incarnation()}
            self._arm(seconds)

    def _take_restore_lease(self):
        """A copy restored from a checkpoint of a locked or backed-up engine: the lease of the process it was
        checkpointed from goes (``_current_lease``), the restore lease comes -- ``restore_lease`` seconds until the
        restore path renews it to its own deadline (protocol.RESTORE_LEASE_ENV) -- unless it is off."""
        with self._lease_lock:
            self._current_lease()
            if self.state == protocol.STATE_RUNNING or not self.restore_lease or self._lease is not None:
                return
            self._grant(self.restore_lease, self.RESTORE)
        log("restored %s: holding a restore lease of %.1f s; a restore path that has not restored and unlocked the "
            "device state by then is gone, and the agent finishes the restore itself" % (self.state, self.restore_lease))

    def _restore_pending(self):
        """Whether this is a restored copy whose restore lease still runs (no restore path has finished it)."""
        with self._lease_lock:
            return (self._lease or {}).get("by") == self.RESTORE

    def _drop_lease(self):
        with self._lease_lock:
            self._lease = None
            self._disarm()

    def _arm(self, delay):
        with self._lease_lock:
            self._disarm()
            self._timer = threading.Timer(max(0.0, delay), self._watchdog)
            self._timer.name = "inferops-agent-lease"
            self._timer.daemon = True
            self._timer.start()

    def _disarm(self):
        with self._lease_lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _current_lease(self):
        """The lease, unless it belongs to another incarnation of this process (a CRIU-restored copy).

        A restored copy must never act on the lease of the process it was checkpointed from: the
        restore path brings its device state back itself (device.resume_process: restore + unlock),
        and a watchdog racing it would make its restore fail. So a lease whose incarnation (boot id,
        process start time; see ``incarnation``) is not this process's, or whose clock went backwards,
        is dropped here, before anything reads it.
        """
        with self._lease_lock:
            lease = self._lease
            if lease is not None and (lease["incarnation"] != self._incarnation() or self._clock() < lease["taken"]):
                log("dropped a lease taken before this process was restored from a checkpoint (the restore "
                    "brings the device state back itself)")
                self._lease = None
                self._disarm()
                return None
            return lease

    def _lease_view(self):
        with self._lease_lock:
            lease = self._current_lease()
            if lease is None:
                return None
            left = lease["deadline"] - self._clock()
            return {"seconds": lease["seconds"], "remaining_s": round(max(left, 0.0), 3), "expired": left <= 0,
                    "expires_at": utc(self._wall() + left), "granted_at": lease["granted_at"],
                    "renewed_at": lease["renewed_at"], "by": lease["by"]}

    def _abandoned_view(self):
        with self._lease_lock:
            record = self._abandoned
            if record is None:
                return None
            return dict(record, actions=list(record["actions"]), errors=list(record["errors"]))

    def _renew(self, lease):
        with self._lease_lock:
            current = self._current_lease()
            if self.state not in (protocol.STATE_LOCKED, protocol.STATE_BACKED_UP):
                reply = protocol.error_reply(
                    protocol.OP_RENEW, protocol.KIND_LEASE,
                    "no lease to renew: the process is %s%s" % (self.state, (
                        " (its lease ran out at %s and the agent resumed it: %s)"
                        % (self._abandoned["expired_at"], ", ".join(self._abandoned["actions"]) or "no action needed"))
                        if self._abandoned else ""), state=self.state)
                reply["abandoned"] = self._abandoned_view()
                return reply
            if current is not None and self._clock() >= current["deadline"]:
                return protocol.error_reply(
                    protocol.OP_RENEW, protocol.KIND_LEASE,
                    "the lease ran out %.1f s ago; the agent is bringing the engine back (restore and unlock): "
                    "start again with a new lock" % (self._clock() - current["deadline"]), state=self.state)
            seconds = lease if lease is not None else (current or {}).get("seconds")
            if seconds is None:
                return protocol.error_reply(protocol.OP_RENEW, protocol.KIND_BAD_REQUEST,
                                            "field 'lease': required to renew when no lease is held", state=self.state)
            self._grant(seconds, protocol.OP_RENEW)
        reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": protocol.OP_RENEW, "changed": False}
        reply.update(self.describe())
        return reply

    def _watchdog(self):
        """The timer's callback at the lease's deadline. Never raises; re-arms itself when it cannot act yet."""
        try:
            self._expire()
        except Exception as exc:  # pylint: disable=broad-except  # the watchdog must not die
            log("lease watchdog: unexpected error %r; retrying in %.0f s" % (exc, self.LEASE_RETRY_SECONDS))
            self._arm(self.LEASE_RETRY_SECONDS)

    def _expire(self):
        with self._lease_lock:
            lease = self._current_lease()
            if lease is None:
                return
            if self._clock() < lease["deadline"]:  # renewed since the timer was armed
                self._arm(lease["deadline"] - self._clock())
                return
        # A process frozen by CRIU for a dump runs no thread, this one included: a deadline that passes
        # during a dump is acted on after the process is thawed, when the dump is complete.
        if not self._serial.acquire(timeout=1.0):
            self._arm(self.BUSY_RETRY_SECONDS)
            return
        try:
            if self._inflight is not None and self._inflight[1].is_alive():
                self._arm(self.BUSY_RETRY_SECONDS)  # act on the state the call leaves
                return
            self._inflight = None
            with self._lease_lock:
                lease = self._current_lease()
                if lease is None:
                    return
                if self._clock() < lease["deadline"]:
                    self._arm(lease["deadline"] - self._clock())
                    return
                if self.state == protocol.STATE_RUNNING:  # e.g. a lock that ran past its request and failed
                    self._drop_lease()
                    return
                overdue = self._clock() - lease["deadline"]
            self._bring_back(lease, overdue)
        finally:
            self._serial.release()

    def _bring_back(self, lease, overdue):
        """Restore and unlock the engine of a holder that never came back (``_serial`` is held)."""
        record = self._abandoned
        if record is None or record.get("lease_granted_at") != lease["granted_at"]:
            record = self._abandoned = {
                "at": utc(self._wall()), "previous_state": self.state, "lease_s": lease["seconds"],
                "lease_granted_at": lease["granted_at"], "lease_renewed_at": lease["renewed_at"],
                "lease_by": lease["by"], "expired_at": utc(self._wall() - overdue),
                "overdue_s": round(overdue, 3), "actions": [], "errors": [], "state": self.state}
            log("the lease of %.1f s (taken by %s at %s, last renewed at %s) ran out %.1f s ago with the process %s: "
                "bringing the engine back" % (lease["seconds"], lease["by"], lease["granted_at"],
                                              lease["renewed_at"], overdue, self.state))
        restoring = lease["by"] == self.RESTORE
        if restoring:
            why = self._finish_restore(record)
            if why:
                return self._give_up(record, why)
        steps = {protocol.STATE_BACKED_UP: protocol.OP_RESTORE, protocol.STATE_LOCKED: protocol.OP_UNLOCK}
        while self.state in steps:
            op = steps[self.state]

            def done(op=op):  # in the call's thread, with the state change (a late call's too)
                record["actions"].append(op)
                record["state"] = self.state

            reply = self._run(op, protocol.DEFAULT_TIMEOUT, then=done)
            if not reply["ok"]:
                if restoring and reply["error"]["kind"] != protocol.KIND_TIMEOUT:
                    return self._give_up(record, "%s failed: %s" % (op, reply["error"]["message"]), op)
                with self._lease_lock:
                    record["errors"].append({"at": utc(self._wall()), "op": op, "message": reply["error"]["message"]})
                    del record["errors"][:-10]
                    record["state"] = self.state
                log("lease watchdog: %s failed (%s); retrying in %.0f s"
                    % (op, reply["error"]["message"], self.LEASE_RETRY_SECONDS))
                self._arm(self.BUSY_RETRY_SECONDS if reply["error"]["kind"] == protocol.KIND_TIMEOUT
                          else self.LEASE_RETRY_SECONDS)
                return
        log("lease watchdog: the engine is %s again after %s" % (self.state, ", ".join(record["actions"]) or "nothing"))
        self._drop_lease()

    def _finish_restore(self, record):
        """What the restore path does before the device restore and the agent can do itself (``_serial`` is held):
        the engine's RESTORE_POST hooks, with a nonce of the agent's own where no restore path told one; the POSIX
        locks the process held at the last look before its checkpoint (``_remember_locks``), taken back. Returns
        why the restore cannot be finished, or None."""
        if self._resumed_nonce is None:
            reply = self._resume(os.urandom(protocol.NONCE_HEX_DIGITS // 2).hex(), by="lease")
            if not reply["ok"]:
                return reply["error"]["message"]
            record["actions"].append(protocol.OP_RESUMED)
        missing = self._locks_missing()
        if missing:
            reply = self._relock(missing)
            if not reply["ok"]:
                return "the POSIX file locks of the checkpoint cannot be taken back: %s" % reply["error"]["message"]
            record["actions"].append(protocol.OP_RELOCK)
        return None

    def _give_up(self, record, why, op="finish"):
        """A restore lease that cannot end in a restored engine ends the process: the restore path would have
        started the engine cold (``reseed_failed``, ``file_locks_failed``, ``device_restore_failed``); its container
        starts cold by its restart policy, or the next restore does (docs/agent.md)."""
        with self._lease_lock:
            record["errors"].append({"at": utc(self._wall()), "op": op, "message": why})
            record["state"] = "EXITED"
        log("restore lease: the restore cannot be finished here (%s); exiting with status %d so that the engine "
            "starts cold" % (why, self.GAVE_UP_EXIT_CODE))
        self._exit(self.GAVE_UP_EXIT_CODE)

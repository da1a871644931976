# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's Controller: the process's snapshot state and the ACL calls, one request at a time; its lease
(lease.py) and what it does after a restore (restored.py) are mixins. PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import threading
import time

from . import acl, protocol, reseed
from .lease import Leases
from .process import incarnation, log
from .restored import Restored


class Controller(Leases, Restored):
    """Tracks the process's snapshot state and makes the ACL calls, one request at a time.

    The runtime has no public get-state call, so the caller tracks state: it changes only when
    the ACL call succeeded (a failed lock leaves the process RUNNING, as the runtime does).

    The lease (see protocol.py): a lock or backup may carry one; a timer (the watchdog) fires at its
    deadline, and when the process is still LOCKED or BACKED_UP then, the controller brings it back
    itself -- restore then unlock from BACKED_UP, unlock from LOCKED -- and keeps a record of what it
    did (``abandoned``) in every reply until a later successful lock or unlock. A restore that fails is
    not followed by an unlock (the engine would serve from device memory the backup released); it is
    retried, every LEASE_RETRY_SECONDS.

    The restore lease (see lease.py): a copy restored from a checkpoint of a locked or backed-up engine drops the
    lease of the process it was checkpointed from and holds one of its own, ``restore_lease`` seconds from the moment
    it notices the restore (the restore path renews it to its own deadline). When it runs out, no restore path has
    finished the restore: the controller finishes it -- the RESTORE_POST hooks with a nonce of its own, the POSIX
    locks of its last look before the checkpoint taken back, restore, unlock -- or, where any of that fails, ends the
    process with GAVE_UP_EXIT_CODE so that it starts cold.

    The restore (see reseed.py): a process restored from a snapshot shares every pseudo-random generator's state
    with every other copy of that snapshot. The restore path says so (``resumed``, with the restore's nonce): the
    controller re-seeds what it can reach in the interpreter and calls the engine's RESTORE_POST hooks with the
    nonce. It also notices a restore by itself (its incarnation changed: ``notice_restore``, on every request and
    every half second from the server) and re-seeds the interpreter's generators at once -- the hooks wait for the
    restore path's nonce, which is the one in the metadata file.
    """

    def __init__(self, runtime=None, runtime_error=None, clock=time.monotonic, wall=time.time,
                 incarnation=incarnation, restore_lease=protocol.DEFAULT_RESTORE_LEASE, exit=os._exit):
        self.runtime = runtime
        self.runtime_error = runtime_error
        self.state = protocol.STATE_RUNNING
        self._clock = clock
        self._wall = wall
        self._incarnation = incarnation
        self._serial = threading.Lock()
        self._inflight = None  # (op, thread) of an operation that outlived its request
        self._engine_info = {}
        self._info_lock = threading.Lock()
        self._lease_lock = threading.RLock()
        self._lease = None      # {"seconds", "deadline" (monotonic), "granted_at", "renewed_at", "by", "incarnation"}
        self._timer = None      # the watchdog: a threading.Timer armed for the lease's deadline
        self._abandoned = None  # what the watchdog did when a lease ran out
        self._hooks = dict((stage, []) for stage in reseed.STAGES)
        self._restore_lock = threading.RLock()
        self._incarnation_seen = incarnation()
        self._resumed = None    # the last restore of this process: when, who said so, what was re-seeded
        self._resumed_nonce = None
        self.restore_lease = restore_lease  # seconds, or None: a restored copy waits for its restore path forever
        self._exit = exit
        self._locks_seen = []   # [(fd, type, start, len)]: the POSIX locks held at the last look while locked

    @classmethod
    def load(cls, library_path=None, environ=None):
        """Load libascendcl; a missing library is kept as an error every request reports. The restore lease is the
        environment's (protocol.RESTORE_LEASE_ENV)."""
        restore_lease, why = protocol.parse_restore_lease((os.environ if environ is None else environ).get(
            protocol.RESTORE_LEASE_ENV))
        if why:
            log(why)
        try:
            return cls(runtime=acl.AclRuntime(library_path), restore_lease=restore_lease)
        except acl.AclLibraryError as exc:
            return cls(runtime_error=str(exc), restore_lease=restore_lease)

    def report(self, **fields):
        """Let the engine publish facts the runtime cannot tell (device memory in use, model, ...)."""
        with self._info_lock:
            self._engine_info.update(fields)

    def describe(self):
        with self._info_lock:
            info = dict(self._engine_info)
        with self._lease_lock:  # the state, its lease and the record as of one moment (see _run)
            state, lease, abandoned = self.state, self._lease_view(), self._abandoned_view()
        reply = {
            "pid": os.getpid(),
            "state": state,
            "devices": sorted(self.runtime.devices_in_use) if self.runtime else [],
            "runtime_version": None,
            "engine": info,
            "lease": lease,
            "abandoned": abandoned,
            "resumed": dict(self._resumed) if self._resumed else None,
        }
        if self.runtime is not None:
            try:
                reply["runtime_version"] = self.runtime.version()
            except acl.AclError:
                pass
            # the snapshot API's shape, what the last backup asked for, and the versions the args shape compares
            reply["snapshot"] = dict(api=self.runtime.snapshot_api, device_memory=self.runtime.backup_device_memory,
                                     api_versions=self.runtime.api_versions())
        return reply

    def close(self):
        """Stop the watchdog (the engine exits)."""
        with self._lease_lock:
            self._disarm()

    def handle(self, message):
        """Answer one decoded request; never raises."""
        self.notice_restore()
        try:
            return self._answer(message)
        finally:
            self._remember_locks()

    def _answer(self, message):
        op = message.get("op") if isinstance(message, dict) else None
        try:
            op, timeout = protocol.parse_request(message)
            lease = protocol.parse_lease(message)
        except protocol.ProtocolError as exc:
            return protocol.error_reply(op if op in protocol.OPERATIONS else None,
                                        protocol.KIND_BAD_REQUEST, str(exc), state=self.state)
        if op == protocol.OP_RESUMED:
            return self._resume(protocol.parse_nonce(message))
        if op == protocol.OP_STATE:
            reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": op, "changed": False}
            reply.update(self.describe())
            if self._inflight is not None and self._inflight[1].is_alive():
                reply["busy_with"] = self._inflight[0]
            return reply
        if op == protocol.OP_RENEW:
            return self._renew(lease)
        if op == protocol.OP_RELOCK:
            return self._relock(protocol.parse_locks(message))
        if self.runtime is None:
            return protocol.error_reply(op, protocol.KIND_UNAVAILABLE, self.runtime_error, state=self.state)
        if not self._serial.acquire(timeout=min(timeout, 1.0)):
            return protocol.error_reply(op, protocol.KIND_BUSY, "another snapshot request is being served",
                                        state=self.state)
        try:
            if self._inflight is not None and self._inflight[1].is_alive():
                return protocol.error_reply(
                    op, protocol.KIND_BUSY,
                    "an earlier %r request is still running in the ACL runtime; retry when it finishes"
                    % self._inflight[0], state=self.state)
            self._inflight = None
            return self._leased(op, timeout, lease, protocol.parse_device_memory(message))
        finally:
            self._serial.release()

    # ------------------------------------------------------------------ the ACL calls
    def _run(self, op, timeout, then=None, device_memory=None):
        """Make the ACL call in a thread of its own, waiting ``timeout`` for it; ``then()`` runs with the
        state change, under the lease lock, so that no reply shows one without the other."""
        previous = self.state
        calls = {
            protocol.OP_LOCK: self.runtime.snapshot_lock,
            protocol.OP_BACKUP: lambda: self.runtime.snapshot_backup(device_memory=device_memory),
            protocol.OP_RESTORE: self.runtime.snapshot_restore,
            protocol.OP_UNLOCK: self.runtime.snapshot_unlock,
        }
        outcome = {}

        def call():
            try:
                calls[op]()
            except acl.AclError as exc:
                outcome["error"] = exc
            except acl.AclLibraryError as exc:  # asked for what this library's shape cannot do: nothing was called
                outcome["unsupported"] = exc
            except Exception as exc:  # the engine must survive anything a request triggers
                outcome["internal"] = exc
            else:
                with self._lease_lock:
                    self.state = protocol.TRANSITIONS[op][1]
                    if op == protocol.OP_UNLOCK:  # RUNNING: nothing left for a lease to protect
                        self._drop_lease()
                    if then is not None:
                        then()

        started = self._clock()
        worker = threading.Thread(target=call, name="inferops-agent-%s" % op, daemon=True)
        worker.start()
        worker.join(timeout)
        duration = self._clock() - started
        if worker.is_alive():
            self._inflight = (op, worker)
            log("%s did not finish within %.1fs; it keeps running in the runtime" % (op, timeout))
            return protocol.error_reply(
                op, protocol.KIND_TIMEOUT,
                "%s did not finish within %.1f s (state was %s); the call is still running inside the "
                "ACL runtime and further requests are refused until it ends" % (op, timeout, previous),
                state=self.state)
        if "error" in outcome:
            exc = outcome["error"]
            log(str(exc))
            return protocol.error_reply(op, protocol.KIND_ACL, str(exc), state=self.state,
                                        code=exc.code, name=exc.name)
        if "unsupported" in outcome:
            return protocol.error_reply(op, protocol.KIND_BAD_REQUEST, str(outcome["unsupported"]), state=self.state)
        if "internal" in outcome:
            return protocol.error_reply(op, protocol.KIND_INTERNAL, "%s failed: %r" % (op, outcome["internal"]),
                                        state=self.state)
        log("%s: %s -> %s in %.3fs" % (op, previous, self.state, duration))
        reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": op, "changed": True,
                 "previous_state": previous, "duration_s": round(duration, 6)}
        reply.update(self.describe())
        return reply

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""In-process snapshot agent: runs inside the inference process and drives its ACL snapshot state.

PRIVATE to the inferops.snapshot collection: no compatibility promise for other users.

The ACL snapshot calls only act on the calling process, so something inside the engine's process
has to make them. This module is that something. With this folder copied into the engine image as
the package ``inferops_agent`` (on the interpreter's path, e.g. PYTHONPATH=/opt/inferops):

    python3 -m inferops_agent [--socket PATH] [--library PATH] -- ENGINE_SCRIPT.py [ARGS...]
    python3 -m inferops_agent [--socket PATH] [--library PATH] -- -m ENGINE.MODULE [ARGS...]

starts a control server thread on a unix socket, then runs the engine in the same interpreter
(runpy), so both share one loaded libascendcl. The engine may import this module (``from
inferops_agent import launcher``) to reach the same Controller, e.g. to expose it on its own HTTP
endpoint, or to register a RESTORE_POST hook (``Controller.register_hook``): what re-seeds the engine's own
samplers after a restore, from the restore's nonce.

Only root and the engine's own user may talk to the socket: the agent checks each peer's credentials
(SO_PEERCRED) and refuses anyone else before reading what they ask.

Pure standard library, and self-contained: it imports nothing outside this folder.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import datetime
import errno
import fcntl
import os
import runpy
import socket
import socketserver
import struct
import sys
import threading
import time

from . import acl, protocol, reseed

DEFAULT_SOCKET_DIR = protocol.DEFAULT_SOCKET_DIR
SOCKET_ENV = protocol.SOCKET_ENV
SOCKET_DIR_ENV = protocol.SOCKET_DIR_ENV
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with its terminating NUL
LIBRARY_ENV = protocol.LIBRARY_ENV
RESTORE_POST = reseed.RESTORE_POST  # Controller.register_hook(RESTORE_POST, fn): fn(nonce) after every restore

_CONTROLLER = None


def default_socket_path(pid=None, environ=None):
    """The socket a process's agent listens on, named by the pid *inside* its pid namespace."""
    directory = (os.environ if environ is None else environ).get(SOCKET_DIR_ENV) or DEFAULT_SOCKET_DIR
    return os.path.join(directory, protocol.SOCKET_NAME % (pid or os.getpid()))


def current_controller():
    """The Controller of the agent running in this process, or None when not launched by it."""
    return _CONTROLLER


def _log(message):
    sys.stderr.write("inferops-agent[%d]: %s\n" % (os.getpid(), message))
    sys.stderr.flush()


def _utc(timestamp=None):
    """ISO 8601 UTC with microseconds, as in the collection's records."""
    moment = datetime.datetime.fromtimestamp(time.time() if timestamp is None else timestamp, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def incarnation(proc="/proc"):
    """What tells this process from a CRIU-restored copy of it: (boot id, start time of the process).

    A copy restored by CRIU -- on this host or another one -- holds this agent's memory, its lease
    included, and CLOCK_MONOTONIC does not tell it apart: CRIU restores into a time namespace whose
    offsets make the monotonic clock continue from the moment of the dump (measured here with
    CRIU 4.2), so a lease's deadline keeps its meaning in the copy. What CRIU cannot restore is the
    start time of the process (/proc/self/stat field 22): the restored task is a new one, so its
    start time is the moment of the restore (shifted by the namespace's offsets, it reads as the
    moment of the dump -- still later than any lease the original took after its start). The boot id
    tells another host (or a reboot). A lease is acted on only by the incarnation that took it.
    """
    found = []
    for path, pick in (("sys/kernel/random/boot_id", lambda text: text.strip()),
                       ("self/stat", lambda text: text.rsplit(")", 1)[1].split()[19])):
        try:
            with open(os.path.join(proc, path)) as handle:
                found.append(pick(handle.read()))
        except (OSError, IndexError):
            found.append(None)
    return tuple(found)


class Controller:
    """Tracks the process's snapshot state and makes the ACL calls, one request at a time.

    The runtime has no public get-state call, so the caller tracks state: it changes only when
    the ACL call succeeded (a failed lock leaves the process RUNNING, as the runtime does).

    The lease (see protocol.py): a lock or backup may carry one; a timer (the watchdog) fires at its
    deadline, and when the process is still LOCKED or BACKED_UP then, the controller brings it back
    itself -- restore then unlock from BACKED_UP, unlock from LOCKED -- and keeps a record of what it
    did (``abandoned``) in every reply until a later successful lock or unlock. A restore that fails is
    not followed by an unlock (the engine would serve from device memory the backup released); it is
    retried, every LEASE_RETRY_SECONDS.

    The restore (see reseed.py): a process restored from a snapshot shares every pseudo-random generator's state
    with every other copy of that snapshot. The restore path says so (``resumed``, with the restore's nonce): the
    controller re-seeds what it can reach in the interpreter and calls the engine's RESTORE_POST hooks with the
    nonce. It also notices a restore by itself (its incarnation changed: ``notice_restore``, on every request and
    every half second from the server) and re-seeds the interpreter's generators at once -- the hooks wait for the
    restore path's nonce, which is the one in the metadata file.
    """

    LEASE_RETRY_SECONDS = 5.0   # after an expiry action that failed
    BUSY_RETRY_SECONDS = 0.5    # while a request or a call that outlived its timeout holds the runtime

    def __init__(self, runtime=None, runtime_error=None, clock=time.monotonic, wall=time.time,
                 incarnation=incarnation):
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

    @classmethod
    def load(cls, library_path=None):
        """Load libascendcl; a missing library is kept as an error every request reports."""
        try:
            return cls(runtime=acl.AclRuntime(library_path))
        except acl.AclLibraryError as exc:
            return cls(runtime_error=str(exc))

    def report(self, **fields):
        """Let the engine publish facts the runtime cannot tell (device memory in use, model, ...)."""
        with self._info_lock:
            self._engine_info.update(fields)

    def register_hook(self, stage, hook):
        """Call ``hook(nonce)`` at ``stage``: RESTORE_POST, once per restore of this process, with the restore's nonce
        (32 hex digits, the metadata file's restore_nonce), after the interpreter's generators were re-seeded and
        before the engine is unlocked -- so no device call in it (it would wait for the unlock). What the engine
        re-seeds there: its own generators and samplers (docs/engines.md). A hook that raises fails the restore."""
        if stage not in self._hooks:
            raise ValueError("stage %r: expected one of %s" % (stage, ", ".join(reseed.STAGES)))
        if not callable(hook):
            raise TypeError("hook: expected a callable taking the nonce, got %r" % (hook,))
        with self._restore_lock:
            if hook not in self._hooks[stage]:
                self._hooks[stage].append(hook)

    def unregister_hook(self, stage, hook):
        with self._restore_lock:
            if hook in self._hooks.get(stage, ()):
                self._hooks[stage].remove(hook)

    def notice_restore(self):
        """Re-seed the interpreter's generators once this process finds itself restored (a new incarnation), whoever
        restored it and before anyone says so; returns whether it did."""
        now = self._incarnation()
        with self._restore_lock:
            if now == self._incarnation_seen:
                return False
            self._incarnation_seen = now
            done, errors = reseed.reseed_interpreter()
            self._resumed = {"at": _utc(self._wall()), "by": "agent", "reseeded": done, "errors": errors,
                             "hooks": None}
        _log("this process was restored from a checkpoint: re-seeded %s%s" % (
            ", ".join(done) or "nothing (no generator loaded)",
            "; not re-seeded: %s" % errors if errors else ""))
        return True

    def _resume(self, nonce):
        """The restore path says this process was restored (protocol.OP_RESUMED): re-seed, then the hooks, once per
        nonce."""
        with self._restore_lock:
            self._incarnation_seen = self._incarnation()
            if nonce == self._resumed_nonce:  # the same restore asking again: done already
                reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": protocol.OP_RESUMED, "changed": False}
                reply.update(self.describe())
                return reply
            done, errors = reseed.reseed_interpreter()
            hooks = list(self._hooks[RESTORE_POST])
            for hook in hooks:
                try:
                    hook(nonce)
                except Exception as exc:  # pylint: disable=broad-except  # the engine must survive its hook
                    errors["hook %s" % getattr(hook, "__qualname__", repr(hook))] = "%s: %s" % (type(exc).__name__, exc)
            self._resumed_nonce = nonce
            self._resumed = {"at": _utc(self._wall()), "by": "restore", "reseeded": done, "errors": errors,
                             "hooks": len(hooks)}
        _log("restored from a snapshot: re-seeded %s, %d RESTORE_POST hook(s) called with the restore's nonce%s" % (
            ", ".join(done) or "nothing (no generator loaded)", len(hooks),
            "; failed: %s" % errors if errors else ""))
        if errors:
            return protocol.error_reply(protocol.OP_RESUMED, protocol.KIND_RESEED, "not everything was re-seeded after "
                                        "the restore: %s" % "; ".join("%s: %s" % item for item in sorted(errors.items())),
                                        state=self.state)
        reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": protocol.OP_RESUMED, "changed": True}
        reply.update(self.describe())
        return reply

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
        op = message.get("op") if isinstance(message, dict) else None
        self.notice_restore()
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

    # ------------------------------------------------------------------ file locks after a restore
    def _relock(self, locks):
        """Take the POSIX locks of this process back (see protocol.OP_RELOCK). F_SETLK, never waiting: a lock
        that another process holds now is refused, with the others kept, and the caller starts cold."""
        refused = []
        for fd, kind, start, length in locks:
            try:
                fcntl.lockf(fd, (fcntl.LOCK_SH if kind == "read" else fcntl.LOCK_EX) | fcntl.LOCK_NB, length, start,
                            os.SEEK_SET)
            except (IOError, OSError) as exc:
                why = "held by another process" if exc.errno in (errno.EAGAIN, errno.EACCES) else \
                    os.strerror(exc.errno or 0)
                refused.append("fd %d %s lock at %d+%d: %s" % (fd, kind, start, length, why))
        if refused:
            message = "%d of %d lock(s) not taken: %s" % (len(refused), len(locks), "; ".join(refused))
            return protocol.error_reply(protocol.OP_RELOCK, protocol.KIND_FILE_LOCK, message, state=self.state)
        _log("took back %d POSIX file lock(s) after a restore" % len(locks))
        reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": protocol.OP_RELOCK, "changed": True,
                 "locks": len(locks)}
        reply.update(self.describe())
        return reply

    # ------------------------------------------------------------------ the lease
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
                           "granted_at": previous["granted_at"] if previous else _utc(self._wall()),
                           "renewed_at": _utc(self._wall()), "by": previous["by"] if previous else by,
                           "incarnation": self._incarnation()}
            self._arm(seconds)

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
                _log("dropped a lease taken before this process was restored from a checkpoint (the restore "
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
                    "expires_at": _utc(self._wall() + left), "granted_at": lease["granted_at"],
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
            _log("lease watchdog: unexpected error %r; retrying in %.0f s" % (exc, self.LEASE_RETRY_SECONDS))
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
                "at": _utc(self._wall()), "previous_state": self.state, "lease_s": lease["seconds"],
                "lease_granted_at": lease["granted_at"], "lease_renewed_at": lease["renewed_at"],
                "lease_by": lease["by"], "expired_at": _utc(self._wall() - overdue),
                "overdue_s": round(overdue, 3), "actions": [], "errors": [], "state": self.state}
            _log("the lease of %.1f s (taken by %s at %s, last renewed at %s) ran out %.1f s ago with the process %s: "
                 "bringing the engine back" % (lease["seconds"], lease["by"], lease["granted_at"],
                                               lease["renewed_at"], overdue, self.state))
        steps = {protocol.STATE_BACKED_UP: protocol.OP_RESTORE, protocol.STATE_LOCKED: protocol.OP_UNLOCK}
        while self.state in steps:
            op = steps[self.state]

            def done(op=op):  # in the call's thread, with the state change (a late call's too)
                record["actions"].append(op)
                record["state"] = self.state

            reply = self._run(op, protocol.DEFAULT_TIMEOUT, then=done)
            if not reply["ok"]:
                with self._lease_lock:
                    record["errors"].append({"at": _utc(self._wall()), "op": op, "message": reply["error"]["message"]})
                    del record["errors"][:-10]
                    record["state"] = self.state
                _log("lease watchdog: %s failed (%s); retrying in %.0f s"
                     % (op, reply["error"]["message"], self.LEASE_RETRY_SECONDS))
                self._arm(self.BUSY_RETRY_SECONDS if reply["error"]["kind"] == protocol.KIND_TIMEOUT
                          else self.LEASE_RETRY_SECONDS)
                return
        _log("lease watchdog: the engine is %s again after %s" % (self.state, ", ".join(record["actions"]) or "nothing"))
        self._drop_lease()

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
            _log("%s did not finish within %.1fs; it keeps running in the runtime" % (op, timeout))
            return protocol.error_reply(
                op, protocol.KIND_TIMEOUT,
                "%s did not finish within %.1f s (state was %s); the call is still running inside the "
                "ACL runtime and further requests are refused until it ends" % (op, timeout, previous),
                state=self.state)
        if "error" in outcome:
            exc = outcome["error"]
            _log(str(exc))
            return protocol.error_reply(op, protocol.KIND_ACL, str(exc), state=self.state,
                                        code=exc.code, name=exc.name)
        if "unsupported" in outcome:
            return protocol.error_reply(op, protocol.KIND_BAD_REQUEST, str(outcome["unsupported"]), state=self.state)
        if "internal" in outcome:
            return protocol.error_reply(op, protocol.KIND_INTERNAL, "%s failed: %r" % (op, outcome["internal"]),
                                        state=self.state)
        _log("%s: %s -> %s in %.3fs" % (op, previous, self.state, duration))
        reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": op, "changed": True,
                 "previous_state": previous, "duration_s": round(duration, 6)}
        reply.update(self.describe())
        return reply


def peer_credentials(connection):
    """(pid, uid, gid) of the process at the other end of a unix socket, as the kernel recorded them at connect."""
    return struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))


def peer_refusal(pid, uid, own_uid):
    """Why the peer may not control this engine, or None: only root and the engine's own user may (in the agent's
    user namespace)."""
    if uid in (0, own_uid):
        return None
    return ("uid %d (pid %d) may not control this engine: only root and the engine's own uid %d may (the agent "
            "checks each peer's credentials)" % (uid, pid, own_uid))


class _RequestHandler(socketserver.StreamRequestHandler):
    def handle(self):
        self.connection.settimeout(30)
        try:
            refused = peer_refusal(*(peer_credentials(self.connection)[:2] + (os.geteuid(),)))
        except (OSError, struct.error) as exc:
            refused = "the peer's credentials cannot be read (%s)" % exc
        try:
            line = self.rfile.readline(protocol.MAX_MESSAGE_BYTES + 1)
            if refused:  # read, never decoded nor acted on: the reply is the refusal
                _log("refused a request: %s" % refused)
                reply = protocol.error_reply(None, protocol.KIND_FORBIDDEN, refused)
            else:
                message = protocol.decode(line)
        except protocol.ProtocolError as exc:
            reply = protocol.error_reply(None, protocol.KIND_BAD_REQUEST, str(exc), state=self.server.controller.state)
        except (OSError, socket.timeout):
            return
        else:
            if not refused:
                reply = self.server.controller.handle(message)
        try:
            self.wfile.write(protocol.encode(reply))
        except OSError:
            pass  # the client went away; nothing to tell it


class AgentServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, socket_path, controller):
        self.controller = controller
        self.socket_path = socket_path
        directory = os.path.dirname(socket_path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.path.lexists(socket_path):
            os.unlink(socket_path)  # a stale socket from an earlier process with our pid
        old_umask = os.umask(0o177)
        try:
            socketserver.UnixStreamServer.__init__(self, socket_path, _RequestHandler)
        finally:
            os.umask(old_umask)

    def service_actions(self):
        """Every turn of serve_forever (half a second at most): a restored process re-seeds at once (see
        Controller.notice_restore), not only when someone asks it something."""
        try:
            self.controller.notice_restore()
        except Exception as exc:  # pylint: disable=broad-except  # the server thread must not die
            _log("checking for a restore failed: %r" % exc)

    def start(self):
        thread = threading.Thread(target=self.serve_forever, name="inferops-agent", daemon=True)
        thread.start()
        return thread

    def close(self):
        self.shutdown()
        self.server_close()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="inferops-agent",
        description="Run an inference engine with the inferops.snapshot control agent in its process.")
    parser.add_argument("--socket", default=os.environ.get(SOCKET_ENV),
                        help="unix socket to listen on (default $%s, else agent.<pid>.sock in $%s or %s)"
                        % (SOCKET_ENV, SOCKET_DIR_ENV, DEFAULT_SOCKET_DIR))
    parser.add_argument("--library", default=os.environ.get(LIBRARY_ENV),
                        help="path to libascendcl.so (default: from ASCEND_HOME_PATH or the CANN install)")
    parser.add_argument("engine", nargs=argparse.REMAINDER,
                        help="-- followed by the engine's python script or -m module and its arguments")
    args = parser.parse_args(argv)
    engine = args.engine[1:] if args.engine[:1] == ["--"] else args.engine
    if engine and os.path.basename(engine[0]).startswith("python"):
        engine = engine[1:]  # "python3 app.py" runs in this interpreter, not a new one
    if not engine:
        parser.error("no engine command given: use -- ENGINE_SCRIPT.py [ARGS] or -- -m MODULE [ARGS]")
    if engine[0] == "-m" and len(engine) < 2:
        parser.error("-m needs a module name")
    return args, engine


def main(argv=None):
    global _CONTROLLER
    args, engine = _parse_args(sys.argv[1:] if argv is None else argv)
    controller = Controller.load(args.library)
    if controller.runtime is None:
        _log("ACL runtime unavailable: %s" % controller.runtime_error)
    _CONTROLLER = controller
    server = _listen(args.socket or default_socket_path(), controller)
    try:
        if engine[0] == "-m":
            sys.argv = [engine[1]] + engine[2:]
            sys.path[0] = os.getcwd()
            runpy.run_module(engine[1], run_name="__main__", alter_sys=True)
        else:
            script = engine[0]
            sys.argv = list(engine)
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        if server is not None:
            server.close()
        controller.close()
    return 0


def _listen(socket_path, controller):
    """The agent's server, or None: an agent that cannot listen leaves the engine serving, not snapshottable."""
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
        _log("agent socket path %s is %d bytes, over the %d a unix socket allows; this engine cannot be "
             "snapshotted: set $%s (or --socket) to a shorter directory"
             % (socket_path, len(os.fsencode(socket_path)), MAX_SOCKET_PATH, SOCKET_DIR_ENV))
        return None
    try:
        server = AgentServer(socket_path, controller)
    except OSError as exc:
        _log("agent socket %s: %s; this engine cannot be snapshotted: set $%s (or --socket) to a directory "
             "the engine's user can create and write" % (socket_path, exc.strerror or exc, SOCKET_DIR_ENV))
        return None
    server.start()
    _log("listening on %s" % server.socket_path)
    return server

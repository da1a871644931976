# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After a restore: the interpreter's generators re-seeded, the engine's RESTORE_POST hooks called with the
restore's nonce (reseed.py), the POSIX file locks taken back. A mixin of ``controller.Controller``.
PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import os

from . import protocol, reseed
from .process import log, utc


def posix_locks(fdinfo):
    """{(type, start, len)} of the POSIX locks the text of a ``/proc/<pid>/fdinfo/<fd>`` file lists: those process
    <pid> holds through that descriptor's open file (``len`` 0: to the end of the file)."""
    found = set()
    for line in fdinfo.splitlines():
        # lock:	1: POSIX  ADVISORY  READ 21191 fe:00:2146951 100 100   (a waiter has "->" after the number)
        fields = line.split()
        if len(fields) < 9 or fields[0] != "lock:" or fields[2] != "POSIX":
            continue
        start, end = int(fields[7]), fields[8]
        found.add(("read" if fields[4] == "READ" else "write", start, 0 if end == "EOF" else int(end) - start + 1))
    return found


def own_posix_locks(proc="/proc"):
    """[(fd, type, start, len)] of the POSIX locks this process holds, sorted."""
    directory = os.path.join(proc, "self", "fdinfo")
    held = []
    try:
        fds = [int(name) for name in os.listdir(directory) if name.isdigit()]
    except OSError:
        return held
    for fd in fds:
        try:
            with open(os.path.join(directory, str(fd))) as handle:
                text = handle.read()
        except (IOError, OSError):
            continue  # closed meanwhile
        held.extend((fd,) + lock for lock in posix_locks(text))
    return sorted(held)


class Restored:
    """The restore half of the Controller: ``_restore_lock`` guards the hooks and the record of the last restore."""

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
        restored it and before anyone says so, and take the restore lease (lease.py) when it is locked or backed
        up; returns whether it did."""
        now = self._incarnation()
        with self._restore_lock:
            if now == self._incarnation_seen:
                return False
            self._incarnation_seen = now
            done, errors = reseed.reseed_interpreter()
            self._resumed = {"at": utc(self._wall()), "by": "agent", "reseeded": done, "errors": errors,
                             "hooks": None}
            self._resumed_nonce = None  # the hooks of this restore are still to be called
            log("this process was restored from a checkpoint: re-seeded %s%s" % (
                ", ".join(done) or "nothing (no generator loaded)",
                "; not re-seeded: %s" % errors if errors else ""))
            # under the same lock: a request that finds the restore noticed (the server's turn noticed it) finds the
            # restore lease too -- a restore path's renew must extend it, not start a lease of its own
            self._take_restore_lease()
        return True

    def _remember_locks(self):
        """While LOCKED or BACKED_UP for a snapshot: the POSIX locks this process holds now, the last look before a
        dump being what a restored copy must hold again (``_locks_missing``). Not in a copy waiting for its restore
        path: it has lost locks, and the look of the process it was checkpointed from is the one to keep."""
        if self.state == protocol.STATE_RUNNING or self._restore_pending():
            return
        try:
            self._locks_seen = own_posix_locks()
        except Exception as exc:  # pylint: disable=broad-except  # a request is answered whatever /proc says
            log("could not read this process's POSIX file locks: %r" % exc)

    def _locks_missing(self):
        """Those of the locks seen at the last look before the checkpoint that this process does not hold now."""
        held = set(own_posix_locks())
        return [lock for lock in self._locks_seen if lock not in held]

    def _resume(self, nonce, by="restore"):
        """The restore path says this process was restored (protocol.OP_RESUMED): re-seed, then the hooks, once per
        nonce. ``by`` "lease": the agent finishing a restore its restore path left (lease.py), with a nonce of its
        own."""
        with self._restore_lock:
            self._incarnation_seen = self._incarnation()
            if nonce == self._resumed_nonce:  # the same restore asking again: done already
                reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": protocol.OP_RESUMED, "changed": False}
                reply.update(self.describe())
                return reply
            done, errors = reseed.reseed_interpreter()
            hooks = list(self._hooks[reseed.RESTORE_POST])
            for hook in hooks:
                try:
                    hook(nonce)
                except Exception as exc:  # pylint: disable=broad-except  # the engine must survive its hook
                    errors["hook %s" % getattr(hook, "__qualname__", repr(hook))] = "%s: %s" % (type(exc).__name__, exc)
            self._resumed_nonce = nonce
            self._resumed = {"at": utc(self._wall()), "by": by, "reseeded": done, "errors": errors,
                             "hooks": len(hooks)}
        log("restored from a snapshot: re-seeded %s, %d RESTORE_POST hook(s) called with the restore's nonce%s" % (
            ", ".join(done) or "nothing (no generator loaded)", len(hooks),
            "; failed: %s" % errors if errors else ""))
        if errors:
            return protocol.error_reply(protocol.OP_RESUMED, protocol.KIND_RESEED, "not everything was re-seeded after "
                                        "the restore: %s" % "; ".join("%s: %s" % item for item in sorted(errors.items())),
                                        state=self.state)
        reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": protocol.OP_RESUMED, "changed": True}
        reply.update(self.describe())
        return reply

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
        log("took back %d POSIX file lock(s) after a restore" % len(locks))
        reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": protocol.OP_RELOCK, "changed": True,
                 "locks": len(locks)}
        reply.update(self.describe())
        return reply

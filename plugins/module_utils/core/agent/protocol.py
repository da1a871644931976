# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Control protocol between the modules and the process that owns the NPU state.

PRIVATE to the inferops.snapshot collection: no compatibility promise for other users.

The real ACL snapshot API acts only on the calling process, so the modules never call it
themselves: they send one of these requests to a control endpoint *inside* the inference
process (the collection's in-process agent over a unix socket, or the engine's own HTTP
endpoint). Both transports carry the same JSON documents.

Pure standard library: this file is copied into engine images with the rest of the agent folder.
It is also the home of the agent's own names (its socket and environment variables).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024

# Where an agent listens: agent.<pid>.sock (its pid inside its own pid namespace) in this directory.
DEFAULT_SOCKET_DIR = "/run/inferops-snapshot"
SOCKET_ENV = "INFEROPS_AGENT_SOCKET"          # the socket path itself
SOCKET_DIR_ENV = "INFEROPS_AGENT_SOCKET_DIR"  # the directory
LIBRARY_ENV = "INFEROPS_ACL_LIBRARY"          # libascendcl.so to load
SOCKET_NAME = "agent.%d.sock"

OP_STATE = "state"
OP_LOCK = "lock"
OP_BACKUP = "backup"
OP_RESTORE = "restore"
OP_UNLOCK = "unlock"
OP_RENEW = "renew"  # extends the lease of whoever holds the lock (no ACL call)
OP_RELOCK = "relock"  # takes POSIX file locks back for the process after a restore (no ACL call)
OP_RESUMED = "resumed"  # this process was restored from a snapshot: re-seed, RESTORE_POST hooks (no ACL call)
OPERATIONS = (OP_STATE, OP_LOCK, OP_BACKUP, OP_RESTORE, OP_UNLOCK, OP_RENEW, OP_RELOCK, OP_RESUMED)

# The lease (an optional field, added within version 1): a lock or a backup that carries
# "lease": <seconds> tells the agent that the caller will come back -- unlock, or renew the lease --
# within that many seconds. When it does not, the agent brings the engine back itself (restore + unlock
# from BACKED_UP, unlock from LOCKED) and reports what it did as "abandoned" in its replies. A request
# without the field gets the behaviour from before leases: no lease, the engine waits for its caller.
LEASE_OPERATIONS = (OP_LOCK, OP_BACKUP, OP_RENEW)
MAX_LEASE = 86400.0

# The restore lease: a copy restored from a checkpoint of a locked or backed-up engine holds one from the moment its
# agent notices the restore; when no restore path has finished the device restore by its end (a restore killed
# mid-way), the agent finishes it itself, or exits so that the container starts cold (docs/agent.md). Its length,
# until the restore path renews it to the restore's own deadline, is the image's setting (read at the engine's start:
# a restored copy keeps the environment it was checkpointed with); 0 turns it off.
RESTORE_LEASE_ENV = "INFEROPS_AGENT_RESTORE_LEASE"
DEFAULT_RESTORE_LEASE = 135.0  # snapshot_restore's default timeout (120 s) + the restore path's lease margin (15 s)

# Relock (added within version 1): "locks": [{"fd", "type": "read"|"write", "start", "len"}], the POSIX
# locks the process held at its checkpoint. CRIU restores them, then releases those on a file the process
# also maps when it closes the descriptor it mapped the file through (a POSIX lock belongs to the process
# and any close of that file drops it); only the process itself can take them again. An agent that
# predates the operation refuses it as a bad request.
MAX_LOCKS = 256
LOCK_TYPES = ("read", "write")

# Device memory (added within version 1): a backup may carry "device_memory": "required" (the default) or
# "required_and_optional", the runtime's backupFlags 0 or 1 (the snapshot API's args shape). An agent that predates
# the field refuses it as unknown, so callers send it only when it is not the default.
DEVICE_MEMORY_CHOICES = ("required", "required_and_optional")
DEFAULT_DEVICE_MEMORY = "required"

# Resumed (added within version 1): "nonce": 32 hex digits, fresh random bytes of this very restore (the metadata
# file's restore_nonce). Every process restored from one snapshot starts with the same memory, so the same state of
# every random generator in it; the restore path tells the restored agent, which re-seeds what it can reach in the
# interpreter and calls the engine's RESTORE_POST hooks with the nonce (launcher.Controller.register_hook). An agent
# that predates the operation refuses it as a bad request; the restore path then goes on without it.
NONCE_HEX_DIGITS = 32

STATE_RUNNING = "RUNNING"
STATE_LOCKED = "LOCKED"
STATE_BACKED_UP = "BACKED_UP"

# Error kinds carried in failed replies.
KIND_ACL = "acl"                  # the ACL runtime returned an error code
KIND_BAD_REQUEST = "bad_request"  # malformed request; the engine is untouched
KIND_TIMEOUT = "timeout"          # the operation did not finish within the request's timeout
KIND_BUSY = "busy"                # an earlier operation is still running (requests are serialised)
KIND_UNAVAILABLE = "unavailable"  # no ACL runtime loaded in this process
KIND_INTERNAL = "internal"
KIND_LEASE = "lease"              # renew refused: no lease to renew, or it already ran out
KIND_FILE_LOCK = "file_lock"      # relock: a lock another process holds now, or a descriptor not open
KIND_FORBIDDEN = "forbidden"      # the peer is neither root nor the engine's own user (SO_PEERCRED): nothing done
KIND_RESEED = "reseed"            # resumed: a generator not re-seeded, or a RESTORE_POST hook of the engine failed

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 3600.0

# Legal transitions of the runtime's state machine: op -> (allowed from, resulting state).
TRANSITIONS = {
    OP_LOCK: ((STATE_RUNNING,), STATE_LOCKED),
    OP_BACKUP: ((STATE_LOCKED,), STATE_BACKED_UP),
    OP_RESTORE: ((STATE_BACKED_UP,), STATE_LOCKED),
    OP_UNLOCK: ((STATE_LOCKED, STATE_BACKED_UP), STATE_RUNNING),
}


class ProtocolError(ValueError):
    """A message that does not follow this protocol."""


def encode(message):
    """Serialise one message as a single JSON line."""
    data = json.dumps(message, sort_keys=True, separators=(",", ":")).encode("utf-8") + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message of %d bytes exceeds the %d byte limit" % (len(data), MAX_MESSAGE_BYTES))
    return data


def decode(data):
    """Parse one JSON line into a dict, or raise ProtocolError."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message exceeds the %d byte limit" % MAX_MESSAGE_BYTES)
    try:
        message = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("not a JSON document: %s" % exc)
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object, got %s" % type(message).__name__)
    return message


def make_request(op, timeout=DEFAULT_TIMEOUT, lease=None, locks=None, device_memory=None, nonce=None):
    request = {"v": PROTOCOL_VERSION, "op": op, "timeout": float(timeout)}
    if nonce is not None:
        request["nonce"] = nonce
    if lease is not None:
        request["lease"] = float(lease)
    if locks is not None:
        request["locks"] = list(locks)
    if device_memory is not None and device_memory != DEFAULT_DEVICE_MEMORY:
        request["device_memory"] = device_memory
    return request


def parse_request(message):
    """Validate a request dict; return (op, timeout) or raise ProtocolError naming the field."""
    version = message.get("v", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError("field 'v': unsupported protocol version %r (this agent speaks %d)"
                            % (version, PROTOCOL_VERSION))
    op = message.get("op")
    if op not in OPERATIONS:
        raise ProtocolError("field 'op': %r is not one of %s" % (op, ", ".join(OPERATIONS)))
    timeout = message.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ProtocolError("field 'timeout': expected a number of seconds, got %r" % (timeout,))
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ProtocolError("field 'timeout': %r is outside (0, %d] seconds" % (timeout, MAX_TIMEOUT))
    unknown = sorted(set(message) - {"v", "op", "timeout", "lease", "locks", "device_memory", "nonce"})
    if unknown:
        raise ProtocolError("unknown field(s) %s" % ", ".join(repr(k) for k in unknown))
    parse_lease(message)
    parse_locks(message)
    parse_device_memory(message)
    parse_nonce(message)
    return op, float(timeout)


def parse_nonce(message):
    """The nonce of a resumed request (None on any other op); ProtocolError when it is missing or malformed."""
    if message.get("op") != OP_RESUMED:
        if "nonce" in message:
            raise ProtocolError("field 'nonce': only %s takes a nonce, not %r" % (OP_RESUMED, message.get("op")))
        return None
    nonce = message.get("nonce")
    if not isinstance(nonce, str) or len(nonce) != NONCE_HEX_DIGITS or nonce.strip("0123456789abcdef"):
        raise ProtocolError("field 'nonce': expected %d lowercase hex digits (the restore's restore_nonce), got %r"
                            % (NONCE_HEX_DIGITS, nonce))
    return nonce


def parse_device_memory(message):
    """The backup's device memory (DEVICE_MEMORY_CHOICES; the default when absent); ProtocolError when malformed."""
    if "device_memory" not in message:
        return DEFAULT_DEVICE_MEMORY
    value = message["device_memory"]
    if message.get("op") != OP_BACKUP:
        raise ProtocolError("field 'device_memory': only %s takes it, not %r" % (OP_BACKUP, message.get("op")))
    if value not in DEVICE_MEMORY_CHOICES:
        raise ProtocolError("field 'device_memory': %r is not one of %s" % (value, ", ".join(DEVICE_MEMORY_CHOICES)))
    return value


def parse_lease(message):
    """The request's lease in seconds, or None when it carries none; ProtocolError when it is malformed."""
    if "lease" not in message:
        return None
    lease = message["lease"]
    if message.get("op") not in LEASE_OPERATIONS:
        raise ProtocolError("field 'lease': only %s take a lease, not %r"
                            % (", ".join(LEASE_OPERATIONS), message.get("op")))
    if isinstance(lease, bool) or not isinstance(lease, (int, float)):
        raise ProtocolError("field 'lease': expected a number of seconds, got %r" % (lease,))
    if not 0 < lease <= MAX_LEASE:
        raise ProtocolError("field 'lease': %r is outside (0, %d] seconds" % (lease, MAX_LEASE))
    return float(lease)


def parse_restore_lease(text):
    """The restore lease of the setting ``text`` (RESTORE_LEASE_ENV): (seconds or None for none, why the text was not
    taken or None). Unset or empty: the default."""
    if text is None or not text.strip():
        return DEFAULT_RESTORE_LEASE, None
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds == 0:
        return None, None
    if seconds is None or not 0 < seconds <= MAX_LEASE:
        return DEFAULT_RESTORE_LEASE, ("%s: not 0 (no restore lease) or a number of seconds up to %d; using %.0f s "
                                       "(its value is not repeated)" % (RESTORE_LEASE_ENV, MAX_LEASE,
                                                                        DEFAULT_RESTORE_LEASE))
    return seconds, None


def parse_locks(message):
    """The relock request's locks as [(fd, type, start, len)]; ProtocolError naming what is malformed."""
    if message.get("op") != OP_RELOCK:
        if "locks" in message:
            raise ProtocolError("field 'locks': only %s takes locks, not %r" % (OP_RELOCK, message.get("op")))
        return None
    locks = message.get("locks")
    if not isinstance(locks, list) or not 0 < len(locks) <= MAX_LOCKS:
        raise ProtocolError("field 'locks': expected a list of 1 to %d locks, got %r" % (MAX_LOCKS, locks))
    parsed = []
    for index, lock in enumerate(locks):
        if not isinstance(lock, dict) or sorted(lock) != ["fd", "len", "start", "type"]:
            raise ProtocolError("field 'locks[%d]': expected exactly fd, type, start and len, got %r" % (index, lock))
        numbers = [lock[key] for key in ("fd", "start", "len")]
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in numbers):
            raise ProtocolError("field 'locks[%d]': fd, start and len must be integers >= 0, got %r" % (index, lock))
        if lock["type"] not in LOCK_TYPES:
            raise ProtocolError("field 'locks[%d].type': %r is not one of %s"
                                % (index, lock["type"], ", ".join(LOCK_TYPES)))
        parsed.append((lock["fd"], lock["type"], lock["start"], lock["len"]))
    return parsed


def error_reply(op, kind, message, state=None, code=None, name=None):
    error = {"kind": kind, "message": message}
    if code is not None:
        error["code"] = code
    if name is not None:
        error["name"] = name
    reply = {"v": PROTOCOL_VERSION, "ok": False, "op": op, "error": error}
    if state is not None:
        reply["state"] = state
    return reply


def check_transition(op, state):
    """Return the state `op` leads to from `state`, or None when the runtime would refuse it."""
    allowed, result = TRANSITIONS[op]
    return result if state in allowed else None

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Clients for the control endpoint inside an inference process. PRIVATE to inferops.snapshot.

One protocol (``_protocol``), two transports: the collection's in-process agent on a unix socket,
and an engine's own HTTP endpoint with configurable paths (vllm-ascend style).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import json
import os
import re
import socket
import stat
import struct

from ..agent import protocol
from ..base.clock import Renewer, wait_for
from ..base.errors import EndpointError, ParameterError, RuntimeRefusedError
from ..linux import proc, syscalls
from . import engine_http

DEFAULT_AGENT_SOCKET_DIR = protocol.DEFAULT_SOCKET_DIR
DEFAULT_HTTP_PATHS = {
    protocol.OP_STATE: "/snapshot/state",
    protocol.OP_LOCK: "/snapshot/lock",
    protocol.OP_BACKUP: "/snapshot/backup",
    protocol.OP_RESTORE: "/snapshot/restore",
    protocol.OP_UNLOCK: "/snapshot/unlock",
    protocol.OP_RENEW: "/snapshot/renew",
}
# Time allowed on top of the operation's own timeout for connecting and transferring the reply.
TRANSPORT_MARGIN = 10.0


def agent_socket_for_pid(pid, socket_dir=DEFAULT_AGENT_SOCKET_DIR, proc_root="/proc"):
    """Path of the agent socket of ``pid``, reached through its own mount namespace.

    The agent names its socket after its namespace pid; /proc/PID/root reaches it from the host
    whether or not the process runs in a container.
    """
    if not isinstance(pid, int) or pid <= 0:
        raise ParameterError("pid: expected a positive process id, got %r" % (pid,))
    ns_pid = proc.namespace_pid(pid, proc_root)
    if ns_pid is None:
        raise EndpointError("process %d does not exist (or /proc/%d/status is unreadable): check `pid` "
                            "or that the container is running" % (pid, pid), pid=pid)
    inner = os.path.join(socket_dir, protocol.SOCKET_NAME % ns_pid).lstrip("/")
    return os.path.join(proc_root, str(pid), "root", inner)


# A generation's lock and backup take a lease that ends at most this long after the generation's timeout (the
# role's on hosts, timeoutSeconds on Kubernetes): time for a controller that is still there to resume the engine
# itself (the roles' unlock step) before its agent does. A controller killed with the module leaves the engine
# locked no longer than timeout + LEASE_MARGIN (+ the agent's restore and unlock).
LEASE_MARGIN = 15.0


def bounded_lease(lease, remaining):
    """``lease`` seconds (None: no lease) cut to the ``remaining`` seconds of the generation's timeout + LEASE_MARGIN."""
    if lease is None:
        return None
    return min(float(lease), max(float(remaining), 0.0) + LEASE_MARGIN)


def lease_seconds(value, field="lease"):
    """A module's ``lease`` option as the protocol field: None for 0 (no lease), else seconds in (0, MAX_LEASE]."""
    if value is None or value == 0:
        return None
    if not 0 < value <= protocol.MAX_LEASE:
        raise ParameterError("%s: must be 0 (no lease) or a number of seconds up to %d, got %s"
                             % (field, protocol.MAX_LEASE, value), field=field)
    return float(value)


def _check_reply(op, reply, where):
    if not isinstance(reply, dict) or "ok" not in reply:
        raise EndpointError("the control endpoint at %s answered %r with something that is not a snapshot "
                            "protocol reply" % (where, op), endpoint=where, reply=reply)
    if reply.get("v") != protocol.PROTOCOL_VERSION:
        raise EndpointError("the control endpoint at %s speaks protocol version %r; this collection speaks %d"
                            % (where, reply.get("v"), protocol.PROTOCOL_VERSION), endpoint=where, reply=reply)
    if not reply["ok"]:
        error = reply.get("error") or {}
        message = error.get("message", "no reason given")
        if error.get("kind") == protocol.KIND_BAD_REQUEST and ("'lease'" in message or "'renew'" in message) \
                and "field 'lease': required" not in message:
            message += (" -- this endpoint predates leases (the agent in the engine's image is older than the "
                        "collection): copy the collection's agent into the image again, or set lease: 0 to go "
                        "without one")
        extra = {"abandoned": reply["abandoned"]} if reply.get("abandoned") else {}
        raise RuntimeRefusedError("%s refused by the process behind %s: %s" % (op, where, message),
                                  endpoint=where, state=reply.get("state"), error=error, **extra)
    return reply


# sun_path holds 108 bytes. A host path longer than that is reached through its directory, opened first (O_PATH), as
# /proc/self/fd/<n>/<name>.
SUN_PATH_MAX = 107
# A socket inside a process's own root: resolved there without following any link (syscalls.open_path_in_root).
IN_PROCESS_ROOT = re.compile(r"^(/proc/[0-9]+/root)(/.+)$")


def open_socket_path(path):
    """An O_PATH descriptor of the socket at ``path``. Below /proc/<pid>/root -- a container's root, which a
    compromised engine controls -- no symbolic link is followed (syscalls.LinkRefused); None for any other path."""
    match = IN_PROCESS_ROOT.match(path)
    if not match:
        return None
    root = os.open(match.group(1), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the host's /proc: trusted
    try:
        fd = syscalls.open_path_in_root(root, match.group(2))
    finally:
        os.close(root)
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.ENOTSOCK, "not a socket", path)
    return fd


def _connect(sock, path):
    """Connect ``sock`` to the socket at ``path``; returns the owner of the socket file it reached (None: a host path
    connected to by name)."""
    fd = open_socket_path(path)
    if fd is not None:
        try:
            sock.connect("/proc/self/fd/%d" % fd)  # that very inode, whatever happens to the path meanwhile
            return os.fstat(fd).st_uid
        finally:
            os.close(fd)
    if len(path.encode("utf-8")) <= SUN_PATH_MAX:
        sock.connect(path)
        return None
    directory = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.connect("/proc/self/fd/%d/%s" % (directory, os.path.basename(path)))
    finally:
        os.close(directory)
    return None


def impostor(sock, owner, engine):
    """Why the socket ``sock`` is connected to is not the agent of the engine whose host pid is ``engine``, or None.
    Its listener (SO_PEERCRED: the process that called listen, as this pid namespace sees it) must be the engine
    itself, and the socket file (``owner``) and the listener the engine's uid -- or root's: CRIU binds and listens
    a restored process's sockets as root, before it gives the process its own credentials back. Anyone else in the
    engine's container who can write its socket directory (an emptyDir is 0777) could put a socket of their own
    there and answer in the engine's name."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    engine_uid = proc.effective_uid(engine)
    wrong = []
    if pid != engine:
        wrong.append("its listener is pid %d, not the engine's pid %d" % (pid, engine))
    if uid not in (0, engine_uid):
        wrong.append("its listener runs as uid %d, not the engine's uid %s" % (uid, engine_uid))
    if owner is not None and owner not in (0, engine_uid):
        wrong.append("the socket file is uid %d's, not the engine's uid %s" % (owner, engine_uid))
    return "; ".join(wrong) or None


def _refused_link(path, exc):
    return EndpointError("refusing the agent socket %s: %s inside the process's root; the host never follows a link "
                         "the engine could have planted there: set agent_socket_dir (and the engine's "
                         "%s) to the real directory" % (path, exc.strerror, protocol.SOCKET_DIR_ENV),
                         endpoint="unix://" + path)


class AgentSocketClient:
    """Talks to the collection's in-process agent over its unix socket."""

    def __init__(self, path, engine=None):
        self.path = path
        self.where = "unix://" + path
        self.engine = engine  # the engine's host pid (for_pid): only its own socket is believed (impostor)

    @classmethod
    def for_pid(cls, pid, socket_dir=DEFAULT_AGENT_SOCKET_DIR):
        return cls(agent_socket_for_pid(pid, socket_dir), engine=pid)

    def wait_listening(self, timeout, gone=None):
        """Wait until the socket exists (a restored agent's socket comes back with its process)."""
        def listening():
            if gone is not None and gone():
                raise EndpointError("the process behind %s exited before its agent listened" % self.path)
            return self.listening(), "no socket at %s" % self.path
        return wait_for(listening, timeout, interval=0.01, what="the agent socket %s" % self.path)

    def listening(self):
        """Whether the socket is there (reached as ``request`` reaches it); a planted link is an EndpointError."""
        try:
            fd = open_socket_path(self.path)
        except syscalls.LinkRefused as exc:
            raise _refused_link(self.path, exc)
        except (IOError, OSError):
            return False
        if fd is None:
            return os.path.exists(self.path)
        os.close(fd)
        return True

    def request(self, op, timeout=protocol.DEFAULT_TIMEOUT, lease=None, locks=None, device_memory=None, nonce=None):
        """One request; ``lease`` (seconds) goes with lock, backup and renew, ``locks`` with relock, ``device_memory``
        with backup, ``nonce`` with resumed (see protocol.py)."""
        data = protocol.encode(protocol.make_request(op, timeout, lease, locks, device_memory, nonce))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout + TRANSPORT_MARGIN)
        try:
            try:
                owner = _connect(sock, self.path)
            except syscalls.LinkRefused as exc:
                raise _refused_link(self.path, exc)
            except (IOError, OSError) as exc:
                raise EndpointError(
                    "cannot reach the snapshot agent at %s (%s): is the engine running under the inferops "
                    "agent launcher, and is this the right pid/container/endpoint?" % (self.path, exc),
                    endpoint=self.where)
            wrong = impostor(sock, owner, self.engine) if self.engine is not None else None
            if wrong:  # nothing sent, nothing believed
                raise EndpointError(
                    "refusing the agent socket %s: it is not the engine's own (%s); another process in the engine's "
                    "container replaced it: keep the agent's socket directory (%s) private to the engine -- not a "
                    "volume others in the pod can write" % (self.path, wrong, protocol.SOCKET_DIR_ENV),
                    endpoint=self.where)
            sock.sendall(data)
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > protocol.MAX_MESSAGE_BYTES:
                    break
        except socket.timeout:
            raise EndpointError("the snapshot agent at %s did not answer %r within %.0f s"
                                % (self.path, op, timeout + TRANSPORT_MARGIN), endpoint=self.where)
        except (IOError, OSError) as exc:
            raise EndpointError("connection to the snapshot agent at %s failed during %r: %s"
                                % (self.path, op, exc), endpoint=self.where)
        finally:
            sock.close()
        if not buf:
            raise EndpointError("the snapshot agent at %s closed the connection without answering %r"
                                % (self.path, op), endpoint=self.where)
        try:
            reply = protocol.decode(buf.strip())
        except protocol.ProtocolError as exc:
            raise EndpointError("bad reply from the snapshot agent at %s: %s" % (self.path, exc), endpoint=self.where)
        return _check_reply(op, reply, self.where)


class HttpEndpointClient:
    """Talks to an engine's own HTTP control endpoint: POST {"timeout": s[, "lease": s]} to the op's path."""

    def __init__(self, base_url, paths=None):
        self.base_url = base_url.rstrip("/")
        self.paths = dict(DEFAULT_HTTP_PATHS)
        for op, path in (paths or {}).items():
            if op not in DEFAULT_HTTP_PATHS:  # relock is the in-process agent's, after a restore
                raise ParameterError("endpoint_paths: unknown operation %r; use keys from %s"
                                     % (op, ", ".join(DEFAULT_HTTP_PATHS)))
            if not isinstance(path, str) or not path.startswith("/"):
                raise ParameterError("endpoint_paths.%s: expected a path starting with '/', got %r" % (op, path))
            self.paths[op] = path
        self.where = engine_http.shown(self.base_url)  # control traffic stays on the node: never through a proxy

    def request(self, op, timeout=protocol.DEFAULT_TIMEOUT, lease=None, device_memory=None):
        url = self.base_url + self.paths[op]
        shown = engine_http.shown(url)  # what messages and results say: without a user and password in the URL
        document = {"v": protocol.PROTOCOL_VERSION, "timeout": float(timeout)}
        if lease is not None:
            document["lease"] = float(lease)
        if device_memory not in (None, protocol.DEFAULT_DEVICE_MEMORY):
            document["device_memory"] = device_memory
        body = json.dumps(document).encode("utf-8")
        try:
            status, payload = engine_http.request(url, "POST", body, {"Content-Type": "application/json"},
                                                  timeout + TRANSPORT_MARGIN, limit=protocol.MAX_MESSAGE_BYTES + 1)
        except engine_http.EngineHttpError as exc:
            raise EndpointError("cannot reach the engine's control endpoint %s (%s): check `endpoint` and "
                                "`endpoint_paths`" % (shown, exc), endpoint=shown)
        if status >= 400 and not payload:  # an error still carries a protocol reply when it has a body
            raise EndpointError("HTTP %d from %s for %r" % (status, shown, op), endpoint=shown)
        try:
            reply = protocol.decode(payload.strip())
        except protocol.ProtocolError as exc:
            raise EndpointError("bad reply from %s: %s" % (shown, exc), endpoint=shown)
        return _check_reply(op, reply, shown)


class LeaseKeeper:
    """Renews the engine's lease every ``seconds / 3`` from a background thread, while a long task works.

    ``quiet()`` holds the renewals while CRIU dumps the process: the process is frozen then, its agent
    cannot answer, and a connection to its socket would be part of what CRIU dumps (a unix socket with
    a peer outside the dumped tree). Entering ``quiet()`` renews once, so the dump starts with a whole
    lease, and leaving it renews again at once. The agent cannot act on the lease while the process is
    frozen either (its watchdog thread is frozen with it); when the dump outlasts the lease, the
    renewal after it is refused and ``check()`` raises -- the lease must be longer than the dump.

    ``lost`` is the agent's refusal once the lease cannot be renewed any more (it ran out and the agent
    brought the engine back, or someone unlocked it); ``check(stage)`` raises it as a
    RuntimeRefusedError. A connection that fails is retried at the next renewal.
    """

    REQUEST_TIMEOUT = 10.0

    def __init__(self, client, seconds, log=None, remaining=None):
        """``remaining``: () -> seconds left of the generation's timeout; each renewal is then bounded_lease of it."""
        self.client, self.seconds, self.log = client, float(seconds), log
        self.remaining = remaining
        self.renewals = 0
        self.lost = None
        self.last_error = None
        self._renewer = Renewer(self.seconds / 3.0, self._tick, "inferops-lease-keeper")

    def start(self):
        self._renewer.start()
        return self

    def _tick(self):
        self._renew()
        return self.lost is None

    def _renew(self):
        """One renewal (the renewer's lock is held)."""
        if self.lost is not None:
            return
        seconds = self.seconds if self.remaining is None else bounded_lease(self.seconds, self.remaining())
        try:
            self.client.request(protocol.OP_RENEW, self.REQUEST_TIMEOUT, seconds)
        except RuntimeRefusedError as exc:
            if (exc.result.get("error") or {}).get("kind") in (protocol.KIND_LEASE, protocol.KIND_BAD_REQUEST):
                self.lost = exc.msg
                if self.log:
                    self.log("lease lost: %s" % exc.msg, force=True)
            else:
                self.last_error = exc.msg
        except EndpointError as exc:  # a connection that failed: the next renewal may get through
            self.last_error = exc.msg
        else:
            self.renewals += 1

    @contextlib.contextmanager
    def quiet(self):
        """No renewal while the block runs (a CRIU dump); one renewal right before and one right after."""
        with self._renewer.lock:
            self._renew()
            self._renewer.paused = True
        self.check("the checkpoint")
        try:
            yield self
        finally:
            with self._renewer.lock:
                self._renewer.paused = False
                self._renew()

    def check(self, stage):
        if self.lost is not None:
            raise RuntimeRefusedError(
                "the engine's lease of %.0f s could not be renewed before %s: %s. The engine is no longer locked for "
                "this snapshot (the agent resumes an engine whose lease runs out); give it a lease longer than the "
                "checkpoint takes (lease of inferops.snapshot.npu_snapshot_backup)" % (self.seconds, stage, self.lost),
                lease_lost=self.lost)

    def stop(self):
        """Stop renewing, after one last renewal: whoever unlocks next has a whole lease to do it."""
        self._renewer.stop(last=self._renew)


def client_for_endpoint(endpoint, paths=None):
    """Build a client from an ``endpoint`` parameter: unix:///path, /path/to.sock or http(s)://..."""
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://"):]
    elif endpoint.startswith("/"):
        path = endpoint
    elif endpoint.startswith(("http://", "https://")):
        return HttpEndpointClient(engine_http.check_url(endpoint, "endpoint", example="http://127.0.0.1:8000"), paths)
    else:
        raise ParameterError("endpoint: %r is neither unix:///path/to/agent.sock, an absolute socket path, nor "
                             "an http(s):// URL" % (engine_http.shown(endpoint),))
    if not os.path.isabs(path):
        raise ParameterError("endpoint: the socket path %r must be absolute" % (path,))
    return AgentSocketClient(path)

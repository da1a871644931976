# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Clients for the control endpoint inside an inference process. PRIVATE to inferops.snapshot.

One protocol (``_protocol``), two transports: the collection's in-process agent on a unix socket,
and an engine's own HTTP endpoint with configurable paths (vllm-ascend style).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket

from urllib.error import HTTPError, URLError
from urllib.request import ProxyHandler, Request, build_opener

from .. import proc as proc_facts
from ..agent import protocol
from ..clock import wait_for
from ..errors import (
    EndpointError,
    ParameterError,
    RuntimeRefusedError,
)

DEFAULT_AGENT_SOCKET_DIR = protocol.DEFAULT_SOCKET_DIR
DEFAULT_HTTP_PATHS = {
    protocol.OP_STATE: "/snapshot/state",
    protocol.OP_LOCK: "/snapshot/lock",
    protocol.OP_BACKUP: "/snapshot/backup",
    protocol.OP_RESTORE: "/snapshot/restore",
    protocol.OP_UNLOCK: "/snapshot/unlock",
}
# Time allowed on top of the operation's own timeout for connecting and transferring the reply.
TRANSPORT_MARGIN = 10.0


def agent_socket_for_pid(pid, socket_dir=DEFAULT_AGENT_SOCKET_DIR, proc="/proc"):
    """Path of the agent socket of ``pid``, reached through its own mount namespace.

    The agent names its socket after its namespace pid; /proc/PID/root reaches it from the host
    whether or not the process runs in a container.
    """
    if not isinstance(pid, int) or pid <= 0:
        raise ParameterError("pid: expected a positive process id, got %r" % (pid,))
    ns_pid = proc_facts.namespace_pid(pid, proc)
    if ns_pid is None:
        raise EndpointError("process %d does not exist (or /proc/%d/status is unreadable): check `pid` "
                            "or that the container is running" % (pid, pid), pid=pid)
    inner = os.path.join(socket_dir, protocol.SOCKET_NAME % ns_pid).lstrip("/")
    return os.path.join(proc, str(pid), "root", inner)


def _check_reply(op, reply, where):
    if not isinstance(reply, dict) or "ok" not in reply:
        raise EndpointError("the control endpoint at %s answered %r with something that is not a snapshot "
                            "protocol reply" % (where, op), endpoint=where, reply=reply)
    if reply.get("v") != protocol.PROTOCOL_VERSION:
        raise EndpointError("the control endpoint at %s speaks protocol version %r; this collection speaks %d"
                            % (where, reply.get("v"), protocol.PROTOCOL_VERSION), endpoint=where, reply=reply)
    if not reply["ok"]:
        error = reply.get("error") or {}
        raise RuntimeRefusedError(
            "%s refused by the process behind %s: %s" % (op, where, error.get("message", "no reason given")),
            endpoint=where, state=reply.get("state"), error=error)
    return reply


class AgentSocketClient:
    """Talks to the collection's in-process agent over its unix socket."""

    def __init__(self, path):
        self.path = path
        self.where = "unix://" + path

    @classmethod
    def for_pid(cls, pid, socket_dir=DEFAULT_AGENT_SOCKET_DIR):
        return cls(agent_socket_for_pid(pid, socket_dir))

    def wait_listening(self, timeout, gone=None):
        """Wait until the socket exists (a restored agent's socket comes back with its process)."""
        def listening():
            if gone is not None and gone():
                raise EndpointError("the process behind %s exited before its agent listened" % self.path)
            return os.path.exists(self.path), "no socket at %s" % self.path
        return wait_for(listening, timeout, interval=0.01, what="the agent socket %s" % self.path)

    def request(self, op, timeout=protocol.DEFAULT_TIMEOUT):
        data = protocol.encode(protocol.make_request(op, timeout))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout + TRANSPORT_MARGIN)
        try:
            try:
                sock.connect(self.path)
            except (IOError, OSError) as exc:
                raise EndpointError(
                    "cannot reach the snapshot agent at %s (%s): is the engine running under the inferops "
                    "agent launcher, and is this the right pid/container/endpoint?" % (self.path, exc),
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
    """Talks to an engine's own HTTP control endpoint: POST {"timeout": s} to the op's path."""

    def __init__(self, base_url, paths=None):
        self.base_url = base_url.rstrip("/")
        self.paths = dict(DEFAULT_HTTP_PATHS)
        for op, path in (paths or {}).items():
            if op not in protocol.OPERATIONS:
                raise ParameterError("endpoint_paths: unknown operation %r; use keys from %s"
                                     % (op, ", ".join(protocol.OPERATIONS)))
            if not isinstance(path, str) or not path.startswith("/"):
                raise ParameterError("endpoint_paths.%s: expected a path starting with '/', got %r" % (op, path))
            self.paths[op] = path
        self.where = self.base_url
        # Control traffic stays on the node: never send it through an environment proxy.
        self._opener = build_opener(ProxyHandler({}))

    def request(self, op, timeout=protocol.DEFAULT_TIMEOUT):
        url = self.base_url + self.paths[op]
        body = json.dumps({"v": protocol.PROTOCOL_VERSION, "timeout": float(timeout)}).encode("utf-8")
        req = Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            response = self._opener.open(req, timeout=timeout + TRANSPORT_MARGIN)
            payload = response.read(protocol.MAX_MESSAGE_BYTES + 1)
        except HTTPError as exc:
            payload = exc.read(protocol.MAX_MESSAGE_BYTES + 1)  # errors still carry a protocol reply
            if not payload:
                raise EndpointError("HTTP %d from %s for %r" % (exc.code, url, op), endpoint=url)
        except (URLError, socket.timeout, IOError, OSError) as exc:
            raise EndpointError("cannot reach the engine's control endpoint %s (%s): check `endpoint` and "
                                "`endpoint_paths`" % (url, getattr(exc, "reason", exc)), endpoint=url)
        try:
            reply = protocol.decode(payload.strip())
        except protocol.ProtocolError as exc:
            raise EndpointError("bad reply from %s: %s" % (url, exc), endpoint=url)
        return _check_reply(op, reply, url)


def client_for_endpoint(endpoint, paths=None):
    """Build a client from an ``endpoint`` parameter: unix:///path, /path/to.sock or http(s)://..."""
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://"):]
    elif endpoint.startswith("/"):
        path = endpoint
    elif endpoint.startswith(("http://", "https://")):
        return HttpEndpointClient(endpoint, paths)
    else:
        raise ParameterError("endpoint: %r is neither unix:///path/to/agent.sock, an absolute socket path, nor "
                             "an http(s):// URL" % (endpoint,))
    if not os.path.isabs(path):
        raise ParameterError("endpoint: the socket path %r must be absolute" % (path,))
    return AgentSocketClient(path)

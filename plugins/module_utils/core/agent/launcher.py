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
endpoint.

Pure standard library, and self-contained: it imports nothing outside this folder.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import os
import runpy
import socket
import socketserver
import sys
import threading
import time

from . import acl, protocol

DEFAULT_SOCKET_DIR = protocol.DEFAULT_SOCKET_DIR
SOCKET_ENV = protocol.SOCKET_ENV
SOCKET_DIR_ENV = protocol.SOCKET_DIR_ENV
LIBRARY_ENV = protocol.LIBRARY_ENV

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


class Controller:
    """Tracks the process's snapshot state and makes the ACL calls, one request at a time.

    The runtime has no public get-state call, so the caller tracks state: it changes only when
    the ACL call succeeded (a failed lock leaves the process RUNNING, as the runtime does).
    """

    def __init__(self, runtime=None, runtime_error=None, clock=time.monotonic):
        self.runtime = runtime
        self.runtime_error = runtime_error
        self.state = protocol.STATE_RUNNING
        self._clock = clock
        self._serial = threading.Lock()
        self._inflight = None  # (op, thread) of an operation that outlived its request
        self._engine_info = {}
        self._info_lock = threading.Lock()

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

    def describe(self):
        with self._info_lock:
            info = dict(self._engine_info)
        reply = {
            "pid": os.getpid(),
            "state": self.state,
            "devices": sorted(self.runtime.devices_in_use) if self.runtime else [],
            "runtime_version": None,
            "engine": info,
        }
        if self.runtime is not None:
            try:
                reply["runtime_version"] = self.runtime.version()
            except acl.AclError:
                pass
        return reply

    def handle(self, message):
        """Answer one decoded request; never raises."""
        op = message.get("op") if isinstance(message, dict) else None
        try:
            op, timeout = protocol.parse_request(message)
        except protocol.ProtocolError as exc:
            return protocol.error_reply(op if op in protocol.OPERATIONS else None,
                                        protocol.KIND_BAD_REQUEST, str(exc), state=self.state)
        if op == protocol.OP_STATE:
            reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": op, "changed": False}
            reply.update(self.describe())
            if self._inflight is not None and self._inflight[1].is_alive():
                reply["busy_with"] = self._inflight[0]
            return reply
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
            return self._run(op, timeout)
        finally:
            self._serial.release()

    def _run(self, op, timeout):
        previous = self.state
        calls = {
            protocol.OP_LOCK: self.runtime.snapshot_lock,
            protocol.OP_BACKUP: self.runtime.snapshot_backup,
            protocol.OP_RESTORE: self.runtime.snapshot_restore,
            protocol.OP_UNLOCK: self.runtime.snapshot_unlock,
        }
        outcome = {}

        def call():
            try:
                calls[op]()
            except acl.AclError as exc:
                outcome["error"] = exc
            except Exception as exc:  # the engine must survive anything a request triggers
                outcome["internal"] = exc
            else:
                self.state = protocol.TRANSITIONS[op][1]

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
        if "internal" in outcome:
            return protocol.error_reply(op, protocol.KIND_INTERNAL, "%s failed: %r" % (op, outcome["internal"]),
                                        state=self.state)
        _log("%s: %s -> %s in %.3fs" % (op, previous, self.state, duration))
        reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, "op": op, "changed": True,
                 "previous_state": previous, "duration_s": round(duration, 6)}
        reply.update(self.describe())
        return reply


class _RequestHandler(socketserver.StreamRequestHandler):
    def handle(self):
        self.connection.settimeout(30)
        try:
            line = self.rfile.readline(protocol.MAX_MESSAGE_BYTES + 1)
            message = protocol.decode(line)
        except protocol.ProtocolError as exc:
            reply = protocol.error_reply(None, protocol.KIND_BAD_REQUEST, str(exc), state=self.server.controller.state)
        except (OSError, socket.timeout):
            return
        else:
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
    server = AgentServer(args.socket or default_socket_path(), controller)
    server.start()
    _log("listening on %s" % server.socket_path)
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
        server.close()
    return 0


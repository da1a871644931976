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

This file is the entry point: its arguments, the socket, the engine run in this interpreter. The Controller is
controller.py (its lease: lease.py; after a restore: restored.py), the socket server server.py, this process's
incarnation and log line process.py; the names engines import from here still are.

Pure standard library, and self-contained: it imports nothing outside this folder.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import os
import runpy
import sys

from . import protocol, reseed

# What engines and the tests import from here (``from inferops_agent import launcher``):
from .controller import Controller
from .process import incarnation, log
from .server import AgentServer, peer_credentials, peer_refusal

__all__ = ["AgentServer", "Controller", "RESTORE_POST", "current_controller", "default_socket_path", "incarnation",
           "log", "main", "peer_credentials", "peer_refusal"]

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
        log("ACL runtime unavailable: %s" % controller.runtime_error)
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
        log("agent socket path %s is %d bytes, over the %d a unix socket allows; this engine cannot be "
            "snapshotted: set $%s (or --socket) to a shorter directory"
            % (socket_path, len(os.fsencode(socket_path)), MAX_SOCKET_PATH, SOCKET_DIR_ENV))
        return None
    try:
        server = AgentServer(socket_path, controller)
    except OSError as exc:
        log("agent socket %s: %s; this engine cannot be snapshotted: set $%s (or --socket) to a directory "
            "the engine's user can create and write" % (socket_path, exc.strerror or exc, SOCKET_DIR_ENV))
        return None
    server.start()
    log("listening on %s" % server.socket_path)
    return server

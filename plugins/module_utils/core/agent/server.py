# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's unix socket server: one JSON line in, one out, served only to root and the engine's own user
(their credentials, SO_PEERCRED). PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import socket
import socketserver
import struct
import threading

from . import protocol
from .process import log


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
                log("refused a request: %s" % refused)
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
        # Its mode is set after the bind, not through the umask: that is the whole process's, and the engine's own
        # threads may be creating files meanwhile. Until the chmod the folder (0700) keeps others out, and the
        # peer's credentials decide in any case (_RequestHandler).
        socketserver.UnixStreamServer.__init__(self, socket_path, _RequestHandler)
        os.chmod(socket_path, 0o600)

    def service_actions(self):
        """Every turn of serve_forever (half a second at most): a restored process re-seeds at once (see
        Controller.notice_restore), not only when someone asks it something."""
        try:
            self.controller.notice_restore()
        except Exception as exc:  # pylint: disable=broad-except  # the server thread must not die
            log("checking for a restore failed: %r" % exc)

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

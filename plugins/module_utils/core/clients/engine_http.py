# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for an engine's HTTP: control endpoints, readiness probes, canaries. PRIVATE to inferops.snapshot.

Every request goes straight to the engine with http.client -- never through an environment proxy, never following a
redirect -- and, for an engine that listens inside its own network namespace (127.0.0.1 of its pod), from a thread
that joins that namespace first (netns.run_in). Callers turn ``EngineHttpError`` into their own words.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import http.client
import socket
from urllib.parse import urlsplit

from .. import netns

MAX_BODY = 1024 * 1024


class EngineHttpError(Exception):
    """No answer: the URL is not one this client speaks, the engine cannot be reached, or it said nothing in time."""


def request(url, method="GET", body=None, headers=None, timeout=10.0, netns_pid=None, limit=MAX_BODY):
    """(HTTP status, body bytes -- at most ``limit``) of one request; ``netns_pid``: made from inside that process's
    network namespace. Any status is an answer (the caller decides); no answer raises EngineHttpError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineHttpError("only http(s):// URLs can be asked, got %r" % url)
    if netns_pid is not None and parts.scheme != "http":
        raise EngineHttpError("only http:// URLs can be asked inside a network namespace, got %r" % url)

    def ask():
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=timeout)
        try:
            path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
            connection.request(method, path, body=body, headers=dict(headers or {}))
            response = connection.getresponse()
            return response.status, response.read(limit)
        finally:
            connection.close()

    try:
        if netns_pid is None:
            return ask()
        return netns.run_in("/proc/%d/ns/net" % netns_pid, ask, timeout + 5.0, what="an answer from %s" % url)
    except (OSError, socket.timeout, http.client.HTTPException, netns.ProbeError) as exc:
        raise EngineHttpError("%s: %s: %s" % (url, type(exc).__name__, exc))

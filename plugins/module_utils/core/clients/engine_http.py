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
import re
import socket
from urllib.parse import urlsplit

from ..base.errors import ParameterError
from ..linux import netns

MAX_BODY = 1024 * 1024
# http.client refuses these anywhere in a URL (urlsplit silently drops a tab or a newline instead)
_NOT_IN_URL = re.compile(r"[\x00-\x20\x7f]")
_USERINFO = re.compile(r"\A([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


class EngineHttpError(Exception):
    """No answer: the URL is not one this client speaks, the engine cannot be reached, or it said nothing in time."""


def shown(url):
    """``url`` as a message shows it: without its userinfo (``http://user:password@host/`` is ``http://host/``). Works
    on a URL that does not parse too."""
    return _USERINFO.sub(r"\1", url) if isinstance(url, str) else url


def check_url(url, field, schemes=("http", "https"), example="http://127.0.0.1:8000/health"):
    """``url`` when this client can ask it -- one of ``schemes``, a host, a port that is a number, no whitespace or
    control character -- else a ParameterError naming ``field`` (the URL shown without its userinfo)."""
    wanted = "http(s)" if set(schemes) == {"http", "https"} else "/".join(schemes)
    if not isinstance(url, str) or not url:
        raise ParameterError("%s: give an %s URL, e.g. %s" % (field, wanted, example), field=field)
    if _NOT_IN_URL.search(url):
        raise ParameterError("%s: the URL contains whitespace or a control character (a newline, a NUL); give it "
                             "without, e.g. %s" % (field, example), field=field)
    try:
        parts = urlsplit(url)
        parts.port  # pylint: disable=pointless-statement  # a ValueError when it is no number from 0 to 65535
    except ValueError as exc:
        raise ParameterError("%s: %r is not a URL that can be asked (%s), e.g. %s" % (field, shown(url), exc, example),
                             field=field)
    if parts.scheme not in schemes or not parts.hostname:
        raise ParameterError("%s: %r is not an %s URL, e.g. %s" % (field, shown(url), wanted, example), field=field)
    return url


def request(url, method="GET", body=None, headers=None, timeout=10.0, netns_pid=None, limit=MAX_BODY):
    """(HTTP status, body bytes -- at most ``limit``) of one request; ``netns_pid``: made from inside that process's
    network namespace. Any status is an answer (the caller decides); no answer raises EngineHttpError."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an IPv6 address without its closing ]
        raise EngineHttpError("%r is not a URL: %s" % (shown(url), exc))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineHttpError("only http(s):// URLs can be asked, got %r" % shown(url))
    if netns_pid is not None and parts.scheme != "http":
        raise EngineHttpError("only http:// URLs can be asked inside a network namespace, got %r" % shown(url))

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
        return netns.run_in("/proc/%d/ns/net" % netns_pid, ask, timeout + 5.0, what="an answer from %s" % shown(url))
    except (OSError, socket.timeout, http.client.HTTPException, netns.ProbeError) as exc:
        raise EngineHttpError("%s: %s: %s" % (shown(url), type(exc).__name__, exc))
    except ValueError as exc:
        # http.client's refusal of a header, a method or a port quotes the value (a header's may be a token): the
        # callers check these first, naming the option; this is the backstop, and it repeats nothing
        raise EngineHttpError("%s: the request could not be sent (%s): a header, the method or the port is not "
                              "valid" % (shown(url), type(exc).__name__))

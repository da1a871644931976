# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP to an engine from inside its own network namespace. PRIVATE to the inferops.snapshot collection.

An engine listens where it listens: on 127.0.0.1 of its pod or container, which the node's runtime
or a module in the host's namespace cannot reach. A request made by a thread that first joins the
process's network namespace (``setns``; Python 3.11 has no ``os.setns``, so through libc) reaches it
at the address the engine itself would use. Needs root, as every caller here has.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import ctypes.util
import fcntl
import http.client
import os
import socket
import struct
import threading

try:
    from urllib.parse import urlsplit
except ImportError:  # pragma: no cover
    from urlparse import urlsplit

CLONE_NEWNET = 0x40000000
MAX_BODY = 1024 * 1024


class ProbeError(Exception):
    pass


def _setns(fd):
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise ProbeError("cannot enter the network namespace: %s" % os.strerror(err))


SIOCGIFADDR = 0x8915


def ipv4_addresses(ns_path):
    """The IPv4 addresses of the interfaces in the network namespace at ``ns_path`` (a netns file, /proc/PID/ns/net),
    loopback included, in interface order: what a pod's new address is read from (as MindCluster's grus does)."""
    outcome = {}

    def run():
        try:
            fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(fd)  # this thread only
            finally:
                os.close(fd)
            found = []
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                for _index, name in socket.if_nameindex():
                    try:
                        raw = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                    except OSError:  # no IPv4 address on it
                        continue
                    found.append(socket.inet_ntoa(raw[20:24]))
            outcome["addresses"] = found
        except (OSError, ProbeError) as exc:
            outcome["error"] = "%s: %s" % (type(exc).__name__, exc)

    thread = threading.Thread(target=run, name="inferops-netns-addresses", daemon=True)
    thread.start()
    thread.join(10.0)
    if "addresses" not in outcome:
        raise ProbeError("cannot read the addresses of the network namespace %s: %s"
                         % (ns_path, outcome.get("error", "no answer")))
    return outcome["addresses"]


def request(pid, url, method="GET", body=None, headers=None, timeout=10.0):
    """(status, body bytes) of one HTTP request to ``url`` as seen from ``pid``'s network namespace."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ProbeError("only http:// URLs can be probed, got %r" % url)
    outcome = {}

    def run():
        try:
            fd = os.open("/proc/%d/ns/net" % pid, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(fd)  # this thread only: the caller's own namespace is untouched
            finally:
                os.close(fd)
            connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
            try:
                path = parts.path or "/"
                if parts.query:
                    path += "?" + parts.query
                connection.request(method, path, body=body, headers=dict(headers or {}))
                response = connection.getresponse()
                outcome["answer"] = (response.status, response.read(MAX_BODY))
            finally:
                connection.close()
        except (OSError, http.client.HTTPException, ProbeError) as exc:
            outcome["error"] = "%s: %s" % (type(exc).__name__, exc)

    thread = threading.Thread(target=run, name="inferops-netns-probe", daemon=True)
    thread.start()
    thread.join(timeout + 5.0)
    if thread.is_alive():
        raise ProbeError("no answer from %s within %.0f s" % (url, timeout))
    if "error" in outcome:
        raise ProbeError("%s: %s" % (url, outcome["error"]))
    return outcome["answer"]

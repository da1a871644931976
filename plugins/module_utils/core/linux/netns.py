# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Work done from inside a process's network namespace. PRIVATE to the inferops.snapshot collection.

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
import os
import socket
import struct
import threading

CLONE_NEWNET = 0x40000000


class ProbeError(Exception):
    pass


def _setns(fd):
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise ProbeError("cannot enter the network namespace: %s" % os.strerror(err))


SIOCGIFADDR = 0x8915


def run_in(ns_path, function, timeout, what="the answer"):
    """``function()``'s result, called by a thread of its own that first joins the network namespace at ``ns_path``
    (a netns file, /proc/PID/ns/net): the caller's own namespace is untouched. Its exception is raised here; no result
    within ``timeout`` is a ProbeError."""
    outcome = {}

    def run():
        try:
            fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(fd)  # this thread only
            finally:
                os.close(fd)
            outcome["result"] = function()
        except Exception as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="inferops-netns", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ProbeError("no %s within %.0f s in the network namespace %s" % (what, timeout, ns_path))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def ipv4_addresses(ns_path):
    """The IPv4 addresses of the interfaces in the network namespace at ``ns_path`` (a netns file, /proc/PID/ns/net),
    loopback included, in interface order: what a pod's new address is read from (as MindCluster's grus does)."""
    def addresses():
        found = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _index, name in socket.if_nameindex():
                try:
                    raw = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                except OSError:  # no IPv4 address on it
                    continue
                found.append(socket.inet_ntoa(raw[20:24]))
        return found
    try:
        return run_in(ns_path, addresses, 10.0, what="addresses")
    except (OSError, ProbeError) as exc:
        raise ProbeError("cannot read the addresses of the network namespace %s: %s" % (ns_path, exc))

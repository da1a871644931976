# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""This process as the agent sees it: its incarnation (what tells it from a CRIU-restored copy), its log line,
the time in the collection's format. PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import os
import sys
import time


def log(message):
    sys.stderr.write("inferops-agent[%d]: %s\n" % (os.getpid(), message))
    sys.stderr.flush()


def utc(timestamp=None):
    """ISO 8601 UTC with microseconds, as in the collection's records."""
    moment = datetime.datetime.fromtimestamp(time.time() if timestamp is None else timestamp, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def incarnation(proc="/proc"):
    """What tells this process from a CRIU-restored copy of it: (boot id, start time of the process).

    A copy restored by CRIU -- on this host or another one -- holds this agent's memory, its lease
    included, and CLOCK_MONOTONIC does not tell it apart: CRIU restores into a time namespace whose
    offsets make the monotonic clock continue from the moment of the dump (measured here with
    CRIU 4.2), so a lease's deadline keeps its meaning in the copy. What CRIU cannot restore is the
    start time of the process (/proc/self/stat field 22): the restored task is a new one, so its
    start time is the moment of the restore (shifted by the namespace's offsets, it reads as the
    moment of the dump -- still later than any lease the original took after its start). The boot id
    tells another host (or a reboot). A lease is acted on only by the incarnation that took it.
    """
    found = []
    for path, pick in (("sys/kernel/random/boot_id", lambda text: text.strip()),
                       ("self/stat", lambda text: text.rsplit(")", 1)[1].split()[19])):
        try:
            with open(os.path.join(proc, path)) as handle:
                found.append(pick(handle.read()))
        except (OSError, IndexError):
            found.append(None)
    return tuple(found)

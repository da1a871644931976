# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is the engine serving? One HTTP probe and one wait for it. PRIVATE to the inferops.snapshot collection.

Probes go straight to the engine on the node, never through an environment proxy. The wait is
``clock.wait_for``: wall time, the last probe's answer in the timeout error, and an early end when
the process it waits for has exited.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ..base.clock import wait_for
from ..base.errors import SnapshotTimeout
from ..clients import engine_http

PROBE_TIMEOUT = 5.0


def probe(url, timeout=PROBE_TIMEOUT):
    """(HTTP status or None, a short description of what happened), through the one engine HTTP client."""
    try:
        status, _body = engine_http.request(url, timeout=timeout, limit=0)
    except engine_http.EngineHttpError as exc:
        return None, str(exc)
    return status, "HTTP %d" % status


def wait_serving(url, timeout, status=200, gone=None, interval=0.2, progress=None, progress_every=None):
    """Wait until ``url`` answers ``status``; return (last description, seconds waited).

    ``gone()`` returns a text when the process behind ``url`` exited: the wait ends at once with it.
    """
    shown = engine_http.shown(url)  # messages never show a user and password given in the URL

    def serving():
        exited = gone() if gone else None
        if exited:
            raise SnapshotTimeout("%s will not answer: %s" % (shown, exited), last_state=exited)
        code, what = probe(url, min(PROBE_TIMEOUT, max(0.5, float(timeout))))
        return code == status, what
    try:
        return wait_for(serving, timeout, interval, what="%s answering %d" % (shown, status), progress=progress,
                        progress_every=progress_every)
    except SnapshotTimeout as exc:
        if "elapsed" not in exc.result:  # the process exited: its own message
            raise
        last = exc.result.get("last_state")
        raise SnapshotTimeout("%s did not answer %d within %.0f s (last: %s)" % (shown, status, timeout, last),
                              last_state=last, elapsed=exc.result.get("elapsed"))

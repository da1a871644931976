# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Clocks, the stopwatch and the one waiter. PRIVATE to the inferops.snapshot collection.

Standard library only: used by the modules, the node's restore-on-create runtime and the tests.
Every duration is measured on the monotonic clock; wall-clock time only appears in records
(``utc_now``). Every wait in the collection is ``wait_for``: a predicate, a deadline, an interval.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import math
import threading
import time

from .errors import ParameterError, SnapshotTimeout


def utc_now():
    """The time for records: ISO 8601, UTC, microseconds."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Stopwatch:
    """Durations of a run's phases on a monotonic clock (``with watch.timed("checkpoint"):``), reported as
    ``durations`` in results and records."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.started = clock()
        self.durations = {}

    def timed(self, name):
        watch = self

        class _Timed:
            def __enter__(self):
                self.started = watch.clock()
                return self

            def __exit__(self, *exc):
                watch.durations[name] = round(watch.durations.get(name, 0.0) + watch.clock() - self.started, 6)
                return False

        return _Timed()

    def elapsed(self):
        return self.clock() - self.started

    def total(self):
        """Record and return the time since the stopwatch was made, as ``durations["total"]``."""
        self.durations["total"] = round(self.elapsed(), 6)
        return self.durations


class Deadline:
    """A point on the monotonic clock that several steps share (one timeout for a whole restore)."""

    def __init__(self, seconds, clock=time.monotonic):
        self.clock = clock
        self.seconds = float(seconds)
        self.at = clock() + self.seconds

    def remaining(self, floor=0.0):
        return max(floor, self.at - self.clock())

    def expired(self):
        return self.clock() >= self.at


def wait_for(predicate, timeout, interval=0.1, what="the condition", clock=time.monotonic, sleep=time.sleep,
             progress=None, progress_every=None):
    """Call ``predicate()`` until it returns ``(True, state)``; return ``(state, elapsed)``.

    ``predicate`` returns ``(done, state)``: ``state`` is whatever was last observed (an HTTP status,
    a pod phase) and is put into the timeout error, so that an operator sees where it stood. It may
    raise to end the wait at once (the process it waits for died). ``timeout`` is wall time on the
    monotonic clock, not a number of attempts: a slow predicate does not stretch it past the
    deadline by more than one call. ``progress(state, elapsed)`` is called at most every
    ``progress_every`` seconds, for long waits.
    """
    started = clock()
    deadline = started + float(timeout)
    last_note = started
    while True:
        done, state = predicate()
        now = clock()
        if done:
            return state, now - started
        if now >= deadline:
            raise SnapshotTimeout("%s did not happen within %.1f s (last: %s)" % (what, float(timeout), state),
                                  last_state=state, elapsed=round(now - started, 3))
        if progress is not None and progress_every is not None and now - last_note >= progress_every:
            last_note = now
            progress(state, now - started)
        sleep(max(0.0, min(interval, deadline - now)))


class Renewer:
    """The one renewal loop (an engine's lease, a generation's claim): ``renew()`` every ``interval`` seconds from a
    timer thread while a long task works, until ``stop()`` or until ``renew()`` returns False (lost: nothing more to
    renew). Every call holds ``lock``, which the owner takes too for renewals of its own; ``paused`` (set under the
    lock) skips the timer's calls without ending the loop."""

    def __init__(self, interval, renew, name):
        self.interval, self.renew, self.name = float(interval), renew, name
        self.lock = threading.Lock()
        self.paused = False
        self._stopped = False
        self._timer = None

    def start(self):
        with self.lock:
            self._schedule()
        return self

    def _schedule(self):
        self._timer = threading.Timer(self.interval, self._tick)
        self._timer.name = self.name
        self._timer.daemon = True
        self._timer.start()

    def _tick(self):
        with self.lock:
            if self._stopped:
                return
            if not self.paused and self.renew() is False:
                return
            self._schedule()

    def stop(self, last=None):
        """No more renewals; ``last()`` (under the lock) once more before the loop ends, when given."""
        with self.lock:
            self._stopped = True
            if self._timer is not None:
                self._timer.cancel()
            if last is not None:
                last()


def check_seconds(params, *names):
    """Fail, naming the option, unless each of ``names`` that is set is a finite number > 0 (before anything runs):
    NaN and infinity are no number of seconds -- a wait on them never ends, a deadline of them cannot be a time, a
    lease of them never lapses."""
    for name in names:
        value = params.get(name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ParameterError("%s: must be a positive number of seconds, got %s" % (name, value), field=name)

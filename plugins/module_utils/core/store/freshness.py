# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Freshness: a snapshot's generation and expiry, and who keeps count of them. PRIVATE to inferops.snapshot.

Every manifest carries ``generation``, a number that only grows per identity, and optionally ``expires``; the
signature covers both. Two counters keep them honest, each a small JSON map {identity: number} written under an
flock by its one owner (``Counters``):

- the **signer's** (the controller, plugins/action/host_checkpoint.py): the last generation it signed per identity.
  The next one is ``max(last + 1, now in seconds since 1970)``: strictly above everything this signer signed, and --
  when its record is lost (an AWX execution environment keeps none between jobs) or a second controller signs --
  above everything signed before now, as long as the signers' clocks are right and no identity is signed more than
  once a second on average. A signer whose clock runs ahead pushes the numbers ahead for everyone.
- each **node's** high-water mark (``HighWater``, layout.GENERATIONS_FILE): the highest generation it has restored
  per identity. A restore of an older one is refused (``rollback:``); a snapshot without a generation (taken before
  the collection had them) counts as generation 0. Root's alone: the file 0600 in a 0700 directory, checked.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import contextlib
import json
import os
import stat
import time

from ..base import layout
from ..base.clock import utc_now
from ..linux import fs, paths

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class CounterError(Exception):
    """A counter file that cannot be read or trusted."""


def generation(manifest):
    """The snapshot's generation (0 for a snapshot taken before manifests had one)."""
    return int((manifest or {}).get("generation") or 0)


def next_generation(last, now=None):
    """The generation after ``last``: above it, and never below the time in seconds since 1970."""
    return max(int(last or 0) + 1, int(time.time() if now is None else now))


def expires_at(seconds, now=None):
    """``expires`` for a snapshot valid ``seconds`` from ``now`` (UTC, the manifest's date-time form)."""
    return time.strftime(TIME_FORMAT, time.gmtime((time.time() if now is None else now) + float(seconds)))


def parse_time(text):
    return calendar.timegm(time.strptime(text, TIME_FORMAT))


def expired_reason(manifest, now=None):
    """``expired: ...`` when the snapshot's ``expires`` has passed (by this host's clock); None otherwise."""
    text = (manifest or {}).get("expires")
    if not text:
        return None
    now = time.time() if now is None else now
    try:
        when = parse_time(text)
    except (TypeError, ValueError):
        return "expired: the snapshot's expiry %r is not a time in the form 2026-01-31T12:00:00Z" % (text,)
    if now >= when:
        return ("expired: the snapshot expired at %s (this host's clock says %s); generate a new one"
                % (text, time.strftime(TIME_FORMAT, time.gmtime(now))))
    return None


class Counters(object):
    """A JSON map {identity string: {"generation": n, "at": time}} in ``path``, read and written only under the flock
    of ``<path>.lock``, by root (or the user this runs as), never through a link; the file 0600, its directory made
    0700 and checked not to be writable by anyone else."""

    def __init__(self, path):
        self.path = path

    @contextlib.contextmanager
    def _locked(self):
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            fs.ensure_dir(directory)
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()) or stat.S_IMODE(st.st_mode) & 0o022:
            raise CounterError("%s must be a directory of root's that nobody else can write (it is uid %d, mode %o)"
                               % (directory, st.st_uid, stat.S_IMODE(st.st_mode)))
        with fs.locked(self.path + ".lock", flags=os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC):
            yield

    def _read(self):
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == 2:
                return {}
            raise CounterError("%s: %s" % (self.path, exc.strerror or exc))
        try:
            problem = paths.private_reason(os.fstat(fd), self.path)
            if problem:
                raise CounterError(problem)
            data = os.read(fd, 16 * 1024 * 1024)
        finally:
            os.close(fd)
        try:
            counters = json.loads(data.decode("utf-8"))
            if not isinstance(counters, dict) or not all(isinstance(v, dict) and isinstance(v.get("generation"), int)
                                                         for v in counters.values()):
                raise ValueError("not a map of identities to generations")
        except (ValueError, UnicodeDecodeError) as exc:
            raise CounterError("%s is not the collection's record of generations: %s" % (self.path, exc))
        return counters

    def read(self):
        """{identity string: {generation, at}}; CounterError when the file cannot be trusted."""
        with self._locked():
            return self._read()

    def update(self, identity, decide):
        """``decide(current generation or None)`` -> (new generation to record or None, value to return), atomically."""
        key = layout.identity_string(identity)
        with self._locked():
            counters = self._read()
            current = counters.get(key, {}).get("generation")
            new, value = decide(current)
            if new is not None and new != current:
                counters[key] = {"generation": int(new), "at": utc_now()}
                fs.write_file_atomic(self.path, (json.dumps(counters, indent=1, sort_keys=True) + "\n").encode())
            return value


class HighWater(Counters):
    """The node's record of the highest generation it has restored per identity (layout.GENERATIONS_FILE)."""

    def admit(self, manifest):
        """None when the snapshot (its verified manifest) is at least as new as every one of its identity this node
        has restored -- and then it is the highest now; else the reason it is refused (rollback:, generations_unreadable:).
        Recorded before the restore runs: a snapshot that verified and then failed to restore was still the newest."""
        number = generation(manifest)

        def decide(highest):
            if highest is not None and number < highest:
                return None, ("rollback: the snapshot is generation %d of %s, and this node has already restored "
                              "generation %d of it; an older snapshot put back in place is refused -- generate a new "
                              "one (the node's record: %s)"
                              % (number, layout.identity_string(manifest["identity"]), highest, self.path))
            return max(number, highest or 0), None
        try:
            return self.update(manifest["identity"], decide)
        except (CounterError, OSError) as exc:
            return ("generations_unreadable: the node's record of restored generations cannot be used, so no snapshot "
                    "can be shown to be fresh: %s; only root may write it (0600 in a 0700 directory)" % exc)


class SignerLedger(Counters):
    """The signer's record of the last generation it signed per identity (the controller's; see the module docstring)."""

    def allocate(self, identity, now=None):
        """The generation of a snapshot about to be signed for ``identity``, recorded as taken before it is used
        (two runs at once get two numbers; an unused number leaves a gap, which is harmless)."""
        def decide(last):
            number = next_generation(last, now)
            return number, number
        return self.update(identity, decide)

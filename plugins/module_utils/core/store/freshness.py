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
  the collection had them) counts as generation 0. Root's alone: the file 0600 in a 0700 directory, and every
  directory on its path root's and not writable by others, walked without following a link.

A node that trusts signing keys also needs the controller's signed statement of the latest generation (statement.py),
which covers the nodes that never restored the identity. A mark records the time of the statement it was raised under,
and a statement issued later takes its place: a mark pushed ahead -- by a controller whose clock ran fast, or a
generation since withdrawn -- holds only until the controller signs the next statement (a generation, or the refresh).
``Gate`` is the one check of every restore (restore/verify.for_restore).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import fcntl
import json
import os
import stat
import time

from ..base import layout
from ..base.clock import utc_now
from ..linux import fs, paths, syscalls
from . import statement

TIME_FORMAT = statement.TIME_FORMAT   # the manifest's date-time form, and the statement's
parse_time = statement.parse_time


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
    return statement.format_time((time.time() if now is None else now) + float(seconds))


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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(directory, create):
    """An fd of ``directory``, walked from / one component at a time and never through a link: every component root's
    (or this user's) and not writable by group or others -- a sticky one such as /tmp aside, where nobody can replace
    what is ours --, the last one writable by its owner alone. Missing components are made 0700 (``create``); without
    it a missing one is None. CounterError says which component is wrong."""
    fd, current = os.open("/", _DIR_FLAGS), "/"
    parts = [part for part in directory.split("/") if part]
    try:
        for index, part in enumerate(parts):
            current = os.path.join(current, part)
            try:
                following = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                try:
                    os.mkdir(part, fs.DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass
                following = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise CounterError("%s is a symbolic link or not a directory; the path of the record must pass "
                                       "through real directories only" % current)
                raise
            os.close(fd)
            fd = following
            st = os.fstat(fd)
            mode, last = stat.S_IMODE(st.st_mode), index == len(parts) - 1
            if st.st_uid not in (0, os.geteuid()) or (mode & 0o022 and (last or not mode & stat.S_ISVTX)):
                raise CounterError("%s must be a directory of root's that nobody else can write (it is uid %d, mode %o)"
                                   % (current, st.st_uid, mode))
        return fd
    except BaseException:
        os.close(fd)
        raise


class Counters(object):
    """A JSON map {identity string: {"generation": n, "at": time, ...}} in ``path``, read and written only under the
    flock of its directory, by root (or the user this runs as), never through a link; the file 0600, its directory made
    0700, and every directory on the path checked (``_open_dir``)."""

    def __init__(self, path):
        self.path = path

    @contextlib.contextmanager
    def _locked(self, create=True):
        directory = _open_dir(os.path.dirname(self.path), create)
        try:
            if directory is not None:
                fcntl.flock(directory, fcntl.LOCK_EX)
            yield directory
        finally:
            if directory is not None:
                os.close(directory)

    def _read(self, directory):
        if directory is None:
            return {}
        try:
            fd = fs.open_regular(os.path.basename(self.path), dir_fd=directory)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return {}
            raise CounterError("%s: %s" % (self.path, exc.strerror or exc))
        try:
            problem = paths.private_reason(os.fstat(fd), self.path)
            if problem:
                raise CounterError(problem)
            data = fs.read_limited(fd, fs.RECORD_LIMIT, self.path)
        except ValueError as exc:
            raise CounterError(str(exc))
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
        """{identity string: {generation, at, ...}}; CounterError when the file cannot be trusted. Creates nothing."""
        with self._locked(create=False) as directory:
            return self._read(directory)

    def update(self, identity, decide, record=True):
        """``decide(entry or None)`` -> (new entry to record or None, value to return), atomically. Without ``record``
        nothing is made or written (a check): the value alone."""
        key = layout.identity_string(identity)
        with self._locked(create=record) as directory:
            counters = self._read(directory)
            entry = counters.get(key)
            new, value = decide(entry)
            if record and new is not None and _without_time(new) != _without_time(entry):
                counters[key] = dict(_without_time(new), at=utc_now())
                syscalls.write_below(directory, os.path.basename(self.path),
                                     (json.dumps(counters, indent=1, sort_keys=True) + "\n").encode())
            return value


def _without_time(entry):
    return dict((key, value) for key, value in (entry or {}).items() if key != "at")


def superseded(entry, latest, now=None):
    """Whether the statement ``latest`` takes the place of the mark ``entry``: issued after the statement the mark was
    raised under -- or the mark was raised under none (before statements, or without keys), or under one dated beyond
    this host's clock."""
    if latest is None:
        return False
    issued = (entry or {}).get("issued")
    now = time.time() if now is None else now
    return not isinstance(issued, int) or latest["issued"] > issued or issued > now + layout.CLOCK_SKEW


class HighWater(Counters):
    """The node's record of the highest generation it has restored per identity (layout.GENERATIONS_FILE)."""

    def admit(self, manifest, latest=None, record=True, now=None):
        """None when the snapshot (its verified manifest) is at least as new as every one of its identity this node
        has restored -- and then it is the highest now; else the reason it is refused (rollback:, generations_unreadable:).
        Recorded before the restore runs: a snapshot that verified and then failed to restore was still the newest.
        ``latest``: the statement (statement.check) this restore is admitted under; a mark raised under an earlier
        statement gives way to it. ``record``: False for a check, which reads and writes nothing."""
        number = generation(manifest)

        def decide(entry):
            highest = (entry or {}).get("generation")
            if highest is not None and number < highest and not superseded(entry, latest, now):
                return None, ("rollback: the snapshot is generation %d of %s, and this node has already restored "
                              "generation %d of it; an older snapshot put back in place is refused -- generate a new "
                              "one (the node's record: %s)"
                              % (number, layout.identity_string(manifest["identity"]), highest, self.path))
            if latest is None:
                return dict(entry or {}, generation=max(number, highest or 0)), None
            if superseded(entry, latest, now):
                return {"generation": number, "issued": latest["issued"]}, None
            return dict(entry, generation=max(number, highest), issued=max(latest["issued"], entry["issued"])), None
        try:
            return self.update(manifest["identity"], decide, record)
        except (CounterError, OSError) as exc:
            return ("generations_unreadable: the node's record of restored generations cannot be used, so no snapshot "
                    "can be shown to be fresh: %s; only root may write it (0600, every directory on its path root's "
                    "and writable by root alone, no symbolic link)" % exc)


class SignerLedger(Counters):
    """The signer's record per identity: the last generation it signed, and the last one it published (``published``:
    {generation, fingerprint}), which the refresh signs again (statement.latest_known)."""

    def allocate(self, identity, now=None):
        """The generation of a snapshot about to be signed for ``identity``, recorded as taken before it is used
        (two runs at once get two numbers; an unused number leaves a gap, which is harmless)."""
        def decide(entry):
            number = next_generation((entry or {}).get("generation"), now)
            return dict(entry or {}, generation=number), number
        return self.update(identity, decide)

    def published(self, identity, number, fingerprint):
        """Record that generation ``number`` (``fingerprint``) of ``identity`` was published, unless a later one was."""
        def decide(entry):
            known = (entry or {}).get("published") or {}
            if isinstance(known.get("generation"), int) and known["generation"] > number:
                return None, False
            return dict(entry or {}, generation=max(number, (entry or {}).get("generation") or 0),
                        published={"generation": number, "fingerprint": fingerprint}), True
        return self.update(identity, decide)


class Gate(object):
    """The freshness check of one restore, in its verification (restore/verify.for_restore): on a host that trusts
    signing keys, the controller's statement of the latest generation (statement.py); then the node's mark
    (``marks``: a HighWater, or None where the caller keeps none). ``record``: raise the mark (not for a check, nor
    a hand-over: the runtime's own run records it)."""

    def __init__(self, marks=None, record=True, now=None):
        self.marks, self.record, self.now = marks, record, now

    def admit(self, snapshot_dir, recorded, fingerprint, trusted):
        """None when the verified snapshot (``recorded``: its manifest; ``fingerprint``) may be restored here as fresh;
        else the reason (stale:, statement_invalid:, clock_skew:, rollback:, generations_unreadable:). Without trusted
        keys there is nothing to bind a statement to: the node's mark alone, as before statements."""
        latest = None
        if trusted:
            latest, refused = statement.check(statement.read(snapshot_dir), recorded["identity"], trusted, self.now)
            if refused:
                return refused
            refused = statement.floor_reason(latest, recorded, fingerprint)
            if refused:  # this node's own word first, where it has restored a newer one itself
                mine = self.marks.admit(recorded, latest, False, self.now) if self.marks is not None else None
                return mine if mine and mine.startswith("rollback:") else refused
        if self.marks is None:
            return None
        return self.marks.admit(recorded, latest, self.record, self.now)

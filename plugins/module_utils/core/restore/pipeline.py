# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one restore pipeline. PRIVATE to the inferops.snapshot collection.

Every restore -- ``snapshot_restore`` with ``docker start --checkpoint``, the node's restore-on-create
runtime, a bare process, the hand-over to that runtime -- walks its driver's stages (stages.py) on one stopwatch:

    RESTORE:  verify -> decrypt -> check -> prepare -> host_restore -> verify_pages -> metadata -> reseed
              -> file_locks -> device_restore -> pages_in -> canary -> complete
    HANDOVER: verify -> check -> prepare -> host_restore (another run of this pipeline, in the runtime) -> complete
              any failure, at any stage: undo what was started -> cold_start, with the reason
    then, whatever happened: commit (the outcome, written once)

Every guarantee lives here once: a snapshot that does not verify is never restored; a failure, an unexpected error
included, ends in a cold start with its reason, never in a half-restored process; the outcome says ``restored`` only
after every stage of the driver's list ran -- the device state back too, the restore made to stick (``complete``);
``commit`` writes what really happened and nothing else writes it. In check mode the stages up to ``check`` run, and
``attempt.restored`` says what would happen.

Verified bytes are the bytes used: the small documents a restore acts on (the manifest, the container record,
the canary, the device part) are read once, hashed in that read, and used from memory (``attempt.document``); the
CRIU images are read by CRIU from the files the verification held, or from a verified copy (cached, decrypted).
What a path checks of each file is its driver's verification plan (manifest.Plan), as the restore can follow it
(stages.verification_plan).

Overlap without trusting early: a driver whose plan defers the page images (it can leave the restored tasks
stopped, CRIU's leave-stopped) has them -- process memory, which CRIU copies into the tasks and never interprets --
hashed while CRIU restores; everything CRIU parses (the other images, the manifest, the signature) is verified before
it starts. The tasks run only after ``verify_pages`` has passed (``release``); a page image that does not match kills
them unrun and the engine starts cold.

The node's cache (cache.py): with a ``stage_dir`` holding a verified copy of the requested snapshot -- found by its
fingerprint, every file still the one verified (inode, size, mtime, ctime) -- verify checks the requested snapshot as
always but for its files' content (signature, checksum list, manifest, identity, world; its checksum list must still
hash to the copy's fingerprint), and the restore reads the copy, which nothing can have changed since it was hashed.
A copy that is no longer exactly what was verified is not used: the snapshot is verified in full, as without a cache.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import traceback

from ..base.errors import SnapshotError
from .attempt import Fallback
from .stages import CHECK_MODE_LAST


def run(driver, attempt):
    """Restore through ``driver``, or start cold with the reason. Returns ``attempt`` (restored, reason, ...).

    An error of the cold start itself is raised to the caller: there is nothing left to fall back to.
    """
    timing = _Timing(attempt.watch)
    try:
        for stage in driver.stages:
            if not stage.applies(driver, attempt):
                continue
            with timing(stage.name):
                stage.run(driver, attempt)
            if attempt.check_mode and stage.name == CHECK_MODE_LAST:
                break
        attempt.restored = True
    except Exception as exc:  # every failure, a bug included, is a cold start with its reason
        _fall_back(driver, attempt, exc, timing.current)
    finally:
        _close(driver, attempt)
    return attempt


def _fall_back(driver, attempt, exc, stage):
    """Undo what was started and start cold, with the reason: the failure's, after the driver's own cause and a
    corrupt page image (said first, as a serial check would)."""
    attempt.reason = _reason(exc, stage)
    cause = driver.failure_cause(attempt) if attempt.started else None
    if cause and cause != attempt.reason:
        attempt.reason = "%s; then %s" % (cause, attempt.reason)
    if attempt.pages is not None and "overlapped" not in attempt.verdict:  # failed before the page images' verdict
        wrong = attempt.pages.result(attempt.remaining(1.0))
        if wrong:
            attempt.verdict.update(valid=False, reasons=wrong)
            attempt.reason = "; ".join(wrong + [attempt.reason])
    attempt.manifest = attempt.manifest or (attempt.verdict or {}).pop("manifest", None)
    if attempt.check_mode:  # what the run would do, nothing done: it fails where the cold start would fail
        driver.refuses_cold_start(attempt)
        return
    if attempt.started:
        driver.undo(attempt)
    attempt.failed = True  # until the cold start is done: nothing serves
    with attempt.watch.timed("cold_start"):
        driver.cold_start(attempt)
    attempt.failed = False


def _close(driver, attempt):
    """Whatever happened: CRIU has read everything it will, so the cached copy, the held files (leases,
    descriptors, the view) and the plaintext go; then the outcome is written, once."""
    if attempt.cached:  # retention may remove it again
        attempt.cached.release()
    if attempt.held:
        attempt.held.close()
        attempt.held = None
    if attempt.plain:
        attempt.plain.remove()
        attempt.plain = None
    attempt.watch.total()
    if not attempt.check_mode:
        driver.commit(attempt)


def describe(driver):
    """What a path does, in one line a reader (and a unit test) can pin: its stages, its verification plan, where its
    host restore reads the images from."""
    return "stages %s; verification: %s; images from %s" % (
        " -> ".join(stage.name for stage in driver.stages), driver.verification.describe(),
        " or ".join(driver.images_from) or "nowhere (another run restores them)")


class _Timing:
    """The stopwatch's stages, remembering which one is running (a failure's reason names it)."""

    def __init__(self, watch):
        self.watch = watch
        self.current = None

    def __call__(self, name):
        self.current = name
        return self.watch.timed(name)


def _reason(exc, stage):
    """``<kind>: <detail>``: a Fallback says its own kind; any other error is named by the stage it broke."""
    if isinstance(exc, Fallback):
        return exc.reason
    if isinstance(exc, SnapshotError):
        return "%s_failed: %s" % (stage, exc.msg)
    where = traceback.format_exc(limit=-1).strip()[-300:]
    return "internal_error: %s failed with %s: %s (%s)" % (stage, type(exc).__name__, exc, where)

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stages of a restore, each a function of (driver, attempt), and the stage lists drivers declare. PRIVATE to
the inferops.snapshot collection.

A stage raises Fallback (or any error) to end the restore in a cold start with its reason (pipeline.run); its name is
its timing's in the result's ``durations`` and names it in an unexpected error's reason. A stage with a ``when`` runs
only where it applies (an encrypted snapshot is decrypted, a canary recorded is asked).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections

from ..base import layout
from ..linux import fs, mounts, plaintext, proc
from ..store import canary, device, encryption, keyscope, manifest, npu_driver
from . import cache, file_locks, held, reseed, verify
from .attempt import Fallback
from .page_check import PageCheck, leave_to_decryption

CACHE = "cache"  # a driver's images_from: the node's verified copy of the snapshot, when one is still as verified
HELD = "held"    # the snapshot's files as the verification read them, held open (leased) for the restore (held.Held)
# a private copy made by the read that verifies it (held.Held copied), for a path whose restored tasks may run before
# everything is read and checked (the driver's copy_because says why): nothing written to the store reaches it
COPY = "copy"


class Stage(collections.namedtuple("Stage", "name run when")):
    """``run(driver, attempt)`` under the timing ``name``, where ``when(driver, attempt)`` (None: always)."""

    def applies(self, driver, attempt):
        return self.when is None or bool(self.when(driver, attempt))


# -- verify: what is restored is what was verified -------------------------------------------------------------

def _verify(driver, attempt):
    """The snapshot located, held and verified as the driver's plan says; its verdict, documents and manifest taken."""
    attempt.snapshot_dir = driver.locate(attempt)
    expect = dict(driver.expectations(attempt), checksum=attempt.checksum)
    cache_miss = _find_cached(driver, attempt)
    _hold(driver, attempt)
    attempt.plan = verification_plan(driver, attempt)
    attempt.verdict = verify.for_restore(attempt.snapshot_dir, driver.engine, expect, attempt.min_size,
                                         attempt.workers, trusted=attempt.trusted, world_now=driver.world_now,
                                         plan=attempt.plan, require_signature=attempt.require_signature,
                                         require_encryption=attempt.require_encryption, fresh=attempt.freshness)
    deferred = _take_verdict(attempt, cache_miss)
    if attempt.held:  # what the restore reads: the inodes just verified (links), or their verified copy
        try:
            attempt.held.make_view()
        except held.HoldError as exc:
            raise Fallback(exc.reason)
        attempt.verdict["held"] = attempt.held.summary()
        # a lease only holds a writer off for a while: where the path can, the tasks run only after verify_pages has
        # asked held.broken() (a driver that holds without leaving its tasks stopped is refused by its unit test)
        attempt.leave_stopped = attempt.held.mode == held.LEASED and driver.verification.page_images == manifest.DEFER
    _check_key(attempt)  # a host without the key says so, not that it lacks the room to decrypt
    _check_memory(attempt)  # before anything is decrypted or restored
    deferred = leave_to_decryption(attempt, deferred)
    if deferred:
        attempt.pages = PageCheck(attempt.snapshot_dir, deferred, attempt.workers, attempt.held).start()
        attempt.leave_stopped = True


def verification_plan(driver, attempt):
    """The driver's verification plan (manifest.Plan) as this restore can follow it: a cached copy was hashed when it
    was cached (nothing can have changed it since: sizes only); a check restores nothing (every byte, now); the page
    images are hashed while CRIU reads them only when both read the same leased inodes (a copy is made by the read
    that hashes it, before CRIU reads it: a lazy restore, the Docker path)."""
    if attempt.cached:
        return manifest.SIZES_ONLY
    if attempt.check_mode:
        return manifest.FULL
    plan = driver.verification
    if plan.page_images == manifest.DEFER and attempt.held is not None and attempt.held.mode != held.LEASED:
        plan = plan._replace(page_images=manifest.HASH)
    return plan._replace(files=attempt.held)


def _find_cached(driver, attempt):
    """Sets ``attempt.cached`` to the cache's verified copy of the snapshot, when the driver may restore from one and
    there is one that may be used; returns why not (None without a cache)."""
    if not attempt.stage_dir or CACHE not in driver.images_from:
        return None
    attempt.cached, why = cache.find(attempt.stage_dir, attempt.snapshot_dir, drop=not attempt.check_mode)
    return why


def _hold(driver, attempt):
    """Every file opened once, before anything is hashed, where this run restores from the files it verifies: leased
    (HELD: a driver whose restored tasks wait for verify_pages to ask the leases), or copied as it is verified (COPY:
    a driver whose tasks may run before everything is read and asked, ``copy_because``)."""
    plan, sources = driver.verification, driver.images_from
    if attempt.cached or attempt.check_mode or not (HELD in sources or COPY in sources) or \
            manifest.LISTED == plan.page_images == plan.other:
        return
    leases = HELD in sources
    try:
        attempt.held = held.Held.open(attempt.snapshot_dir, attempt.decrypt_dir, leases=leases,
                                      why=None if leases else driver.copy_because)
    except held.HoldError as exc:
        raise Fallback(exc.reason)


def _take_verdict(attempt, cache_miss):
    """The verdict's documents and manifest into the attempt; Fallback when it is not valid. Returns what the page
    check must still hash (None: nothing)."""
    verdict = attempt.verdict
    if attempt.held:
        verdict["held"] = attempt.held.summary()
    deferred = verdict.pop("deferred", None)
    attempt.documents = verdict.pop("documents", None) or {}
    if attempt.cached:
        verdict.update(checksums="staged", staged=attempt.cached.summary())
        if verdict["fingerprint"] != attempt.cached.fingerprint:  # regenerated since the lookup
            verdict.update(valid=False, reasons=["checksum_mismatch: the snapshot is %s now, its staged copy %s"
                                                 % (verdict["fingerprint"], attempt.cached.fingerprint)])
    elif cache_miss:
        verdict.update(staged=None, staged_miss=cache_miss)
    if not verdict["valid"]:
        attempt.manifest = verdict.pop("manifest", None)  # a cold start may still use the record
        raise Fallback(verify.reason(verdict))
    attempt.manifest = verdict.pop("manifest")
    return deferred


def _check_key(attempt):
    """An encrypted snapshot needs its key on this host, configured for its identity: the first thing said about it
    when the key is missing."""
    described = attempt.manifest.get("encryption")
    scoped = getattr(attempt.keys, "allows", None)
    if described and described["key_id"] in attempt.keys and scoped and \
            not scoped(described["key_id"], attempt.manifest["identity"]):
        raise Fallback("encrypted: the snapshot is encrypted with key %s, which this host holds only for %s, not for %s "
                       "(the identities of encryption_keys)" % (
                           described["key_id"], keyscope.describe(attempt.keys.scope_of(described["key_id"])),
                           layout.identity_string(attempt.manifest["identity"])))
    if described and described["key_id"] not in attempt.keys:
        raise Fallback("encrypted: the snapshot is encrypted with key %s and this host has %s; configure that key "
                       "(encryption_keys)" % (described["key_id"], "keys %s" % ", ".join(sorted(attempt.keys))
                                              if attempt.keys else "no key"))


def _check_memory(attempt):
    """A restore that cannot get its process memory would be killed half-way (or take the node's other
    tenants down with it): refuse it before anything is decrypted or CRIU runs. The page images are that
    memory, byte for byte; an encrypted snapshot's plaintext needs room too, until CRIU has read it: memory
    when it is on tmpfs (the default), disk space otherwise."""
    files = attempt.manifest["files"]
    need = sum(item["size"] for item in files if layout.is_page_image(item["path"]))
    described = attempt.manifest.get("encryption")
    if described:
        encrypted = set(described["files"])
        plain = sum(item["size"] for item in files if item["path"] in encrypted)  # the ciphertext's size bounds it
        free = fs.free_bytes(attempt.decrypt_dir)
        if free is not None and plain > free:  # a tmpfs has its own size limit (a container's /dev/shm: 64 MiB)
            raise Fallback("insufficient_space: decrypting the snapshot needs %d MiB in %s, which has %d MiB free; "
                           "free space there or give the restore a larger private decrypt directory (decrypt_dir)"
                           % (plain >> 20, attempt.decrypt_dir, free >> 20))
        if mounts.is_tmpfs(attempt.decrypt_dir):
            need += plain
    have = proc.available_memory()
    if have is not None and need > have:
        raise Fallback("insufficient_memory: the restored process needs %d MiB (its page images%s), this host has %d "
                       "MiB available (MemAvailable); free memory on the node or restore on another one"
                       % (need >> 20, " and their plaintext on tmpfs while CRIU reads it" if described else "",
                          have >> 20))


# -- from the decryption to the process back ---------------------------------------------------------------------

def decrypt(driver, attempt):
    """The plaintext of an encrypted snapshot, in a private directory (0700) below ``attempt.decrypt_dir``."""
    described = attempt.manifest["encryption"]  # its key is here: _check_key passed before the memory check
    fs.make_dir_if_missing(attempt.decrypt_dir)
    attempt.plain = plaintext.PrivateDir(attempt.decrypt_dir)  # 0700, ours alone
    try:
        encryption.decrypt_tree({described["key_id"]: attempt.keys[described["key_id"]]}, attempt.stored_dir,
                                attempt.plain_dir, described["files"], encryption.Binding.of(attempt.manifest),
                                attempt.workers,
                                files=attempt.held if attempt.held and attempt.held.mode == held.LEASED else None)
    except encryption.DecryptError as exc:
        raise Fallback(exc.msg)


def _check(driver, attempt):
    """What the driver refuses before anything is touched; then, before CRIU runs, the node's NPU driver the process
    mapped (npu_driver.changed: where the new container will see it), its NPU plugin and chips no other process holds
    (device.devices_unavailable; the device part says which chips a manager reached)."""
    driver.check(attempt)
    recorded = attempt.manifest or {}
    part = recorded.get("device") or {}
    if part.get("driver"):
        now = (driver.world_now(recorded)[0] if driver.world_now else None) or (recorded.get("world") or {}).get(
            "process") or {}
        why = npu_driver.changed(part["driver"], (part.get("snapshot_api") or {}).get("driver_api_version"),
                                 now.get("mounts"))
        if why:
            raise Fallback(why)
    unavailable = device.devices_unavailable(attempt.images_dir, driver.device_targets(attempt), part=part)
    if unavailable:
        raise Fallback(unavailable)


def _host_restore(driver, attempt):
    attempt.started = True  # from here on a failure needs an undo
    attempt.pid = driver.host_restore(attempt)


def _verify_pages(driver, attempt):
    """Nothing restored has run yet (leave-stopped: always when leased): the page images' verdict, and that nobody
    wrote to the held files or changed the view meanwhile -- a lease break pending now included --, decide whether it
    ever does."""
    wrong = attempt.pages.result(attempt.remaining()) if attempt.pages is not None else []
    wrong = wrong + swapped(attempt)
    if attempt.pages is not None:
        attempt.verdict["overlapped"] = {"files": len(attempt.pages.deferred["listed"]), "hashing": attempt.pages.stats,
                                         "task_states_at_verdict": proc.tree_states(attempt.pid),
                                         "released": not wrong}
        attempt.verdict["hashed_bytes"] = (attempt.verdict.get("hashed_bytes") or 0) + \
            (attempt.pages.stats or {}).get("bytes", 0)
    if wrong:
        attempt.verdict.update(valid=False, reasons=wrong)
        raise Fallback("; ".join(wrong))
    if attempt.leave_stopped:
        driver.release(attempt)


def swapped(attempt):
    """Reasons when someone wrote to a held file, or to the view's folders, while the restore read them
    (held.Held.broken)."""
    broken = attempt.held.broken() if attempt.held is not None else []
    return ["swapped: %s was written to while the restore read it; nothing restored from it runs" % rel
            for rel in broken]


# -- the restored process made whole, then proven -----------------------------------------------------------------

def _reseed(driver, attempt):
    """Every restored copy its own randomness: the nonce the drivers wrote into the metadata file, told to the agent."""
    attempt.details["reseed"] = reseed.tell(
        attempt.pid, driver.agent_socket_dir(attempt), attempt.restore_nonce, attempt.remaining(1.0),
        wait=bool(attempt.device_restore and attempt.manifest.get("device")), gone=lambda: not driver.alive(attempt))


def _file_locks(driver, attempt):
    """The POSIX locks CRIU dropped at the restore, held again before anything serves."""
    locks = file_locks.hold_again(attempt.images_dir, attempt.pid, driver.agent_socket_dir(attempt),
                                  min(attempt.remaining(1.0), 10.0), gone=lambda: not driver.alive(attempt))
    if locks:
        attempt.details["file_locks"] = locks


def _device_restore(driver, attempt):
    """The device state back (it overlaps a lazy restore's page copy; the unlock waits for the pages)."""
    attempt.device_actions = driver.device_resume(attempt)


def _pages_in(driver, attempt):
    """Every page in before anything serves from it (at once unless lazy, or done by the device restore)."""
    driver.pages_in(attempt)
    wrong = swapped(attempt)  # a lazy restore read the page images until now
    if wrong:
        raise Fallback("; ".join(wrong))


def _canary(driver, attempt):
    """The restored engine answers as the checkpointed one did, or it is not restored."""
    wrong = canary.mismatch(canary.parse(attempt.document(layout.CANARY)), attempt.pid, attempt.remaining(5.0))
    if wrong:
        raise Fallback(wrong)
    attempt.details["canary"] = "answered as recorded"


VERIFY = Stage("verify", _verify, None)
DECRYPT = Stage("decrypt", decrypt, lambda driver, attempt: attempt.manifest.get("encryption"))
CHECK = Stage("check", _check, None)
# A hand-over's own check: the run it hands the snapshot to checks the devices where CRIU runs (here the images are
# unverified, and still ciphertext when encrypted).
CHECK_REQUEST = Stage("check", lambda driver, attempt: driver.check(attempt), None)
PREPARE = Stage("prepare", lambda driver, attempt: driver.prepare(attempt), None)
HOST_RESTORE = Stage("host_restore", _host_restore, None)
VERIFY_PAGES = Stage("verify_pages", _verify_pages,
                     lambda driver, attempt: attempt.pages is not None or attempt.held is not None)
METADATA = Stage("metadata", lambda driver, attempt: driver.after_host_restore(attempt), None)
RESEED = Stage("reseed", _reseed, None)
FILE_LOCKS = Stage("file_locks", _file_locks, None)
DEVICE_RESTORE = Stage("device_restore", _device_restore,
                       lambda driver, attempt: attempt.device_restore and attempt.manifest.get("device"))
PAGES_IN = Stage("pages_in", _pages_in, None)
CANARY = Stage("canary", _canary, lambda driver, attempt: attempt.has_document(layout.CANARY))
COMPLETE = Stage("complete", lambda driver, attempt: driver.complete(attempt), None)

# A restore by this run: the snapshot verified, the process brought back, made whole (metadata, randomness, locks,
# device state, every page), proven (canary) and made to stick.
RESTORE = (VERIFY, DECRYPT, CHECK, PREPARE, HOST_RESTORE, VERIFY_PAGES, METADATA, RESEED, FILE_LOCKS, DEVICE_RESTORE,
           PAGES_IN, CANARY, COMPLETE)
# A hand-over to another run of this pipeline (the node's runtime), whose host_restore does the stages after it.
HANDOVER = (VERIFY, CHECK_REQUEST, PREPARE, HOST_RESTORE, COMPLETE)
CHECK_MODE_LAST = "check"  # in check mode nothing after this stage runs

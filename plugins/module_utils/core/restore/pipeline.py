# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one restore pipeline. PRIVATE to the inferops.snapshot collection.

Every restore -- ``snapshot_restore`` with ``docker start --checkpoint``, the node's restore-on-create
runtime, a bare process -- runs these stages on one stopwatch:

    locate, verify -> check -> prepare -> host_restore -> verify_pages -> metadata -> reseed -> file_locks
        -> device_restore -> pages_in -> canary -> complete
                 any failure, at any stage: undo what was started -> cold_start, with the reason
    then, whatever happened: commit (the outcome, written once)

A driver supplies only what differs between paths (how to find the snapshot, what to expect of it, how
to put the process back, how to start it cold, where the outcome is written). Every guarantee lives here
once: a snapshot that does not verify is never restored; a failure, an unexpected error included, ends in a
cold start with its reason, never in a half-restored process; the outcome says ``restored`` only after the
device state is back too and the driver has made the restore stick (``complete``); ``commit`` writes what
really happened and nothing else writes it.

Verified bytes are the bytes used: the small documents a restore acts on (the manifest, the container record,
the canary, the device part) are read once, hashed in that read, and used from memory
(``attempt.document``); the CRIU images are read by CRIU from the verified copy (staged, decrypted) or hashed
as described below.

Four drivers: ``docker start --checkpoint`` (checkpoint.py), the node's restore-on-create runtime (on_create.py),
a bare process (bare.py), and the hand-over of ``snapshot_restore method=runtime`` to that runtime
(handover.py), whose ``host_restore`` is another run of this pipeline, in the runtime: the stages after it are
that run's (``Driver.delegates``).

Overlap without trusting early: a driver that can leave the restored tasks stopped (CRIU's leave-stopped)
has the CRIU page images -- process memory, which CRIU copies into the tasks and never interprets --
hashed while CRIU restores; everything CRIU parses (the other images, the manifest, the signature) is
verified before it starts. The tasks run only after ``verify_pages`` has passed (``release``); a page
image that does not match kills them unrun and the engine starts cold.

Staged ahead (stage.py): with a node cache (``stage_dir``) holding a verified copy of the requested
snapshot -- found by its fingerprint, every file still the one verified (inode, size, mtime, ctime) --
verify checks the requested snapshot as always but for its files' content (signature, checksum list,
manifest, identity, world; its checksum list must still hash to the copy's fingerprint), and the
restore reads the copy, which nothing can have changed since it was hashed. A copy that is no longer
exactly what was verified is not used: the snapshot is verified in full, as without a cache.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import threading
import traceback

from ..base import layout
from ..base.clock import Deadline, Stopwatch
from ..base.errors import SnapshotError
from ..linux import fs, mounts, paths, plaintext, proc
from ..store import canary, device, encryption, fleet, hashing, keyscope, manifest, status
from . import cache, file_locks, held, reseed, verify


DECRYPT_DIR = layout.TMPFS   # the plaintext of an encrypted snapshot never reaches a disk


class Fallback(Exception):
    """The snapshot cannot be used: start cold, for ``reason`` (``<kind>: <detail>``)."""

    def __init__(self, reason):
        super(Fallback, self).__init__(reason)
        self.reason = reason


class Attempt:
    """What one restore knows as it goes; drivers read and fill it."""

    def __init__(self, requested, timeout, device_restore=True, check_mode=False, hash_files=True, min_size=0,
                 workers=None, trusted=None, checksum=None, keys=None, decrypt_dir=None, overlap=True, stage_dir=None,
                 require_signature=False, require_encryption=False, generations=None):
        self.requested = requested     # the snapshot asked for; snapshot_dir once it is validated
        self.snapshot_dir = None
        self.watch = Stopwatch()
        self.deadline = Deadline(timeout)
        self.timeout = timeout
        self.device_restore = device_restore
        self.check_mode = check_mode
        self.hash_files = hash_files
        self.min_size = min_size
        self.workers = workers
        self.trusted = trusted         # {key id: public key}: only snapshots signed by one of them are restored
        self.checksum = checksum       # the fingerprint the caller knows the snapshot by (a pod annotation)
        self.keys = keys or {}         # {key id: key}: what an encrypted snapshot may be decrypted with
        self.require_signature = require_signature    # this host's policy (verify.requirements)
        self.require_encryption = require_encryption
        self.generations = generations  # freshness.HighWater: the highest generation restored per identity, or None
        self.decrypt_dir = decrypt_dir or DECRYPT_DIR
        self.plain = None              # plaintext.PrivateDir: an encrypted snapshot's plaintext, while restored
        self.overlap = overlap         # hash the page images while CRIU restores into stopped tasks (when it can)
        self.leave_stopped = False     # the host restore leaves the tasks stopped, for release() after the verdict
        self.stage_dir = stage_dir     # the node's cache of verified snapshots (stage.py), or None
        self.staged = None             # the verified copy restored from (stage.Entry, held until the end), or None
        self.held = None               # the snapshot's files held for this restore (held.Held), or None
        self.verdict = None
        self.manifest = None
        self.pid = None
        self.pid_start_time = None
        self.started = False           # the host restore began: a failure from here on needs an undo
        self.device_actions = None
        self.restored = False
        self.failed = False            # neither restored nor started cold (the cold start itself failed)
        self.reason = None
        self.details = {}              # driver facts for the caller's result (container id, placement, ...)
        self.documents = {}            # {relpath: bytes} of the small files, as read and hashed by the verification
        self.restore_nonce = fleet.new_nonce()  # this restore's own: its metadata file's, and the agent's (reseed.py)

    @property
    def outcome(self):
        return "restored" if self.restored else ("failed" if self.failed else "cold")

    def document(self, relpath):
        """The bytes of a small file of the snapshot (manifest.DOCUMENTS) as verified: from the verified copy the
        restore reads (the plaintext of an encrypted snapshot, a staged copy), or as they were hashed; never read
        again from the store. Raises Fallback when the verification did not hand them over."""
        described = (self.manifest or {}).get("encryption") or {}
        if self.plain and relpath in described.get("files", ()):
            return hashing.read_document(os.path.join(self.plain.path, relpath))
        if self.staged:
            return hashing.read_document(os.path.join(self.staged.dir, relpath))
        if relpath not in self.documents:
            raise Fallback("unverified: %s was not read by the verification (not listed in %s?)"
                           % (relpath, layout.CHECKSUMS))
        data = self.documents[relpath]
        if relpath in described.get("files", ()):
            data = encryption.decrypt_bytes(self.keys, data, relpath, encryption.Binding.of(self.manifest))
        return data

    def has_document(self, relpath):
        return any(item["path"] == relpath for item in (self.manifest or {}).get("files", ()))

    def remaining(self, floor=0.1):
        return self.deadline.remaining(floor)

    @property
    def stored_dir(self):
        """Where the snapshot's files as stored are read from, once verified: its staged copy, the very files the
        verification hashed (held.Held's view: leased, or copied as they were hashed), or -- for a path that reads
        nothing of the images itself -- the snapshot."""
        if self.staged:
            return self.staged.dir
        return self.held.view if self.held else self.snapshot_dir

    @property
    def plain_dir(self):
        return self.plain.path if self.plain else None

    @property
    def content_dir(self):
        """Where the snapshot's files are read from: the snapshot (or its staged copy), or the plaintext of an
        encrypted one."""
        return self.plain_dir or self.stored_dir

    @property
    def images_dir(self):
        return layout.images_dir(self.content_dir)


class Driver:
    """What differs between restore paths. ``path`` names it in status records (docker, runtime, criu).

    The task's wishes common to the paths a module drives: the pod ``identity``, its new ``env``, where
    the engine reads its metadata file and listens for the agent, and the versions to expect.
    """

    path = None
    engine = "docker"
    can_leave_stopped = False  # host_restore honours attempt.leave_stopped, and release() lets the tasks run
    can_use_staged = True      # host_restore only reads the images (a link to them would change the copy's ctime)
    # delegates: host_restore hands the snapshot to another run of this pipeline (the node's runtime), which hashes
    # the images, decrypts, restores and resumes: the stages after host_restore are that run's, not this one's
    delegates = False
    reads_images = True        # False: this run will not restore the images (it knows it starts cold): not hashed

    def __init__(self, identity=None, env=None, metadata_path=None, agent_socket_dir=None, criu_version="auto",
                 runtime_version=None):
        self.identity = identity
        self.env = dict(env or {})
        self.metadata_path = metadata_path
        self.socket_dir = agent_socket_dir
        self.criu_version = criu_version
        self.runtime_version = runtime_version

    def locate(self, attempt):
        """The validated snapshot directory of ``attempt.requested`` (raise Fallback when it may not be used)."""
        return paths.validate_snapshot_dir(attempt.requested)

    def image_id(self, attempt):
        """The image the restored process would run with (None: not checked)."""
        return None

    def expectations(self, attempt):
        """What the snapshot must match: identity, image_id, criu_version, runtime_version (None: unchecked)."""
        return verify.expectations(self.identity, self.image_id(attempt), self.criu_version, self.runtime_version)

    def world_now(self, recorded):
        """(process facts of what would run now, or None when the process keeps its own; this host's runc
        version): what the recorded world is compared with (world.py)."""
        return None, None

    def check(self, attempt):
        """Refuse before anything is touched when this host cannot succeed (raise Fallback)."""

    def prepare(self, attempt):
        """Everything before the process comes back (a container to restore into, its metadata file)."""

    def host_restore(self, attempt):
        """Bring the process back from the CRIU images; return its host pid."""
        raise NotImplementedError

    def release(self, attempt):
        """Let the tasks a leave-stopped host restore left stopped run (the whole snapshot is verified)."""
        proc.continue_tree(attempt.pid)

    def after_host_restore(self, attempt):
        """What needs the restored process but must come before its device state (its metadata file)."""

    def failure_cause(self, attempt):
        """What, of this path's own, explains a failure better than the stage that saw it (a lazy-pages daemon that
        died: the tasks then fault on its holes), or None."""
        return None

    def pages_in(self, attempt):
        """Return once all of the restored process's memory is in (a lazy restore copies it in after
        host_restore); raise Fallback when it will never be. Called before the engine is unlocked."""

    def device_resume(self, attempt):
        return device.resume_process(attempt.pid, self.agent_socket_dir(attempt), attempt.remaining(1.0),
                                     gone=lambda: not self.alive(attempt), before_unlock=lambda: self.pages_in(attempt),
                                     recorded=device.read_device_part(attempt.content_dir))  # versions: issue 24

    def device_targets(self, attempt):
        """{path in the restored process: (type, major, minor)} of the NPU device nodes its new container has
        (device.targets_from_oci/_docker), or None: the nodes at those paths on this host (a bare process)."""
        return None

    def agent_socket_dir(self, attempt):
        return self.socket_dir

    def alive(self, attempt):
        return proc.alive(attempt.pid)

    def undo(self, attempt):
        """Remove a half-restored process: it holds the pids, ports and device a cold start needs."""

    def cold_start(self, attempt):
        """Start the engine normally (the reason is in ``attempt.reason``)."""
        raise NotImplementedError

    def complete(self, attempt):
        """The last step of a restore, after the canary: what makes it stick (the node runtime's marker that the
        next ``start`` is done). Raising here is a cold start like any other failure."""

    def record_fields(self, attempt):
        """Fields of this path for the status record's restore entry (container, name, policy)."""
        return {}

    def commit(self, attempt):
        """Write the outcome -- restored, cold with the reason, or failed -- once, after everything else; nothing
        else writes it. The default: the attempt in the snapshot's status record (informative: a failure to write
        it is not one of the restore)."""
        record_attempt(self, attempt)


def run(driver, attempt):
    """Restore through ``driver``, or start cold with the reason. Returns ``attempt`` (restored, reason, ...).

    In check mode only locate, verify and check run, and ``attempt.restored`` says what would happen.
    An error of the cold start itself is raised to the caller: there is nothing left to fall back to.
    """
    watch = attempt.watch
    stage = Stage(watch)
    pages = None
    try:
        with stage("verify"):
            attempt.snapshot_dir = driver.locate(attempt)
            expect = dict(driver.expectations(attempt), checksum=attempt.checksum)
            staged_why = _find_staged(driver, attempt)
            if not (attempt.staged or attempt.check_mode or driver.delegates or not driver.reads_images):
                try:  # every file opened once, before anything is hashed: what is verified is what is restored
                    attempt.held = held.Held.open(attempt.snapshot_dir, attempt.decrypt_dir)
                except held.HoldError as exc:
                    raise Fallback(exc.reason)
            # Hashing the page images while CRIU reads them needs both to read the same bytes: the same leased inodes
            defer = layout.is_page_image if attempt.overlap and driver.can_leave_stopped and not attempt.check_mode \
                and not attempt.staged and (attempt.held is None or attempt.held.mode == held.LEASED) else None
            # A delegate hashes the images and the device state right before it restores them, and a run that restores
            # neither does not need them: this run hashes what it acts on itself, the documents.
            unhashed = _not_a_document if (driver.delegates or not driver.reads_images) and not attempt.check_mode \
                else None
            attempt.verdict = verify.for_restore(attempt.snapshot_dir, driver.engine, expect, attempt.min_size,
                                                 attempt.workers, attempt.hash_files and not attempt.staged,
                                                 trusted=attempt.trusted, world_now=driver.world_now, defer=defer,
                                                 unhashed=unhashed, files=attempt.held,
                                                 require_signature=attempt.require_signature,
                                                 require_encryption=attempt.require_encryption)
            if attempt.held:
                attempt.verdict["held"] = attempt.held.summary()
            deferred = attempt.verdict.pop("deferred", None)
            attempt.documents = attempt.verdict.pop("documents", None) or {}
            if attempt.staged:
                attempt.verdict.update(checksums="staged", staged=attempt.staged.summary())
                if attempt.verdict["fingerprint"] != attempt.staged.fingerprint:  # regenerated since the lookup
                    attempt.verdict.update(valid=False, reasons=["checksum_mismatch: the snapshot is %s now, its staged "
                                                                 "copy %s" % (attempt.verdict["fingerprint"],
                                                                              attempt.staged.fingerprint)])
            elif staged_why:
                attempt.verdict["staged"] = None
                attempt.verdict["staged_miss"] = staged_why
            if not attempt.verdict["valid"]:
                attempt.manifest = attempt.verdict.pop("manifest", None)  # a cold start may still use the record
                raise Fallback(verify.reason(attempt.verdict))
            attempt.manifest = attempt.verdict.pop("manifest")
            _admit(attempt)  # no older generation than this node has restored (freshness.py)
            if attempt.held:  # what the restore reads: the inodes just verified (links), or their verified copy
                try:
                    attempt.held.make_view()
                except held.HoldError as exc:
                    raise Fallback(exc.reason)
                attempt.verdict["held"] = attempt.held.summary()
            _check_key(attempt)  # a host without the key says so, not that it lacks the room to decrypt
            _check_memory(attempt)  # before anything is decrypted or restored
            deferred = _leave_to_decryption(attempt, deferred)
            if deferred:
                pages = PageCheck(attempt.snapshot_dir, deferred, attempt.workers, attempt.held).start()
                attempt.leave_stopped = True
        if attempt.manifest.get("encryption") and not driver.delegates:
            with stage("decrypt"):
                decrypt(attempt)
        with stage("check"):
            driver.check(attempt)
            # Before CRIU runs: its NPU plugin, and devices no other process holds (issue 24). Where CRIU runs: a
            # delegate's own run checks them; here its images are unverified (and still ciphertext when encrypted).
            unavailable = None if driver.delegates else \
                device.devices_unavailable(attempt.images_dir, driver.device_targets(attempt))
            if unavailable:
                raise Fallback(unavailable)
        if attempt.check_mode:
            attempt.restored = True
            return attempt
        with stage("prepare"):
            driver.prepare(attempt)
        attempt.started = True
        with stage("host_restore"):
            attempt.pid = driver.host_restore(attempt)
        if driver.delegates:  # the delegate's own run did every stage below, and decided
            with stage("complete"):
                driver.complete(attempt)
            attempt.restored = True
            return attempt
        if pages is not None or attempt.held is not None:
            with stage("verify_pages"):  # nothing restored has run yet (leave-stopped): the verdict decides
                wrong = pages.result(attempt.remaining()) if pages is not None else []
                wrong = wrong + _swapped(attempt)
                if pages is not None:
                    attempt.verdict["overlapped"] = {"files": len(pages.deferred["listed"]), "hashing": pages.stats,
                                                     "task_states_at_verdict": proc.tree_states(attempt.pid),
                                                     "released": not wrong}
                    attempt.verdict["hashed_bytes"] = (attempt.verdict.get("hashed_bytes") or 0) + \
                        (pages.stats or {}).get("bytes", 0)
                if wrong:
                    attempt.verdict.update(valid=False, reasons=wrong)
                    raise Fallback("; ".join(wrong))
                if attempt.leave_stopped:
                    driver.release(attempt)
        with stage("metadata"):
            driver.after_host_restore(attempt)
        # -- issue 28: every restored copy its own randomness (the nonce the drivers wrote into the metadata file) --
        with stage("reseed"):
            attempt.details["reseed"] = reseed.tell(
                attempt.pid, driver.agent_socket_dir(attempt), attempt.restore_nonce, attempt.remaining(1.0),
                wait=bool(attempt.device_restore and attempt.manifest.get("device")),
                gone=lambda: not driver.alive(attempt))
        # -- end issue 28 --
        with stage("file_locks"):  # the POSIX locks CRIU dropped at the restore, held again before anything serves
            locks = file_locks.hold_again(attempt.images_dir, attempt.pid, driver.agent_socket_dir(attempt),
                                          min(attempt.remaining(1.0), 10.0), gone=lambda: not driver.alive(attempt))
            if locks:
                attempt.details["file_locks"] = locks
        if attempt.device_restore and attempt.manifest.get("device"):
            with stage("device_restore"):  # the device copy overlaps a lazy restore's page copy; unlock waits for it
                attempt.device_actions = driver.device_resume(attempt)
        with stage("pages_in"):  # every page in before anything serves from it (at once unless lazy, or done above)
            driver.pages_in(attempt)
            wrong = _swapped(attempt)  # a lazy restore read the page images until now
            if wrong:
                raise Fallback("; ".join(wrong))
        recorded = canary.parse(attempt.document(layout.CANARY)) if attempt.has_document(layout.CANARY) else None
        if recorded is not None:
            with stage("canary"):  # the restored engine answers as the checkpointed one did, or it is not restored
                wrong = canary.mismatch(recorded, attempt.pid, attempt.remaining(5.0))
                if wrong:
                    raise Fallback(wrong)
                attempt.details["canary"] = "answered as recorded"
        with stage("complete"):
            driver.complete(attempt)
        attempt.restored = True
    except Exception as exc:  # every failure, a bug included, is a cold start with its reason
        attempt.reason = _reason(exc, stage.current)
        cause = driver.failure_cause(attempt) if attempt.started else None
        if cause and cause != attempt.reason:
            attempt.reason = "%s; then %s" % (cause, attempt.reason)
        if pages is not None and "overlapped" not in attempt.verdict:
            # failed before the page images' verdict: a corrupt snapshot is said first, as a serial check would
            wrong = pages.result(attempt.remaining(1.0))
            if wrong:
                attempt.verdict.update(valid=False, reasons=wrong)
                attempt.reason = "; ".join(wrong + [attempt.reason])
        attempt.manifest = attempt.manifest or (attempt.verdict or {}).pop("manifest", None)
        if attempt.check_mode:
            return attempt
        if attempt.started:
            driver.undo(attempt)
        attempt.failed = True  # until the cold start is done: nothing serves
        with watch.timed("cold_start"):
            driver.cold_start(attempt)
        attempt.failed = False
    finally:
        if attempt.staged:  # CRIU has read the copy: retention may remove it again
            attempt.staged.release()
        if attempt.held:  # CRIU has read everything it will: leases, descriptors and the view go
            attempt.held.close()
            attempt.held = None
        if attempt.plain:  # CRIU has read the images: the plaintext goes, whatever happened
            attempt.plain.remove()
            attempt.plain = None
        watch.total()
        if not attempt.check_mode:
            driver.commit(attempt)
    return attempt


def _swapped(attempt):
    """Reasons when someone wrote to a held file, or to the view's folders, while the restore read them
    (held.Held.broken)."""
    broken = attempt.held.broken() if attempt.held is not None else []
    return ["swapped: %s was written to while the restore read it; nothing restored from it runs" % rel
            for rel in broken]


def _not_a_document(relpath):
    return relpath not in manifest.DOCUMENTS


def _check_memory(attempt):
    """A restore that cannot get its process memory would be killed half-way (or take the node's other
    tenants down with it): refuse it before anything is decrypted or CRIU runs. The page images are that
    memory, byte for byte; an encrypted snapshot's plaintext needs room too, until CRIU has read it: memory
    when it is staged on tmpfs (the default), disk space otherwise."""
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


def _find_staged(driver, attempt):
    """Sets ``attempt.staged`` to the cache's verified copy of the snapshot, when there is one that may be used;
    returns why not (None without a cache)."""
    if not attempt.stage_dir or not attempt.hash_files or not driver.can_use_staged:
        return None
    attempt.staged, why = cache.find(attempt.stage_dir, attempt.snapshot_dir, drop=not attempt.check_mode)
    return why


class PageCheck:
    """The deferred content check of the page images (manifest.verify_deferred), in a thread of its own, through the
    descriptors the restore holds (``files``) when it holds them."""

    def __init__(self, directory, deferred, workers=None, files=None):
        self.directory, self.deferred, self.workers, self.files = directory, deferred, workers, files
        self.reasons = None
        self.stats = None
        self._thread = threading.Thread(target=self._run, name="inferops-verify-pages")
        self._thread.daemon = True  # a restore that failed meanwhile does not wait for it

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        try:
            self.reasons, self.stats = manifest.verify_deferred(self.directory, self.deferred, self.workers,
                                                                files=self.files)
        except Exception as exc:  # unreadable now: not verified, so never released
            self.reasons = ["unreadable: the page images could not be hashed: %s: %s" % (type(exc).__name__, exc)]

    def result(self, timeout):
        """The reasons the page images do not match ([] when every byte does); a check still running at the
        deadline is a reason too."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return ["timeout: the page images were still being hashed when the restore's deadline came"]
        return self.reasons


def authenticated_by_decryption(attempt):
    """The encrypted files whose bytes decrypting them authenticates, when hashing them would prove no more.

    Without a signature required (``trusted``) and without a fingerprint known from outside the store
    (``checksum``, a pod annotation), checksum.sha256 is only as trustworthy as the store that holds it: whoever
    can rewrite a file can rewrite its checksum. AES-GCM under this host's key refuses every byte that a holder of
    the key did not write, a truncation and a reordering included, so for those files it is the stronger check and
    the hash is left out (their listing, sizes and the manifest's digests are still checked). With trusted keys or an
    expected fingerprint the checksums are bound to something the store cannot rewrite, and every key holder (each
    restoring node) could forge ciphertext: those snapshots are hashed in full."""
    described = (attempt.manifest or {}).get("encryption")
    if not described or attempt.trusted or attempt.checksum or described["key_id"] not in attempt.keys:
        return set()
    return set(described["files"])


def _leave_to_decryption(attempt, deferred):
    """``deferred`` without the files the decryption authenticates (recorded in the verdict)."""
    if not deferred:
        return deferred
    by_decryption = authenticated_by_decryption(attempt)
    left = sorted(rel for rel in deferred["listed"] if rel in by_decryption)
    if not left:
        return deferred
    attempt.verdict["authenticated_by_decryption"] = left
    kept = dict(whole=[rel for rel in deferred["whole"] if rel not in by_decryption],
                chunked=dict((rel, item) for rel, item in deferred["chunked"].items() if rel not in by_decryption),
                listed=dict((rel, digest) for rel, digest in deferred["listed"].items() if rel not in by_decryption))
    return kept if kept["listed"] else None


def _admit(attempt):
    """A snapshot older than one of its identity this node has restored is refused (rollback:); this one is the highest
    now. Not for a check (nor where the caller keeps no record: a run that hands over to the node's runtime, whose own
    run keeps it with the runtime's settings)."""
    if attempt.generations is None or attempt.check_mode:
        return
    refused = attempt.generations.admit(attempt.manifest)
    if refused:
        raise Fallback(refused)


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


def decrypt(attempt):
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


class Stage:
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


def record_attempt(driver, attempt):
    """The attempt in the snapshot's status record; informative, so a failure to write it is not one of the restore."""
    if not attempt.snapshot_dir or not os.path.isdir(os.path.dirname(attempt.snapshot_dir.rstrip("/"))):
        return
    fields = dict(driver.record_fields(attempt))
    outcome = attempt.outcome
    entry = status.restore_entry(driver.path, outcome, attempt.reason,
                                 pid=attempt.pid, pid_start_time=attempt.pid_start_time,
                                 device_actions=attempt.device_actions, durations=attempt.watch.durations, **fields)
    try:
        status.update(attempt.snapshot_dir, restore=entry)
        attempt.details["record"] = entry
    except (IOError, OSError, SnapshotError) as exc:
        attempt.details["record_error"] = str(getattr(exc, "msg", exc))

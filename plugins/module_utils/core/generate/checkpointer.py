# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host part of a generation: checkpoint, seal, publish, status. PRIVATE to inferops.snapshot.

What ``host_checkpoint`` does: check the host and the target (CRIU, the daemon, the device part of
the staging directory), checkpoint the target into the staging directory through its engine's driver (driver.py: a
Docker container, a container of a pod on containerd, a bare process), seal it (seal.py) and publish it by one rename,
within one deadline. Any failure removes what this run wrote and records ``failed`` with the reason.

Signed on the controller (``controller_signing``, set by plugins/action/host_checkpoint.py): the node never holds a
signing key. The task runs the module twice under the generation's claim -- ``seal``: everything up to the sealed
staging directory, whose checksum list and manifest go up to the controller; ``publish``: the signature the controller
sent down is written beside them and the snapshot published -- or ``abort`` when the controller refuses to sign. A
snapshot is never published unsigned in between: until ``publish`` it is the staging directory, the status record
says ``generating``, and the claim is held.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import json
import os
import threading

from ..agent import protocol
from ..base import layout
from ..base.clock import Deadline, Stopwatch, utc_now
from ..base.errors import ParameterError, RuntimeRefusedError, SnapshotError, SnapshotTimeout
from ..clients.control import AgentSocketClient, LeaseKeeper, bounded_lease, lease_seconds
from ..clients.criu_cli import CriuCli, make_work_dir
from ..linux import fs, paths, plaintext
from ..store import (device, encryption, fleet, freshness, hashing, manifest, npu_driver, seal, signature, statement,
                     status, world)
from ..base.progress import Progress
from . import claim, leftovers
from .bare_process import BareProcess
from .cri_container import CriContainer
from .docker_container import DockerContainer


SEAL, PUBLISH, ABORT = "seal", "publish", "abort"   # the phases of controller_signing (module docstring)
SEALED = "sealed"   # the seal phase's status: sealed in staging, waiting for the controller's signature
DRIVERS = dict((driver.engine, driver) for driver in (DockerContainer, CriContainer, BareProcess))


class Checkpointer:
    def __init__(self, params, log=None):
        self.params = params
        self.watch = Stopwatch()
        self.deadline = Deadline(params["timeout"])
        self.snapshot_dir = paths.validate_snapshot_dir(params["snapshot_dir"])
        self.staging_dir = layout.staging_dir(self.snapshot_dir)
        paths.validate_snapshot_dir(self.staging_dir, field="snapshot_dir (staging sibling)")
        self.identity = paths.check_identity(params["identity"], self.snapshot_dir)
        self.progress = Progress("host_checkpoint %s" % self.snapshot_dir, log, watch=self.watch)
        self.versions = {}
        self.criu = CriuCli()
        self._driver = None
        self.device_part = None
        self.signing = params.get("controller_signing") or {}   # the controller's signer's phase (module docstring)
        self.generation_number = None   # the manifest's generation (freshness.py)
        self.expires = None             # the manifest's expires, or None
        self.encryption_key = None
        self.encrypted = None
        self.plain = None  # plaintext.PrivateDir CRIU writes into when the snapshot is encrypted
        self.follower = None
        self.written = {}  # digests of the ciphertext, taken as encryption wrote it
        self.agent = None
        self.lease = None   # seconds of the engine's lease, renewed by self.keeper while this runs
        self.backup_lease = None  # the lease device_backup asks for
        self.keeper = None
        self.claim_keeper = None  # renews the generation's claim on the pod while this runs
        self.generation = params.get("generation_id") or claim.new_id()
        self.claim_lease = params.get("generation_lease") or claim.DEFAULT_LEASE
        self.work = None  # the work dir runc or CRIU gets (noted in the claim: a run that takes it over removes it)
        self.step = "host snapshot"  # what a failure is reported as (the roles name the step that failed)

    @property
    def driver(self):
        """The driver of the task's engine (driver.py), made on first use: the publish and abort phases need none."""
        if self._driver is None:
            self._driver = DRIVERS[self.params["engine"]](self.params, self.criu)
        return self._driver

    def remaining(self, stage):
        if self.keeper:
            self.keeper.check(stage)
        if self.deadline.expired():
            raise SnapshotTimeout("generation ran past its timeout of %.0f s before %s" % (self.params["timeout"], stage))
        return self.deadline.remaining()

    def preflight(self):
        params = self.params
        self.versions["criu"] = self.criu.require()
        self.driver.preflight(self.versions)
        self.freshness()
        if params.get("encryption_key"):
            self.encryption_key = encryption.load_key(params["encryption_key"], "encryption_key", self.snapshot_dir)
            if not os.path.isdir(params["encryption_workdir"]):
                raise ParameterError("encryption_workdir: %s is not a directory" % params["encryption_workdir"],
                                     field="encryption_workdir")
        memory = params.get("device_memory")
        if memory not in (None, protocol.DEFAULT_DEVICE_MEMORY) and not params.get("device_backup"):
            raise ParameterError("device_memory: %s is what host_checkpoint's own device backup saves; set "
                                 "device_backup=true, or give it to npu_snapshot_backup" % memory,
                                 field="device_memory")
        if params.get("device_backup"):
            if not params["require_device_part"]:
                raise ParameterError("device_backup: needs require_device_part=true (the backup is the device part)",
                                     field="device_backup")
            self.backup_lease = lease_seconds(params.get("lease"))
            self.agent = AgentSocketClient.for_pid(self.driver.pid, params["agent_socket_dir"])
            self.agent.request(protocol.OP_STATE, 30)  # reachable before the claim is taken
            return
        self._read_device_part()

    def freshness(self):
        """The generation and expiry the manifest will carry: the controller's signer's, or -- unsigned -- one above the
        published snapshot's and never below the time (freshness.next_generation)."""
        if self.signing.get("generation") is not None:
            self.generation_number = int(self.signing["generation"])
            self.expires = self.signing.get("expires")
            return
        try:
            last = freshness.generation(manifest.load_manifest(self.snapshot_dir))
        except (IOError, OSError, ValueError):
            last = 0
        self.generation_number = freshness.next_generation(last)
        if self.params.get("max_age"):
            self.expires = freshness.expires_at(self.params["max_age"])

    def _read_device_part(self):
        """The device part in the staging directory, checked against the process when one is required."""
        self.device_part = device.read_device_part(self.staging_dir)
        if self.params["require_device_part"]:
            self._check_device_part()
        self.versions["runtime"] = (self.device_part or {}).get("runtime", {}).get("version")

    def back_up_device(self, result, check_mode=False):
        """device_backup: lock and back up the engine here, after the preflight checks and under the claim, so that
        its lock window is the backup, the checkpoint and the resume -- no module start, no task in between."""
        self.step = "device snapshot"
        with self.watch.timed("device_backup"):  # the lease ends by the generation's timeout + LEASE_MARGIN
            lease = bounded_lease(self.backup_lease, self.deadline.remaining())
            result["device_backup"] = device.back_up(self.agent, self.staging_dir, self.identity, lease,
                                                     True, min(self.remaining("the device backup"), 90.0),
                                                     check_mode, device_memory=self.params.get("device_memory"))
        if check_mode:
            return
        self._read_device_part()  # require_device_part holds: preflight refuses device_backup without it
        self.step = "host snapshot"

    def _check_device_part(self):
        if self.device_part is None:
            raise RuntimeRefusedError(
                "no device part at %s: back up the NPU state first with inferops.snapshot.npu_snapshot_backup "
                "(same snapshot_dir), or set require_device_part=false for a process without an NPU"
                % device.device_part_path(self.staging_dir))
        self.agent = AgentSocketClient.for_pid(self.driver.pid, self.params["agent_socket_dir"])
        reply = self.agent.request(protocol.OP_STATE, 30)
        self.lease = (reply.get("lease") or {}).get("seconds")
        if reply["state"] != protocol.STATE_BACKED_UP:
            raise RuntimeRefusedError(
                "the process is %s, not BACKED_UP: its device memory would not be in the checkpoint. Run "
                "inferops.snapshot.npu_snapshot_backup first" % reply["state"], state=reply["state"])
        if reply["pid"] != self.device_part.get("pid"):
            raise RuntimeRefusedError(
                "the device part in %s was recorded for pid %s, but the target process is pid %s: it belongs to "
                "another process; take the device snapshot again" % (self.staging_dir, self.device_part.get("pid"),
                                                                     reply["pid"]))

    def checkpoint(self):
        params = self.params
        image_dir = os.path.join(self.staging_dir, layout.IMAGES_DIR)
        if os.path.lexists(image_dir):
            fs.remove_tree(image_dir)  # a leftover of an interrupted run: never mix two checkpoints
        fs.ensure_dir(os.path.dirname(image_dir))
        if self.encryption_key is not None:  # CRIU writes the plaintext to private tmpfs, never to the store
            self.plain = plaintext.PrivateDir(params["encryption_workdir"])
            image_dir = os.path.join(self.plain_dir, layout.IMAGES_DIR)
            fs.ensure_dir(os.path.dirname(image_dir))
        seconds = self.remaining("the checkpoint")
        if self.driver.work_dir:
            fs.ensure_dir(image_dir)  # docker checkpoint create makes its own
            self.work = make_work_dir("dump")
            self.note_work()
        if params["hash_during_checkpoint"] and self.encryption_key is None:  # encrypted: hashed as encryption writes it
            self.follower = seal.Follower(image_dir, prefix=layout.IMAGES_DIR, workers=params["workers"]).start()
        # The world it runs in, fingerprinted while CRIU writes the images (mostly I/O of other files).
        self.world = {}
        capture = threading.Thread(target=self._capture_world, name="inferops-world")
        capture.start()
        try:
            with self.watch.timed("dump"):  # the runc / docker / CRIU call alone, inside "checkpoint"
                self.driver.dump(image_dir, params["leave_running"], seconds, self.work)
        except Exception:
            if self.follower:
                self.follower.abort()
                self.follower = None
            raise
        finally:
            capture.join()
        if "error" in self.world:
            raise ParameterError("the world of the process could not be recorded: %s" % self.world["error"])

    def resume_engine(self):
        """Serve again as soon as both parts are taken: the device part (the backup, in the engine's host memory
        and in the staging directory) and the checkpoint. Encrypting, hashing, fsync and publishing need the
        engine no more, so they run after it, and the lock window is the backup + the checkpoint + this."""
        if not (self.params.get("resume") and self.params["leave_running"] and self.agent is not None):
            return None
        if self.keeper:  # the lease is no longer needed once the engine runs; lost already: refuse as before
            self.keeper.check("resuming the engine")
            self.keeper.stop()
            self.keeper = None
        with self.watch.timed("resume"):
            try:
                actions, reply = device.resume(self.agent, min(self.remaining("resuming the engine"), 60.0))
            except SnapshotError as exc:  # the snapshot is sound; the role's unlock step tries again
                self.progress.note("the engine could not be resumed: %s" % exc.msg, force=True)
                return {"actions": [], "state": None, "error": exc.msg}
        self.progress.note("engine resumed (%s) %.2f s after the checkpoint began"
                           % (", ".join(actions) or "was running", self.watch.elapsed()), force=True)
        return {"actions": actions, "state": reply.get("state"), "error": None}

    def note_work(self):
        """Name in the claim what a kill from here on would leave (leftovers.clean_after removes it)."""
        work = {"dirs": [self.work], "container_id": self.driver.container_id, "runc_root": self.driver.runc_root}
        claim.take(self.snapshot_dir, self.generation, self.claim_lease, work=work)

    def digest_world(self):
        """The SHA-256 of every file the world records, now that the engine runs again (never in its lock window);
        from the node's cache for a file hashed before with the same identity."""
        self.remaining("recording the digests of the mounted files")
        with self.watch.timed("world_digests"):
            try:
                self.world["digests"] = world.add_digests(self.world["facts"], self.params["workers"])
            except world.WorldError as exc:
                raise ParameterError("the world of the process could not be recorded: %s" % exc)
        self.progress.note("digests of %(files)d mounted files (%(hashed_bytes)d bytes hashed, %(cached_files)d from "
                           "the node's cache)" % self.world["digests"], force=True)

    def encrypt(self):
        """Everything that holds the process's memory or environment, encrypted into the staging directory."""
        canary = os.path.join(self.staging_dir, layout.CANARY)
        if os.path.isfile(canary):  # snapshot_canary left it in the clear: it holds a prompt and its answer
            os.rename(canary, os.path.join(self.plain_dir, layout.CANARY))
        relpaths = [rel for rel in manifest.list_files(self.plain_dir) if encryption.encrypts(rel)]
        with self.watch.timed("encrypt"):  # the ciphertext is hashed as it is written, from memory: never read back
            self.written = encryption.encrypt_tree(
                self.encryption_key, self.plain_dir, self.staging_dir, relpaths,
                encryption.Binding(self.identity, self.generation_number), self.params["workers"],
                digest=seal.WrittenDigest if self.params["hash_during_checkpoint"] else None)
        self.encrypted = encryption.describe(self.encryption_key, relpaths)
        self.discard_plaintext()

    def discard_plaintext(self):
        if self.plain:
            self.plain.remove()
            self.plain = None

    @property
    def plain_dir(self):
        return self.plain.path if self.plain else None

    def _capture_world(self):
        try:
            self.world["facts"] = self.driver.facts(self.versions)
            self.world["driver"] = npu_driver.mapped(self.driver.pid) if self.device_part else None  # npu_driver.py
        except (OSError, ValueError) as exc:  # world.WorldError is a ValueError, as digests' are
            self.world["error"] = str(exc)

    def fields(self):
        part = self.device_part or {}
        fields = {
            "identity": self.identity,
            "generation": self.generation_number,
            "created_at": utc_now(),
            "image": self.driver.image(),
            "engine": {"name": self.driver.engine, "version": self.driver.version(self.versions),
                       "criu_version": self.versions.get("criu"), "oci_runtime_version": self.versions.get("runc")},
            "runtime": part.get("runtime") or {"name": device.RUNTIME_NAME, "version": None},
            "devices": part.get("devices") or [],
            "durations": dict(self.watch.durations),
            "world": self.world["facts"],
        }
        if part:
            fields["device"] = dict(part, driver=self.world["driver"]) if self.world.get("driver") else part
        if self.encrypted:
            fields["encryption"] = self.encrypted
        if self.expires:
            fields["expires"] = self.expires
        return fields

    def run(self):
        """The whole generation of the host part, under the generation's claim; returns the module's result."""
        taken = claim.take(self.snapshot_dir, self.generation, self.claim_lease)
        self.claim_keeper = claim.Keeper(self.snapshot_dir, self.generation, self.claim_lease).start()
        swept = leftovers.sweep_work_dirs()  # what killed checkpoints of any pod left in the temp dir
        sealed = False
        try:
            result = self._run()
            sealed = result.get("status") == SEALED
        finally:  # the generation's later steps (verify, unlock) need no claim: the snapshot is published
            self.claim_keeper.stop()
            if not sealed:  # sealed for the controller's signature: the claim is held until it is published
                claim.release(self.snapshot_dir, self.generation)
        return dict(result, took_over=taken.get("took_over"), work_dirs_swept=swept, generation_id=self.generation)

    def _run(self):
        params = self.params
        result = dict(snapshot_dir=self.snapshot_dir, durations=self.watch.durations, progress=self.progress.lines)
        try:
            if params.get("device_backup"):
                self.back_up_device(result)
            # the host snapshot starts (a device backup that failed goes from the roles' "generating" to "failed")
            status.update(self.snapshot_dir, "generating", identity=self.identity, generation_id=self.generation)
            if self.lease:  # renewed until the snapshot is published; never while CRIU dumps the process
                self.keeper = LeaseKeeper(self.agent, self.lease, log=self.progress.note,
                                          remaining=self.deadline.remaining).start()
            self.progress.note("checkpoint of %s started" % self.driver.describe(), force=True)
            with self.watch.timed("checkpoint"), (self.keeper.quiet() if self.keeper else contextlib.nullcontext()):
                self.checkpoint()
            result["resumed"] = self.resume_engine()
            if self.follower:  # the images to the disk while their hashing catches up (not beside CRIU's writes)
                self.follower.flush()
            self.driver.write_record(self.plain_dir or self.staging_dir)  # after the resume: nothing the engine waits for
            self.digest_world()
            result["world_digests"] = self.world["digests"]
            if self.encryption_key is not None:
                self.encrypt()
            self.progress.note("checkpoint done in %.2f s; sealing" % self.watch.durations["checkpoint"], force=True)
            self.remaining("sealing")
            with self.watch.timed("seal"):
                known = self.follower.finish() if self.follower else self.written
                self.follower = None
                document, fingerprint, hashing = seal.seal(
                    self.staging_dir, self.fields(), workers=params["workers"], progress=self.progress.bytes_done,
                    known=known)
            self.remaining("publishing")
            if self.claim_keeper:  # never publish over a generation that took the pod meanwhile
                self.claim_keeper.check()
            if self.signing.get("phase") == SEAL:  # the controller signs it; publish() follows in a second run
                return self.sealed_for_signature(result, document, fingerprint, hashing)
            with self.watch.timed("publish"):
                seal.publish(self.staging_dir, self.snapshot_dir)
            self.progress.final("published %d bytes" % document["total_bytes"])
        except Exception as exc:
            self.fail(exc, result)
            raise
        if self.keeper:
            self.keeper.stop()
        self.watch.total()
        status.update(self.snapshot_dir, "completed", checksum=fingerprint, total_bytes=document["total_bytes"],
                      generation_id=self.generation)
        self.hold_devices()
        return dict(result, changed=True, status="completed", checksum=fingerprint, total_bytes=document["total_bytes"],
                    files=len(document["files"]), versions=self.versions, hashing=hashing,
                    signed_by=None, generation=self.generation_number, expires=self.expires,
                    manifest_path=os.path.join(self.snapshot_dir, manifest.MANIFEST))

    def fail(self, exc, result):
        """Remove what this run wrote and record the failure (the device snapshot leaves the record to its caller, as
        npu_snapshot_backup does)."""
        if self.keeper:
            self.keeper.stop()
        if self.follower:
            self.follower.abort()
        self.discard_plaintext()
        seal.discard(self.staging_dir)
        reason = exc.msg if isinstance(exc, SnapshotError) else "%s: %s" % (type(exc).__name__, exc)
        if self.step == "host snapshot":
            status.update(self.snapshot_dir, "failed", reason=reason, generation_id=self.generation)
        if isinstance(exc, SnapshotError):
            exc.result.update(result, status="failed", cleaned=[self.staging_dir], step=self.step)

    def sealed_for_signature(self, result, document, fingerprint, hashing):
        """The seal phase's result: the staging directory stays, with the claim; its checksum list and manifest go up
        to the controller, which signs the list (plugins/action/host_checkpoint.py)."""
        if self.keeper:
            self.keeper.stop()
        self.watch.total()
        self.hold_devices()
        with open(os.path.join(self.staging_dir, manifest.CHECKSUMS), "rb") as handle:
            checksums = handle.read()
        with open(os.path.join(self.staging_dir, manifest.MANIFEST), "rb") as handle:
            recorded = handle.read()
        self.progress.note("sealed %d bytes; waiting for the controller's signature" % document["total_bytes"],
                           force=True)
        return dict(result, changed=True, status=SEALED, checksum=fingerprint, total_bytes=document["total_bytes"],
                    files=len(document["files"]), versions=self.versions, hashing=hashing,
                    generation=self.generation_number, expires=self.expires,
                    to_sign={"checksums": checksums.decode("utf-8"), "manifest": recorded.decode("utf-8")})

    def publish_signed(self):
        """The publish phase: the controller's signature beside the sealed staging directory, checked to be of its very
        checksum list, then the snapshot published and completed -- all under the claim the seal phase held."""
        taken = claim.take(self.snapshot_dir, self.generation, self.claim_lease)
        result = dict(snapshot_dir=self.snapshot_dir, durations=self.watch.durations, progress=self.progress.lines)
        try:
            if taken.get("took_over") or not os.path.isdir(self.staging_dir):
                raise ParameterError("the sealed snapshot of generation %s is gone from %s (another run took the pod "
                                     "over, or it was removed): nothing to publish" % (self.generation, self.staging_dir))
            with self.watch.timed("publish"):
                try:
                    signed = signature.write(self.staging_dir, json.loads(self.signing.get("signature") or "null"))
                except (ValueError, TypeError) as exc:
                    raise ParameterError("controller_signing: the controller's signature cannot be used: %s" % exc,
                                         field="controller_signing")
                document = manifest.load_manifest(self.staging_dir)
                if document.get("identity") != self.identity:
                    raise ParameterError("identity: the sealed snapshot is of %s, not %s"
                                         % (layout.identity_string(document.get("identity") or {}),
                                            layout.identity_string(self.identity)), field="identity")
                fingerprint = hashing.fingerprint(self.staging_dir)
                latest = statement.accepted(self.signing.get("statement"), self.identity, document.get("generation"),
                                            fingerprint)  # the controller's statement that it is the latest now
                seal.publish(self.staging_dir, self.snapshot_dir)
            self.progress.final("published %d bytes, signed by key %s" % (document["total_bytes"], signed["key_id"]))
        except Exception as exc:
            self.fail(exc, result)
            claim.release(self.snapshot_dir, self.generation)
            raise
        status.update(self.snapshot_dir, "completed", checksum=fingerprint, total_bytes=document["total_bytes"],
                      generation_id=self.generation)
        try:
            if latest:  # under the claim still: no other generation writes its own meanwhile
                statement.write(self.snapshot_dir, latest)
        finally:
            claim.release(self.snapshot_dir, self.generation)
        self.watch.total()
        return dict(result, changed=True, status="completed", checksum=fingerprint, total_bytes=document["total_bytes"],
                    files=len(document["files"]), signed_by=signed["key_id"], generation=document.get("generation"),
                    expires=document.get("expires"), generation_id=self.generation,
                    manifest_path=os.path.join(self.snapshot_dir, manifest.MANIFEST))

    def abort_signing(self):
        """The controller refused to sign the sealed snapshot: remove it, record the failure, let the pod go."""
        claim.take(self.snapshot_dir, self.generation, self.claim_lease)
        reason = "signing_refused: the controller did not sign the sealed snapshot: %s" % (
            self.signing.get("reason") or "no reason given")
        existed = seal.discard(self.staging_dir)
        status.update(self.snapshot_dir, "failed", reason=reason, generation_id=self.generation)
        claim.release(self.snapshot_dir, self.generation)
        return dict(snapshot_dir=self.snapshot_dir, changed=existed, status="failed", reason=reason,
                    cleaned=[self.staging_dir] if existed else [], generation_id=self.generation)

    def hold_devices(self):
        """The engine that was snapshotted runs on its devices from this snapshot's state: enter it in the record of
        restores (fleet.py), so that a clone is never restored onto the device of the process it was taken from."""
        keys, pid = self.driver.device_keys(), self.driver.pid
        if keys is None:
            return
        try:
            entry = fleet.begin(self.snapshot_dir, keys, 0, identity=self.identity, pid=pid)
            fleet.running(self.snapshot_dir, entry, pid)
        except fleet.Busy as exc:
            if (exc.holder or {}).get("pid") != pid:  # another live process holds it: say so, keep the snapshot
                self.progress.note("the record of restores says: %s" % exc.reason, force=True)
        except (IOError, OSError) as exc:  # informative: the snapshot is completed either way
            self.progress.note("cannot enter the engine in the record of restores: %s" % exc, force=True)

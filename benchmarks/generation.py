# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generation: the modules' generate playbook, its lock window, the raw checkpoint variants, the encrypted variant.
Part of benchmarks/run.py's Bench."""

from __future__ import absolute_import, division, print_function

import datetime
import os
import shutil
import time
import uuid

from common import AGENT_LINE, DEVICE_SHARE, docker, run  # pylint: disable=import-error
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout


class Generation:
    """A mixin of benchmarks/run.py's Bench."""

    def record_generate(self, gen, w, rep, variant):
        tasks = {r["action"].split(".")[-1]: r for r in gen["records"]}
        checkpoint = tasks["host_checkpoint"]
        durations = checkpoint["result"]["durations"]
        module_totals = {name: task["result"]["durations"].get("total", sum(task["result"]["durations"].values()))
                         for name, task in tasks.items() if "durations" in task["result"]}  # not the signing key's
        # host_checkpoint's start on the wall clock the engine's log is dated with (the callback times are monotonic)
        started = gen["wall_t0"] + (checkpoint["start"] - gen["t0"])
        window = self.lock_window(w["name"], gen["wall_t0"], started) if not w.get("pid") else None
        sample = self.record("checkpoint", variant, w["size_mb"], rep, durations["total"], stages=durations,
                             task_wall_s=round(checkpoint["end"] - checkpoint["start"], 3),
                             total_bytes=checkpoint["result"]["total_bytes"], hashing=checkpoint["result"].get("hashing"))
        self.record("generate", variant, w["size_mb"], rep, gen["wall"], module_totals=module_totals,
                    task_walls={name: round(task["end"] - task["start"], 3) for name, task in tasks.items()},
                    lock_window=window)
        if window:
            self.record("lock_window", variant, w["size_mb"], rep, window["window_s"], **window)
        return sample

    @staticmethod
    def lock_window(name, since, checkpoint_started=None):
        """The engine's own account of the generation (its agent logs every transition, docker logs timestamps each
        line): from the lock's start to the unlock's end, and the parts: lock, backup, the time between the backup and
        the resume (the host checkpoint, and what drives it; of which ``to_checkpoint_s`` passed before
        host_checkpoint's task started), restore, unlock."""
        proc = run(["docker", "logs", "--timestamps", "--since", "%.3f" % (since - 1.0), name], check=False)
        events = []
        for line in (proc.stdout + "\n" + proc.stderr).splitlines():
            match = AGENT_LINE.match(line.strip())
            if match:
                stamp = match.group(1)
                day, clock = stamp.rstrip("Z").split("T")
                whole, _dot, frac = clock.partition(".")
                moment = datetime.datetime.strptime("%sT%s" % (day, whole), "%Y-%m-%dT%H:%M:%S").replace(
                    tzinfo=datetime.timezone.utc).timestamp() + float("0." + (frac or "0"))
                events.append((moment, match.group(2), float(match.group(5))))
        events.sort()
        locks = [i for i, event in enumerate(events) if event[1] == "lock"]
        if not locks:
            return None
        after = events[locks[-1]:]
        ends = [i for i, event in enumerate(after) if event[1] == "unlock"]
        if not ends:
            return None
        after = after[:ends[0] + 1]
        by_op = {op: (moment, seconds) for moment, op, seconds in after}
        start = by_op["lock"][0] - by_op["lock"][1]
        end = by_op["unlock"][0]
        resume_start = (by_op["restore"][0] - by_op["restore"][1]) if "restore" in by_op else (end - by_op["unlock"][1])
        out = {"window_s": round(end - start, 4), "lock_s": by_op["lock"][1], "unlock_s": by_op["unlock"][1],
               "backup_s": by_op.get("backup", (None, None))[1], "restore_s": by_op.get("restore", (None, None))[1]}
        if "backup" in by_op:
            out["between_s"] = round(resume_start - by_op["backup"][0], 4)
            if checkpoint_started is not None:  # 0 when host_checkpoint took the backup itself (device_backup)
                out["to_checkpoint_s"] = round(max(0.0, checkpoint_started - by_op["backup"][0]), 4)
        return out

    def resume_var(self, resume, device_backup=True):
        """Playbook vars: host_checkpoint's resume when this checkout has it (else the playbook's unlock task resumes),
        and its device_backup (the roles' sequence) unless ``device_backup`` is false or it has none."""
        out = {"bench_resume": resume} if self.has_resume else {}
        if self.has_device_backup and resume and device_backup:
            out["bench_device_backup"] = True
        return out

    def encryption_size_mb(self):
        """Encrypted vs plain is measured at 2 GiB, or at the largest size of the run below it (a quick run)."""
        below = [size for size in self.args.sizes_mb if size <= 2048]
        return 2048 if 2048 in self.args.sizes_mb else (max(below) if below else min(self.args.sizes_mb))

    def encrypted_generate(self, w, rep):
        """The same engine's generation with host_checkpoint's encryption_key, into its own snapshot directory."""
        return self.other_generate(w, rep, "enc", "host_checkpoint_runc_encrypted",
                                   bench_encryption_key=self.encryption["key_file"])

    def unsigned_generate(self, w, rep):
        """The same engine's generation without a signature, into its own snapshot directory: what the node restores
        unauthenticated (no keys) -- the fast path the secure default is compared with."""
        return self.other_generate(w, rep, "unsigned", "host_checkpoint_runc_unsigned", bench_unsigned=True)

    def other_generate(self, w, rep, suffix, variant, **extra):
        other = dict(w, snapshot_dir=w["snapshot_dir"] + "-" + suffix, identity=dict(w["identity"]))
        other["identity"]["pod"] = os.path.basename(other["snapshot_dir"])
        self.settle()
        try:
            gen = self.playbook("generate", [other], **dict(self.resume_var(True), **extra))
        except RuntimeError as exc:
            self.record("checkpoint", variant, w["size_mb"], rep, None, error=str(exc)[:2000])
            return None
        self.record_generate(gen, w, rep, variant)
        return other

    def raw_runc_checkpoint(self, w, cid, rep, beside, variant="raw_runc_checkpoint", parent=None):
        """The generation's floor: a raw ``runc checkpoint --leave-running`` of the engine, backed up first as a
        generation leaves it, into ``parent`` (the bench's work dir, on the store's filesystem). Measured right before
        and right after the generation it judges (``beside``), so that the floor and the generation share the load."""
        pid = int(docker("inspect", "--format", "{{.State.Pid}}", w["name"]))
        parent = parent or self.workdir
        target = os.path.join(parent, "runc-%s" % uuid.uuid4().hex[:6])
        work = os.path.join(parent, "runc-work-%s" % uuid.uuid4().hex[:6])
        self.backup(pid)
        try:
            os.makedirs(target, mode=0o700)
            os.makedirs(work, mode=0o700)
            self.settle()
            t0 = time.monotonic()
            run(["runc", "--root", layout.DOCKER_RUNC_ROOT, "checkpoint", "--leave-running", "--image-path", target,
                 "--work-path", work, cid])
            seconds = time.monotonic() - t0
            self.record("checkpoint", variant, w["size_mb"], rep, seconds, total_bytes=self.snapshot_bytes(target),
                        beside=beside)
        finally:
            shutil.rmtree(target, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
            self.resume(pid)

    def checkpoint_variants(self, w, cid, rep, docker_paths=True, tmpfs=True):
        """Raw runc checkpoint into tmpfs, plain docker checkpoint create, and host_checkpoint method=docker (the raw
        runc checkpoint on disk is measured beside the generation: raw_runc_checkpoint)."""
        # The tmpfs variant holds the images in RAM beside the engine and its device: only where they fit easily.
        with open("/proc/meminfo") as handle:
            mem_mb = int(handle.readline().split()[1]) / 1024.0
        if tmpfs and w["size_mb"] * (2 + DEVICE_SHARE) < 0.6 * mem_mb:
            self.raw_runc_checkpoint(w, cid, rep, None, "raw_runc_checkpoint_tmpfs", self.shmdir)
        pid = int(docker("inspect", "--format", "{{.State.Pid}}", w["name"]))
        self.backup(pid)
        try:
            if not self.args.skip_docker_checkpoint and docker_paths:
                target = os.path.join(self.workdir, "docker-cp")
                store_before = self.content_store_mb()
                self.settle()
                before = self.profile(cid)
                t0 = time.monotonic()
                docker("checkpoint", "create", "--leave-running", "--checkpoint-dir", target, w["name"], "cp1")
                seconds = time.monotonic() - t0
                profile = self.diff_profile(before, self.profile(cid))
                self.record("checkpoint", "raw_docker_checkpoint", w["size_mb"], rep, seconds, profile=profile,
                            total_bytes=self.snapshot_bytes(target), content_store_growth_mb=(self.content_store_mb() or 0) - (store_before or 0))
                shutil.rmtree(target)
        finally:
            self.resume(pid)
        if not self.args.skip_docker_checkpoint and docker_paths and rep == 0:
            other = dict(w, snapshot_dir=w["snapshot_dir"] + "-docker", identity=dict(w["identity"]))
            other["identity"]["pod"] = os.path.basename(other["snapshot_dir"])
            self.settle()
            gen = self.playbook("generate", [other], bench_checkpoint_method="docker")
            self.record_generate(gen, w, rep, "host_checkpoint_docker")
            shutil.rmtree(other["snapshot_dir"], ignore_errors=True)

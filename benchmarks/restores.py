# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restores: snapshot_restore's methods, docker run --runtime, the raw Docker path, the encrypted variant. Part of
benchmarks/run.py's Bench."""

from __future__ import absolute_import, division, print_function

import json
import os
import shutil
import tempfile
import time

from common import FirstAnswer, OPENER, docker, log, run  # pylint: disable=import-error
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import docker_cli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import checkpoint, containerd_leak
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import (container_record,
                                                                                   status)


class Restores:
    """A mixin of benchmarks/run.py's Bench."""

    def encrypted_restores(self, w, encrypted, rep):
        enc = dict(encrypted, record=w["record"])
        # method docker refuses an encrypted snapshot by design (Docker would copy the plaintext through containerd)
        self.module_restore(enc, rep, self.fastest_method(), tag="_encrypted", bench_encryption_keys=[self.encryption["key_file"]])
        if self.runtime_installed:
            self.runtime_run_restore(enc, rep, tag="_encrypted")

    def unauthenticated_restore(self, w, unsigned, rep):
        """docker run --runtime of the unsigned snapshot on a node that trusts no key and requires no signature: the
        unauthenticated fast path, side by side with the secure default (docker_run_runtime: signed, the node
        requiring it). Both read only bytes hashed in the same read; the difference is the signature's check."""
        with self.runtime_settings(trusted_keys=[], require_signature=False):
            self.runtime_run_restore(dict(unsigned, record=w["record"]), rep, tag="_unauthenticated")

    def module_restore(self, w, rep, method, cold_cache=False, tag="", warm=None, **extra):
        """snapshot_restore through ansible-playbook; the snapshot in the page cache (just taken) or not (restored later).
        ``warm``: what the page cache holds instead of the snapshot (the staged copy a staged restore reads)."""
        variant = "snapshot_restore" + ("_" + method if method else "") + tag + ("_cold_cache" if cold_cache else "")
        self.settle(warm=() if cold_cache else (warm or [w["snapshot_dir"]]))
        wall_t0 = time.time()
        t0 = time.monotonic()
        poll = FirstAnswer(w["url"], None, t0, 1800)
        poll.start()
        if method:
            extra["bench_restore_method"] = method
        if self.runtime_installed and (method or self.restore_default) in ("runtime", "auto"):
            extra["bench_runtime_name"] = self.prefix  # the bench's own runtime (auto looks for it by this name too)
        try:
            result = self.playbook("restore", [w], **extra)
        except RuntimeError as exc:
            if not tag:
                raise
            poll.stop.set()
            self.record("ttfa", variant, w["size_mb"], rep, None, correct=False, restored=False, error=str(exc)[:2000])
            self.remove(w)
            self.reset_device(w)
            return
        seconds, answer = poll.result(60)
        task = [r for r in result["records"] if r["action"].endswith("snapshot_restore")][0]  # after the key's task
        restored = task["result"].get("restored") is True and self.was_restored(w, wall_t0)
        correct = self.check_answers(w, answer) and restored
        durations = task["result"]["durations"]
        self.record("ttfa", variant, w["size_mb"], rep, seconds, correct=correct, restored=restored, stages=durations,
                    module_total_s=durations["total"], task_wall_s=round(task["end"] - task["start"], 3),
                    playbook_wall_s=round(result["wall"], 3), reason=task["result"].get("reason"),
                    placement=task["result"].get("placement"), verify=task["result"].get("verify"),
                    runtime=task["result"].get("runtime_record"), method=task["result"].get("method"),
                    method_reason=task["result"].get("method_reason"))
        self.record("host_restore", variant, w["size_mb"], rep, durations.get("host_restore"))
        self.remove(w)
        self.reset_device(w)

    def runtime_run_restore(self, w, rep, cold_cache=False, tag="", warm=None):
        """`docker run --runtime <restore-on-create runtime>` with INFEROPS_RESTORE_FROM, no Ansible: the restore path
        at its shortest (the runtime verifies, runs `runc restore`, writes the metadata, restores the device, all
        inside the container's create); to the first correct answer."""
        variant = "docker_run_runtime" + tag + ("_cold_cache" if cold_cache else "")
        snap = w["snapshot_dir"]
        identity = "/".join(w["identity"][k] for k in ("namespace", "service", "instance", "pod"))
        env = {layout.ENV_RESTORE_FROM: snap, "INFEROPS_RESTORE_IDENTITY": identity}
        argv = ["run", "--detach", "--runtime", self.prefix] + self.with_env_file(
            container_record.create_args(w["record"], w["name"], env))
        self.settle(warm=() if cold_cache else (warm or [snap]))
        wall_t0 = time.time()
        t0 = time.monotonic()
        poll = FirstAnswer(w["url"], None, t0, 1800)
        poll.start()
        docker(*argv)
        run_s = time.monotonic() - t0
        try:
            seconds, answer = poll.result(120)
        except RuntimeError:
            self.why_no_answer(w)
            raise
        restored = self.was_restored(w, wall_t0)
        last = (status.read(snap) or {}).get("last_restore") or {}
        self.record("ttfa", variant, w["size_mb"], rep, seconds, restored=restored, correct=self.check_answers(w, answer) and restored,
                    docker_run_s=round(run_s, 3), runtime=last, reason=last.get("reason"),
                    stages={"host_restore": round(run_s, 3)})
        self.remove(w)
        self.reset_device(w)

    def with_env_file(self, create):
        """A CreateArgs as docker's arguments: its environment (the restore request included) in an --env-file, 0600,
        as DockerCli.create hands it over -- a CreateArgs used as a plain list has no environment at all."""
        path, by_name = docker_cli.write_env_file(tempfile.mkdtemp(dir=self.workdir), create.env)
        if by_name:
            raise RuntimeError("the bench's workloads have no multi-line environment values: %s" % sorted(by_name))
        return ["--env-file", path] + list(create)

    def why_no_answer(self, w):
        """What to read when a restored container never answers (the run's work dir goes at its end): the
        container's state and log, and the node runtime's last record."""
        state = docker("inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}} {{.State.Error}}", w["name"],
                       check=False)
        logs = run(["docker", "logs", "--tail", "20", w["name"]], check=False)
        log("no answer from %s: container %s; its log:\n%s%s\nthe runtime's last record: %s"
            % (w["name"], state, logs.stdout, logs.stderr, json.dumps((self.runtime_log() or [None])[-1])[:4000]))

    def recreate_args(self, w, verb, env_overrides=None):
        record = container_record.read_container_record(w["snapshot_dir"])
        args = ["create"] + self.with_env_file(container_record.create_args(record, w["name"], env_overrides))
        return [verb] + args[1:]

    def write_metadata(self, name):
        """What snapshot_restore's prepare stage does (docker cp of /run/inferops-snapshot/metadata.json).

        It also makes /run/inferops-snapshot exist in the new container's filesystem: the restored agent's
        unix socket is bound there, and CRIU cannot restore it into a missing directory.
        """
        scratch = tempfile.mkdtemp(dir=self.workdir)
        staged = os.path.join(scratch, "inferops-snapshot")
        os.mkdir(staged, 0o700)
        with open(os.path.join(staged, "metadata.json"), "w") as handle:
            json.dump({"env": {"INFEROPS_BENCH": "1"}, "container": name, "restored": True}, handle)
        docker("cp", staged, "%s:/run" % name)
        shutil.rmtree(scratch)

    def was_restored(self, w, wall_t0):
        """True when the answering process is the checkpointed one (started before this restore began)."""
        with OPENER.open(w["url"] + "/v1/info", timeout=30) as response:
            return json.loads(response.read())["started_at"] < wall_t0

    def raw_docker_restore(self, w, rep):
        """docker create + hard-linked images + docker start --checkpoint + device restore (no ansible, no verify)."""
        self.settle(warm=[w["snapshot_dir"]])
        wall_t0 = time.time()
        t0 = time.monotonic()
        poll = FirstAnswer(w["url"], None, t0, 1800)
        poll.start()
        docker(*self.recreate_args(w, "create"))
        cid = docker("inspect", "--format", "{{.Id}}", w["name"])
        self.write_metadata(cid)
        checkpoint.place_checkpoint(layout.images_dir(w["snapshot_dir"]), cid, "bench", layout.DOCKER_ROOT)
        store_before = self.content_store_mb()
        before = self.profile()
        guard = containerd_leak.LeakGuard(layout.images_dir(w["snapshot_dir"])).__enter__()
        t1 = time.monotonic()
        docker("start", "--checkpoint", "bench", cid)
        start_s = time.monotonic() - t1
        guard.sweep()  # containerd keeps a copy of the images per start (containerd#10166); not timed
        after = self.profile(cid)
        after.setdefault("shim", {})
        before["shim"] = {}
        profile = self.diff_profile(before, after)
        t2 = time.monotonic()
        self.resume(int(docker("inspect", "--format", "{{.State.Pid}}", cid)))
        device_s = time.monotonic() - t2
        seconds, answer = poll.result(60)
        restored = self.was_restored(w, wall_t0)
        self.record("ttfa", "raw_docker_start_checkpoint", w["size_mb"], rep, seconds, restored=restored,
                    correct=self.check_answers(w, answer) and restored, stages={"host_restore": round(start_s, 3), "device_restore": round(device_s, 3)})
        self.record("host_restore", "raw_docker_start_checkpoint", w["size_mb"], rep, start_s, profile=profile,
                    content_store_growth_mb=(self.content_store_mb() or 0) - (store_before or 0))
        self.remove(w)
        self.reset_device(w)

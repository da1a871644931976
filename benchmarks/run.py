# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""inferops.snapshot benchmark: cold start vs restore, verification and checkpoint speed, on this machine.

    make bench                       # full run: sizes 0.25 0.5 1 2 8 GiB, 3 runs (1 at 8), 30 s warmup
    make bench BENCH_ARGS=--quick    # development: small sizes, 1 run, 3 s warmup
    .venv/bin/python benchmarks/run.py --help

Everything users run goes through ansible-playbook with the collection's modules (the playbooks in
benchmarks/playbooks); the alternatives (raw criu, raw runc, plain docker checkpoint / start
--checkpoint, docker run --runtime, sha256sum) run side by side on the same workloads in the same
run, and so do the floors each part of a restore and of a generation is compared with (SHA-256,
CRIU's page copy, the device copy of the simulated NPU, an fsync'd write, a trivial container, a
tiny CRIU restore, a one-task playbook). Writes results/<stamp>/{bench.json,results.md,chart.png}
(see benchmarks/report.py) and points results/latest at it. Needs root, the environment of
scripts/env/setup.sh and the workload image.

One file per benchmark, each a mixin of ``Bench`` below: floors.py (physical limits, fixed costs), files.py
(verification variants), generation.py, restores.py, bare_process.py, orchestration.py, runtime.py (the node
runtime and staged restores); base.py has the state and tools they share, common.py the paths, commands and
machine facts. This file is the driver: the per-size sequence, detection of what the collection offers, the CLI.
"""

from __future__ import absolute_import, division, print_function

import argparse
import datetime
import importlib
import json
import os
import shutil
import signal
import sys
import time

from common import (  # pylint: disable=import-error
    BIN, COLLECTIONS, DEVICE_SHARE, IMAGE, REPO, become_subreaper, control_mounts_below, docker, load_average, log,
    machine_info, run, stage_cache,
)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import container_record
import report  # pylint: disable=import-error
from base import BenchBase  # pylint: disable=import-error
from bare_process import BareProcess  # pylint: disable=import-error
from files import Files  # pylint: disable=import-error
from floors import Floors  # pylint: disable=import-error
from generation import Generation  # pylint: disable=import-error
from orchestration import Orchestration  # pylint: disable=import-error
from restores import Restores  # pylint: disable=import-error
from runtime import Runtime  # pylint: disable=import-error


class Bench(BenchBase, Floors, Files, Generation, Restores, BareProcess, Orchestration, Runtime):
    """One run: every benchmark (a mixin each, one file each), size by size."""

    # -- the per-size sequence -----------------------------------------------------------------------------------
    def one_size(self, size_mb, rep):
        args = self.args
        focus = args.focus  # only what the goals (docs/benchmarks.md "Each part against its floor") are measured with
        docker_paths = size_mb <= args.docker_paths_max_mb and not focus  # Docker's own checkpoint path: up to this size
        self.device_copy(size_mb, rep)  # first, while the machine's memory is free
        w = self.new_workload(size_mb, "w")
        encrypted = unsigned = None
        try:
            self.settle()
            self.cold_start(w, rep, args.warmup)
            cid = docker("inspect", "--format", "{{.Id}}", w["name"])
            # A/B of hashing during the checkpoint, and of resuming the engine inside host_checkpoint vs in a task of its
            # own after it (snapshot kept: the default generation, measured last).
            if not focus:
                self.settle()
                gen = self.playbook("generate", [w], bench_hash_during_checkpoint=False, **self.resume_var(True))
                self.record_generate(gen, w, rep, "host_checkpoint_runc_hash_after")
                if self.has_resume:
                    self.settle()
                    gen = self.playbook("generate", [w], **self.resume_var(False))
                    self.record_generate(gen, w, rep, "host_checkpoint_runc_unlock_task")
            if self.has_device_backup:  # the sequence before it: the backup in a task of its own, side by side
                self.settle()
                gen = self.playbook("generate", [w], **self.resume_var(True, device_backup=False))
                self.record_generate(gen, w, rep, "host_checkpoint_runc_backup_task")
            # The default generation between two raw runc checkpoints and beside the fsync'd write: its floors share
            # its load (a floor measured apart from what it judges drifts with the machine).
            self.raw_runc_checkpoint(w, cid, rep, "before")
            self.settle()
            gen = self.playbook("generate", [w], **self.resume_var(True))
            sample = self.record_generate(gen, w, rep, "host_checkpoint_runc")
            w["record"] = container_record.read_container_record(w["snapshot_dir"])
            self.raw_runc_checkpoint(w, cid, rep, "after")
            self.fsync_write(size_mb, sample["total_bytes"], rep)
            self.verify_rate(w, rep)
            if self.encryption and size_mb == self.encryption_size_mb():
                self.encryption_floor(size_mb, sample["total_bytes"], rep)
                encrypted = self.encrypted_generate(w, rep)
            if self.runtime_installed and size_mb == self.encryption_size_mb():
                unsigned = self.unsigned_generate(w, rep)
            if not focus:
                self.verify_variants(w, rep)
            if not focus:  # raw runc on disk is measured beside the generation above
                self.checkpoint_variants(w, cid, rep, docker_paths)
            self.remove(w)
            self.reset_device(w)
            fastest = self.fastest_method()
            for method in self.methods_at(docker_paths):
                self.module_restore(w, rep, method)
                if method == fastest and not args.skip_cold_cache_restore:  # verify from storage, on the best path
                    self.module_restore(w, rep, method, cold_cache=True)
            if self.runtime_installed:
                self.runtime_run_restore(w, rep)
                if self.lazy_pages:
                    with self.runtime_settings(lazy_pages=True):
                        self.runtime_run_restore(w, rep, tag="_lazy")
                if self.staging and "runtime" in self.restore_methods:
                    self.staged_restores(w, rep)
                if not args.skip_cold_cache_restore:
                    self.runtime_run_restore(w, rep, cold_cache=True)
            if encrypted:
                self.encrypted_restores(w, encrypted, rep)
            if unsigned:
                self.unauthenticated_restore(w, unsigned, rep)
            if docker_paths:
                self.raw_docker_restore(w, rep)
        finally:
            self.remove(w)
            shutil.rmtree(w["snapshot_dir"], ignore_errors=True)
            for other in (encrypted, unsigned):
                if other:
                    shutil.rmtree(other["snapshot_dir"], ignore_errors=True)
            shutil.rmtree(w["device_dir"], ignore_errors=True)
        if not focus:
            self.bare_process(size_mb, rep)

    # -- driver -------------------------------------------------------------------------------------------------------------------------
    @staticmethod
    def module_options(module):
        """The options of a module of this checkout: its argument spec, else what ansible-doc documents; {} when
        neither can be read."""
        try:
            imported = importlib.import_module("ansible_collections.inferops.snapshot.plugins.modules." + module)
            if isinstance(getattr(imported, "ARGUMENT_SPEC", None), dict):
                return imported.ARGUMENT_SPEC
        except Exception:  # pylint: disable=broad-except  # any failure: ask ansible-doc
            pass
        proc = run([os.path.join(BIN, "ansible-doc"), "-j", "inferops.snapshot." + module], check=False,
                   env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS))
        try:
            return json.loads(proc.stdout)["inferops.snapshot." + module]["doc"].get("options") or {}
        except (ValueError, KeyError, AttributeError):
            return {}

    def detect_encryption(self):
        """Encrypted vs plain, when host_checkpoint has encryption_key and snapshot_restore encryption_keys: a 256-bit
        key (hex) in a root-only 0600 file outside the snapshot store, given to the modules and to the node's runtime."""
        if "encryption_key" not in self.module_options("host_checkpoint") or \
                "encryption_keys" not in self.module_options("snapshot_restore"):
            return None
        keys = os.path.join(self.workdir, "keys")
        os.makedirs(keys, mode=0o700, exist_ok=True)
        path = os.path.join(keys, "bench.key")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(os.urandom(32).hex() + "\n")
        return {"key_file": path}

    def detect_restore_methods(self):
        """Extra snapshot_restore methods (e.g. the restore-on-create runtime) when the module offers them."""
        option = self.module_options("snapshot_restore").get("method") or {}
        default = option.get("default")
        self.restore_default = default or "docker"
        return [choice for choice in option.get("choices") or [] if choice != default]

    def fastest_method(self):
        """The method the floors are compared with: the restore-on-create runtime when the module has it."""
        if "runtime" in self.restore_methods:
            return "runtime"
        return self.restore_methods[-1] if self.restore_methods else None

    def methods_at(self, docker_paths):
        """snapshot_restore methods to measure at a size (None: the module's default); Docker's own path only up to
        --docker-paths-max."""
        methods = [None] + self.restore_methods
        if not docker_paths:
            methods = [m for m in methods if (m or self.restore_default) != "docker"]
        return methods or [self.fastest_method()]

    def cleanup(self):
        out = docker("ps", "-a", "--filter", "name=^%s-" % self.prefix, "--format", "{{.Names}}", check=False)
        for name in out.split():
            docker("rm", "-f", name, check=False)
        for pid in self.bare:
            self.kill_bare(pid)
        if self.runtime_installed:
            try:
                self.node("absent")
            except RuntimeError as exc:
                log("could not remove the runtime %s: %s" % (self.prefix, exc))
        if not control_mounts_below(self.workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.shmdir, ignore_errors=True)

    def main(self):
        args = self.args
        started = time.monotonic()
        result = {"started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "args": vars(args), "load_at_start": load_average(), "machine": machine_info(self.workdir),
                  "image": IMAGE, "device_share": DEVICE_SHARE}
        self.restore_methods = [] if args.no_extra_methods else self.detect_restore_methods()
        self.encryption = None if args.no_encryption else self.detect_encryption()
        # host_checkpoint's resume (the engine unlocked right after the checkpoint), as the roles use it
        self.has_resume = "resume" in self.module_options("host_checkpoint")
        # host_checkpoint's device_backup (the lock and the backup inside it, after its checks), as the roles use it
        self.has_device_backup = "device_backup" in self.module_options("host_checkpoint")
        result["resume"] = self.has_resume
        result["device_backup"] = self.has_device_backup
        result["restore_methods"] = ["default"] + self.restore_methods
        result["restore_default"] = self.restore_default
        result["fastest_method"] = self.fastest_method()
        result["encryption"] = bool(self.encryption)
        self.lazy_pages = "runtime" in self.restore_methods and self.detect_lazy_pages()
        result["lazy_pages"] = self.lazy_pages
        self.staging = stage_cache is not None and "stage_dir" in layout.RUNTIME_DEFAULTS
        result["staging"] = self.staging
        result["docker_paths_max_mb"] = args.docker_paths_max_mb
        result["simulator"] = {"copy_gbps": os.environ.get("ACL_SIM_COPY_GBPS") or "25 (default)",
                               "device_prealloc": os.environ.get("ACL_SIM_DEVICE_PREALLOC") or "huge (default)"}
        log("machine: %s" % json.dumps(result["machine"]))
        log("load at start: %s; extra restore methods: %s; host_checkpoint resume: %s; encrypted variant: %s" % (
            result["load_at_start"], self.restore_methods or "none", self.has_resume,
            "at %s MiB" % self.encryption_size_mb() if self.encryption else "no (host_checkpoint has no encryption_key)"))
        try:
            if "runtime" in self.restore_methods:
                log("installing the restore-on-create runtime %s with the snapshot_node role" % self.prefix)
                self.node("present")
            for rep in range(args.runs):
                self.limits(rep)
                self.fixed_costs(rep, tries=1 if args.quick else 3)
                self.world_files(rep)
                for size_mb in args.sizes_mb:
                    if rep >= args.runs_largest and size_mb == max(args.sizes_mb):
                        continue
                    self.one_size(size_mb, rep)
            for rep in range(args.orchestration_runs):
                for hosts in args.hosts:
                    self.orchestration(hosts, args.orchestration_size_mb, rep)
            self.limits(args.runs)
            result["limits"] = self.limit_summary()
        finally:
            self.cleanup()
        result.update(load_at_end=load_average(), duration_s=round(time.monotonic() - started, 1), samples=self.samples,
                      finished_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        return result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="development run: sizes 0.0625 0.125 GiB, 1 run, 3 s warmup")
    parser.add_argument("--sizes", type=float, nargs="+",
                        help="state sizes in GiB (device + host memory); default 0.25 0.5 1 2 8 (--focus: 0.25 2 4)")
    parser.add_argument("--runs", type=int, help="runs per size (medians are reported); default 3")
    parser.add_argument("--runs-largest", type=int, help="runs at the largest size; default = --runs, 1 when it is above 4 GiB")
    parser.add_argument("--docker-paths-max", type=float, default=2.0,
                        help="largest size (GiB) at which Docker's own checkpoint path (docker checkpoint create, host_checkpoint "
                             "method=docker, snapshot_restore method=docker, docker start --checkpoint) is measured; it is "
                             "linear and slower than the cold start from about 2 GiB on (default 2)")
    parser.add_argument("--no-encryption", action="store_true", help="leave out the encrypted variant even when the modules have it")
    parser.add_argument("--focus", action="store_true",
                        help="only what the floors and goals need: limits, fixed costs, device copy, cold start, one generation "
                             "(lock window, durability), raw runc checkpoint, the fastest snapshot_restore method and docker run "
                             "--runtime (warm and cold cache), the encrypted variant; no verification variants, no Docker "
                             "checkpoint path, no bare process, no orchestration")
    parser.add_argument("--warmup", type=float, help="WORKLOAD_WARMUP_SECONDS of the cold start; default 30")
    parser.add_argument("--world-file-gb", type=float, help="the mounted model file a restore compares; default 2 "
                        "(--quick: 0.25)")
    parser.add_argument("--hosts", type=int, nargs="+", help="inventory sizes for the orchestration overhead; default 1 4")
    parser.add_argument("--orchestration-size", type=float, default=0.25, help="state size (GB) per host there")
    parser.add_argument("--orchestration-runs", type=int, help="default = --runs")
    parser.add_argument("--skip-docker-checkpoint", action="store_true", help="leave out docker checkpoint create (slow)")
    parser.add_argument("--no-extra-methods", action="store_true", help="only snapshot_restore's default method")
    parser.add_argument("--skip-cold-cache-restore", action="store_true",
                        help="leave out snapshot_restore (fastest method) with the snapshot not in the page cache")
    parser.add_argument("--no-settle", action="store_true", help="do not drop caches and pause before each timed variant")
    parser.add_argument("--settle-seconds", type=float, default=2.0, help="pause after dropping caches (default 2)")
    parser.add_argument("--workdir", help="scratch directory on the same filesystem as /var/lib/docker")
    parser.add_argument("--out", default=os.path.join(REPO, "results"), help="results folder (default results/)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    quick = args.quick
    args.sizes = args.sizes or ([0.0625, 0.125] if quick else [0.25, 2, 4] if args.focus else [0.25, 0.5, 1, 2, 8])
    args.sizes_mb = [int(round(s * 1024)) for s in args.sizes]
    args.runs = args.runs or (1 if quick else 3)
    if args.runs_largest is None:
        args.runs_largest = 1 if max(args.sizes_mb) > 4096 else args.runs
    args.docker_paths_max_mb = int(round(args.docker_paths_max * 1024))
    args.warmup = args.warmup if args.warmup is not None else (3.0 if quick else 30.0)
    args.world_file_mb = max(64, int(round((args.world_file_gb or (0.25 if quick else 2.0)) * 1024)) // 64 * 64)
    args.hosts = args.hosts or ([1, 2] if quick else [1, 4])
    args.orchestration_size_mb = int(round((0.0625 if quick and args.orchestration_size == 0.25 else args.orchestration_size) * 1024))
    args.orchestration_runs = args.runs if args.orchestration_runs is None else args.orchestration_runs
    if args.focus:
        args.orchestration_runs = 0
    return args


def main(argv=None):
    args = parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: checkpoints, drop_caches and dockerd need it")
    become_subreaper()
    # A run stopped with SIGTERM or SIGHUP (kill, a closed terminal) still removes its runtime, containers and
    # scratch (Bench.main's finally), as Ctrl-C does; without this, Python would die before the finally ran.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda signum, _frame: sys.exit(128 + signum))
    log("building the workload image %s (scripts/build-workload-image.sh)" % IMAGE)
    run(["bash", os.path.join(REPO, "scripts", "build-workload-image.sh"), IMAGE])
    run(["bash", os.path.join(REPO, "tests", "simulator", "build.sh"), os.path.join(REPO, "build", "simulator")])
    bench = Bench(args)
    result = bench.main()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = os.path.join(os.path.abspath(args.out), stamp + ("-quick" if args.quick else "") + ("-focus" if args.focus else ""))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench.json"), "w") as handle:
        json.dump(result, handle, indent=1, sort_keys=True)
    report.write_report(result, out)
    latest = os.path.join(os.path.abspath(args.out), "latest")
    if os.path.islink(latest):
        os.unlink(latest)
    if not os.path.exists(latest):
        os.symlink(os.path.basename(out), latest)
    log("results in %s (bench.json, results.md, chart.png); load at end %s" % (out, result["load_at_end"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

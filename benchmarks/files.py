# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""File-level measurements: verification variants over the same snapshot. Part of benchmarks/run.py's Bench."""

from __future__ import absolute_import, division, print_function

import os
import subprocess
import time

from common import MB, MIB, run  # pylint: disable=import-error
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import manifest


class Files:
    """A mixin of benchmarks/run.py's Bench."""

    @staticmethod
    def drop_caches():
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")

    def settle(self, warm=()):
        """Same starting point for every timed variant: page cache dropped (only ``warm`` snapshots read
        back in), then a pause. On this VM freed memory goes back to the hypervisor after a moment (virtio
        balloon free page reporting) and fresh memory is slow to fault in, so without this whichever
        variant ran right after a big free would look faster."""
        if self.args.no_settle:
            return
        self.drop_caches()
        for path in warm:
            self.read_all(path)
        time.sleep(self.args.settle_seconds)

    @staticmethod
    def snapshot_bytes(snap):
        total = 0
        for directory, _dirs, files in os.walk(snap):
            for name in files:
                total += os.lstat(os.path.join(directory, name)).st_size
        return total

    @staticmethod
    def read_all(snap):
        """Read every file once, no hashing: the storage (cold) or page cache (warm) limit."""
        buf = bytearray(4 * MIB)
        for directory, _dirs, files in os.walk(snap):
            for name in files:
                with open(os.path.join(directory, name), "rb", buffering=0) as handle:
                    while handle.readinto(buf):
                        pass

    def verify_rate(self, w, rep):
        """snapshot_verify through ansible on a snapshot in the page cache, and SHA-256 on all cores right beside it:
        the module's own hashing rate against the machine's (the goal: >= 0.9x)."""
        self.read_all(w["snapshot_dir"])
        seconds, extra = self.verify_module(w)
        self.record("verify", "snapshot_verify_module_warm", w["size_mb"], rep, seconds,
                    mb_s=round(self.snapshot_bytes(w["snapshot_dir"]) / MB / seconds, 1), **extra)
        self.sha256_beside(w["size_mb"], rep)

    def verify_module(self, w):
        """(task seconds, what the module reported) of one snapshot_verify through ansible-playbook."""
        result = self.playbook("verify", [w])
        task = [r for r in result["records"] if r["action"].endswith("snapshot_verify")][0]
        return task["end"] - task["start"], {"module_total_s": task["result"]["durations"]["total"],
                                             "hash_s": task["result"]["durations"]["hash"],
                                             "module_mb_s": task["result"]["throughput_mb_s"],
                                             "workers": task["result"]["workers"], "reader": task["result"].get("reader"),
                                             "playbook_wall_s": round(result["wall"], 3)}

    def verify_variants(self, w, rep):
        """snapshot_verify (through ansible and in-process) vs sha256sum over the same files, warm and cold."""
        snap = w["snapshot_dir"]
        nbytes = self.snapshot_bytes(snap)
        with open(os.path.join(snap, manifest.CHECKSUMS)) as handle:
            files = sorted(manifest.parse_checksums(handle.read()))

        def module():
            return self.verify_module(w)

        def inproc(workers=None):
            t0 = time.monotonic()
            valid, reasons, details = manifest.verify(snap, expect={"identity": w["identity"]}, workers=workers)
            if not valid:
                raise RuntimeError("verify: %s" % reasons)
            return time.monotonic() - t0, {"workers": details["hashing"]["workers"], "chunks": details["hashing"].get("chunks"),
                                           "chunked_files": details["hashing"].get("chunked_files")}

        def sha256sum():
            t0 = time.monotonic()
            run(["sha256sum", "--check", "--strict", "--quiet", manifest.CHECKSUMS], cwd=snap)
            return time.monotonic() - t0, {}

        def sha256sum_parallel():
            listing = os.path.join(self.workdir, "files-%s.list" % w["name"])
            with open(listing, "w") as handle:
                handle.write("".join(rel + "\n" for rel in files))
            t0 = time.monotonic()
            run(["xargs", "-a", listing, "-d", "\\n", "-P", str(os.cpu_count() or 1), "-n", "1", "sha256sum"], cwd=snap)
            seconds = time.monotonic() - t0
            os.unlink(listing)
            return seconds, {}

        def read_only():
            t0 = time.monotonic()
            self.read_all(snap)
            return time.monotonic() - t0, {}

        variants = [("snapshot_verify_module", module), ("snapshot_verify_inprocess", inproc),
                    ("snapshot_verify_inprocess_1worker", lambda: inproc(1)), ("sha256sum_c", sha256sum),
                    ("sha256sum_parallel", sha256sum_parallel), ("read_only", read_only)]
        for cache in ("warm", "cold"):
            for variant, func in variants:
                if cache == "cold":
                    self.drop_caches()
                else:
                    self.read_all(snap)
                seconds, extra = func()
                self.record("verify", "%s_%s" % (variant, cache), w["size_mb"], rep, seconds,
                            mb_s=round(nbytes / MB / seconds, 1), bytes=nbytes, **extra)

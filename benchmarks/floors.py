# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Physical limits, fixed costs and floors, measured in the same run. Part of benchmarks/run.py's Bench."""

from __future__ import absolute_import, division, print_function

import contextlib
import ctypes
import hashlib
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from common import HERE, IMAGE, MB, MIB, SIM_LIBRARY, docker, run, sizes_of  # pylint: disable=import-error
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import digests, world
import report  # pylint: disable=import-error


class Floors:
    """A mixin of benchmarks/run.py's Bench."""

    def limits(self, rep, tries=3):
        """What this machine can do at most: SHA-256 on one core and on all cores, copying into new
        memory, faulting fresh memory in. Measured at the start of every run and at the end, because
        the load others put on the machine changes; the report gives the best and the median."""
        buf = os.urandom(256 * MIB)
        for _attempt in range(tries):
            one = self.sha256_seconds(buf, 1)
            cores = os.cpu_count() or 1
            every = self.sha256_seconds(buf, cores)
            t0 = time.monotonic()
            copy = bytearray(buf)
            memcpy = time.monotonic() - t0
            del copy
            self.settle()
            t0 = time.monotonic()
            fresh = bytearray(len(buf))  # calloc: fresh pages, each faulted in (and zeroed) once
            fault = time.monotonic() - t0
            del fresh
            faulted = bytearray(buf)  # its pages are faulted in by this first copy
            target = memoryview(faulted)
            t0 = time.monotonic()
            target[:] = buf  # one memcpy (a bytearray slice assignment is not)
            memcpy_faulted = time.monotonic() - t0
            target.release()
            del faulted
            criu_copy = self.criu_copy_limit(buf)
            for key, seconds, nbytes in (("sha256_one_core", one, len(buf)), ("sha256_all_cores", every, len(buf) * cores),
                                         ("memcpy", memcpy, len(buf)), ("fault_in_fresh_memory", fault, len(buf)),
                                         ("memcpy_faulted", memcpy_faulted, len(buf)), ("criu_copy", criu_copy, len(buf))):
                self.record("limits", key, None, rep, seconds, mb_s=round(nbytes / MB / seconds, 1))

    @staticmethod
    def sha256_seconds(buf, threads):
        """Seconds for ``threads`` threads to hash ``buf`` each (from memory, 4 MiB updates; hashlib drops the GIL)."""
        view = memoryview(buf)

        def hash_all():
            digest = hashlib.sha256()
            for offset in range(0, len(buf), 4 * MIB):
                digest.update(view[offset:offset + 4 * MIB])

        return Floors.threads_seconds([threading.Thread(target=hash_all) for _index in range(threads)])

    @staticmethod
    def threads_seconds(workers):
        """Seconds from starting ``workers`` (threads) until the last has ended."""
        t0 = time.monotonic()
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        return time.monotonic() - t0

    def sha256_beside(self, size_mb, rep, tries=3):
        """SHA-256 on all cores, right beside the verification it judges (floors measured at the start and the end
        of a run drift with the load of the run)."""
        buf = os.urandom(256 * MIB)
        cores = os.cpu_count() or 1
        for _attempt in range(tries):
            seconds = self.sha256_seconds(buf, cores)
            self.record("floor", "sha256_all_cores", size_mb, rep, seconds, mb_s=round(len(buf) * cores / MB / seconds, 1))

    def criu_copy_limit(self, buf):
        """CRIU's page restore at its floor: one preadv() of a pages image that is in the page cache into fresh
        anonymous memory (what `criu restore` does for each memory area; 2.4-2.5 GB/s measured here on 2026-12-01)."""
        path = os.path.join(self.workdir, "limits-pages-%s.img" % uuid.uuid4().hex[:6])
        with open(path, "wb") as handle:
            handle.write(buf)
        try:
            self.read_all_file(path)
            self.settle(warm=[path])
            fd = os.open(path, os.O_RDONLY)
            try:
                target = mmap.mmap(-1, len(buf), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                t0 = time.monotonic()
                got = os.preadv(fd, [target], 0)
                seconds = time.monotonic() - t0
                target.close()
            finally:
                os.close(fd)
            if got != len(buf):
                raise RuntimeError("preadv read %d of %d bytes" % (got, len(buf)))
            return seconds
        finally:
            os.unlink(path)

    @staticmethod
    def read_all_file(path):
        buf = bytearray(4 * MIB)
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(buf):
                pass

    # -- fixed costs and floors, measured in the same run ---------------------------------------------------------
    def fixed_costs(self, rep, tries=3):
        """Size-independent floors: a one-task playbook, a trivial container of the workload image, a CRIU restore
        of a tiny process. Parts of every restore that no optimisation of the collection removes. Measured ``tries``
        times each per run (the report takes the median): a single start of Python or of a container is noisy."""
        for _attempt in range(tries):
            self.settle()
            t0 = time.monotonic()
            self.playbook("noop", [])
            self.record("fixed", "ansible_one_task", None, rep, time.monotonic() - t0)
            self.settle()
            name = self.name("trivial")
            t0 = time.monotonic()  # create + start, as docker run --detach of a restore (the removal is not timed)
            docker("run", "--detach", "--name", name, "--network", "none", "--entrypoint", "/bin/sleep", IMAGE, "100000")
            self.record("fixed", "docker_run_trivial", None, rep, time.monotonic() - t0)
            docker("rm", "-f", name, check=False)
            self.record("fixed", "criu_restore_tiny", None, rep, self.criu_tiny_restore())

    def world_files(self, rep):
        """A mounted model file of --world-file-gb, as a snapshot's world records it and a restore compares it
        (world.py, digests.py): the full SHA-256 at generation, then the restore's comparison -- unchanged (its
        identity: no read at all), another identity of the same content (chmod moves ctime: read in full once),
        and that again (the node's digest cache). A cache of the run's own, so the first hash is a real one."""
        size_mb = self.args.world_file_mb
        models = os.path.join(self.workdir, "world-models-%d" % rep)
        os.makedirs(models, mode=0o700)
        path = os.path.join(models, "model.gguf")
        block = os.urandom(64 * MIB)
        with open(path, "wb") as handle:
            for _index in range(size_mb // 64):
                handle.write(block)
        saved_cache = digests.cache_dir
        digests.cache_dir = os.path.join(self.workdir, "digest-cache-%d" % rep)
        process = {"args": ["engine"], "cwd": "/", "mounts": [{"source": models, "destination": "/models", "rw": False}]}
        try:
            self.settle()
            t0 = time.monotonic()
            facts = world.capture(process)
            world.add_digests(facts)
            seconds = time.monotonic() - t0
            self.record("world_files", "generation_digest", size_mb, rep, seconds, mb_s=round(size_mb / seconds, 1))
            for variant, change in (("restore_unchanged", None), ("restore_other_identity_first", "chmod"),
                                    ("restore_other_identity_cached", None)):
                if change:
                    os.chmod(path, 0o640)  # same bytes, a new ctime: another identity
                self.settle()
                t0 = time.monotonic()
                reasons = world.compare(facts, process)
                seconds = time.monotonic() - t0
                self.record("world_files", variant, size_mb, rep, seconds, correct=reasons == [],
                            mb_s=round(size_mb / seconds, 1))
        finally:
            digests.cache_dir = saved_cache
            shutil.rmtree(models, ignore_errors=True)
            shutil.rmtree(os.path.join(self.workdir, "digest-cache-%d" % rep), ignore_errors=True)

    def criu_tiny_restore(self):
        """`criu restore --restore-detached` of a checkpointed `sleep` (CRIU's own cost, no memory to speak of)."""
        target = os.path.join(self.workdir, "criu-tiny-%s" % uuid.uuid4().hex[:6])
        os.makedirs(target, mode=0o700)
        proc = subprocess.Popen(["sleep", "100000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        self.bare.append(proc.pid)
        restored = None
        try:
            run(["criu", "dump", "--tree", proc.pid, "--images-dir", target, "--log-file", "dump.log"])
            proc.wait(timeout=30)
            self.settle(warm=[target])
            pidfile = os.path.join(target, "restored.pid")
            t0 = time.monotonic()
            run(["criu", "restore", "--images-dir", target, "--restore-detached", "--pidfile", pidfile,
                 "--log-file", "restore.log"])
            seconds = time.monotonic() - t0
            with open(pidfile) as handle:
                restored = int(handle.read().strip())
            self.bare.append(restored)
            return seconds
        finally:
            for pid in (restored, proc.pid):
                if pid:
                    self.kill_bare(pid)
            shutil.rmtree(target, ignore_errors=True)

    def fsync_write(self, size_mb, nbytes, rep):
        """Writing the snapshot's bytes durably, the floor of a generation with durability: write + fsync of one file
        of the same size, on the same filesystem, from memory (64 MiB blocks), each block handed to the disk as soon
        as it is written (sync_file_range) so that the disk works while the writer does: the fastest durable write."""
        path = os.path.join(self.workdir, "fsync-%s.img" % uuid.uuid4().hex[:6])
        block = os.urandom(64 * MIB)
        sync_file_range = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)  # loaded before the clock
        self.settle()
        t0 = time.monotonic()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            left = nbytes
            while left > 0:
                written = os.write(fd, block[:min(left, len(block))])
                if sync_file_range is not None:  # SYNC_FILE_RANGE_WRITE (2): start writing it out, do not wait
                    sync_file_range(ctypes.c_int(fd), ctypes.c_int64(nbytes - left), ctypes.c_int64(written),
                                    ctypes.c_uint(2))
                left -= written
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = time.monotonic() - t0
        os.unlink(path)
        self.record("floor", "fsync_write", size_mb, rep, seconds, bytes=nbytes, mb_s=round(nbytes / MB / seconds, 1))

    def encryption_floor(self, size_mb, nbytes, rep):
        """The least that encryption adds to a generation and to a restore of ``nbytes``, from floors that owe nothing
        to the collection's code. Generation: CRIU writes the images to private tmpfs instead of the store, and they go
        to the store encrypted -- one more copy of the bytes (a kernel copy, tmpfs -> the store's filesystem) and
        AES-256-GCM over them; a restore the same the other way (store -> tmpfs). Hashing is not extra: the plain path
        hashes the same number of bytes. Pipelined, encryption adds at least the larger of the copy and the cipher."""
        scratch = tempfile.mkdtemp(prefix="bench-encryption-floor-", dir="/dev/shm")
        plain, back = os.path.join(scratch, "plain.img"), os.path.join(scratch, "back.img")
        stored = os.path.join(self.workdir, "encryption-floor-%s.img" % uuid.uuid4().hex[:6])
        try:
            block = os.urandom(64 * MIB)
            with open(plain, "wb") as handle:
                for offset in range(0, nbytes, len(block)):
                    handle.write(block[:min(len(block), nbytes - offset)])
            self.settle()
            t0 = time.monotonic()
            shutil.copyfile(plain, stored)  # sendfile(2): the kernel's copy
            to_store = time.monotonic() - t0
            os.unlink(plain)
            self.settle()
            self.read_all_file(stored)  # the restore reads a snapshot that is in the page cache (the warm-cache rows)
            t0 = time.monotonic()
            shutil.copyfile(stored, back)
            from_store = time.monotonic() - t0
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(stored)
        cipher = self.aes_gcm_all_cores(nbytes)
        for variant, seconds in (("encryption_copy_to_store", to_store), ("encryption_copy_from_store", from_store),
                                 ("aes_gcm_all_cores", cipher)):
            self.record("floor", variant, size_mb, rep, seconds, bytes=nbytes, mb_s=round(nbytes / MB / seconds, 1))

    @staticmethod
    def aes_gcm_all_cores(nbytes, chunk=4 * MIB):
        """Seconds for AES-256-GCM over ``nbytes`` on every core: 4 MiB chunks from memory into reused buffers
        (cryptography's update_into; the library releases the GIL), one key and a nonce per chunk."""
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        key, source = os.urandom(32), os.urandom(chunk)
        threads = os.cpu_count() or 1
        shares = [nbytes // threads + (1 if index < nbytes % threads else 0) for index in range(threads)]

        def encrypt(share):
            out = bytearray(chunk + 16)
            for index, offset in enumerate(range(0, share, chunk)):
                encryptor = Cipher(algorithms.AES(key), modes.GCM(index.to_bytes(12, "little"))).encryptor()
                encryptor.update_into(memoryview(source)[:min(chunk, share - offset)], out)
                encryptor.finalize()

        return Floors.threads_seconds([threading.Thread(target=encrypt, args=(share,)) for share in shares])

    def device_copy(self, size_mb, rep):
        """The device copy as its own line: the simulated NPU's backup and restore of this size's device memory, alone
        (benchmarks/device_copy.py), with today's model and with the old one (a fresh sparse shmem file per restore)."""
        device_mb = sizes_of(size_mb)[0]
        for variant, prealloc in (("device_copy", "huge"), ("device_copy_fresh_shmem", "none")):
            device_dir = os.path.join(self.shmdir, "devcopy-%s" % uuid.uuid4().hex[:6])
            env = dict(os.environ, ACL_SIM_DEVICE_DIR=device_dir, ACL_SIM_DEVICE_MEM_BYTES="%dM" % (device_mb + 16),
                       ACL_SIM_DEVICE_PREALLOC=prealloc if prealloc == "none" else os.environ.get("ACL_SIM_DEVICE_PREALLOC") or prealloc)
            env["ACL_SIM_DEVICE_NODES"] = self.sim_ctl(device_dir, "install", "1").strip()
            self.settle()
            try:
                proc = run([sys.executable, os.path.join(HERE, "device_copy.py"), SIM_LIBRARY, device_mb], env=env)
            finally:
                self.sim_ctl(device_dir, "uninstall")
                shutil.rmtree(device_dir, ignore_errors=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            self.record("device_copy", variant, size_mb, rep, result["restore_s"], **result)

    def limit_summary(self):
        out = {}
        for sample in self.samples:
            if sample["section"] == "limits":
                out.setdefault(sample["variant"], []).append(sample["mb_s"])
        return dict((key, {"best": max(values), "median": round(report.median(values), 1), "n": len(values)}) for key, values in out.items())

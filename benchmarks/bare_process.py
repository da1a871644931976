# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A bare process: host_checkpoint engine=criu vs raw criu dump / criu restore. Part of benchmarks/run.py's Bench."""

from __future__ import absolute_import, division, print_function

import os
import shutil
import signal
import subprocess
import time
import uuid

from common import FirstAnswer, REPO, agent_package_dir, control_mounts_below, run  # pylint: disable=import-error
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout


class BareProcess:
    """A mixin of benchmarks/run.py's Bench."""

    def start_bare(self, w, warmup):
        socket_dir = os.path.join(self.workdir, "agent-" + w["name"][len(self.prefix) + 1:])
        os.makedirs(socket_dir, mode=0o700)
        env = dict(os.environ, INFEROPS_ACL_LIBRARY=os.path.join(REPO, "build", "simulator", "libascendcl.so"),
                   INFEROPS_AGENT_SOCKET_DIR=socket_dir, INFEROPS_METADATA_FILE=os.path.join(socket_dir, "metadata.json"),
                   PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        env.update(self.workload_env(w["size_mb"], w["port"], w["device_dir"], warmup))
        env["ACL_SIM_DEVICE_NODES"] = w["nodes"]
        logfile = open(os.path.join(self.workdir, w["name"] + ".log"), "ab")
        env["PYTHONPATH"] = agent_package_dir()
        proc = subprocess.Popen(["/usr/bin/python3", "-m", "inferops_agent", "--",
                                 os.path.join(REPO, "tests", "workload", "workload.py")], env=env, stdin=subprocess.DEVNULL,
                                stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
        logfile.close()
        w.update(pid=proc.pid, socket_dir=socket_dir)
        self.bare.append(proc.pid)
        return proc

    def kill_bare(self, pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        try:
            os.waitpid(pid, 0)  # our child, or reparented to us (child subreaper) after a criu restore
        except ChildProcessError:
            while os.path.exists("/proc/%d" % pid):
                time.sleep(0.01)

    def bare_process(self, size_mb, rep):
        w = self.new_workload(size_mb, "bare")
        work = None
        try:
            t0 = time.monotonic()
            poll = FirstAnswer(w["url"], None, t0, 900)
            poll.start()
            self.start_bare(w, 1)
            _seconds, answer = poll.result(900)
            if not self.check_answers(w, answer):
                raise RuntimeError("the bare workload answers differently from the container")
            self.settle()
            gen = self.playbook("generate", [w])
            self.record_generate(gen, w, rep, "host_checkpoint_criu")
            self.backup(w["pid"], w["socket_dir"])
            target = os.path.join(self.workdir, "criu-%s" % uuid.uuid4().hex[:6])
            work = target + "-work"
            os.makedirs(target, mode=0o700)
            os.makedirs(work, mode=0o700)
            self.settle()
            t0 = time.monotonic()
            run(["criu", "dump", "--tree", w["pid"], "--images-dir", target, "--work-dir", work, "--log-file", "dump.log", "-v4",
                 "--tcp-close", "--ext-unix-sk", "--file-locks", "--leave-running"])
            self.record("checkpoint", "raw_criu_dump", size_mb, rep, time.monotonic() - t0, total_bytes=self.snapshot_bytes(target))
            shutil.rmtree(target)
            self.kill_bare(w["pid"])
            self.reset_device(w)
            # Restore the module's snapshot with raw criu: same images, no module around it.
            images = layout.images_dir(w["snapshot_dir"])
            pidfile = os.path.join(work, "restored.pid")
            self.settle(warm=[w["snapshot_dir"]])
            wall_t0 = time.time()
            t0 = time.monotonic()
            poll = FirstAnswer(w["url"], None, t0, 900)
            poll.start()
            run(["criu", "restore", "--images-dir", images, "--work-dir", work, "--restore-detached", "--tcp-close",
                 "--ext-unix-sk", "--file-locks", "--pidfile", pidfile, "--log-file", "restore.log", "-v4"])
            restore_s = time.monotonic() - t0
            with open(pidfile) as handle:
                restored = int(handle.read().strip())
            self.bare.append(restored)
            t2 = time.monotonic()
            self.resume(restored, w["socket_dir"])
            device_s = time.monotonic() - t2
            seconds, answer = poll.result(60)
            was = self.was_restored(w, wall_t0)
            self.record("ttfa", "raw_criu_restore_bare", size_mb, rep, seconds, restored=was, correct=self.check_answers(w, answer) and was,
                        stages={"host_restore": round(restore_s, 3), "device_restore": round(device_s, 3)})
            self.record("host_restore", "raw_criu_restore_bare", size_mb, rep, restore_s)
            self.kill_bare(restored)
        finally:
            for pid in list(self.bare):
                self.kill_bare(pid)
            self.bare = []
            shutil.rmtree(w["snapshot_dir"], ignore_errors=True)
            shutil.rmtree(w["device_dir"], ignore_errors=True)
            if work and not control_mounts_below(work):
                shutil.rmtree(work, ignore_errors=True)

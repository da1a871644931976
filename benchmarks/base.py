# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark's bookkeeping, workloads, device control and profiles of Docker's path: what every benchmark uses.
Part of benchmarks/run.py's Bench."""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import sys
import time
import uuid

from common import (  # pylint: disable=import-error
    BIN, COLLECTIONS, FirstAnswer, HERE, IMAGE, MB, PLAYBOOKS, PROMPTS, REPO, SIM_KNOBS, docker, free_port,
    generate, load_average, log, run, sizes_of,
)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import control
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import device


class BenchBase:
    """Bench's state and the tools every benchmark uses."""

    def __init__(self, args):
        self.args = args
        self.run_id = uuid.uuid4().hex[:6]
        self.prefix = "inferops-bench-%s" % self.run_id
        self.workdir = os.path.abspath(args.workdir or "/var/tmp/%s" % self.prefix)
        self.shmdir = "/dev/shm/%s" % self.prefix
        for path in (self.workdir, self.shmdir):
            os.makedirs(path, mode=0o700, exist_ok=True)
        self.samples = []
        self.expected = {}
        self.bare = []
        self.counter = 0
        self.restore_methods = []
        self.restore_default = "docker"
        self.runtime_installed = False
        self.encryption = None  # {"key_file"} when host_checkpoint has encryption_key
        self.has_resume = False  # host_checkpoint has resume
        self.has_device_backup = False  # host_checkpoint has device_backup
        self.lazy_pages = False  # the node runtime has lazy_pages and this kernel has userfaultfd
        self.staging = False  # the collection has the node cache of verified snapshots (core/restore/cache.py)

    # -- bookkeeping --------------------------------------------------------------------------------
    def record(self, section, variant, size_mb, rep, seconds, **extra):
        sample = dict(section=section, variant=variant, size_mb=size_mb, rep=rep,
                      seconds=None if seconds is None else round(seconds, 4), load1=load_average()[0])
        sample.update(extra)
        self.samples.append(sample)
        wrong = "" if extra.get("correct", True) else "  WRONG ANSWERS"
        log("%-13s %-26s %6s MB rep %d: %s s%s" % (section, variant, size_mb, rep, sample["seconds"], wrong))
        return sample

    def name(self, tag):
        self.counter += 1
        return "%s-%s-%d" % (self.prefix, tag, self.counter)

    # -- workloads --------------------------------------------------------------------------------------
    def workload_env(self, size_mb, port, device_dir, warmup):
        device_mb, host_mb = sizes_of(size_mb)
        env = {"ACL_SIM_DEVICE_DIR": device_dir, "ACL_SIM_DEVICE_MEM_BYTES": "%dM" % (device_mb + 16),
               "WORKLOAD_PORT": str(port), "WORKLOAD_WARMUP_SECONDS": str(warmup),
               "WORKLOAD_DEVICE_MB": str(device_mb), "WORKLOAD_HOST_MB": str(host_mb)}
        for knob in SIM_KNOBS:  # the simulated NPU's cost model, as the bench was given it (docs/simulator.md)
            if os.environ.get(knob):
                env[knob] = os.environ[knob]
        return env

    def new_workload(self, size_mb, tag):
        name = self.name(tag)
        device_dir = os.path.join(self.shmdir, "npu-" + name[len(self.prefix) + 1:])
        os.makedirs(device_dir, mode=0o700)
        # The node has its NPU before the pod: the simulated device is installed (its memory allocated) now, not
        # during the cold start's warmup or a restore (docs/simulator.md "The cost model").
        self.sim_ctl(device_dir, "create", "0", "%dM" % (sizes_of(size_mb)[0] + 16))
        # ... and its device nodes, which the engine holds as a real one does (docs/simulator.md): a container gets
        # them as NPU containers do (docker run --device), a bare process uses them where they were made
        devices = json.loads(self.sim_ctl(device_dir, "docker-args", "0"))
        nodes = self.sim_ctl(device_dir, "nodes").strip()
        port = free_port()
        snap = os.path.join(self.workdir, "snapshots", "bench", "sample", "p0", name)
        return {"name": name, "device_dir": device_dir, "devices": devices, "nodes": nodes,
                "port": port, "url": "http://127.0.0.1:%d" % port,
                "snapshot_dir": snap, "size_mb": size_mb,
                "identity": {"namespace": "bench", "service": "sample", "instance": "p0", "pod": name}}

    def docker_run_args(self, w, warmup):
        args = ["--name", w["name"], "--network", "host", "-v", "%s:%s" % (w["device_dir"], w["device_dir"])] + w["devices"]
        for key, value in sorted(self.workload_env(w["size_mb"], w["port"], w["device_dir"], warmup).items()):
            args += ["-e", "%s=%s" % (key, value)]
        return args + [IMAGE]

    def check_answers(self, w, first_answer):
        """Every prompt answered as the warmed-up engine of this size answers it."""
        expected = self.expected.get(w["size_mb"])
        answers = [first_answer] + [generate(w["url"], p)[1] for p in PROMPTS[1:]]
        if expected is None:
            self.expected[w["size_mb"]] = answers
            return True
        return answers == expected

    def cold_start(self, w, rep, warmup, record=True):
        """docker run to the first correct answer (the warmup included)."""
        t0 = time.monotonic()
        poll = FirstAnswer(w["url"], None, t0, warmup + 900)
        poll.start()
        docker("run", "-d", *self.docker_run_args(w, warmup))
        seconds, answer = poll.result(warmup + 900)
        correct = self.check_answers(w, answer)
        if record:
            self.record("ttfa", "cold_start", w["size_mb"], rep, seconds, correct=correct, warmup_s=warmup)
        return seconds

    @staticmethod
    def sim_ctl(device_dir, *argv):
        env = dict(os.environ, ACL_SIM_DEVICE_DIR=device_dir)
        return run([sys.executable, os.path.join(REPO, "tests", "simulator", "aclsim_ctl.py")] + list(argv), env=env).stdout

    def reset_device(self, w):
        """What deleting the pod does to the NPU (aclsim_ctl.py reset 0): its memory is wiped (the device stays)."""
        self.sim_ctl(w["device_dir"], "reset", "0")

    def remove(self, w):
        docker("rm", "-f", w["name"], check=False)

    def inventory(self, workloads, **extra):
        hosts = {}
        for index, w in enumerate(workloads):
            entry = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                     "bench_snapshot_dir": w["snapshot_dir"], "bench_identity": w["identity"], "bench_url": w["url"]}
            if w.get("pid"):
                entry.update(bench_pid=w["pid"], bench_agent_socket_dir=w["socket_dir"])
            else:
                entry["bench_container"] = w["name"]
            entry.update(extra)
            hosts["bench-%d" % index] = entry
        path = os.path.join(self.workdir, "inventory-%s.json" % uuid.uuid4().hex[:8])
        with open(path, "w") as handle:
            json.dump({"bench": {"hosts": hosts}}, handle)
        return path

    def playbook(self, name, workloads, **extra):
        """Run benchmarks/playbooks/<name>.yml over one inventory alias per workload; return timings."""
        inventory = self.inventory(workloads, **extra)
        timing = inventory + ".timing"
        env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_CALLBACK_PLUGINS=os.path.join(HERE, "callback_plugins"),
                   ANSIBLE_CALLBACKS_ENABLED="inferops_bench_timing", INFEROPS_BENCH_TIMING_FILE=timing,
                   ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_HOST_KEY_CHECKING="False",
                   ANSIBLE_RETRY_FILES_ENABLED="False")
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", inventory, "-f", str(max(1, len(workloads))),
                os.path.join(PLAYBOOKS, name + ".yml")]
        wall_t0 = time.time()
        t0 = time.monotonic()
        proc = run(argv, check=False, env=env)
        t1 = time.monotonic()
        with open(timing) as handle:
            records = json.load(handle)
        os.unlink(timing)
        os.unlink(inventory)
        failed = [r for r in records if r["outcome"] not in ("ok", "skipped")]
        records = [r for r in records if r["outcome"] != "skipped"]  # a task this checkout's modules make unneeded
        if proc.returncode != 0 or failed:
            raise RuntimeError("ansible-playbook %s failed (rc=%d): %s\n%s"
                               % (name, proc.returncode, json.dumps(failed)[:3000], proc.stdout[-3000:]))
        return {"t0": t0, "t1": t1, "wall": t1 - t0, "wall_t0": wall_t0, "records": records}

    # -- device control (for the raw baselines, which have no module around them) --------------------------
    def agent(self, pid, socket_dir=control.DEFAULT_AGENT_SOCKET_DIR, timeout=60):
        path = control.agent_socket_for_pid(pid, socket_dir)
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise RuntimeError("agent socket %s did not appear" % path)
            time.sleep(0.005)
        return control.AgentSocketClient(path)

    def backup(self, pid, socket_dir=control.DEFAULT_AGENT_SOCKET_DIR):
        client = self.agent(pid, socket_dir)
        client.request(protocol.OP_LOCK, 120)
        client.request(protocol.OP_BACKUP, 600)

    def resume(self, pid, socket_dir=control.DEFAULT_AGENT_SOCKET_DIR):
        device.resume(self.agent(pid, socket_dir), 600)

    # -- profiles of docker's path ------------------------------------------------------------------------
    @staticmethod
    def pids_named(*names):
        found = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/comm" % entry) as handle:
                        comm = handle.read().strip()
                except OSError:
                    continue
                if comm in names:
                    found.setdefault(comm, []).append(int(entry))
        return found

    @staticmethod
    def shim_of(container_id):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/cmdline" % entry, "rb") as handle:
                        argv = handle.read().split(b"\0")
                except OSError:
                    continue
                if argv and b"containerd-shim" in argv[0] and container_id.encode() in argv:
                    return int(entry)
        return None

    @staticmethod
    def proc_counters(pid):
        """CPU seconds (own + reaped children: runc and criu under a shim) and I/O bytes of one process."""
        try:
            with open("/proc/%d/stat" % pid) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open("/proc/%d/io" % pid) as handle:
                io = dict(line.split(": ") for line in handle.read().splitlines())
        except OSError:
            return None
        ticks = float(os.sysconf("SC_CLK_TCK"))
        return {"cpu_s": sum(int(fields[i]) for i in (11, 12)) / ticks, "children_cpu_s": sum(int(fields[i]) for i in (13, 14)) / ticks,
                "read_mb": int(io["rchar"]) / MB, "write_mb": int(io["wchar"]) / MB,
                "disk_read_mb": int(io["read_bytes"]) / MB, "disk_write_mb": int(io["write_bytes"]) / MB}

    @staticmethod
    def system_counters():
        with open("/proc/stat") as handle:
            cpu = [int(x) for x in handle.readline().split()[1:]]
        ticks = float(os.sysconf("SC_CLK_TCK"))
        disk = {"read_mb": 0.0, "write_mb": 0.0}
        with open("/proc/diskstats") as handle:
            for line in handle:
                parts = line.split()
                if re.match(r"^(vd[a-z]|sd[a-z]|nvme\d+n\d+|xvd[a-z])$", parts[2]):
                    disk["read_mb"] += int(parts[5]) * 512 / MB
                    disk["write_mb"] += int(parts[9]) * 512 / MB
        return {"user_s": (cpu[0] + cpu[1]) / ticks, "system_s": cpu[2] / ticks, "iowait_s": cpu[4] / ticks,
                "disk_read_mb": disk["read_mb"], "disk_write_mb": disk["write_mb"]}

    def profile(self, container_id=None):
        """Counters of dockerd, containerd, the container's shim and the whole system, to diff later."""
        pids = self.pids_named("dockerd", "containerd")
        snap = {"system": self.system_counters()}
        for comm, found in pids.items():
            snap[comm] = {pid: self.proc_counters(pid) for pid in found}
        if container_id:
            shim = self.shim_of(container_id)
            snap["shim"] = {shim: self.proc_counters(shim)} if shim else {}
        return snap

    @staticmethod
    def diff_profile(before, after):
        out = {}
        for key in after:
            if key == "system":
                out[key] = {k: round(after[key][k] - before[key][k], 2) for k in after[key]}
                continue
            total = {}
            for pid, counters in after[key].items():
                if counters is None:
                    continue
                base = (before.get(key) or {}).get(pid) or {k: 0.0 for k in counters}
                for k in counters:
                    total[k] = round(total.get(k, 0.0) + counters[k] - base[k], 2)
            out[key] = total
        return out

    def content_store_mb(self):
        root = "/var/lib/docker/containerd/daemon/io.containerd.content.v1.content"
        proc = run(["du", "-sm", root], check=False)
        return int(proc.stdout.split()[0]) if proc.returncode == 0 and proc.stdout else None

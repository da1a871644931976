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
"""

from __future__ import absolute_import, division, print_function

import argparse
import contextlib
import ctypes
import datetime
import hashlib
import importlib
import json
import mmap
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
COLLECTIONS = os.path.join(REPO, "build", "collections")
BIN = os.path.dirname(sys.executable)
PLAYBOOKS = os.path.join(HERE, "playbooks")
IMAGE = "inferops/workload:bench"
PROMPTS = ["What is an NPU?", "Why snapshot a warmed-up engine?", "数据", "the quick brown fox"]
DEVICE_SHARE = 0.75  # of the state size: device memory (weights); the rest is host memory (caches)
MB = 1000.0 * 1000.0
MIB = 1024 * 1024


def ensure_collection_link():
    link = os.path.join(COLLECTIONS, "ansible_collections", "inferops", "snapshot")
    if not os.path.islink(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(REPO, link)


ensure_collection_link()


def agent_package_dir():
    """A folder holding the agent as the package inferops_agent, as an engine image has it."""
    parent = os.path.join(REPO, "build", "agent")
    link = os.path.join(parent, "inferops_agent")
    if not os.path.islink(link):
        os.makedirs(parent, exist_ok=True)
        os.symlink(os.path.join(REPO, "plugins", "module_utils", "core", "agent"), link)
    return parent


sys.path.insert(0, COLLECTIONS)
# pylint: disable=wrong-import-position
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import containerd_leak  # noqa: E402
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import control  # noqa: E402
from ansible_collections.inferops.snapshot.plugins.module_utils.core import device  # noqa: E402
from ansible_collections.inferops.snapshot.plugins.module_utils.core import container, layout  # noqa: E402
from ansible_collections.inferops.snapshot.plugins.module_utils.core import digests, world  # noqa: E402
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import checkpoint  # noqa: E402
from ansible_collections.inferops.snapshot.plugins.module_utils.core import manifest as manifest_utils  # noqa: E402
from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol  # noqa: E402

from ansible_collections.inferops.snapshot.plugins.module_utils.core import status as status_record  # noqa: E402

sys.path.insert(0, HERE)
try:  # the node cache of verified snapshots, where the checkout has it
    from ansible_collections.inferops.snapshot.plugins.module_utils.core import stage as stage_cache  # noqa: E402
except ImportError:
    stage_cache = None
import report  # noqa: E402  pylint: disable=import-error
SIM_LIBRARY = os.path.join(REPO, "build", "simulator", "libascendcl.so")
SIM_KNOBS = ("ACL_SIM_COPY_GBPS", "ACL_SIM_DEVICE_PREALLOC")
AGENT_LINE = re.compile(r"^(\S+) inferops-agent\[\d+\]: (lock|backup|restore|unlock): (\w+) -> (\w+) in ([0-9.]+)s$")


def log(message):
    sys.stdout.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stdout.flush()


def run(argv, check=True, timeout=1800, env=None, cwd=None):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False,
                          env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise RuntimeError("%s failed (rc=%d): %s" % (" ".join(str(a) for a in argv), proc.returncode,
                                                      (proc.stderr or proc.stdout).strip()[-3000:]))
    return proc


def docker(*args, **kwargs):
    return run(["docker"] + list(args), **kwargs).stdout.strip()


def load_average():
    with open("/proc/loadavg") as handle:
        return [float(x) for x in handle.read().split()[:3]]


# -- the machine ------------------------------------------------------------------------------------

def first_line(argv, pattern=None):
    try:
        proc = run(argv, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout + proc.stderr).strip()
    if pattern:
        match = re.search(pattern, text)
        return match.group(1) if match else None
    return text.splitlines()[0] if text else None


def machine_info(workdir):
    cpu = None
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as handle:
        mem_kib = int(handle.readline().split()[1])
    fs = run(["df", "--output=fstype,source", workdir], check=False).stdout.split()[-2:]
    git = run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
    dirty = bool(run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"], check=False).stdout.strip())
    return {
        "nproc": os.cpu_count(), "cpu_model": cpu, "kernel": platform.release(), "mem_total_gib": round(mem_kib / 1048576.0, 1),
        "os": first_line(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "virtualization": first_line(["lscpu"], r"Hypervisor vendor:\s*(\S+)"),
        "docker_server": first_line(["docker", "version", "--format", "{{.Server.Version}}"]),
        "docker_cli": first_line(["docker", "version", "--format", "{{.Client.Version}}"]),
        "containerd": first_line(["docker", "version", "--format", "{{range .Server.Components}}{{if eq .Name \"containerd\"}}{{.Version}}{{end}}{{end}}"]),
        "storage_driver": first_line(["docker", "info", "--format", "{{.Driver}}"]),
        "runc": first_line(["runc", "--version"], r"runc version (\S+)"),
        "criu": first_line(["criu", "--version"], r"Version:\s*(\S+)"),
        "ansible_core": first_line([os.path.join(BIN, "ansible"), "--version"], r"core ([0-9.]+)"),
        "python": platform.python_version(),
        "workdir_fs": {"type": fs[0] if fs else None, "source": fs[1] if len(fs) > 1 else None},
        "git_commit": git, "git_dirty": dirty,
    }


# -- workloads ----------------------------------------------------------------------------------------

def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def generate(url, prompt, timeout=120):
    """(status, answer or None); raises OSError when nothing listens."""
    try:
        with OPENER.open(url + "/v1/generate?prompt=" + urllib.parse.quote(prompt), timeout=timeout) as response:
            return response.status, json.loads(response.read())["answer"]
    except urllib.error.HTTPError as exc:
        return exc.code, None


def sizes_of(size_mb):
    device_mb = int(round(size_mb * DEVICE_SHARE))
    return device_mb, size_mb - device_mb


class FirstAnswer(threading.Thread):
    """Polls PROMPTS[0] every 10 ms from ``t0`` until an answer arrives; records when, and whether it is right.

    A request sent while the restored process is still locked waits inside the engine and is
    answered after the device restore: that moment is the first correct answer.
    """

    def __init__(self, url, expected, t0, timeout):
        super(FirstAnswer, self).__init__(daemon=True)
        self.url, self.expected, self.t0, self.timeout = url, expected, t0, timeout
        self.seconds = None
        self.answer = None
        self.error = None
        self.stop = threading.Event()

    def run(self):
        deadline = self.t0 + self.timeout
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                status, answer = generate(self.url, PROMPTS[0])
            except (OSError, ValueError):
                status, answer = None, None
            if status == 200:
                self.seconds = time.monotonic() - self.t0
                self.answer = answer
                return
            time.sleep(0.01)
        self.error = "no answer within %.0f s" % self.timeout

    def result(self, join_timeout):
        self.join(join_timeout)
        self.stop.set()
        if self.seconds is None:
            raise RuntimeError("%s: %s" % (self.url, self.error or "no answer yet"))
        return self.seconds, self.answer


class Bench:
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
        self.staging = False  # the collection has the node cache of verified snapshots (core/stage.py)

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

    # -- physical limits ------------------------------------------------------------------------------------------
    def limits(self, rep, tries=3):
        """What this machine can do at most: SHA-256 on one core and on all cores, copying into new
        memory, faulting fresh memory in. Measured at the start of every run and at the end, because
        the load others put on the machine changes; the report gives the best and the median."""
        buf = os.urandom(256 * MIB)
        view = memoryview(buf)

        def hash_all():
            digest = hashlib.sha256()
            for offset in range(0, len(buf), 4 * MIB):
                digest.update(view[offset:offset + 4 * MIB])

        for _attempt in range(tries):
            t0 = time.monotonic()
            hash_all()
            one = time.monotonic() - t0
            threads = [threading.Thread(target=hash_all) for _index in range(os.cpu_count() or 1)]
            t0 = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            every = time.monotonic() - t0
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
            for key, seconds, nbytes in (("sha256_one_core", one, len(buf)), ("sha256_all_cores", every, len(buf) * len(threads)),
                                         ("memcpy", memcpy, len(buf)), ("fault_in_fresh_memory", fault, len(buf)),
                                         ("memcpy_faulted", memcpy_faulted, len(buf)), ("criu_copy", criu_copy, len(buf))):
                self.record("limits", key, None, rep, seconds, mb_s=round(nbytes / MB / seconds, 1))

    def criu_copy_limit(self, buf):
        """CRIU's page restore at its floor: one preadv() of a pages image that is in the page cache into fresh
        anonymous memory (what `criu restore` does for each memory area; issue 11 measured 2.4-2.5 GB/s here)."""
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
        of the same size, on the same filesystem, from memory (64 MiB blocks)."""
        path = os.path.join(self.workdir, "fsync-%s.img" % uuid.uuid4().hex[:6])
        block = os.urandom(64 * MIB)
        self.settle()
        t0 = time.monotonic()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            left = nbytes
            while left > 0:
                left -= os.write(fd, block[:min(left, len(block))])
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

        workers = [threading.Thread(target=encrypt, args=(share,)) for share in shares]
        t0 = time.monotonic()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.monotonic() - t0

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

    # -- file-level measurements ----------------------------------------------------------------------------------------
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

    def verify_variants(self, w, rep):
        """snapshot_verify (through ansible and in-process) vs sha256sum over the same files, warm and cold."""
        snap = w["snapshot_dir"]
        nbytes = self.snapshot_bytes(snap)
        with open(os.path.join(snap, manifest_utils.CHECKSUMS)) as handle:
            files = sorted(manifest_utils.parse_checksums(handle.read()))

        def module():
            result = self.playbook("verify", [w])
            task = [r for r in result["records"] if r["action"].endswith("snapshot_verify")][0]
            return task["end"] - task["start"], {"module_total_s": task["result"]["durations"]["total"],
                                                 "hash_s": task["result"]["durations"]["hash"],
                                                 "module_mb_s": task["result"]["throughput_mb_s"],
                                                 "workers": task["result"]["workers"], "playbook_wall_s": round(result["wall"], 3)}

        def inproc(workers=None):
            t0 = time.monotonic()
            valid, reasons, details = manifest_utils.verify(snap, expect={"identity": w["identity"]}, workers=workers)
            if not valid:
                raise RuntimeError("verify: %s" % reasons)
            return time.monotonic() - t0, {"workers": details["hashing"]["workers"], "chunks": details["hashing"].get("chunks"),
                                           "chunked_files": details["hashing"].get("chunked_files")}

        def sha256sum():
            t0 = time.monotonic()
            run(["sha256sum", "--check", "--strict", "--quiet", manifest_utils.CHECKSUMS], cwd=snap)
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

    # -- the per-size sequence -------------------------------------------------------------------------------------------------
    def one_size(self, size_mb, rep):
        args = self.args
        focus = args.focus  # only what the goals (docs/benchmarks.md "Each part against its floor") are measured with
        docker_paths = size_mb <= args.docker_paths_max_mb and not focus  # Docker's own checkpoint path: up to this size
        self.device_copy(size_mb, rep)  # first, while the machine's memory is free
        w = self.new_workload(size_mb, "w")
        encrypted = None
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
            self.settle()
            gen = self.playbook("generate", [w], **self.resume_var(True))
            sample = self.record_generate(gen, w, rep, "host_checkpoint_runc")
            w["record"] = container.read_container_record(w["snapshot_dir"])
            self.fsync_write(size_mb, sample["total_bytes"], rep)
            if self.encryption and size_mb == self.encryption_size_mb():
                self.encryption_floor(size_mb, sample["total_bytes"], rep)
                encrypted = self.encrypted_generate(w, rep)
            if not focus:
                self.verify_variants(w, rep)
            self.checkpoint_variants(w, cid, rep, docker_paths, tmpfs=not focus)
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
            if docker_paths:
                self.raw_docker_restore(w, rep)
        finally:
            self.remove(w)
            shutil.rmtree(w["snapshot_dir"], ignore_errors=True)
            if encrypted:
                shutil.rmtree(encrypted["snapshot_dir"], ignore_errors=True)
            shutil.rmtree(w["device_dir"], ignore_errors=True)
        if not focus:
            self.bare_process(size_mb, rep)

    def record_generate(self, gen, w, rep, variant):
        tasks = {r["action"].split(".")[-1]: r for r in gen["records"]}
        checkpoint = tasks["host_checkpoint"]
        durations = checkpoint["result"]["durations"]
        module_totals = {name: task["result"]["durations"].get("total", sum(task["result"]["durations"].values()))
                         for name, task in tasks.items()}
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
        other = dict(w, snapshot_dir=w["snapshot_dir"] + "-enc", identity=dict(w["identity"]))
        other["identity"]["pod"] = os.path.basename(other["snapshot_dir"])
        self.settle()
        try:
            gen = self.playbook("generate", [other], bench_encryption_key=self.encryption["key_file"], **self.resume_var(True))
        except RuntimeError as exc:
            self.record("checkpoint", "host_checkpoint_runc_encrypted", w["size_mb"], rep, None, error=str(exc)[:2000])
            return None
        self.record_generate(gen, w, rep, "host_checkpoint_runc_encrypted")
        return other

    def encrypted_restores(self, w, encrypted, rep):
        enc = dict(encrypted, record=w["record"])
        # method docker refuses an encrypted snapshot by design (Docker would copy the plaintext through containerd)
        self.module_restore(enc, rep, self.fastest_method(), tag="_encrypted", bench_encryption_keys=[self.encryption["key_file"]])
        if self.runtime_installed:
            self.runtime_run_restore(enc, rep, tag="_encrypted")

    def checkpoint_variants(self, w, cid, rep, docker_paths=True, tmpfs=True):
        """Raw runc checkpoint (disk and tmpfs), plain docker checkpoint create, and host_checkpoint method=docker."""
        pid = int(docker("inspect", "--format", "{{.State.Pid}}", w["name"]))
        self.backup(pid)
        # The tmpfs variant holds the images in RAM beside the engine and its device: only where they fit easily.
        with open("/proc/meminfo") as handle:
            mem_mb = int(handle.readline().split()[1]) / 1024.0
        targets = [("raw_runc_checkpoint", self.workdir)]
        if tmpfs and w["size_mb"] * (2 + DEVICE_SHARE) < 0.6 * mem_mb:
            targets.append(("raw_runc_checkpoint_tmpfs", self.shmdir))
        try:
            for variant, parent in targets:
                target = os.path.join(parent, "runc-%s" % uuid.uuid4().hex[:6])
                work = os.path.join(parent, "runc-work-%s" % uuid.uuid4().hex[:6])
                os.makedirs(target, mode=0o700)
                os.makedirs(work, mode=0o700)
                self.settle()
                t0 = time.monotonic()
                run(["runc", "--root", layout.DOCKER_RUNC_ROOT, "checkpoint", "--leave-running", "--image-path", target,
                     "--work-path", work, cid])
                seconds = time.monotonic() - t0
                self.record("checkpoint", variant, w["size_mb"], rep, seconds, total_bytes=self.snapshot_bytes(target))
                shutil.rmtree(target)
                shutil.rmtree(work)
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
        task = result["records"][0]
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
        argv = ["run", "--detach", "--runtime", self.prefix] + container.create_args(w["record"], w["name"], env)
        self.settle(warm=() if cold_cache else (warm or [snap]))
        wall_t0 = time.time()
        t0 = time.monotonic()
        poll = FirstAnswer(w["url"], None, t0, 1800)
        poll.start()
        docker(*argv)
        run_s = time.monotonic() - t0
        seconds, answer = poll.result(120)
        restored = self.was_restored(w, wall_t0)
        last = (status_record.read(snap) or {}).get("last_restore") or {}
        self.record("ttfa", variant, w["size_mb"], rep, seconds, restored=restored, correct=self.check_answers(w, answer) and restored,
                    docker_run_s=round(run_s, 3), runtime=last, reason=last.get("reason"),
                    stages={"host_restore": round(run_s, 3)})
        self.remove(w)
        self.reset_device(w)

    def recreate_args(self, w, verb, env_overrides=None):
        record = container.read_container_record(w["snapshot_dir"])
        args = ["create"] + container.create_args(record, w["name"], env_overrides)
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

    # -- a bare process: host_checkpoint engine=criu vs raw criu dump / criu restore ----------------------------
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

    # -- orchestration overhead: N inventory aliases of localhost, one workload each -----------------------
    def orchestration(self, hosts, size_mb, rep):
        workloads = [self.new_workload(size_mb, "o%d" % hosts) for _index in range(hosts)]
        try:
            for w in workloads:
                docker("run", "-d", *self.docker_run_args(w, 1))
            for w in workloads:
                poll = FirstAnswer(w["url"], None, time.monotonic(), 900)
                poll.run()
                if not self.check_answers(w, poll.answer):
                    raise RuntimeError("wrong answers from %s" % w["name"])
            for step in ("generate", "restore"):
                if step == "restore":
                    for w in workloads:
                        self.remove(w)
                        self.reset_device(w)
                extra = {}
                if step == "restore" and self.restore_methods:
                    extra["bench_restore_method"] = self.fastest_method()
                    if self.runtime_installed and extra["bench_restore_method"] in ("runtime", "auto"):
                        extra["bench_runtime_name"] = self.prefix
                result = self.playbook(step, workloads, **extra)
                per_host = {}
                for r in result["records"]:
                    durations = r["result"].get("durations") or {}
                    module = durations.get("total", sum(v for v in durations.values() if isinstance(v, (int, float))))
                    entry = per_host.setdefault(r["host"], {"module_s": 0.0, "task_wall_s": 0.0})
                    entry["module_s"] += module
                    entry["task_wall_s"] += r["end"] - r["start"]
                restores = [r["result"].get("restored") for r in result["records"] if r["action"].endswith("snapshot_restore")]
                self.record("orchestration", "%s_%d_hosts" % (step, hosts), size_mb, rep, result["wall"], hosts=hosts,
                            method=extra.get("bench_restore_method", "runc" if step == "generate" else "docker"),
                            all_restored=all(x is True for x in restores) if step == "restore" else None,
                            sum_module_s=round(sum(e["module_s"] for e in per_host.values()), 3),
                            max_module_s=round(max(e["module_s"] for e in per_host.values()), 3),
                            sum_task_wall_s=round(sum(e["task_wall_s"] for e in per_host.values()), 3),
                            max_task_wall_s=round(max(e["task_wall_s"] for e in per_host.values()), 3))
                if step == "restore":
                    for w in workloads:
                        answer = generate(w["url"], PROMPTS[0])[1]
                        if not self.check_answers(w, answer):
                            raise RuntimeError("wrong answers after restore from %s" % w["name"])
        finally:
            for w in workloads:
                self.remove(w)
                shutil.rmtree(w["snapshot_dir"], ignore_errors=True)
                shutil.rmtree(w["device_dir"], ignore_errors=True)

    # -- the restore-on-create runtime (snapshot_node role) ------------------------------------------------------------
    def node_vars(self):
        base = os.path.join(self.workdir, "node")
        return {"snapshot_node_runtime_name": self.prefix, "snapshot_node_runtime_path": os.path.join(base, "bin", "inferops-restore-runtime"),
                "snapshot_node_lib_dir": os.path.join(base, "lib"), "snapshot_node_state_dir": "/run/%s" % self.prefix,
                "snapshot_node_log_file": os.path.join(base, "log", "restore.log"),
                "snapshot_node_snapshot_roots": [os.path.join(self.workdir, "snapshots")]}

    def staged_restores(self, w, rep):
        """The snapshot copied and verified into a node cache ahead (snapshot_stage's core), then restored from the
        verified copy without hashing: the playbook (method runtime) and docker run --runtime."""
        cache = os.path.join(self.workdir, "stage")
        os.makedirs(cache, mode=0o700, exist_ok=True)
        t0 = time.monotonic()
        staged = stage_cache.stage(w["snapshot_dir"], cache)
        self.record("staging", "snapshot_stage", w["size_mb"], rep, time.monotonic() - t0,
                    bytes=(staged.get("hashing") or {}).get("bytes"))
        # warm as the other warm restores are, with what this one reads: the copy (the snapshot's own small files
        # are read too, a few kB)
        copy = [staged["staged"]["dir"]]
        with self.runtime_settings(stage_dir=cache):
            for variant, restore in (("snapshot_restore_runtime_staged",
                                      lambda: self.module_restore(w, rep, "runtime", tag="_staged", warm=copy)),
                                     ("docker_run_runtime_staged",
                                      lambda: self.runtime_run_restore(w, rep, tag="_staged", warm=copy))):
                restore()
                verdict = (self.runtime_log()[-1:] or [{}])[0].get("verify") or {}
                used = verdict.get("checksums") == "staged"  # the runtime restored from the verified copy, unhashed
                [s for s in self.samples if s["section"] == "ttfa" and s["variant"] == variant][-1]["staged_copy_used"] = used
                if not used:
                    log("WARNING: %s did not restore from the staged copy: %s" % (variant, verdict.get("staged_miss")))
        shutil.rmtree(cache, ignore_errors=True)

    def runtime_log(self):
        """The installed runtime's restore records (its JSON log), oldest first."""
        try:
            with open(self.node_vars()["snapshot_node_log_file"]) as handle:
                records = [json.loads(line) for line in handle if line.strip()]
        except (IOError, OSError, ValueError):
            return []
        return [r for r in records if r.get("event") == "restore"]

    @staticmethod
    def detect_lazy_pages():
        """The restore-on-create runtime of this checkout restores lazily when told (layout's lazy_pages), and CRIU
        can here (userfaultfd)."""
        if "lazy_pages" not in layout.RUNTIME_DEFAULTS:
            return False
        return run(["criu", "check", "--feature", "uffd-noncoop"], check=False).returncode == 0

    @contextlib.contextmanager
    def runtime_settings(self, **settings):
        """The installed runtime's runtime.json with ``settings`` for the block (it reads the file on every call)."""
        path = os.path.join(self.node_vars()["snapshot_node_lib_dir"], "runtime.json")
        with open(path) as handle:
            original = handle.read()
        with open(path, "w") as handle:
            json.dump(dict(json.loads(original), **settings), handle)
        try:
            yield
        finally:
            with open(path, "w") as handle:
                handle.write(original)

    def node(self, state):
        """Install or remove the runtime with the role, as users do (it reloads dockerd with SIGHUP, no restart)."""
        os.makedirs(os.path.join(self.workdir, "snapshots"), mode=0o700, exist_ok=True)
        extra = dict(self.node_vars(), snapshot_node_state=state)
        if self.encryption:
            extra["snapshot_node_encryption_keys"] = [self.encryption["key_file"]]
        if state == "absent":
            extra["snapshot_node_force_remove"] = True
        vars_file = os.path.join(self.workdir, "node-vars-%s.json" % state)
        with open(vars_file, "w") as handle:
            json.dump(extra, handle)
        proc = run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-e", "ansible_python_interpreter=%s" % sys.executable,
                    "-e", "@" + vars_file, os.path.join(PLAYBOOKS, "node.yml")], check=False,
                   env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False"))
        if proc.returncode != 0:
            raise RuntimeError("snapshot_node state=%s failed:\n%s" % (state, proc.stdout[-4000:]))
        self.runtime_installed = state == "present"

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
        """Extra snapshot_restore methods (e.g. issue 5's restore-on-create runtime) when the module offers them."""
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
        # host_checkpoint's resume (issue 11 item 5: the engine unlocked right after the checkpoint), as the roles use it
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


def control_mounts_below(path):
    prefix = path.rstrip("/") + "/"
    with open("/proc/self/mountinfo") as handle:
        return [line.split()[4] for line in handle if line.split()[4].startswith(prefix)]


def become_subreaper():
    """Processes restored by criu --restore-detached are reparented to us, so we can reap them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="development run: sizes 0.0625 0.125 GiB, 1 run, 3 s warmup")
    parser.add_argument("--sizes", type=float, nargs="+", help="state sizes in GiB (device + host memory); default 0.25 0.5 1 2 8")
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
    args.sizes = args.sizes or ([0.0625, 0.125] if quick else [0.25, 0.5, 1, 2, 8])
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

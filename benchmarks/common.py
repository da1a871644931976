# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every benchmark shares: paths, the collection on sys.path, commands, the machine, the workload's answers."""

from __future__ import absolute_import, division, print_function

import ctypes
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

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


sys.path.insert(0, HERE)
try:  # the node cache of verified snapshots, where the checkout has it
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import (  # noqa: E402 pylint: disable=unused-import
        cache as stage_cache,
    )
except ImportError:
    stage_cache = None
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


def control_mounts_below(path):
    prefix = path.rstrip("/") + "/"
    with open("/proc/self/mountinfo") as handle:
        return [line.split()[4] for line in handle if line.split()[4].startswith(prefix)]


def become_subreaper():
    """Processes restored by criu --restore-detached are reparented to us, so we can reap them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

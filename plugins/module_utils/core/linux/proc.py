# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What /proc says about processes. PRIVATE to the inferops.snapshot collection.

One definition of a live process (a zombie or a dead task is not alive), of a process's identity
(pid + the kernel's start time of that pid), and of a process tree; and the memory the host can
still give a new one.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import time

from ..base.clock import wait_for

DEAD_STATES = ("Z", "X", "x")
MEMINFO = "/proc/meminfo"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
ACCEPTCON = 0x10000   # __SO_ACCEPTCON in /proc/net/unix's flags: a listening socket


def available_memory(meminfo=None):
    """Bytes the kernel estimates a new process can get without swapping (MemAvailable), or None."""
    try:
        with open(meminfo or MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (IOError, OSError, ValueError, IndexError):
        return None
    return None


def stat_fields(pid, proc="/proc"):
    """Fields of /proc/PID/stat after the command name (state first), or None when there is no such pid."""
    try:
        with open(os.path.join(proc, str(pid), "stat")) as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (IOError, OSError, IndexError):
        return None


def alive(pid, proc="/proc"):
    fields = stat_fields(pid, proc)
    return bool(fields) and fields[0] not in DEAD_STATES


def start_time(pid, proc="/proc"):
    """The kernel's start time of ``pid`` (clock ticks since boot): with the pid, it names one process."""
    fields = stat_fields(pid, proc)
    return int(fields[19]) if fields and len(fields) > 19 else None


def comm(pid, proc="/proc"):
    try:
        with open(os.path.join(proc, str(pid), "comm")) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def exists(pid, proc="/proc"):
    """Whether the pid is taken at all (a zombie still holds it)."""
    return os.path.exists(os.path.join(proc, str(pid)))


def children(proc="/proc"):
    """{ppid: [pid, ...]} of every process."""
    found = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        fields = stat_fields(name, proc)
        if fields:
            found.setdefault(int(fields[1]), []).append(int(name))
    return found


def descendants(pid, tree=None):
    """``pid`` and every process below it."""
    tree = children() if tree is None else tree
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found


def tree_states(pid):
    """The distinct states (R, S, T, ...) of ``pid`` and every process below it, sorted."""
    return sorted(set((stat_fields(member) or ["?"])[0] for member in descendants(pid)))


def continue_tree(pid):
    """SIGCONT to ``pid`` and every process below it (tasks CRIU left stopped); returns the pids."""
    pids = descendants(pid)
    kill_quietly(pids, signal.SIGCONT)
    return pids


def kill_quietly(pids, sig=signal.SIGKILL):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def wait_gone(pid, timeout, what=None, proc="/proc", interval=0.02):
    """Wait until ``pid`` is no longer alive (SnapshotTimeout after ``timeout``)."""
    return wait_for(lambda: (not alive(pid, proc), "pid %d alive" % pid), timeout, interval,
                    what=what or "the end of pid %d" % pid)


def stop(pid, expected_start, timeout=10.0, proc="/proc"):
    """SIGKILL the process (pid, start time) -- never another that reused the pid -- and wait until it is gone."""
    if start_time(pid, proc) != expected_start:
        return False
    kill_quietly([pid])
    wait_gone(pid, timeout, "the end of pid %d after SIGKILL" % pid, proc)
    return True


def namespace_pid(pid, proc="/proc"):
    """The pid of ``pid`` inside its own pid namespace (the last NSpid entry, e.g. 1 in a container);
    None when there is no such process."""
    try:
        with open(os.path.join(proc, str(pid), "status")) as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (IOError, OSError):
        return None
    return pid  # kernels without NSpid: no pid namespaces in use


def effective_uid(pid, proc="/proc"):
    """The effective uid of ``pid`` (as the host sees it), or None when there is no such process."""
    try:
        with open(os.path.join(proc, str(pid), "status")) as status:
            for line in status:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except (IOError, OSError, IndexError, ValueError):
        return None
    return None


def cmdline(pid, proc="/proc"):
    """The command line of ``pid`` as a list ([] for a kernel thread or a pid that is gone)."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            return [part.decode("utf-8", "replace") for part in handle.read().split(b"\0")[:-1]]
    except (IOError, OSError):
        return []


def started_at(pid, proc="/proc"):
    """When ``pid`` started, in seconds since the epoch, to a clock tick (its start ticks on the boot-time clock the
    kernel counts them on; /proc/stat's btime is whole seconds); None when it is gone."""
    ticks = start_time(pid, proc)
    if ticks is None:
        return None
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + float(ticks) / os.sysconf("SC_CLK_TCK")


def unix_listeners(path, proc="/proc"):
    """The pids holding a listening unix socket bound at ``path`` (this network namespace's /proc/net/unix), sorted."""
    wanted = set([os.path.normpath(path), os.path.realpath(path)])
    inodes = set()
    try:
        with open(os.path.join(proc, "net", "unix")) as handle:
            next(handle, None)
            for line in handle:
                fields = line.split()  # Num RefCount Protocol Flags Type St Inode [Path]
                if len(fields) >= 8 and int(fields[3], 16) & ACCEPTCON and fields[7] in wanted:
                    inodes.add("socket:[%s]" % fields[6])
    except (IOError, OSError, ValueError):
        return []
    found = set()
    for name in os.listdir(proc) if inodes else []:
        if not name.isdigit():
            continue
        fd_dir = os.path.join(proc, name, "fd")
        try:
            for fd in os.listdir(fd_dir):
                if os.readlink(os.path.join(fd_dir, fd)) in inodes:
                    found.add(int(name))
                    break
        except (IOError, OSError):
            continue
    return sorted(found)


def boot_id(path=BOOT_ID):
    """This boot of this host: a start time counts from it, and a pid of another boot is gone."""
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except (IOError, OSError):
        return None


def pid_namespace(pid="self", proc="/proc"):
    try:
        return os.readlink(os.path.join(proc, str(pid), "ns", "pid"))
    except OSError:
        return None


def run_anchor(pid=None, proc="/proc"):
    """The process that stands for the run ``pid`` (default: this one) belongs to on this host: the parent of its
    session's leader. Ansible runs each task in a session of its own -- a local connection's worker calls setsid
    (its parent is ansible-playbook, alive for the whole run), an SSH connection's shell is the session leader
    (its parent is the connection's sshd session, alive while the controller keeps the connection). So the
    anchor lives as long as the run, across its tasks, and dies with the controller. The leader itself when it
    has no parent worth naming (pid 1); ``pid`` when its session leader is gone."""
    pid = os.getpid() if pid is None else pid
    try:
        leader = os.getsid(pid)
    except OSError:
        return pid
    fields = stat_fields(leader, proc)
    if not fields or fields[0] in DEAD_STATES:
        return pid
    parent = int(fields[1])
    return leader if parent <= 1 or not alive(parent, proc) else parent


def identity(pid, proc="/proc"):
    """{pid, start, boot_id, pidns, what}: enough to tell later whether this very process still lives."""
    words = cmdline(pid, proc)
    what = " ".join(os.path.basename(word) if index == 0 else word for index, word in enumerate(words[:3]))
    return {"pid": pid, "start": start_time(pid, proc), "boot_id": boot_id(), "pidns": pid_namespace(pid, proc),
            "what": what[:120] or comm(pid, proc)}


def gone_reason(recorded, proc="/proc"):
    """Why the process ``recorded`` (an ``identity``) is provably gone, or None while it may live: it was on this
    host's current boot and in this pid namespace, and its pid is free or another process's (another start)."""
    if not recorded or not recorded.get("boot_id") or recorded.get("start") is None:
        return None
    if recorded["boot_id"] != boot_id():
        return "the host was rebooted since (boot id %s, now %s)" % (recorded["boot_id"], boot_id())
    if recorded.get("pidns") != pid_namespace("self", proc):
        return None  # another pid namespace: its pid means nothing here
    pid = recorded.get("pid")
    if alive(pid, proc) and start_time(pid, proc) == recorded["start"]:
        return None
    if alive(pid, proc):
        return "its pid %s is another process now (%s)" % (pid, comm(pid, proc))
    return "its process (pid %s, %s) is gone" % (pid, recorded.get("what") or "?")

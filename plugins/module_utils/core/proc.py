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

from .clock import wait_for

DEAD_STATES = ("Z", "X", "x")
MEMINFO = "/proc/meminfo"


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

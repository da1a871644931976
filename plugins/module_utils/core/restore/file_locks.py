# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The POSIX file locks a restored process held at its checkpoint, held again. PRIVATE.

CRIU (--file-locks) takes a process's POSIX locks again early in its restore, before it maps the
process's files; it then closes the descriptors it mapped them through, and closing any descriptor of a
file releases every POSIX lock the process holds on that file (POSIX semantics). An engine that maps a
file it locks -- SQLite's ``-shm`` index, which llama.cpp's disk cache uses -- comes back believing it
holds locks it no longer has, and another writer is not kept out. Seen with CRIU 4.2.1 on these nodes,
bare and in containers; ``docker start --checkpoint`` restores no POSIX lock at all (Docker does not ask
CRIU to). Tested in tests/unit/core/restore/test_file_locks.py and, with the real CRIU, test_bare_process_restore.py,
test_host_snapshot.py and test_llama_engine.py.

Only the process itself can take a POSIX lock again: its agent does (protocol.OP_RELOCK), before the
engine is unlocked. What a process holds is read from /proc/<pid>/fdinfo/<fd>. A lock still missing
after that -- in a process without an agent, in another process of the tree, or one that another
process took meanwhile -- means the restored engine is not the checkpointed one: a cold start, with
the reason.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..agent import protocol, restored
from ..base.errors import SnapshotError
from ..clients.control import AgentSocketClient
from ..linux import proc
from ..store import criu_images

AGENT_WAIT = 5.0  # an agent's socket comes back with its process; a process without one never has it


class LocksLost(SnapshotError):
    """The restored process tree does not hold every POSIX lock it held at the checkpoint."""


def held(pid, fd, proc_root="/proc"):
    """The POSIX locks process ``pid`` holds on the file behind its descriptor ``fd``: {(type, start, len)}."""
    try:
        with open(os.path.join(proc_root, str(pid), "fdinfo", str(fd))) as handle:
            return restored.posix_locks(handle.read())
    except (IOError, OSError):
        return set()


def missing(pid, locks, proc_root="/proc"):
    """Those of ``locks`` (criu_images.read_posix_locks entries) that process ``pid`` does not hold."""
    by_fd = dict((fd, held(pid, fd, proc_root)) for fd in set(lock["fd"] for lock in locks))
    return [lock for lock in locks if (lock["type"], lock["start"], lock["len"]) not in by_fd[lock["fd"]]]


def host_pids(root_pid, proc_root="/proc"):
    """{pid in the restored tree's own pid namespace: host pid} for ``root_pid`` and every process below it."""
    found = {}
    for pid in proc.descendants(root_pid):
        inner = proc.namespace_pid(pid, proc_root)
        if inner is not None:
            found[inner] = pid
    return found


def _describe(locks):
    return ", ".join("fd %d %s %d+%d" % (lock["fd"], lock["type"], lock["start"], lock["len"]) for lock in locks)


def hold_again(images_dir, root_pid, socket_dir, timeout, gone=None):
    """Make the restored tree rooted at host pid ``root_pid`` hold the POSIX locks it held at the checkpoint
    (``images_dir``: its CRIU images); the root's agent takes back what the restore dropped. Returns None
    when the checkpoint held none, else {"checkpointed", "taken_back"}; raises LocksLost."""
    try:
        locks = criu_images.read_posix_locks(images_dir)
    except ValueError as exc:
        raise LocksLost("cannot read the checkpoint's file locks: %s" % exc)
    if not locks:
        return None
    tree = host_pids(root_pid)
    root = criu_images.read_pstree(images_dir)[0][0]
    lost = {}
    for pid, mine in _by_pid(locks).items():
        host = tree.get(pid)
        gone_ones = mine if host is None else missing(host, mine)
        if gone_ones:
            lost[pid] = gone_ones
    others = dict((pid, mine) for pid, mine in lost.items() if pid != root)
    if others:
        raise LocksLost("process(es) %s of the restored tree lost POSIX file locks at the restore (%s) and only "
                        "the engine's own process has an agent to take them back"
                        % (", ".join(str(pid) for pid in sorted(others)),
                           "; ".join(_describe(mine) for mine in others.values())))
    if root not in lost:
        return {"checkpointed": len(locks), "taken_back": 0}
    wanted = [dict((key, lock[key]) for key in ("fd", "type", "start", "len")) for lock in lost[root]]
    try:
        client = AgentSocketClient.for_pid(root_pid, socket_dir)
        client.wait_listening(min(timeout, AGENT_WAIT), gone=gone)
        client.request(protocol.OP_RELOCK, timeout, locks=wanted)
    except SnapshotError as exc:
        raise LocksLost("the restore dropped %d of the engine's POSIX file locks (%s; CRIU releases a lock on a "
                        "file the process also maps) and its agent could not take them back: %s"
                        % (len(wanted), _describe(lost[root]), exc.msg))
    still = missing(root_pid, lost[root])
    if still:
        raise LocksLost("the engine's agent took back its POSIX file locks, yet the process does not hold %s"
                        % _describe(still))
    return {"checkpointed": len(locks), "taken_back": len(wanted)}


def _by_pid(locks):
    grouped = {}
    for lock in locks:
        grouped.setdefault(lock["pid"], []).append(lock)
    return grouped

"""Publishing a snapshot over an older one never leaves the published path empty: one renameat2(RENAME_EXCHANGE)
where the filesystem can, and where it cannot, two renames under the pod's lock whose leftover -- the last published
snapshot aside at .<pod>.old.<pid>, after a kill between them -- the next generation puts back (audit F3)."""

import errno
import os
import subprocess
import sys

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import fs, syscalls
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import manifest, seal

IDENTITY = {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "pod-a"}


def sealed(snap, tag):
    """A sealed staging directory of the pod, its one file saying ``tag``; returns the staging path."""
    staging = layout.staging_dir(snap)
    os.makedirs(os.path.join(staging, "host"))
    with open(os.path.join(staging, "host", "pages-1.img"), "w") as handle:
        handle.write(tag)
    seal.seal(staging, {"identity": IDENTITY, "created_at": "2026-12-05T12:00:00Z", "image": None,
                        "engine": {"name": "docker"}, "runtime": {"name": "acl", "version": "9.1.0"}, "devices": []},
              durable=False)
    return staging


def content(snap):
    with open(os.path.join(snap, "host", "pages-1.img")) as handle:
        return handle.read()


def published(tmp_path, tag="old"):
    snap = str(tmp_path / "ns" / "svc" / "p0" / "pod-a")
    seal.publish(sealed(snap, tag), snap)
    return snap


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no except clause of the code under test catches it."""


def watch_every_step(monkeypatch, snap, kill_at=None):
    """After every rename, exchange and removal publish makes, the published path holds a complete snapshot. With
    ``kill_at`` (a step's name), the process 'dies' right after that step."""
    seen = []

    def watched(name, real):
        def step(*args, **kwargs):
            real(*args, **kwargs)
            seen.append((name, content(snap) if os.path.isdir(snap) else None))
            assert manifest.verify(snap, plan=manifest.SIZES_ONLY)[0], "nothing complete published after %s" % name
            if name == kill_at:
                raise Killed(name)
        return step
    monkeypatch.setattr(seal.os, "rename", watched("rename", os.rename))
    monkeypatch.setattr(seal.syscalls, "exchange", watched("exchange", syscalls.exchange))
    monkeypatch.setattr(seal.fs, "remove_tree", watched("remove_tree", fs.remove_tree))
    return seen


def test_a_replacement_is_one_exchange_and_the_published_path_is_never_empty(tmp_path, monkeypatch):
    snap = published(tmp_path)
    staging = sealed(snap, "new")
    seen = watch_every_step(monkeypatch, snap)
    seal.publish(staging, snap)
    assert seen == [("exchange", "new"), ("remove_tree", "new")]
    assert sorted(os.listdir(os.path.dirname(snap))) == ["pod-a"]


def test_killed_after_the_exchange_the_new_snapshot_is_published_and_the_old_one_is_the_staging_leftover(
        tmp_path, monkeypatch):
    snap = published(tmp_path)
    staging = sealed(snap, "new")
    watch_every_step(monkeypatch, snap, kill_at="exchange")
    with pytest.raises(Killed):
        seal.publish(staging, snap)
    assert content(snap) == "new" and content(layout.staging_dir(snap)) == "old"  # a takeover removes the staging dir


def unsupported(*_args):
    raise OSError(errno.EINVAL, "Invalid argument")  # what NFS answers to RENAME_EXCHANGE


def test_where_the_filesystem_cannot_exchange_two_renames_replace_it_over_a_killed_namesakes_leftover(
        tmp_path, monkeypatch):
    snap = published(tmp_path)
    namesake = layout.old_dir(snap, os.getpid())  # a killed process that had this pid left half its old snapshot
    os.makedirs(os.path.join(namesake, "host"))
    monkeypatch.setattr(seal.syscalls, "exchange", unsupported)
    seal.publish(sealed(snap, "new"), snap)
    assert content(snap) == "new" and sorted(os.listdir(os.path.dirname(snap))) == ["pod-a"]


def test_the_exchange_swaps_two_paths_or_says_the_host_cannot(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.write_text("b")
    syscalls.exchange(str(first), str(second))
    assert first.read_text() == "b" and second.is_dir()

    class NoWrapper:  # a libc without renameat2 or syscall
        pass

    monkeypatch.setattr(syscalls, "_libc", NoWrapper)
    monkeypatch.setattr(syscalls.platform, "machine", lambda: "sparc64")
    with pytest.raises(OSError) as info:
        syscalls.exchange(str(first), str(second))
    assert info.value.errno in syscalls.EXCHANGE_UNSUPPORTED


def killed_between_the_two_renames(tmp_path, monkeypatch):
    """A publish on a filesystem without the exchange, killed after its first rename: the last published snapshot
    aside, the new sealed one in staging, nothing published."""
    snap = published(tmp_path)
    staging = sealed(snap, "new")
    monkeypatch.setattr(seal.syscalls, "exchange", unsupported)
    renames, real = [], os.rename

    def rename(src, dst):
        if renames:
            raise Killed("between the renames")
        renames.append(dst)
        real(src, dst)
    monkeypatch.setattr(seal.os, "rename", rename)
    with pytest.raises(Killed):
        seal.publish(staging, snap)
    monkeypatch.undo()
    assert not os.path.exists(snap) and content(renames[0]) == "old"
    return snap, renames[0]


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_next_generation_puts_back_the_snapshot_a_kill_between_the_renames_left_aside(tmp_path, monkeypatch):
    snap, aside = killed_between_the_two_renames(tmp_path, monkeypatch)
    moved = layout.old_dir(snap, dead_pid())  # the killed module's pid, gone now
    os.rename(aside, moved)
    taken = claim.take(snap, "next-run", lease=60)
    assert taken["put_back"] == moved and content(snap) == "old"
    assert not os.path.exists(moved) and os.path.isdir(layout.staging_dir(snap))  # no takeover: no claim was left


def test_a_leftover_is_not_put_back_while_its_writer_may_live_or_when_it_is_half_removed(tmp_path, monkeypatch):
    snap, aside = killed_between_the_two_renames(tmp_path, monkeypatch)
    live = layout.old_dir(snap, os.getppid())  # a live process's: maybe a publish of an older version, mid-way
    os.rename(aside, live)
    assert seal.put_back(snap) is None and os.path.isdir(live)
    half = layout.old_dir(snap, dead_pid())
    os.rename(live, half)
    os.unlink(os.path.join(half, "host", "pages-1.img"))  # a kill while the old one was being removed
    assert seal.put_back(snap) is None and not os.path.exists(snap)


def test_cleanup_puts_the_snapshot_back_before_its_policy_judges_it_and_check_mode_predicts_it(tmp_path, monkeypatch):
    """snapshot_cleanup would otherwise remove the only copy as the leftover of a generation that never finished."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import retention
    from ansible_collections.inferops.snapshot.plugins.modules import snapshot_cleanup
    snap, aside = killed_between_the_two_renames(tmp_path, monkeypatch)
    moved = layout.old_dir(snap, dead_pid())
    os.rename(aside, moved)
    now = os.stat(moved).st_mtime + 7200  # past the generation grace
    policy = {"remove": ["failed", "orphaned"], "generation_grace": 3600}
    outcomes = []
    for check_mode in (True, False):
        entries = retention.scan(str(tmp_path), now)
        put = snapshot_cleanup.put_back(entries, check_mode, now)
        assert put == [{"path": snap, "from": moved}] and os.path.isdir(moved) == check_mode
        entries = entries if check_mode else retention.scan(str(tmp_path), now)
        removals, kept = retention.decide(entries, {}, policy, {}, {}, None, now)
        outcomes.append(([item["path"] for item in removals], [item["reason"] for item in kept]))
    assert outcomes[0] == outcomes[1] and moved not in outcomes[0][0] and snap not in outcomes[0][0], outcomes
    assert content(snap) == "old"

"""Lazy pages (snapshot_node_lazy_pages): the restore-on-create runtime restores a container's memory through a
``criu lazy-pages`` daemon on the real (shared) dockerd, runc and CRIU, with the sample workload on the
simulated NPU. A lazy restore comes back with identical answers and every page in before the engine is
unlocked; a daemon killed while it still copies pages in ends in a cold start -- the restored tasks never
serve from zeroed memory; a tampered page image still never runs. Its pages stream in after the restored tasks
resume, so the daemon reads a private copy the verification made as it hashed the store's files (stages.COPY).

The node's criu is a wrapper around the real one (the role's snapshot_node_criu): while the file KILL_FLAG
exists, it SIGKILLs each lazy-pages daemon as soon as that has read 64 MiB of page images, i.e. in the
middle of its copy -- an operator's kill -9 or an OOM kill at the worst moment, nothing simulated -- and
tells its parent (the runtime) 0.3 s later, so that the restored tasks may fault on the holes first.

The workload's size: INFEROPS_LAZY_DEVICE_MB / INFEROPS_LAZY_HOST_MB (default 256 + 128 MB: its pages are
several times the 64 MiB, so the kill lands while pages are still missing)."""

import os
import shutil
import subprocess

import pytest

from _runtime_helpers import PROMPTS, WarmSnapshot, installed_runtime
from _runtime_helpers import recreated_containers_removed  # noqa: F401  # pylint: disable=unused-import  # the fixture
from test_restore_on_create import identity_env
from test_restore_on_create import WARMUP, assert_cold, corrupt_copy, flip_byte  # assert_cold checks that warmup

DEVICE_MB = int(os.environ.get("INFEROPS_LAZY_DEVICE_MB", "256"))
HOST_MB = int(os.environ.get("INFEROPS_LAZY_HOST_MB", "128"))
KILL_AFTER_BYTES = 64 * 1024 * 1024

WRAPPER = """#!/bin/bash
# criu for the lazy-pages tests: the real one; while %(flag)s exists, a lazy-pages daemon is killed mid-copy
real=%(real)s
if [ "$1" = lazy-pages ] && [ -e %(flag)s ]; then
    "$real" "$@" &
    daemon=$!
    while kill -0 "$daemon" 2>/dev/null; do
        read_bytes=$(awk '/^rchar:/ {print $2}' /proc/$daemon/io 2>/dev/null)
        if [ "${read_bytes:-0}" -gt %(after)d ]; then
            kill -9 "$daemon"
            echo "killed after $read_bytes bytes" >> %(killed)s
            break
        fi
        sleep 0.002
    done
    wait "$daemon"
    status=$?
    sleep 0.3  # the runtime learns of the death later than the restored tasks meet its holes (its grace covers it)
    [ "$status" -gt 128 ] && kill -$((status - 128)) $$  # die as the daemon did: the runtime sees the signal
    exit $status
fi
exec "$real" "$@"
"""


@pytest.fixture(scope="module")
def node(docker_env, tmp_path_factory):
    base = tmp_path_factory.mktemp("lazy-node")
    wrapper = base / "criu"
    flag, killed = base / "KILL_FLAG", base / "killed.log"
    wrapper.write_text(WRAPPER % {"real": shutil.which("criu"), "flag": flag, "killed": killed, "after": KILL_AFTER_BYTES})
    wrapper.chmod(0o755)
    with installed_runtime(base, snapshot_node_lazy_pages=True, snapshot_node_criu=str(wrapper)) as n:
        n.kill_flag, n.killed = flag, killed
        yield n


@pytest.fixture(scope="module")
def warm(node, docker_env, tmp_path_factory):
    w = WarmSnapshot(node, docker_env, tmp_path_factory.mktemp("lazy-warm"), "lzy", WARMUP, WORKLOAD_DEVICE_MB=DEVICE_MB,
                     WORKLOAD_HOST_MB=HOST_MB, ACL_SIM_DEVICE_MEM_BYTES="%dM" % (DEVICE_MB + 16))
    yield w
    w.remove()


def lazy_daemons():
    out = subprocess.run(["pgrep", "-af", "criu lazy-pages"], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def as_dict(w):
    return dict(pod=w.pod, snapshot_dir=w.snapshot_dir, expected=w.expected, info=w.info)


def test_a_lazy_restore_comes_back_with_every_page_in_before_the_unlock(node, warm):
    assert node.vars["snapshot_node_lazy_pages"] is True
    c, seconds = warm.restore()
    assert [c.generate(p) for p in PROMPTS] == warm.expected, "the memory or the device state is not the snapshot's"
    assert c.info()["started_at"] == warm.info["started_at"], "not the warmed-up process"
    record = node.log_records(c.id)[-1]
    assert record["outcome"] == "restored" and record["reason"] is None, record
    assert record["lazy_pages"]["status"] == 0, record.get("lazy_pages")
    assert "pages_in" in record["durations"] and record["device_actions"] == ["restore", "unlock"], record
    # the pages stream in after the tasks resume, past any check of a lease: the daemon reads a private copy, made and
    # hashed by the verification's one read of the store before anything was restored
    held = record["verify"]["held"]
    assert held["mode"] == "copied" and held["why_copied"].startswith("a lazy restore's pages"), held
    assert record["verify"]["overlapped"] is None, record["verify"]
    assert not lazy_daemons(), "the daemon exits once every page is in"
    print("\nlazy restore (%d + %d MB): first correct answer %.2f s after docker run; stages %s; lazy %s"
          % (DEVICE_MB, HOST_MB, seconds, record["durations"], record["lazy_pages"]))
    c.remove()


def test_a_lazy_pages_daemon_killed_mid_copy_ends_in_a_cold_start_never_zeros(node, warm):
    node.kill_flag.write_text("")
    c = warm.recreate(INFEROPS_RESTORE_FROM=warm.snapshot_dir)
    try:
        c.run()
        # whichever the restore saw first (the daemon's death, or the agent that faulted on its holes and
        # closed its connection), the reason names the daemon first
        record, info = assert_cold(node, c, as_dict(warm), "lazy_pages_failed: the criu lazy-pages daemon killed by signal 9")
        assert node.killed.exists() and "killed after" in node.killed.read_text(), "the daemon was never killed mid-copy"
        assert "killed before they serve (locked until every page is in)" in record["reason"], record
        assert info["metadata"]["restored"] is False
        assert not lazy_daemons()
    finally:  # the cold-started engine holds the workload's port: removed whatever the outcome, or the next test fails too
        node.kill_flag.unlink()
        c.remove()


def test_a_tampered_page_image_restored_lazily_never_runs(node, warm):
    snap = corrupt_copy(node, as_dict(warm), "corrupt", flip_byte)  # below another namespace: the identity is asked for
    c = warm.recreate(INFEROPS_RESTORE_FROM=snap, **identity_env(as_dict(warm)))
    try:
        c.run()
        record, _info = assert_cold(node, c, as_dict(warm), "checksum_mismatch: host/criu/pages-")
        assert record["verify"]["held"]["mode"] == "copied", record["verify"]
        assert "host_restore" not in record["durations"], "refused by the verifying read, before CRIU ran"
        assert not lazy_daemons(), "the daemon of the killed restore is gone too"
    finally:
        c.remove()

"""Hashing from mappings in a child process (mapped.py): the same digests as reading, and a file truncated while
it is mapped fails the check -- the child dies of SIGBUS, the caller gets an OSError and lives on.

hash_jobs forks only from a process with one thread, which a pytest worker is not always (tests before may leave
daemon threads), so the scenarios that must fork run in a fresh interpreter of their own."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import (hashing, manifest as manifest_utils,
                                                                                   mapped)
from unit.core.store.test_manifest_chunks import BIG, CHUNK, IDENTITY, sealed


def in_fresh_python(code, *args):
    """Run ``code`` in a new single-threaded interpreter with this one's import path; its stdout as JSON."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + [str(a) for a in args], env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("offset,length", [(0, None), (0, 5000), (4096, 10000), (7, 123457), (100000, None),
                                           (130000, 10 ** 9), (200000, None)])
def test_a_mapped_range_hashes_as_a_read_one(tmp_path, offset, length):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(131072 + 17))
    assert mapped.hash_range(str(path), offset, length) == hashing._hash_range(str(path), offset, length)


def test_an_empty_file_hashes_as_empty(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert mapped.hash_range(str(tmp_path / "empty")) == (0, hashlib.sha256(b"").hexdigest())


def test_the_child_hashes_every_job_and_reports_each(tmp_path):
    for name, size in (("a", 0), ("b", 3 * CHUNK + 5), ("c", 777)):
        (tmp_path / name).write_bytes(os.urandom(size))
    jobs = [(str(tmp_path / "b"), 0, CHUNK), (str(tmp_path / "b"), CHUNK, CHUNK), (str(tmp_path / "b"), 3 * CHUNK, CHUNK),
            (str(tmp_path / "a"), 0, None), (str(tmp_path / "c"), 0, None), (str(tmp_path / "b"), 0, None)]
    got = in_fresh_python("""
        import json, sys
        from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import mapped
        jobs = json.loads(sys.argv[1])
        seen = []
        results = mapped.hash_jobs([tuple(job) for job in jobs], 3, lambda index, result: seen.append(index))
        print(json.dumps({"results": results, "seen": sorted(seen)}))
    """, json.dumps(jobs))
    assert got["results"] == [list(hashing._hash_range(*job)) for job in jobs]
    assert got["seen"] == list(range(len(jobs)))


def test_a_file_truncated_while_mapped_fails_the_hashing_and_the_caller_lives(tmp_path):
    (tmp_path / "pages.img").write_bytes(os.urandom(4 * CHUNK))
    got = in_fresh_python("""
        import json, os, sys
        from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import mapped
        path = sys.argv[1]
        try:
            mapped.hash_jobs([(path, 0, None)], 2, after_map=lambda p: os.truncate(p, 0))
            print(json.dumps({"raised": None}))
        except OSError as exc:
            print(json.dumps({"raised": str(exc)}))
    """, tmp_path / "pages.img")
    assert got["raised"] and "SIGBUS" in got["raised"] and "changed while it was hashed" in got["raised"]


def test_a_job_that_cannot_be_opened_fails_the_hashing(tmp_path):
    got = in_fresh_python("""
        import json, sys
        from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import mapped
        try:
            mapped.hash_jobs([(sys.argv[1], 0, None)], 1)
            print(json.dumps({"raised": None}))
        except OSError as exc:
            print(json.dumps({"raised": str(exc)}))
    """, tmp_path / "absent")
    assert got["raised"] and "absent" in got["raised"]


def test_verify_by_path_hashes_mappings_and_still_finds_damage(tmp_path, small_chunks):
    final = sealed(tmp_path)[0]
    code = """
        import json, sys
        from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, manifest
        valid, reasons, details = manifest.verify(sys.argv[1], expect={"identity": json.loads(sys.argv[2])})
        print(json.dumps({"valid": valid, "reasons": reasons, "reader": details["hashing"]["reader"],
                          "bytes": details["bytes"]}))
    """
    got = in_fresh_python(code, final, json.dumps(IDENTITY))
    assert (got["valid"], got["reasons"], got["reader"]) == (True, [], "mapped")
    with open(final / BIG, "r+b") as handle:
        handle.seek(3 * CHUNK + 7)
        byte = handle.read(1)
        handle.seek(3 * CHUNK + 7)
        handle.write(bytes([byte[0] ^ 1]))
    got = in_fresh_python(code, final, json.dumps(IDENTITY))
    assert got["valid"] is False and got["reader"] == "mapped"
    assert "checksum_mismatch: %s" % BIG in got["reasons"]


def test_a_process_with_other_threads_reads_instead_of_forking(tmp_path, small_chunks):
    final = sealed(tmp_path)[0]
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert mapped.hash_jobs([(str(final / BIG), 0, None)], 1) is None
        valid, reasons, details = manifest_utils.verify(str(final), expect={"identity": IDENTITY})
    finally:
        stop.set()
        other.join()
    assert (valid, reasons, details["hashing"]["reader"]) == (True, [], "read")


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(manifest_utils, "CHUNK_BYTES", CHUNK)


def test_a_failing_progress_callback_leaves_no_child_behind(tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(3 * CHUNK))
    got = in_fresh_python("""
        import json, os, sys
        from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import mapped
        def fail(index, result):
            raise RuntimeError("progress failed")
        try:
            mapped.hash_jobs([(sys.argv[1], 0, None)] * 4, 2, fail)
            raised = None
        except RuntimeError as exc:
            raised = str(exc)
        try:
            os.waitpid(-1, os.WNOHANG)
            children = True
        except ChildProcessError:
            children = False
        print(json.dumps({"raised": raised, "children": children}))
    """, tmp_path / "f")
    assert got == {"raised": "progress failed", "children": False}


def test_the_hashing_child_dies_with_its_parent(tmp_path):
    """A verification killed mid-way (SIGKILL: no finally runs) leaves no hashing behind."""
    (tmp_path / "f").write_bytes(os.urandom(CHUNK))
    fifo = tmp_path / "child-pid"
    os.mkfifo(str(fifo))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    code = textwrap.dedent("""
        import os, sys, time
        from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import mapped
        def stall(path):
            with open(sys.argv[2], "w") as out:
                out.write(str(os.getpid()))
            time.sleep(3600)
        mapped.hash_jobs([(sys.argv[1], 0, None)], 1, after_map=stall)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "f"), str(fifo)], env=env)
    try:
        with open(str(fifo)) as handle:  # blocks until the child has mapped the file and stalls
            child = int(handle.read())
        parent.kill()
        parent.wait(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
    gone = threading.Event()

    def watch():
        while os.path.exists("/proc/%d" % child) and "Z" not in _state(child):
            gone.wait(0.05)
        gone.set()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert gone.wait(60), "the hashing child %d outlived its parent" % child


def _state(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_nothing_to_hash_names_no_reader(tmp_path):
    _results, _chunks, stats = hashing.hash_tree(str(tmp_path), [], {})
    assert stats["reader"] is None and stats["bytes"] == 0

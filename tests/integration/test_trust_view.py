"""What CRIU reads after the verification, attacked by a writer of the store on the real dockerd + runc + CRIU through
the node's restore-on-create runtime (the snapshot_node role's, with the sample workload on the simulated NPU).

(a) **The store exchanged under the restore.** A restore links the verified inodes into a view beside the snapshot,
``<instance>/.inferops-view-*``, and seals it. A separate process watches ``<instance>`` (inotify): when the view
appears it learns its name, and as soon as the restore writes its record of restores (``.<pod>.restores.json``, the
check stage, right after the seal) it renames a forged tree's prepared folder to that very name and exchanges
``<instance>`` with the forged tree (renameat2 RENAME_EXCHANGE). The forged images are a real snapshot of another
engine of the same image, on the same port and device: what it restores answers with another ``started_at``. When the
view reached runc as a path (``--image-path <instance>/.inferops-view-*/host/criu``), the audit's exchange won 140 of
200 tries (the forged process restored, reported as authenticated). This test's attacker, which acts on the record of
restores, does not reproduce that win against the path-based code: run there for 5 tries it got its trigger once, and
that restore started cold (``checksum_mismatch: host/criu/files.img is no longer the file that was verified``); the
other 4 restores gave it no trigger within 120 s. Now every reader gets the
folder the restore holds (``/proc/<pid>/fd/<N>``): in every try the genuine engine is restored (or, refused, started
cold with ``swapped:``), never the forged one.

(b) **A rename into the sealed view within one timestamp tick.** On a filesystem without multigrain timestamps -- an
ext2 image (128-byte inodes: whole seconds) loop-mounted as the snapshot's ``<instance>`` -- a copy of the genuine
core image (the same bytes, another inode) is renamed over the view's as soon as the view is sealed. A watch on the
folders' ctime missed it almost always (1,973 of 2,000 such renames left an ext2 folder's ctime unchanged); the
inotify watch sees every one: always a cold start, ``swapped:``.
"""

import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from _runtime_helpers import WarmSnapshot, generate_snapshot, identity, installed_runtime, wait_answer
from _runtime_helpers import recreated_containers_removed  # noqa: F401  # pylint: disable=unused-import  # the fixture
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import syscalls
from conftest import WorkloadContainer, docker, reset_device

WARMUP = 4.0
EXCHANGES = 20
RENAMES = 10
RECORD_WAIT = 120.0

# The writer of the store (a, b): names the view when it appears, acts when the restore writes its record of restores.
ATTACKER = r"""
import ctypes, os, shutil, struct, sys
mode, instance, pod, other = sys.argv[1:5]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_CLOEXEC)
assert fd >= 0 and libc.inotify_add_watch(fd, instance.encode(), 0x100 | 0x80 | 0x8) >= 0  # created, moved in, closed
print("watching", flush=True)
view, record = None, "." + pod + ".restores.json"
while True:
    data, offset = os.read(fd, 65536), 0
    while offset < len(data):
        _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, offset)
        name = data[offset + 16:offset + 16 + size].split(b"\0")[0].decode()
        offset += 16 + size
        if name.startswith(".inferops-view-"):
            view = name
        elif name == record and view:
            try:
                if mode == "exchange":  # the forged tree gets a folder of the view's name, then takes <instance>'s place
                    os.rename(os.path.join(other, "prepared"), os.path.join(other, view))
                    if libc.renameat2(-100, instance.encode(), -100, other.encode(), 2) != 0:
                        raise OSError(ctypes.get_errno(), "renameat2")
                else:  # a copy of a core image renamed over the view's
                    os.rename(other, os.path.join(instance, view, "host", "criu", os.path.basename(other)))
            except OSError as exc:
                print("late", view, exc, flush=True)
                sys.exit(0)
            print("done", view, flush=True)
            sys.exit(0)
"""


@pytest.fixture(scope="module")
def node(docker_env, tmp_path_factory):
    with installed_runtime(tmp_path_factory.mktemp("view-node")) as n:
        yield n


@pytest.fixture(scope="module")
def genuine(node, docker_env, tmp_path_factory):
    w = WarmSnapshot(node, docker_env, tmp_path_factory.mktemp("view-warm"), "view", WARMUP)
    yield w
    w.remove()


@pytest.fixture(scope="module")
def forged(node, genuine):
    """A snapshot of another engine of the same image, port and device, below the node's root: what the attacker
    restores in the genuine one's place (its ``started_at`` tells it apart). Returns (snapshot dir, started_at)."""
    pod = "view-forged-%s" % uuid.uuid4().hex[:6]
    engine = WorkloadContainer(pod, genuine.image_id, genuine.device_dir, genuine.port,
                               WORKLOAD_WARMUP_SECONDS=WARMUP)
    reset_device(genuine.device_dir)
    engine.run()
    try:
        engine.wait_ready(timeout=WARMUP + 120)
        started_at = engine.info()["started_at"]
        assert started_at != genuine.info["started_at"]
        snapshot_dir = str(node.roots / "forgery" / "sample" / "p0" / pod)
        generate_snapshot(engine, snapshot_dir, pod)
    finally:
        engine.remove()
    return snapshot_dir, started_at


class Attacker:
    """The writer of the store, a process of its own, watching ``instance`` before the restore starts."""

    def __init__(self, mode, instance, pod, other):
        self.process = subprocess.Popen([sys.executable, "-c", ATTACKER, mode, str(instance), pod, str(other)],
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "watching"

    def outcome(self):
        """("done" | "late", the view's name, ...) once it acted; it acts during the restore or never."""
        try:
            out, _err = self.process.communicate(timeout=RECORD_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            return ["never"]
        return out.split()

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def record_of(node, container):
    """The runtime's log record of the container's create, once written (the last thing a restore does)."""
    deadline = time.monotonic() + RECORD_WAIT
    while time.monotonic() < deadline:
        records = node.log_records(container.id)
        if records:
            return records[-1]
        time.sleep(0.05)
    raise AssertionError("the runtime wrote no record for %s:\n%s" % (container.name,
                                                                      docker("logs", container.name, check=False)))


def judge(container, record, genuine_started_at, forged_started_at):
    """'genuine' (restored, the genuine engine), 'refused' (a cold start for swapped:) or 'forged'."""
    if record["outcome"] == "restored":
        wait_answer(container)
        started_at = container.info()["started_at"]
        assert started_at in (genuine_started_at, forged_started_at), started_at
        return "genuine" if started_at == genuine_started_at else "forged"
    assert record["outcome"] == "cold" and record["reason"].startswith("swapped:"), record
    return "refused"


def test_the_store_exchanged_after_the_seal_never_gets_its_images_restored(node, genuine, forged):
    instance = os.path.dirname(genuine.snapshot_dir)
    other = os.path.join(os.path.dirname(instance), "p0-forged-%s" % uuid.uuid4().hex[:6])
    os.mkdir(other, 0o700)
    seen, left_full = [], []
    try:
        for _try in range(EXCHANGES):
            if not os.path.exists(os.path.join(other, "prepared")):
                shutil.copytree(forged[0], os.path.join(other, "prepared"), copy_function=os.link)
            reset_device(genuine.device_dir)
            attacker = Attacker("exchange", instance, genuine.pod, other)
            c = genuine.recreate(INFEROPS_RESTORE_FROM=genuine.snapshot_dir)
            try:
                c.run()
                record = record_of(node, c)
                acted = attacker.outcome()
                assert acted[0] == "done", acted  # the exchange happened while the restore ran, every time
                seen.append(judge(c, record, genuine.info["started_at"], forged[1]))
            finally:
                attacker.stop()
                c.remove()
            if os.path.exists(os.path.join(instance, acted[1], "host")) and \
                    not os.path.exists(os.path.join(instance, genuine.pod)):  # exchanged: put the store back
                syscalls.exchange(instance, other)
            left_full += put_back(instance, other, acted[1])
    finally:
        for name in os.listdir(instance):
            if name.startswith(layout.VIEW_PREFIX):
                shutil.rmtree(os.path.join(instance, name))
        shutil.rmtree(other, ignore_errors=True)
    print("\nexchanges after the seal: %s" % {outcome: seen.count(outcome) for outcome in set(seen)})
    assert "forged" not in seen, "the forged engine was restored in %d of %d tries: %s" % (
        seen.count("forged"), len(seen), seen)
    assert seen.count("genuine") + seen.count("refused") == EXCHANGES
    assert left_full == [], "a view was removed by a path that led elsewhere, not emptied through its descriptors"


def put_back(instance, other, view):
    """After a try: the forged tree's folder back to ``prepared`` for the next one, and what the restore's run left of
    the genuine view in <instance> removed; returns the files that were still in it (the restore empties its view
    through its descriptors: none)."""
    forged_view = os.path.join(other, view)
    if os.path.isdir(forged_view):
        os.rename(forged_view, os.path.join(other, "prepared"))
    left, full = os.path.join(instance, view), []
    if os.path.lexists(left):
        full = [entry for _dir, _subs, files in os.walk(left) for entry in files]
        shutil.rmtree(left)
    for name in os.listdir(other):  # what the restore wrote by path after the exchange (records) is the store's problem
        if name != "prepared":
            path = os.path.join(other, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    return full


@pytest.fixture
def ext2_instance(node, genuine, tmp_path):
    """The genuine snapshot copied onto an ext2 image (128-byte inodes: timestamps in whole seconds) loop-mounted as
    an <instance> below the node's root; unmounted and removed whatever happens."""
    image = tmp_path / "view-ext2.img"
    with open(str(image), "wb") as handle:
        handle.truncate(1 << 30)
    subprocess.run(["mkfs.ext2", "-q", "-F", "-I", "128", str(image)], check=True, capture_output=True)
    instance = node.roots / "viewext2" / "sample" / "p0"
    instance.mkdir(parents=True, mode=0o700)
    subprocess.run(["mount", "-o", "loop", str(image), str(instance)], check=True, capture_output=True)
    try:
        os.chmod(str(instance), 0o700)
        shutil.rmtree(str(instance / "lost+found"))
        shutil.copytree(genuine.snapshot_dir, str(instance / genuine.pod))
        yield instance
    finally:
        subprocess.run(["umount", str(instance)], check=False, capture_output=True)
        if os.path.ismount(str(instance)):
            subprocess.run(["umount", "-l", str(instance)], check=False, capture_output=True)
        image.unlink()


def test_a_core_image_renamed_into_the_sealed_view_within_one_tick_is_always_a_cold_start(node, genuine,
                                                                                          ext2_instance):
    snapshot_dir = str(ext2_instance / genuine.pod)
    images = os.path.join(snapshot_dir, layout.IMAGES_DIR)
    core = sorted(name for name in os.listdir(images) if name.startswith("core-"))[0]
    copy = str(ext2_instance / core)
    outcomes = []
    for _try in range(RENAMES):
        shutil.copyfile(os.path.join(images, core), copy)
        reset_device(genuine.device_dir)
        attacker = Attacker("rename", ext2_instance, genuine.pod, copy)
        c = genuine.recreate(INFEROPS_RESTORE_FROM=snapshot_dir,
                             INFEROPS_RESTORE_IDENTITY="/".join(identity(genuine.pod)[key]
                                                                for key in layout.IDENTITY_KEYS))
        try:
            c.run()
            record = record_of(node, c)
            acted = attacker.outcome()
            assert acted[0] == "done", acted
            outcomes.append((record["outcome"], record["reason"]))
        finally:
            attacker.stop()
            c.remove()
    print("\nrenames into the sealed view: %s" % outcomes)
    restored = [o for o in outcomes if o[0] != "cold" or not o[1].startswith("swapped: the view's folder host/criu")]
    assert restored == [], "%d of %d renames into the sealed view were not seen: %s" % (
        len(restored), RENAMES, restored)

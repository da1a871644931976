"""What each restore path does, read from its driver's declaration -- its stages, its verification plan, where its host
restore reads the images from -- and pinned: a change to what a path checks or runs is a change to this table."""

import json
import os
import shutil
import socket
import tempfile
import threading
import types

import pytest

from unit.core.restore import test_pipeline
from unit.core.restore.test_pipeline import DEVICE, Broken, run, snapshot, swap
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import pipeline, stages
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.bare import BareProcess
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.checkpoint import DockerCheckpoint
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.driver import Driver
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.handover import Handover
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.on_create import OnCreate

no_locks = test_pipeline.no_locks  # the fixture, as pytest finds it in this module
RESTORE = ("verify -> decrypt -> check -> prepare -> host_restore -> verify_pages -> metadata -> reseed -> file_locks "
           "-> device_restore -> pages_in -> canary -> complete")


def lazy_on_create():
    """The node runtime's driver on a node with lazy pages (snapshot_node_lazy_pages)."""
    return OnCreate(types.SimpleNamespace(config={"lazy_pages": True}), {}, "/bundle", {"id": "c0"},
                    {"identity": None, "runtime_version": None}, {}, "4.2.1")


class NoContainer:
    """The Docker client a DockerCheckpoint asks for its container, before anything runs."""

    def container_id(self, name):
        return None


@pytest.mark.parametrize("driver, expected", [
    (DockerCheckpoint(NoContainer(), "qwen-0"),
     "stages %s; verification: documents keep, page images hash, other files hash; images from copy" % RESTORE),
    (DockerCheckpoint(NoContainer(), "qwen-0", cold_because="docker_path_slower_than_cold: ..."),
     "stages %s; verification: documents keep, page images listed, other files listed; images from copy" % RESTORE),
    (Handover, "stages verify -> check -> prepare -> host_restore -> complete; verification: documents keep, page "
               "images listed, other files listed; images from nowhere (another run restores them)"),
    (OnCreate, "stages %s; verification: documents keep, page images defer, other files hash; images from cache or held"
               % RESTORE),
    (lazy_on_create(), "stages %s; verification: documents keep, page images defer, other files hash; images from "
                       "cache or copy" % RESTORE),
    (BareProcess, "stages %s; verification: documents keep, page images defer, other files hash; images from cache or "
                  "held" % RESTORE),
], ids=["docker", "docker, cold because slower", "handover", "on create", "on create, lazy", "bare process"])
def test_each_path_declares_what_it_runs_and_checks(driver, expected):
    assert pipeline.describe(driver) == expected


@pytest.mark.parametrize("driver", [DockerCheckpoint(NoContainer(), "qwen-0"), OnCreate, lazy_on_create(), BareProcess],
                         ids=["docker", "on create", "on create, lazy", "bare process"])
def test_a_path_that_leases_leaves_its_tasks_stopped_and_one_that_copies_says_why(driver):
    """A lease holds a writer off only for a while (lease-break-time): a path that reads the held files leaves the
    restored tasks stopped until verify_pages has asked the leases (its plan defers the page images, i.e. its host
    restore honours leave_stopped); a path whose tasks may run before that verifies a private copy, and says why."""
    assert stages.HELD in driver.images_from or stages.COPY in driver.images_from
    if stages.HELD in driver.images_from:
        assert driver.verification.page_images == "defer" and stages.COPY not in driver.images_from
    else:
        assert driver.copy_because


def test_the_handover_runs_no_stage_that_its_delegate_runs_where_criu_runs():
    """decrypt, the device check, verify_pages and the rest happen in the runtime's own run of the pipeline."""
    names = [stage.name for stage in Handover.stages]
    assert "decrypt" not in names and "verify_pages" not in names and "device_restore" not in names
    assert [stage.run for stage in Handover.stages if stage.name == "check"] != \
        [stage.run for stage in OnCreate.stages if stage.name == "check"], "its check leaves the devices to the runtime"


# -- the device state comes back checked against the device part as verified ----------------------------------------

class Agent:
    """The restored process's agent, at the process boundary: its socket in this very process (the 'restored process'
    of the pipeline's test driver is the test), answering as an agent whose process was backed up with the args
    shape of the snapshot API under ``versions``."""

    def __init__(self, versions):
        self.dir = tempfile.mkdtemp(prefix="agent-", dir="/tmp")  # short: the socket is bound by path
        self.versions, self.heard = versions, []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(os.path.join(self.dir, "agent.%d.sock" % os.getpid()))
        self.server.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        state = "BACKED_UP"
        while True:
            try:
                conn, _address = self.server.accept()
            except OSError:
                return
            op = json.loads(conn.makefile("rb").readline())["op"]
            self.heard.append(op)
            state = {"restore": "LOCKED", "unlock": "RUNNING"}.get(op, state)
            conn.sendall(json.dumps({"v": 1, "ok": True, "op": op, "state": state, "snapshot": {
                "api": "args", "api_versions": self.versions}}).encode() + b"\n")
            conn.close()

    def close(self):
        self.server.close()
        shutil.rmtree(self.dir)


ARGS_DEVICE = dict(DEVICE, snapshot_api={"api": "args", "device_memory": "required", "runtime_api_version": 71,
                                         "driver_api_version": 250})


def resumed(snap, agent, forge=None):
    """A restore of ``snap`` by the pipeline test's driver, resuming the device state as every path does; ``forge``:
    the device part a writer puts where the restore reads the snapshot's files, after the verification."""

    class Resuming(Broken):
        device_resume = Driver.device_resume  # the one every path runs

        def after_host_restore(self, attempt):  # the page images' verdict is in; the device state comes next
            if forge is not None:
                swap(os.path.join(attempt.content_dir, layout.DEVICE_PART), json.dumps(forge).encode())
            super(Resuming, self).after_host_restore(attempt)

    try:
        driver = Resuming()
        driver.socket_dir = agent.dir
        return run(snap, driver)
    finally:
        agent.close()


def test_the_device_state_comes_back_where_the_versions_are_those_of_the_backup(tmp_path, no_locks):
    agent = Agent({"runtime": 71, "driver": 250})
    attempt = resumed(snapshot(tmp_path, device=ARGS_DEVICE), agent)
    assert attempt.restored and attempt.device_actions == ["restore", "unlock"], attempt.reason
    # renew: the restore path bounds the copy's restore lease by its own deadline before anything else
    assert agent.heard == ["renew", "resumed", "state", "restore", "unlock"]


def test_the_device_versions_are_checked_against_the_device_part_as_verified_not_as_read_again(tmp_path, no_locks):
    """device_resume read device/device.json again, by path, after the verification: a writer who put a device part
    of the engine's new versions where the restore reads the snapshot's files, once the page images' verdict was in,
    had the device restored across versions -- restore and unlock sent before the swap was noticed. Checked against
    the verified bytes, the device is never touched."""
    agent = Agent({"runtime": 72, "driver": 250})
    forged = dict(ARGS_DEVICE, snapshot_api=dict(ARGS_DEVICE["snapshot_api"], runtime_api_version=72))
    attempt = resumed(snapshot(tmp_path, device=ARGS_DEVICE), agent, forge=forged)
    assert not attempt.restored and attempt.reason.startswith(
        "device_restore_failed: device_version_mismatch: runtime API 71 at the backup, 72 now"), attempt.reason
    assert agent.heard == ["renew", "resumed", "state"], "the device was not touched"

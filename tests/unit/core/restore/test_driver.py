"""What each restore path does, read from its driver's declaration -- its stages, its verification plan, where its host
restore reads the images from -- and pinned: a change to what a path checks or runs is a change to this table."""

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import pipeline
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.bare import BareProcess
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.checkpoint import DockerCheckpoint
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.handover import Handover
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.on_create import OnCreate

RESTORE = ("verify -> decrypt -> check -> prepare -> host_restore -> verify_pages -> metadata -> reseed -> file_locks "
           "-> device_restore -> pages_in -> canary -> complete")


class NoContainer:
    """The Docker client a DockerCheckpoint asks for its container, before anything runs."""

    def container_id(self, name):
        return None


@pytest.mark.parametrize("driver, expected", [
    (DockerCheckpoint(NoContainer(), "qwen-0"),
     "stages %s; verification: documents keep, page images hash, other files hash; images from held" % RESTORE),
    (DockerCheckpoint(NoContainer(), "qwen-0", cold_because="docker_path_slower_than_cold: ..."),
     "stages %s; verification: documents keep, page images listed, other files listed; images from held" % RESTORE),
    (Handover, "stages verify -> check -> prepare -> host_restore -> complete; verification: documents keep, page "
               "images listed, other files listed; images from nowhere (another run restores them)"),
    (OnCreate, "stages %s; verification: documents keep, page images defer, other files hash; images from cache or held"
               % RESTORE),
    (BareProcess, "stages %s; verification: documents keep, page images defer, other files hash; images from cache or "
                  "held" % RESTORE),
], ids=["docker", "docker, cold because slower", "handover", "on create", "bare process"])
def test_each_path_declares_what_it_runs_and_checks(driver, expected):
    assert pipeline.describe(driver) == expected


def test_the_handover_runs_no_stage_that_its_delegate_runs_where_criu_runs():
    """decrypt, the device check, verify_pages and the rest happen in the runtime's own run of the pipeline."""
    names = [stage.name for stage in Handover.stages]
    assert "decrypt" not in names and "verify_pages" not in names and "device_restore" not in names
    assert [stage.run for stage in Handover.stages if stage.name == "check"] != \
        [stage.run for stage in OnCreate.stages if stage.name == "check"], "its check leaves the devices to the runtime"

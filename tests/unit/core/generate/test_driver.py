"""Every engine host_checkpoint offers has its driver (generate/driver.py), and what each driver records names an
engine the manifest's schema knows: a snapshot of any engine is a valid manifest."""

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import schemas
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import commands
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate.bare_process import BareProcess
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate.checkpointer import DRIVERS
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate.cri_container import CriContainer
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate.docker_container import DockerContainer
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate.driver import Driver
from ansible_collections.inferops.snapshot.plugins.modules import host_checkpoint


def test_every_engine_of_the_module_has_a_driver_whose_engine_the_manifest_names():
    engines = host_checkpoint.ARGUMENT_SPEC["engine"]["choices"]
    assert DRIVERS == {"docker": DockerContainer, "containerd": CriContainer, "criu": BareProcess}
    assert sorted(DRIVERS) == sorted(engines)
    assert sorted(schemas.SCHEMAS["manifest"]["properties"]["engine"]["properties"]["name"]["enum"]) == sorted(engines)
    for engine, driver in DRIVERS.items():
        assert issubclass(driver, Driver) and driver.engine == engine


def test_a_driver_finds_nothing_before_its_preflight(monkeypatch):
    """The publish and abort phases of the controller's signing build the Checkpointer without a target: no driver
    may ask a daemon before preflight."""
    def no_command(*args, **kwargs):
        raise AssertionError("a driver ran %r before its preflight" % (args,))
    monkeypatch.setattr(commands.DEFAULT, "run", no_command)
    params = {name: spec.get("default") for name, spec in host_checkpoint.ARGUMENT_SPEC.items()}
    for driver in DRIVERS.values():
        made = driver(params, criu=None)
        assert made.pid is None and made.container_id is None
        assert made.runc_root == (made.runc.root if made.runc is not None else params["runc_root"])

"""Every copy of a snapshot its own randomness: the agent re-seeds the interpreter's generators (real
forked copies of one process, as clones of one snapshot are), calls the engine's RESTORE_POST hooks with the
restore's nonce once per restore, and notices a restore by itself; the protocol's resumed operation and its nonce;
the pipeline's reseed stage, which tells a real agent socket the nonce of the metadata file (an old agent, or none,
let the restore go on; a hook that fails is a cold start)."""

import importlib
import importlib.util
import json
import os
import random
import ssl
import sys
import textwrap
import types

import pytest

import conftest
from unit.core.restore import test_pipeline
from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import (launcher, protocol,
                                                                                   reseed as agent_reseed)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import SnapshotTimeout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import reseed, task
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import metadata

no_locks = test_pipeline.no_locks  # the fixture, as pytest finds it in this module

NONCE = "0123456789abcdef0123456789abcdef"


def draws_of_forked_copies(before_draw, copies=2, count=4):
    """``copies`` forked copies of this process (the same memory, as processes restored from one snapshot have), each
    running ``before_draw()`` and then drawing ``count`` numbers from Python's global random generator. A fork runs
    Python's at-fork handlers, which re-seed ``random`` in the child; CRIU runs none: each copy puts the state back."""
    random.seed(42)
    state = random.getstate()  # the state every copy starts from
    results = []
    for _copy in range(copies):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the copy
            try:
                os.close(read)
                random.setstate(state)
                before_draw()
                os.write(write, json.dumps([random.random() for _n in range(count)]).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as handle:
            results.append(json.loads(handle.read()))
        os.waitpid(pid, 0)
    return results


def test_copies_of_one_process_draw_the_same_numbers_unless_the_agent_reseeds_them():
    same = draws_of_forked_copies(lambda: None)
    assert same[0] == same[1], "the control: copies of one memory repeat one stream"
    reseeded = draws_of_forked_copies(agent_reseed.reseed_interpreter)
    assert reseeded[0] != reseeded[1] and reseeded[0] != same[0]


class Recorder(types.ModuleType):
    """A stand-in for a loaded library's module: records how it was seeded, checking the argument's form."""

    def __init__(self, name, check):
        super(Recorder, self).__init__(name)
        self.calls, self.check = [], check

    def _record(self, value):
        assert self.check(value), (self.__name__, value)
        self.calls.append(value)


def test_only_loaded_generators_are_reseeded_each_in_the_form_it_takes():
    numpy_random = Recorder("numpy.random", lambda v: len(v) == 8 and all(0 <= n < 2 ** 32 for n in v))
    numpy_random.seed = numpy_random._record
    torch = Recorder("torch", lambda v: isinstance(v, int) and 0 <= v < 2 ** 63)
    torch.manual_seed = torch._record
    openssl = Recorder("ssl", lambda v: isinstance(v, bytes) and len(v) == agent_reseed.SEED_BYTES)
    openssl.RAND_add = lambda data, entropy: openssl._record(data) if entropy == len(data) else None
    done, errors = agent_reseed.reseed_interpreter({"numpy.random": numpy_random, "torch": torch, "ssl": openssl})
    assert done == ["numpy", "torch", "ssl"] and errors == {}
    assert len(numpy_random.calls) == len(torch.calls) == len(openssl.calls) == 1
    # nothing is imported that the engine did not load: numpy itself is not, torch neither
    assert agent_reseed.reseed_interpreter({}) == ([], {})
    assert agent_reseed.reseed_interpreter({"numpy": object(), "numpy.random": None}) == ([], {})
    # OpenSSL through the ssl module the engine loaded (the real one here), and through _ssl alone
    assert agent_reseed.reseed_interpreter({"ssl": ssl}) == (["ssl"], {})
    assert agent_reseed.reseed_interpreter({"_ssl": sys.modules["_ssl"]}) == (["ssl"], {})


def test_a_generator_that_cannot_be_reseeded_is_named_and_the_others_still_are():
    broken = types.ModuleType("torch")  # half imported: no manual_seed yet
    done, errors = agent_reseed.reseed_interpreter({"random": random, "torch": broken})
    assert done == ["random"] and list(errors) == ["torch"] and "manual_seed" in errors["torch"]


# ------------------------------------------------------------------ the controller: resumed, hooks, noticing

class Incarnation:
    def __init__(self):
        self.value = ("boot", "1")

    def __call__(self):
        return self.value


@pytest.fixture
def controller():
    c = launcher.Controller(runtime=None, runtime_error="no ACL runtime in this test", incarnation=Incarnation())
    yield c
    c.close()


def test_resumed_reseeds_and_calls_each_hook_once_with_the_restores_nonce(controller):
    called = []
    controller.register_hook(launcher.RESTORE_POST, called.append)
    controller.register_hook(launcher.RESTORE_POST, called.append)  # once is enough
    state = random.getstate()
    reply = controller.handle({"op": "resumed", "nonce": NONCE})
    assert reply["ok"] and reply["changed"] is True and called == [NONCE], reply
    assert random.getstate() != state
    assert reply["resumed"]["by"] == "restore" and reply["resumed"]["hooks"] == 1 and "random" in reply["resumed"]["reseeded"]
    again = controller.handle({"op": "resumed", "nonce": NONCE})  # the same restore asking again
    assert again["ok"] and again["changed"] is False and called == [NONCE]
    other = "f" * 32
    assert controller.handle({"op": "resumed", "nonce": other})["changed"] and called == [NONCE, other]
    controller.unregister_hook(launcher.RESTORE_POST, called.append)
    assert controller.handle({"op": "resumed", "nonce": "e" * 32})["resumed"]["hooks"] == 0
    assert controller.handle({"op": "state"})["resumed"]["hooks"] == 0  # every reply says what the last restore did


def test_a_hook_that_fails_is_named_in_the_refusal_and_the_other_hooks_still_run(controller):
    called = []

    def broken(nonce):
        raise RuntimeError("the sampler is gone")
    controller.register_hook(launcher.RESTORE_POST, broken)
    controller.register_hook(launcher.RESTORE_POST, called.append)
    reply = controller.handle({"op": "resumed", "nonce": NONCE})
    assert not reply["ok"] and reply["error"]["kind"] == protocol.KIND_RESEED, reply
    assert "hook" in reply["error"]["message"] and "broken" in reply["error"]["message"]
    assert "the sampler is gone" in reply["error"]["message"] and called == [NONCE]


def test_a_restore_is_noticed_by_the_agent_itself_and_only_the_restore_path_calls_the_hooks(controller):
    called = []
    controller.register_hook(launcher.RESTORE_POST, called.append)
    assert controller.notice_restore() is False and controller.describe()["resumed"] is None
    controller._incarnation.value = ("boot", "2")  # what a CRIU restore of this process looks like from inside
    state = random.getstate()
    assert controller.notice_restore() is True and controller.notice_restore() is False
    record = controller.describe()["resumed"]
    assert random.getstate() != state and record["by"] == "agent" and "random" in record["reseeded"]
    assert called == [], "the hooks wait for the restore path's nonce (the metadata file's)"
    controller._incarnation.value = ("boot", "3")
    controller.handle({"op": "state"})  # any request notices too
    assert controller.describe()["resumed"]["at"] >= record["at"]


@pytest.mark.parametrize("message, words", [
    ({"op": "resumed"}, "field 'nonce': expected 32 lowercase hex digits"),
    ({"op": "resumed", "nonce": "ABCDEF" + "0" * 26}, "field 'nonce'"),
    ({"op": "resumed", "nonce": "0" * 31}, "field 'nonce'"),
    ({"op": "state", "nonce": NONCE}, "only resumed takes a nonce"),
])
def test_a_malformed_nonce_is_refused_naming_the_field(controller, message, words):
    with pytest.raises(protocol.ProtocolError, match=words):
        protocol.parse_request(message)
    reply = controller.handle(message)
    assert reply["error"]["kind"] == protocol.KIND_BAD_REQUEST and "'nonce'" in reply["error"]["message"]


def test_a_hook_for_another_stage_or_not_callable_is_refused(controller):
    with pytest.raises(ValueError, match="stage 'LOCK_PRE': expected one of RESTORE_POST"):
        controller.register_hook("LOCK_PRE", print)
    with pytest.raises(TypeError, match="hook: expected a callable"):
        controller.register_hook(launcher.RESTORE_POST, "reseed")


def test_the_nonce_is_an_optional_field_of_version_1():
    assert protocol.make_request("state", 5) == {"v": 1, "op": "state", "timeout": 5.0}
    request = protocol.make_request("resumed", 5, nonce=NONCE)
    assert protocol.parse_request(request) == ("resumed", 5.0) and protocol.parse_nonce(request) == NONCE
    assert textwrap.dedent(launcher.Controller.register_hook.__doc__)  # documented for the engine


# ------------------------------------------------- the pipeline's reseed stage, against a real agent socket

def load_agent(package_parent, name):
    """The agent package below ``package_parent`` imported under ``name`` (an image's copy, old or new)."""
    path = package_parent / "inferops_agent"
    spec = importlib.util.spec_from_file_location(name, str(path / "__init__.py"),
                                                  submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(name + ".launcher")


@pytest.fixture
def agent_here(tmp_path):
    """An agent serving this very process (the pipeline test's 'restored process' is the test itself), as the
    launcher serves an engine: ``start(agent_module)`` returns its Controller."""
    servers = []

    def start(module=launcher):
        controller = module.Controller(runtime=None, runtime_error="no ACL runtime in this test")
        server = module.AgentServer(str(tmp_path / "agent" / ("agent.%d.sock" % os.getpid())), controller)
        server.start()
        servers.append((server, controller))
        return controller
    yield start
    for server, controller in servers:
        server.close()
        controller.close()


class Restoring(test_pipeline.Broken):
    """The pipeline test's driver with an agent socket dir, and the metadata file written as a driver writes it."""

    def __init__(self, socket_dir, metadata_path, **kwargs):
        super(Restoring, self).__init__(**kwargs)
        self.socket_dir, self.metadata_path = socket_dir, metadata_path

    def after_host_restore(self, attempt):
        super(Restoring, self).after_host_restore(attempt)
        metadata.write_host(self.metadata_path, metadata.document({}, True, attempt.snapshot_dir, "snapshot_restore",
                                                                  restore_nonce=attempt.restore_nonce))


def test_every_restore_tells_the_restored_agent_the_nonce_of_its_metadata_file(tmp_path, agent_here, no_locks):
    controller = agent_here()
    heard = []
    controller.register_hook(launcher.RESTORE_POST, heard.append)
    snap = test_pipeline.snapshot(tmp_path)
    nonces = []
    for _restore in range(2):
        driver = Restoring(str(tmp_path / "agent"), str(tmp_path / "metadata.json"))
        attempt = test_pipeline.run(snap, driver)
        assert attempt.restored, attempt.reason
        with open(str(tmp_path / "metadata.json")) as handle:
            nonces.append(json.load(handle)["restore_nonce"])
        assert heard[-1] == nonces[-1] == attempt.restore_nonce
        assert attempt.details["reseed"] == {"told": True, "reseeded": controller.describe()["resumed"]["reseeded"],
                                             "hooks": 1}
        assert list(attempt.watch.durations).index("reseed") == list(attempt.watch.durations).index("metadata") + 1
    assert nonces[0] != nonces[1] and heard == nonces, "each restore its own nonce"


def test_a_hook_that_fails_makes_the_restore_a_cold_start(tmp_path, agent_here, no_locks):
    def broken(nonce):
        raise RuntimeError("the sampler is gone")
    agent_here().register_hook(launcher.RESTORE_POST, broken)
    driver = Restoring(str(tmp_path / "agent"), str(tmp_path / "metadata.json"))
    attempt = test_pipeline.run(test_pipeline.snapshot(tmp_path), driver)
    assert not attempt.restored and attempt.reason.startswith("reseed_failed: resumed refused by the process behind")
    assert "the sampler is gone" in attempt.reason and driver.calls[-2:] == ["undo", "cold_start"]


def test_an_agent_older_than_resumed_lets_the_restore_go_on_and_says_why(tmp_path, agent_here, no_locks):
    old = load_agent(conftest.old_agent_package(tmp_path), "old_inferops_agent")
    agent_here(old)
    driver = Restoring(str(tmp_path / "agent"), str(tmp_path / "metadata.json"))
    attempt = test_pipeline.run(test_pipeline.snapshot(tmp_path), driver)
    assert attempt.restored and attempt.details["reseed"]["told"] is False, attempt.details
    assert "predates re-seeding" in attempt.details["reseed"]["why"] and "'resumed'" in attempt.details["reseed"]["why"]


def test_a_process_without_an_agent_is_restored_and_only_its_metadata_file_has_the_nonce(tmp_path, no_locks):
    told = reseed.tell(os.getpid(), str(tmp_path / "no-agent"), NONCE, 5)
    assert told["told"] is False and "has no agent socket" in told["why"]
    assert reseed.not_told(told).startswith("reseed: not_told: the restored process has no agent socket at ")
    assert reseed.not_told({"told": True}) is None and reseed.not_told(None) is None
    with pytest.raises(SnapshotTimeout):  # a snapshot with a device part has an agent: waited for, then a failure
        reseed.tell(os.getpid(), str(tmp_path / "no-agent"), NONCE, 0.3, wait=True)


def test_a_restore_whose_engine_was_not_told_says_reseed_not_told_in_the_modules_warnings(tmp_path, no_locks):
    """An engine without the agent's socket was restored without a word about re-seeding: the result's ``reseed`` said
    ``told: false`` among its details, and nothing warned that copies of the snapshot may share their random streams."""
    driver = Restoring(str(tmp_path / "no-agent"), str(tmp_path / "metadata.json"))
    attempt = test_pipeline.run(test_pipeline.snapshot(tmp_path, device=None), driver)
    assert attempt.restored and attempt.details["reseed"]["told"] is False, attempt.reason
    warned = []
    result = task._result(attempt, {}, warned.append)
    assert result["reseed"]["told"] is False and warned[-1] == reseed.not_told(attempt.details["reseed"]), warned
    assert warned[-1].startswith("reseed: not_told: the restored process has no agent socket at /proc/%d/root%s/agent."
                                 % (os.getpid(), tmp_path / "no-agent")), warned

"""Instances from a snapshot, on the real dockerd + CRIU + the simulated NPU: the source
instance keeps serving while a clone -- pod 0 of another instance of the same service, in a network namespace
of its own and on a device of its own -- is restored from the source's snapshot by the node's
restore-on-create runtime. The clone answers exactly as the source does, both keep serving, the clone reads
who it is now (and whom it came from, and its own nonce) from its metadata file, two clones draw random streams
of their own, and a second restore of the same snapshot onto the clone's device while the clone runs is
refused (a cold start, device_busy)."""

import json
import time
import urllib.parse
import uuid

import pytest

from _runtime_helpers import installed_runtime
from conftest import WorkloadContainer, docker, free_port, install_devices, reset_device, run_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import engine_http
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import fleet, status

PROMPTS = ["what is an NPU?", "clone me", "数据"]
DEVICE_MOUNT = "/var/lib/inferops-npu"   # where every instance sees its NPU, whichever host directory backs it
pytestmark = pytest.mark.timeout(600)


class Instance(WorkloadContainer):
    """The workload with its simulated NPU at DEVICE_MOUNT, on a network of choice (host, or none: its own
    namespace, as a pod has), optionally under the restore-on-create runtime."""

    def __init__(self, name, image, device_dir, port, network="host", runtime=None, **env):
        super(Instance, self).__init__(name, image, device_dir, port, **env)
        self.network, self.runtime = network, runtime
        self.env["ACL_SIM_DEVICE_DIR"] = DEVICE_MOUNT

    def create_args(self):
        args = ["--name", self.name, "--network", self.network, "-v", "%s:%s" % (self.device_dir, DEVICE_MOUNT)]
        args += self.devices  # its own NPU's nodes, at /dev/davinci0 and /dev/davinci_manager in every instance
        if self.runtime:
            args += ["--runtime", self.runtime]
        for key, value in sorted(self.env.items()):
            args += ["-e", "%s=%s" % (key, value)]
        return args + [self.image]

    def get(self, path, timeout=30):
        """GET inside the container's own network namespace (a clone's port is not on the host's)."""
        code, body = engine_http.request("http://127.0.0.1:%d%s" % (self.port, path), timeout=timeout,
                                         netns_pid=self.pid)
        assert code == 200, (self.name, code, body[:300])
        return json.loads(body.decode())

    def answers(self):
        return [self.get("/v1/generate?prompt=" + urllib.parse.quote(p))["answer"] for p in PROMPTS]


def device_keys(device_dir):
    """The record of restores' keys of an instance's NPU: its chip's numbering on this node and its memory's directory."""
    return ["c:%d:%d" % tuple(install_devices(device_dir)["chips"]["0"]), "sim:%s" % device_dir]


def wait_answer(instance, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return instance.get("/v1/generate?prompt=" + urllib.parse.quote(PROMPTS[0]), timeout=5)
        except Exception:
            if time.monotonic() > deadline:
                logs = docker("logs", instance.name, check=False)
                raise AssertionError("%s never answered; logs:\n%s" % (instance.name, logs))
            time.sleep(0.05)


@pytest.fixture(scope="module")
def node(docker_env, tmp_path_factory):
    with installed_runtime(tmp_path_factory.mktemp("fleet-node")) as installed:
        yield installed


@pytest.fixture(scope="module")
def source(node, docker_env, tmp_path_factory):
    """Instance p0 of service 'sample' in namespace 'fleet': one warmed-up pod, snapshotted, still serving."""
    base = tmp_path_factory.mktemp("fleet-src")
    tag = uuid.uuid4().hex[:5]
    ident = {"namespace": "fleet", "service": "sample", "instance": "p0", "pod": "fl%s-p0-0" % tag}
    (base / "npu").mkdir(mode=0o700)
    # in a network namespace of its own, as a pod is: CRIU brings a process back into the kind of namespace it was
    # taken in, so a host-network engine's snapshot can only come back on the host's network (its port taken)
    src = Instance(ident["pod"], docker_env, base / "npu", free_port(), network="none", WORKLOAD_WARMUP_SECONDS=3)
    made = [src]
    try:
        src.run()
        wait_answer(src)
        expected = src.answers()
        snapshot_dir = layout.snapshot_dir(str(node.roots), ident)
        backup = run_module("npu_snapshot_backup", {"container": src.name, "lock": True, "snapshot_dir": snapshot_dir,
                                                    "identity": ident})
        assert backup["changed"] and backup["state"] == "BACKED_UP", backup
        checkpoint = run_module("host_checkpoint", {"container": src.name, "snapshot_dir": snapshot_dir,
                                                    "identity": ident, "timeout": 120})
        assert checkpoint["status"] == "completed", (checkpoint.get("msg"), checkpoint.get("criu_log_tail"))
        assert run_module("npu_snapshot_lock", {"container": src.name, "state": "unlocked"})["actions"] == \
            ["restore", "unlock"]
        image = docker("inspect", "--format", "{{.Image}}", src.name)

        def clone(instance, device_dir, ordinal=0, **env):
            target = dict(ident, instance=instance, pod="fl%s-%s-%d" % (tag, instance, ordinal))
            env.update(INFEROPS_RESTORE_FROM=snapshot_dir, INFEROPS_RESTORE_IDENTITY=layout.identity_string(target),
                       INFEROPS_RESTORE_SOURCE=layout.identity_string(ident), WORKLOAD_WARMUP_SECONDS=3)
            c = Instance(target["pod"], image, device_dir, src.port, network="none", runtime=node.name, **env)
            made.append(c)
            return c, target

        yield dict(ident=ident, src=src, expected=expected, snapshot_dir=snapshot_dir, clone=clone, base=base,
                   info=src.get("/v1/info"))
    finally:
        for c in made:
            c.remove()


def test_a_clone_of_another_instance_serves_the_same_answers_while_the_source_keeps_serving(node, source):
    src = source["src"]
    device = source["base"] / "npu-clone"
    device.mkdir(mode=0o700)
    reset_device(device)
    clone, target = source["clone"]("p1", device, POD_IP="10.0.1.1")
    started = time.monotonic()
    clone.run()
    wait_answer(clone)
    seconds = time.monotonic() - started
    record = node.log_records(docker("inspect", "--format", "{{.Id}}", clone.name))[-1]
    assert record["outcome"] == "restored" and record["reason"] is None, record
    # the same warmed-up process, device memory included, on its own device and in its own network namespace
    assert clone.answers() == source["expected"]
    info = clone.get("/v1/info")
    assert info["started_at"] == source["info"]["started_at"] and info["snapshot_state"] == "RUNNING", info
    # who it is now, whom it came from, and what it re-seeds from: the metadata file
    meta = info["metadata"]
    assert meta["restored"] is True and meta["identity"] == target and meta["source"] == source["ident"], meta
    assert len(meta["restore_nonce"]) == 32 and meta["env"]["POD_IP"] == "10.0.1.1"
    # the source was never touched: it serves on, and the clone does too
    for _round in range(3):
        assert src.answers() == source["expected"] and clone.answers() == source["expected"]
    assert src.get("/v1/info")["metadata"] is None, "the source has no metadata file: it was never restored"
    # the attempt is recorded beside the snapshot, with the clone's identity and its declared source
    entry = status.read(source["snapshot_dir"])["last_restore"]
    assert entry["outcome"] == "restored" and entry["source"] == source["ident"] and entry["identity"] == target, entry
    running = [e for e in fleet.read(source["snapshot_dir"]) if e["phase"] == "running"]
    assert running and running[-1]["pid"] == clone.pid and running[-1]["devices"] == device_keys(device), running
    print("\nclone of %s restored as %s in %.2f s after docker run (stages %s)"
          % (layout.identity_string(source["ident"]), layout.identity_string(target), seconds, record["durations"]))

    # a second clone onto the very device the first one runs on: refused, started cold (never restored twice)
    second, _target = source["clone"]("p2", device)
    second.create()
    docker("start", second.name)
    record = node.log_records(docker("inspect", "--format", "{{.Id}}", second.name))[-1]
    second.remove()
    assert record["outcome"] == "cold" and record["reason"].startswith("device_busy: "), record
    assert clone.answers() == source["expected"] and src.answers() == source["expected"]

    # once the clone is gone, its device is free for the next restore
    clone.remove()
    again, _target = source["clone"]("p3", device)
    reset_device(device)
    again.run()
    wait_answer(again)
    assert node.log_records(docker("inspect", "--format", "{{.Id}}", again.name))[-1]["outcome"] == "restored"
    assert again.answers() == source["expected"]
    assert again.get("/v1/info")["metadata"]["restore_nonce"] != meta["restore_nonce"], "each restore its own nonce"


def test_a_clone_onto_the_device_of_the_running_source_is_refused(node, source):
    """The generation entered the snapshotted engine in the record of restores with its devices: a clone mapped
    onto the source's own NPU while the source runs would overwrite the source's device memory -- refused, cold."""
    held = [e for e in fleet.read(source["snapshot_dir"]) if e["phase"] == "running" and e["pid"] == source["src"].pid]
    assert held and held[-1]["devices"] == device_keys(source["base"] / "npu"), fleet.read(source["snapshot_dir"])
    onto, _target = source["clone"]("p4", source["base"] / "npu")
    onto.create()
    docker("start", onto.name)
    record = node.log_records(docker("inspect", "--format", "{{.Id}}", onto.name))[-1]
    onto.remove()
    assert record["outcome"] == "cold" and record["reason"].startswith("device_busy: "), record
    assert source["src"].answers() == source["expected"], "the source serves on, its device memory untouched"


def test_a_clone_request_for_another_service_starts_cold(node, source):
    device = source["base"] / "npu-foreign"
    device.mkdir(mode=0o700)
    reset_device(device)
    foreign, _target = source["clone"]("p1", device, ordinal=5)
    foreign.env["INFEROPS_RESTORE_IDENTITY"] = "fleet/other/p1/" + foreign.name
    foreign.run()
    record = node.log_records(docker("inspect", "--format", "{{.Id}}", foreign.name))[-1]
    assert record["outcome"] == "cold" and record["reason"].startswith("clone_refused: "), record
    foreign.remove()


def test_the_module_clones_the_newest_snapshot_of_the_service_into_a_container_made_for_it(node, source):
    device = source["base"] / "npu-module"
    device.mkdir(mode=0o700)
    reset_device(device)
    clone, target = source["clone"]("p4", device)
    args = {"identity": target, "source": {"instance": "newest", "root": str(node.roots)}, "container": clone.name,
            "method": "runtime", "runtime_name": node.name, "timeout": 60}
    # bad input is refused naming the field, before anything is created
    refused = run_module("snapshot_restore", dict(args, method="docker"))
    assert refused["failed"] and refused["msg"].startswith("source: a clone is restored by the node's"), refused
    missing = run_module("snapshot_restore", args)
    assert missing["failed"] and missing["msg"].startswith("container: a clone needs a container of its own"), missing
    assert "INFEROPS_RESTORE_SOURCE=" + layout.identity_string(source["ident"]) in missing["msg"], missing["msg"]
    foreign = run_module("snapshot_restore", dict(args, identity=dict(target, service="other")))
    assert foreign["failed"] and foreign["msg"].startswith("source: no other instance of fleet/other"), foreign
    clone.create()
    result = run_module("snapshot_restore", args)
    assert not result["failed"] and result["restored"] is True, result
    assert result["source"] == source["ident"] and result["snapshot_dir"] == source["snapshot_dir"], result
    wait_answer(clone)
    assert clone.answers() == source["expected"] and source["src"].answers() == source["expected"]
    assert clone.get("/v1/info")["metadata"]["identity"] == target
    again = run_module("snapshot_restore", args)
    assert not again["failed"] and again["changed"] is False, again  # it runs: left alone


def test_two_clones_of_one_snapshot_draw_their_own_random_streams_and_nonces(node, source):
    """Two clones of one snapshot run side by side. Each restore's agent re-seeded Python's random, and the
    engine's RESTORE_POST hook re-seeded its own sampler from that restore's nonce (the one in its metadata file):
    their streams differ. The control: a generator of the engine that nobody re-seeds repeats itself in both."""
    clones = []
    for instance in ("p5", "p6"):
        device = source["base"] / ("npu-" + instance)
        device.mkdir(mode=0o700)
        reset_device(device)
        clone, _target = source["clone"](instance, device)
        clone.run()
        wait_answer(clone)
        record = node.log_records(docker("inspect", "--format", "{{.Id}}", clone.name))[-1]
        assert record["outcome"] == "restored", record["reason"]
        assert record["reseed"]["told"] is True and record["reseed"]["hooks"] == 1, record
        assert "random" in record["reseed"]["reseeded"] and record["durations"]["reseed"] < 10, record
        clones.append(clone)
    draws = [clone.get("/v1/random?n=8") for clone in clones]
    metas = [clone.get("/v1/info")["metadata"] for clone in clones]
    assert draws[0]["forgotten"] == draws[1]["forgotten"], "the control: without a re-seed the copies repeat a stream"
    assert draws[0]["global"] != draws[1]["global"], "Python's random repeats itself in two clones"
    assert draws[0]["sampler"] != draws[1]["sampler"], "the engine's sampler repeats itself in two clones"
    for drawn, meta in zip(draws, metas):
        assert meta["restored"] is True and drawn["restore_nonce"] == meta["restore_nonce"], (drawn, meta)
    assert metas[0]["restore_nonce"] != metas[1]["restore_nonce"]
    assert [c.answers() for c in clones] == [source["expected"]] * 2, "both serve the snapshot's answers"
    for clone in clones:
        clone.remove()

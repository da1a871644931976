"""The NPU path as it is on a real Ascend node, on the real dockerd and CRIU with the simulated NPU.

After its backup a real NPU process still holds its device files -- descriptors on /dev/davinci_manager (one per
sub-module the HAL bound), /dev/devmm_svm and /dev/hisi_hdc, and hundreds of shared mappings of the manager (its SVM
segments, its streams' queues); a chip it reaches through the manager, with no descriptor on the chip's node -- which
CRIU dumps only through a plugin. The simulator holds the same (docs/simulator.md "Device nodes"), so a checkpoint without the collection's CRIU NPU
plugin fails here as it would on hardware, and with it every restore path has to bring the device files back:
onto a node whose device numbering differs, never onto a device another process holds, never across runtime or
driver API versions (checked before the device is touched), and -- for a pod on a network of its own -- on the
pod's new address.
"""

import contextlib
import json
import os
import random
import shutil
import time
import urllib.parse
import uuid

import pytest

from _runtime_helpers import PROMPTS, RuntimeContainer, identity, installed_runtime
from conftest import (REPO, WorkloadContainer, aclsim_ctl, device_args, docker, free_port, install_devices,
                      reset_device, run_module)

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import engine_http
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import criu_images, device

HELD = {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"}  # no chip fd: the HAL binds it through the manager
DRIVER_LIBS = layout.NPU_DRIVER_DIR + "/lib64"  # what the Ascend Docker Runtime bind-mounts from the host
SIZES = dict(WORKLOAD_DEVICE_MB=16, WORKLOAD_HOST_MB=8, ACL_SIM_DEVICE_MEM_BYTES="64M", WORKLOAD_WARMUP_SECONDS=2)


def held_device_files(pid):
    """(paths of the descriptors, paths of the mappings) of process ``pid`` that are NPU device nodes."""
    fds = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        with contextlib.suppress(OSError):
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            if device.is_npu_node(target):
                fds.add(target)
    with open("/proc/%d/maps" % pid) as handle:
        maps = set(line.split()[-1] for line in handle if "davinci" in line)
    return fds, maps


def generate(container, snapshot_dir, pod, extra_env=None):
    """The device backup and the host checkpoint (the roles' sequence); the checkpoint's result."""
    target = {"container": container.name}
    backup = run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=snapshot_dir,
                                                    identity=identity(pod)))
    assert backup["state"] == "BACKED_UP", backup
    return run_module("host_checkpoint", {"container": container.name, "snapshot_dir": snapshot_dir,
                                          "identity": identity(pod), "timeout": 120}, extra_env=extra_env)


@pytest.fixture(scope="module")
def warm(docker_env, tmp_path_factory):
    """A warmed-up workload given its device nodes, checkpointed first without the NPU plugin (which fails), then
    with it; the original is removed."""
    base = tmp_path_factory.mktemp("npu-files")
    device_dir = base / "npu"
    device_dir.mkdir(mode=0o700)
    pod = "npu-%s" % uuid.uuid4().hex[:6]
    snapshot_dir = str(base / "snapshots" / "default" / "sample" / "p0" / pod)
    port = free_port()
    original = WorkloadContainer(pod, docker_env, device_dir, port, **SIZES)
    facts = dict(pod=pod, snapshot_dir=snapshot_dir, device_dir=device_dir, port=port, base=base)
    try:
        original.run()
        original.wait_ready(timeout=120)
        facts["expected"] = [original.generate(p) for p in PROMPTS]
        facts["image"] = docker("inspect", "--format", "{{.Image}}", pod)
        empty = base / "no-plugins"
        empty.mkdir()
        facts["without_plugin"] = generate(original, snapshot_dir, pod, extra_env={"CRIU_LIBS_DIR": str(empty)})
        facts["held_after_backup"] = held_device_files(original.pid)
        with open("/proc/%d/maps" % original.pid) as handle:
            facts["manager_mappings"] = sum(1 for line in handle if line.rstrip().endswith("/dev/davinci_manager"))
        facts["with_plugin"] = generate(original, snapshot_dir, pod)
        resumed = run_module("npu_snapshot_lock", {"container": original.name, "state": "unlocked"})
        assert resumed["actions"] == ["restore", "unlock"], resumed
        assert [original.generate(p) for p in PROMPTS] == facts["expected"]
    finally:
        original.remove()
    yield facts


def test_after_its_backup_the_engine_still_holds_its_device_files_which_criu_dumps_only_with_the_plugin(warm):
    fds, maps = warm["held_after_backup"]
    assert fds == HELD and maps == {"/dev/davinci_manager"}, (fds, maps)
    failed = warm["without_plugin"]
    assert failed["failed"] and "Can't handle non-regular mapping" in failed["msg"], failed.get("msg")
    assert failed["criu_log"] and os.path.exists(failed["criu_log"]), failed
    done = warm["with_plugin"]
    assert done["status"] == "completed", (done.get("msg"), done.get("criu_log_tail"))
    images = os.path.join(warm["snapshot_dir"], "host", "criu")
    recorded = criu_images.read_npu_devices(images)
    assert set(f["path"] for f in recorded["fds"]) == HELD, recorded["fds"]
    managers = [f for f in recorded["fds"] if f["path"] == "/dev/davinci_manager"]
    nodes = json.loads((warm["device_dir"] / "nodes.json").read_text())
    assert len(managers) > 1, "the HAL opens the manager once per sub-module: %s" % managers
    assert all((f["type"], [f["major"], f["minor"]]) == ("b", nodes["manager"]) for f in managers), (managers, nodes)
    assert set(v["path"] for v in recorded["vmas"]) == {"/dev/davinci_manager"}
    assert warm["manager_mappings"] > 256, "SVM segments and stream queues at real counts, more than the old record cap"
    with open(os.path.join(warm["snapshot_dir"], "checksum.sha256")) as handle:
        assert "host/criu/inferops-npu.img" in handle.read(), "the plugin's image is covered like every other file"
    with open(os.path.join(warm["snapshot_dir"], "device", "device.json")) as handle:
        api = json.load(handle)["snapshot_api"]
    assert api["api"] == "args" and api["device_memory"] == "required", api
    assert isinstance(api["runtime_api_version"], int) and isinstance(api["driver_api_version"], int), api


def restore_into(warm, name, devices_of, **args):
    """Snapshot_restore (method docker) into a new container on the devices installed for ``devices_of``."""
    c = WorkloadContainer(name, warm["image"], warm["device_dir"], warm["port"], **SIZES)
    c.devices = device_args(devices_of)
    c.create()
    result = run_module("snapshot_restore", dict(container=name, snapshot_dir=warm["snapshot_dir"], method="docker",
                                                 identity=identity(warm["pod"]), health_url=c.url + "/health",
                                                 health_timeout=120, **args))
    return c, result


def test_a_restore_onto_a_node_whose_device_numbering_differs_works(warm, tmp_path):
    other = tmp_path / "other-node"
    other.mkdir(mode=0o700)
    reset_device(warm["device_dir"])  # the pod was deleted: its NPU's memory is gone
    c, result = restore_into(warm, "%s-r1" % warm["pod"], other)
    try:
        assert result["restored"] is True, (result.get("reason"), result.get("msg"))
        assert [c.generate(p) for p in PROMPTS] == warm["expected"], "device memory restored"
        there = json.loads((other / "nodes.json").read_text())["chips"]["0"]
        inside = docker("exec", c.name, "stat", "-c", "%t %T", "/dev/davinci0").split()
        assert [int(x, 16) for x in inside] == there, "the plugin re-created the node with this node's numbering"
        assert held_device_files(c.pid) == (HELD, {"/dev/davinci_manager"}), "bound again after the host close"
    finally:
        c.remove()
        aclsim_ctl(other, "uninstall")


def test_a_device_another_process_holds_is_a_cold_start_before_criu_runs(warm, tmp_path):
    other = tmp_path / "held-node"
    other.mkdir(mode=0o700)
    nodes = install_devices(other)
    holder = os.open(os.path.join(nodes["nodes"], "davinci0"), os.O_PATH)
    try:
        c, result = restore_into(warm, "%s-r2" % warm["pod"], other)
    finally:
        os.close(holder)
    try:
        assert result["restored"] is False, result
        assert result["reason"].startswith("device_busy: /dev/davinci0 (c %d:%d on this node) is held by pid %d"
                                           % (tuple(nodes["chips"]["0"]) + (os.getpid(),))), result["reason"]
        assert "host_restore" not in result["durations"], "refused before CRIU ran"
        assert [c.generate(p) for p in PROMPTS] == warm["expected"], "the cold start serves"
    finally:
        c.remove()
        aclsim_ctl(other, "uninstall")


def test_a_restore_under_another_driver_version_is_refused_before_the_device_is_touched(warm, tmp_path):
    other = tmp_path / "upgraded-node"
    other.mkdir(mode=0o700)
    before = aclsim_ctl(warm["device_dir"], "driver")
    aclsim_ctl(warm["device_dir"], "driver", "api_version=%d" % random.randint(1000, 9999))  # the node's driver
    try:
        c, result = restore_into(warm, "%s-r3" % warm["pod"], other)
    finally:
        (warm["device_dir"] / "driver.conf").write_text("".join("%s=%s\n" % kv for kv in json.loads(before).items()))
    try:
        assert result["restored"] is False, result
        assert "device_version_mismatch: driver API" in result["reason"], result["reason"]
        assert "host_restore" in result["durations"] and result.get("device_actions") in (None, []), result
        assert [c.generate(p) for p in PROMPTS] == warm["expected"], "the cold start serves"
    finally:
        c.remove()
        aclsim_ctl(other, "uninstall")


def test_a_driver_upgrade_on_the_node_is_a_cold_start_before_criu_naming_the_driver(docker_env, tmp_path):
    """The Ascend Docker Runtime bind-mounts the node's driver libraries read-only; an upgrade is another
    libascend_hal.so at the same path (another halGetAPIVersion, another size). The checkpoint records what the engine
    mapped of it; the restore compares the node's before CRIU runs, which would refuse the file ("has bad size")."""
    built = REPO / "build" / "simulator"
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    port, pod = free_port(), "npu-drv-%s" % uuid.uuid4().hex[:6]
    snapshot_dir = str(tmp_path / "snapshots" / "default" / "sample" / "p0" / pod)
    original = WorkloadContainer(pod, docker_env, device_dir, port, **SIZES)
    original.volumes.append("%s:%s:ro" % (built / "driver", DRIVER_LIBS))
    restored = None
    try:
        original.run()
        original.wait_ready(timeout=120)
        expected = [original.generate(p) for p in PROMPTS]
        image = docker("inspect", "--format", "{{.Image}}", pod)
        done = generate(original, snapshot_dir, pod)
        assert done["status"] == "completed", (done.get("msg"), done.get("criu_log_tail"))
        with open(os.path.join(snapshot_dir, layout.MANIFEST)) as handle:
            part = json.load(handle)["device"]
        assert part["driver"]["directory"] == DRIVER_LIBS and layout.NPU_DRIVER_LIBRARY in part["driver"]["files"]
        assert part["snapshot_api"]["driver_api_version"] == 500, "the library's constant (build.sh)"
        run_module("npu_snapshot_lock", {"container": original.name, "state": "unlocked"})
        original.remove()
        reset_device(device_dir)
        restored = WorkloadContainer(pod + "-up", image, device_dir, port, **SIZES)
        restored.volumes.append("%s:%s:ro" % (built / "driver-upgrade", DRIVER_LIBS))
        restored.create()
        result = run_module("snapshot_restore", dict(container=restored.name, snapshot_dir=snapshot_dir,
                                                     method="docker", identity=identity(pod),
                                                     health_url=restored.url + "/health", health_timeout=120))
        assert result["restored"] is False, result
        assert result["reason"].startswith("driver_changed: the NPU driver library %s/%s is not the one the "
                                           % (built / "driver-upgrade", layout.NPU_DRIVER_LIBRARY)), result["reason"]
        assert "(driver API 500 then)" in result["reason"], result["reason"]
        assert "host_restore" not in result["durations"], "refused before CRIU ran"
        assert [restored.generate(p) for p in PROMPTS] == expected, "the cold start serves"
    finally:
        original.remove()
        if restored:
            restored.remove()
        aclsim_ctl(device_dir, "uninstall")


# -- the pod's new address ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def bridge_network():
    """A user-defined bridge network of its own (a /24 no other network here has), removed afterwards."""
    name = "inferops-test-%s" % uuid.uuid4().hex[:6]
    for _attempt in range(20):
        prefix = "10.%d.%d" % (random.randint(200, 250), random.randint(0, 255))
        if docker("network", "create", "--driver", "bridge", "--subnet", prefix + ".0/24", name, check=False):
            break
    else:
        raise AssertionError("no free subnet for a test network")
    try:
        yield name, prefix
    finally:
        docker("network", "rm", name, check=False)


def get(container, address, path, timeout=10):
    """GET from inside the container's own network namespace (its pod address is not the host's)."""
    code, body = engine_http.request("http://%s:%d%s" % (address, container.port, path), timeout=timeout,
                                     netns_pid=container.pid)
    assert code == 200, (code, body[:300])
    return json.loads(body.decode())


def answers(container, address):
    return [get(container, address, "/v1/generate?prompt=" + urllib.parse.quote(p))["answer"] for p in PROMPTS]


def wait_served(container, address, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return get(container, address, "/health", timeout=5)
        except Exception:
            if time.monotonic() > deadline:
                raise AssertionError("%s never answered on %s; logs:\n%s"
                                     % (container.name, address, docker("logs", container.name, check=False)))
            time.sleep(0.1)


def test_the_runtime_restores_a_pod_on_a_bridge_network_on_its_new_address(docker_env, tmp_path):
    """The engine listens on its pod's address (not 0.0.0.0): CRIU alone would try to bind the old one in the new
    pod and fail. The restore-on-create runtime learns the new address from dockerd and restores the socket on it."""
    device_dir = tmp_path / "npu"
    device_dir.mkdir(mode=0o700)
    port, pod = free_port(), "addr-%s" % uuid.uuid4().hex[:6]
    (tmp_path / "node").mkdir()
    with installed_runtime(tmp_path / "node") as node, bridge_network() as (network, prefix):
        old, new = prefix + ".10", prefix + ".20"
        snapshot_dir = str(node.roots / "default" / "sample" / "p0" / pod)
        original = WorkloadContainer(pod, docker_env, device_dir, port, network="%s:%s" % (network, old),
                                     WORKLOAD_HOST=old, **SIZES)
        restored = None
        try:
            original.run()
            wait_served(original, old)
            expected = answers(original, old)
            image = docker("inspect", "--format", "{{.Image}}", pod)
            done = generate(original, snapshot_dir, pod)
            assert done["status"] == "completed", done.get("msg")
            run_module("npu_snapshot_lock", {"container": original.name, "state": "unlocked"})
            original.remove()
            reset_device(device_dir)
            restored = RuntimeContainer(node.name, pod + "-new", image, device_dir, port,
                                        network="%s:%s" % (network, new), WORKLOAD_HOST=old,
                                        INFEROPS_RESTORE_FROM=snapshot_dir, **SIZES)
            restored.run()
            try:
                wait_served(restored, new)
            except AssertionError as exc:
                raise AssertionError("%s; the runtime said %s" % (exc, node.log_records(restored.id)))
            assert answers(restored, new) == expected, "the warmed-up engine answers on the new address"
            record = node.log_records(restored.id)[-1]
            assert record["outcome"] == "restored", record
            events = node.log_records(restored.id, event="address")
            assert events and old in events[-1]["action"] and new in events[-1]["action"], events
            with pytest.raises(engine_http.EngineHttpError):
                engine_http.request("http://%s:%d/health" % (old, port), timeout=2, netns_pid=restored.pid)
        finally:
            original.remove()
            if restored:
                restored.remove()
            aclsim_ctl(device_dir, "uninstall")


# -- both shapes of the snapshot API ------------------------------------------------------------------------------

@pytest.mark.parametrize("library, device_memory, outcome", [
    ("legacy-api", "required", "legacy"),
    ("legacy-api", "required_and_optional", "refused"),
    ("current", "required_and_optional", "args"),
])
def test_the_backup_passes_the_flags_with_the_args_shape_and_refuses_them_with_the_older_one(
        workload_factory, simulator_library, tmp_path, library, device_memory, outcome):
    lib = simulator_library if library == "current" else simulator_library.parent / "legacy-api" / "libascendcl.so"
    workload = workload_factory(INFEROPS_ACL_LIBRARY=lib).start()
    workload.wait_ready()
    target = {"pid": workload.pid, "agent_socket_dir": str(workload.socket_dir)}
    snapshot_dir = str(tmp_path / "snapshots" / "default" / "svc" / "p0" / "pod-a")
    ident = {"namespace": "default", "service": "svc", "instance": "p0", "pod": "pod-a"}
    backup = run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=snapshot_dir, identity=ident,
                                                    device_memory=device_memory))
    if outcome == "refused":
        assert backup["failed"] and "older snapshot API without arguments" in backup["msg"], backup
        assert "device_memory=required" in backup["msg"]
    else:
        assert backup["state"] == "BACKED_UP", backup
        assert backup["snapshot_api"]["api"] == outcome, backup["snapshot_api"]
        assert backup["snapshot_api"]["device_memory"] == (device_memory if outcome == "args" else None)
    resumed = run_module("npu_snapshot_lock", dict(target, state="unlocked"))
    assert resumed["state"] == "RUNNING", resumed
    shutil.rmtree(tmp_path / "snapshots", ignore_errors=True)

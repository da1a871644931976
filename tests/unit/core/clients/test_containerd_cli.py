"""containerd's client (clients/containerd_cli.py): a pod's container read from containerd's record as ``ctr
containers info`` prints it -- the CRI's metadata extension (base64 JSON), runc's options (base64 protobuf) --, with the
process boundary (the Runner) stubbed; and every way a container cannot be checkpointed named with the option."""

import base64
import json

import pytest

from conftest import protobuf_varint

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import CommandError, ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.containerd_cli import (
    ContainerdCli, container_id, cri_target, proto_string)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import containerd_cli as cc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.runc_cli import RuncCli

from ..test_clients import FakeRunner

CID = "3f" * 32
SANDBOX = "5a" * 32
IMAGE_ID = "sha256:" + "ab" * 32
SOCKET = "/run/test-node/containerd.sock"
RUNC = RuncCli().executable   # the runc the client runs (PATH's)


def field(number, value):
    """One protobuf field: a string/bytes (wire type 2), a bool or int (wire type 0)."""
    if isinstance(value, (bytes, str)):
        data = value.encode() if isinstance(value, str) else value
        return protobuf_varint(number << 3 | 2) + protobuf_varint(len(data)) + data
    return protobuf_varint(number << 3) + protobuf_varint(int(value))


def runc_options(**values):
    """containerd's runc Options message (runtime/v2/runc/options/oci.proto) with the fields given."""
    numbers = {"no_pivot_root": 1, "shim_cgroup": 3, "io_uid": 4, "binary_name": 6, "root": 7, "systemd_cgroup": 9}
    return b"".join(field(numbers[name], value) for name, value in values.items())


def any_json(type_url, data):
    """A protobuf Any as ctr prints it (Go's encoding/json of []byte: base64)."""
    return {"type_url": type_url, "value": base64.b64encode(data).decode()}


def record(kind="container", image_ref=IMAGE_ID, runtime="io.containerd.runc.v2", options=None, extension=True,
           version="v1"):
    """containerd's record of a pod's container, shaped as `ctr -n k8s.io containers info` prints it."""
    notes = {"io.kubernetes.cri.container-type": kind, "io.kubernetes.cri.sandbox-id": SANDBOX,
             "io.kubernetes.cri.sandbox-namespace": "inference", "io.kubernetes.cri.sandbox-name": "qwen-p0-0",
             "io.kubernetes.cri.container-name": "engine",
             "io.kubernetes.cri.image-name": "docker.io/inferops/workload:latest"}
    meta = {"Version": version, "Metadata": {"ID": CID, "Name": "engine", "SandboxID": SANDBOX, "ImageRef": image_ref,
                                             "Config": {"envs": [{"key": "TOKEN", "value": "s3cret-value"}]}}}
    info = {"ID": CID, "Labels": {"io.cri-containerd.kind": kind}, "Image": "docker.io/inferops/workload:latest",
            "Runtime": {"Name": runtime}, "SnapshotKey": CID, "Snapshotter": "overlayfs",
            "Spec": {"ociVersion": "1.0.2-dev", "annotations": notes, "process": {"env": ["TOKEN=s3cret-value"]}}}
    if options is not None:
        printed = options if isinstance(options, dict) else any_json("containerd.runc.v1.Options", options)
        info["Runtime"]["Options"] = printed
    if extension:
        info["Extensions"] = {"io.cri-containerd.container.metadata": any_json(
            "github.com/containerd/cri/pkg/store/container/Metadata", json.dumps(meta).encode())}
    return info


def cli(answers):
    client = ContainerdCli(SOCKET, runner=FakeRunner(answers))
    client.executable = "/usr/bin/ctr"
    return client


def ctr(*args):
    return ["/usr/bin/ctr", "--address", SOCKET, "--namespace", "k8s.io"] + list(args)


@pytest.mark.parametrize("reference, expected", [
    ("containerd://" + CID, CID), (CID, CID), ("  containerd://" + CID + "\n", CID)])
def test_a_container_is_named_by_its_id_or_as_the_kubelet_reports_it(reference, expected):
    assert container_id(reference) == expected


@pytest.mark.parametrize("reference", ["", "docker://" + CID, "containerd://", "-x", "a/b", "containerd://--all"])
def test_anything_else_is_refused_naming_the_option(reference):
    with pytest.raises(ParameterError, match=r"^container: .* is no container id of containerd") as info:
        container_id(reference)
    assert info.value.result["field"] == "container"


def test_proto_string_reads_a_string_field_among_others():
    data = runc_options(no_pivot_root=True, binary_name="/usr/sbin/runc", io_uid=1000, root="/run/node/runc",
                        systemd_cgroup=True)
    assert proto_string(data, 7) == "/run/node/runc" and proto_string(data, 6) == "/usr/sbin/runc"
    assert proto_string(data, 3) is None and proto_string(b"", 7) is None
    for broken in (data[:-3], b"\x3f", b"\x80"):
        with pytest.raises(ValueError):
            proto_string(broken, 7)


def test_a_pods_container_gives_its_image_its_runc_root_and_its_pod():
    target = cri_target(record(options=runc_options(binary_name="/usr/sbin/runc", root="/run/node-a/runc")))
    assert target == {"id": CID, "image_ref": IMAGE_ID, "image_name": "docker.io/inferops/workload:latest",
                      "runc_root": "/run/node-a/runc/k8s.io", "sandbox_id": SANDBOX, "pod": "inference/qwen-p0-0"}


def test_the_runtime_options_containerd_1_6_printed_for_a_test_nodes_runc_handler():
    """As `ctr containers info` printed them on node-a (BinaryName /usr/sbin/runc, Root /run/inferops-cri/node-a/runc)."""
    printed = {"type_url": "containerd.runc.v1.Options",
               "value": "Mg4vdXNyL3NiaW4vcnVuYzodL3J1bi9pbmZlcm9wcy1jcmkvbm9kZS1hL3J1bmM="}
    assert cri_target(record(options=printed))["runc_root"] == "/run/inferops-cri/node-a/runc/k8s.io"


def test_without_a_root_in_its_handler_the_shims_default_root_is_used():
    assert cri_target(record())["runc_root"] == "/run/containerd/runc/k8s.io"
    assert cri_target(record(options=runc_options(systemd_cgroup=True)))["runc_root"] == "/run/containerd/runc/k8s.io"
    assert cri_target(record(runtime="io.containerd.runc.v1"), namespace="other")["runc_root"] == \
        "/run/containerd/runc/other"


@pytest.mark.parametrize("info, message", [
    (record(kind="sandbox"), r"is the pod sandbox \(pause container\) of inference/qwen-p0-0"),
    (record(kind="sandbox", extension=False), r"is a pod sandbox \(containerd holds no CRI record"),
    (record(extension=False), "is no container the CRI made"),
    (record(version="v2"), "is no container the CRI made"),
    (record(image_ref="docker.io/inferops/workload:latest"), "records image 'docker.io/inferops/workload:latest'"),
    (record(image_ref=None), "records image None"),
    (record(runtime="io.containerd.kata.v2"), "runs in containerd runtime 'io.containerd.kata.v2'"),
    (record(options=b"\x3f\x01"), "runtime options of .* cannot be read"),
])
def test_what_cannot_be_checkpointed_is_refused_naming_the_option(info, message):
    with pytest.raises(ParameterError, match=r"^container: .*" + message) as raised:
        cri_target(info)
    assert raised.value.result["field"] == "container"
    assert "s3cret-value" not in raised.value.msg


def test_the_daemons_version_and_a_socket_that_does_not_answer(tmp_path):
    socket = tmp_path / "containerd.sock"
    socket.write_text("")
    out = ("Client:\n  Version:  1.6.20~ds1\n  Revision: 1.6.20~ds1-1\n\nServer:\n  Version:  1.6.21\n"
           "  Revision: x\n  UUID: y\n")
    client = ContainerdCli(str(socket), runner=FakeRunner([(["/usr/bin/ctr"], (0, out, ""))]))
    client.executable = "/usr/bin/ctr"
    assert client.version() == "1.6.21"
    down = ContainerdCli(str(socket), runner=FakeRunner([(["/usr/bin/ctr"], (
        1, "Client:\n  Version:  1.6.20~ds1\n", "ctr: failed to dial: connection refused\n"))]))
    down.executable = "/usr/bin/ctr"
    with pytest.raises(ParameterError, match="^containerd_address: containerd does not answer on .*connection refused"):
        down.version()
    with pytest.raises(ParameterError, match="^containerd_address: /nowhere/containerd.sock does not exist"):
        ContainerdCli("/nowhere/containerd.sock", runner=FakeRunner([])).version()


def test_a_container_containerd_does_not_know_is_named_with_the_node():
    missing = "ctr: container \"%s\" in namespace \"k8s.io\": not found" % CID
    client = cli([(ctr("containers", "info", CID), (1, "", missing))])
    with pytest.raises(ParameterError, match="^container: containerd on %s has no container %s" % (SOCKET, CID)):
        client.container(CID)
    broken = cli([(ctr("containers", "info", CID), (0, "not json", ""))])
    with pytest.raises(CommandError, match="printed no JSON"):
        broken.container(CID)


def runc_state(status="running", pid=4242):
    return json.dumps({"ociVersion": "1.0.2", "id": CID, "pid": pid, "status": status, "bundle": "/b/" + CID})


def test_find_reads_the_record_then_runcs_state_on_the_handlers_root():
    info = record(options=runc_options(root="/run/node-a/runc"))
    client = cli([(ctr("containers", "info", CID), (0, json.dumps(info), "")),
                  ([RUNC, "--root", "/run/node-a/runc/k8s.io", "state", CID], (0, runc_state(), ""))])
    target, state, runc_cli = client.find("containerd://" + CID)
    assert target["id"] == CID and state["pid"] == 4242 and state["bundle"] == "/b/" + CID
    assert runc_cli.root == "/run/node-a/runc/k8s.io"
    assert client.runner.calls[-1][-4:] == ["--root", "/run/node-a/runc/k8s.io", "state", CID]
    assert client.running_pid(CID) == 4242


@pytest.mark.parametrize("state, message", [
    ((1, "", "container does not exist"), "runc has no state of %s below /run/containerd/runc/k8s.io" % CID),
    ((0, runc_state("stopped", 0), ""), "%s \\(pod inference/qwen-p0-0\\) is stopped, not running" % CID),
    ((0, runc_state("paused"), ""), ".* is paused, not running"),
])
def test_a_container_that_does_not_run_is_refused(state, message):
    client = cli([(ctr("containers", "info", CID), (0, json.dumps(record()), "")), ([RUNC], state)])
    with pytest.raises(ParameterError, match="^container: " + message):
        client.find(CID)


# The node runtime's and snapshot_node's part: the configuration, the plugins, a record with its extensions decoded
PLUGINS = """TYPE                                  ID                       PLATFORMS      STATUS
io.containerd.content.v1              content                  -              ok
io.containerd.grpc.v1                 cri                      linux/amd64    error
io.containerd.snapshotter.v1          zfs                      linux/amd64    skip
"""


def node_cli(answers):
    return cc.ContainerdCli("/run/n/containerd.sock", containerd="/usr/bin/containerd", ctr="/usr/bin/ctr",
                            runner=FakeRunner(answers))


def test_the_plugins_and_their_status():
    found = node_cli([(["/usr/bin/ctr", "--address", "/run/n/containerd.sock", "plugins", "ls"], (0, PLUGINS, ""))]).plugins()
    assert found[cc.CRI_PLUGIN] == "error" and found[("io.containerd.content.v1", "content")] == "ok"
    assert len(found) == 3


def test_a_containers_record_with_the_cri_plugins_extensions_decoded():
    meta = {"Version": "v1", "Metadata": {"ID": "c1", "SandboxID": "s1", "ImageRef": "sha256:" + "e" * 64}}
    info = {"ID": "c1", "Image": "docker.io/x:latest", "Extensions": {
        cc.CRI_CONTAINER_EXTENSION: {"type_url": "github.com/containerd/cri/pkg/store/container/Metadata",
                                     "value": base64.b64encode(json.dumps(meta).encode()).decode()},
        "proto.extension": {"type_url": "x", "value": base64.b64encode(b"\x08\x01").decode()}}}
    argv = ["/usr/bin/ctr", "--address", "/run/n/containerd.sock", "--namespace", "k8s.io", "containers", "info", "c1"]
    record = node_cli([(argv, (0, json.dumps(info), ""))]).container_record("c1")
    assert cc.cri_metadata(record) == meta["Metadata"] and record["Extensions"]["proto.extension"] is None
    assert cc.cri_metadata(record, sandbox=True) is None


@pytest.mark.parametrize("answer, message", [
    ((1, "", 'ctr: container "c1" in namespace "k8s.io": not found'), 'not found'),
    ((0, "not json", ""), "ctr containers info c1 printed no JSON"),
])
def test_failures_name_the_call(answer, message):
    with pytest.raises(cc.ContainerdError) as failed:
        node_cli([(["/usr/bin/ctr"], answer)]).container_record("c1")
    assert message in failed.value.msg


def test_config_dump_runs_the_binary_given_on_the_file_given():
    runner = FakeRunner([(["/usr/bin/containerd", "--config", "/etc/n.toml", "config", "dump"], (0, "version = 2\n", ""))])
    assert cc.ContainerdCli("/s", containerd="/usr/bin/containerd", runner=runner).config_dump("/etc/n.toml") == \
        "version = 2\n"

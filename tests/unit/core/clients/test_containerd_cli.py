"""containerd's client with the process boundary stubbed: the plugins ctr lists, a container's record with its
extensions decoded (the CRI plugin's record of a container and of its sandbox), and failures that name the call."""

import base64
import json

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import containerd_cli as cc

from ..test_clients import FakeRunner

PLUGINS = """TYPE                                  ID                       PLATFORMS      STATUS
io.containerd.content.v1              content                  -              ok
io.containerd.grpc.v1                 cri                      linux/amd64    error
io.containerd.snapshotter.v1          zfs                      linux/amd64    skip
"""


def cli(answers):
    return cc.ContainerdCli("/run/n/containerd.sock", containerd="/usr/bin/containerd", ctr="/usr/bin/ctr",
                            runner=FakeRunner(answers))


def test_the_plugins_and_their_status():
    found = cli([(["/usr/bin/ctr", "--address", "/run/n/containerd.sock", "plugins", "ls"], (0, PLUGINS, ""))]).plugins()
    assert found[cc.CRI_PLUGIN] == "error" and found[("io.containerd.content.v1", "content")] == "ok"
    assert len(found) == 3


def test_a_containers_record_with_the_cri_plugins_extensions_decoded():
    meta = {"Version": "v1", "Metadata": {"ID": "c1", "SandboxID": "s1", "ImageRef": "sha256:" + "e" * 64}}
    info = {"ID": "c1", "Image": "docker.io/x:latest", "Extensions": {
        cc.CRI_CONTAINER_EXTENSION: {"type_url": "github.com/containerd/cri/pkg/store/container/Metadata",
                                     "value": base64.b64encode(json.dumps(meta).encode()).decode()},
        "proto.extension": {"type_url": "x", "value": base64.b64encode(b"\x08\x01").decode()}}}
    argv = ["/usr/bin/ctr", "--address", "/run/n/containerd.sock", "--namespace", "k8s.io", "containers", "info", "c1"]
    record = cli([(argv, (0, json.dumps(info), ""))]).container("c1")
    assert cc.cri_metadata(record) == meta["Metadata"] and record["Extensions"]["proto.extension"] is None
    assert cc.cri_metadata(record, sandbox=True) is None


@pytest.mark.parametrize("answer, message", [
    ((1, "", 'ctr: container "c1" in namespace "k8s.io": not found'), 'not found'),
    ((0, "not json", ""), "ctr containers info c1 printed no JSON"),
])
def test_failures_name_the_call(answer, message):
    with pytest.raises(cc.ContainerdError) as failed:
        cli([(["/usr/bin/ctr"], answer)]).container("c1")
    assert message in failed.value.msg


def test_config_dump_runs_the_binary_given_on_the_file_given():
    runner = FakeRunner([(["/usr/bin/containerd", "--config", "/etc/n.toml", "config", "dump"], (0, "version = 2\n", ""))])
    assert cc.ContainerdCli("/s", containerd="/usr/bin/containerd", runner=runner).config_dump("/etc/n.toml") == \
        "version = 2\n"

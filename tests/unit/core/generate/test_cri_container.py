"""The containerd driver of host_checkpoint (generate/cri_container.py): a pod's container found in containerd's
record and runc's state, its world read from the bundle's OCI config on disk, and every input it refuses refused
before containerd is asked. ctr and runc are stubbed at the process boundary (the Runner); the bundle, the mounts and
their files are real."""

import json

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import cri_container
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate.cri_container import CriContainer
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import digests, world
from ansible_collections.inferops.snapshot.plugins.modules import host_checkpoint

from ..clients.test_containerd_cli import CID, IMAGE_ID, RUNC, SOCKET, cli, record, runc_options
from ..test_clients import criu_cli

ROOT = "/run/node-a/runc/k8s.io"


@pytest.fixture(autouse=True)
def criu_config(monkeypatch):
    """runc's CRIU configuration is the node's (/etc/criu/runc.conf), checked in clients/runc_cli.py's own tests."""
    monkeypatch.setattr(cri_container, "check_criu_config", lambda: None)


@pytest.fixture(autouse=True)
def digest_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "cache_dir", str(tmp_path / "digest-cache"))


def bundle(tmp_path):
    """A bundle as containerd's shim keeps it, with the OCI config containerd wrote: a weights hostPath, the pod's
    emptyDir and downward API volumes, the kubelet's and containerd's per-pod files, the simulated NPU's devices."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny.gguf").write_bytes(b"weights" * 100)
    pod = tmp_path / "kubelet" / "pods" / "uid-a"
    sandbox = tmp_path / "state" / "io.containerd.grpc.v1.cri" / "sandboxes" / "ab12"
    sources = {"/models": models, "/run/inferops-snapshot": pod / "volumes" / "kubernetes.io~empty-dir" / "agent",
               "/etc/hosts": pod / "etc-hosts", "/dev/termination-log": pod / "containers" / "engine" / "5e3a",
               "/etc/hostname": sandbox / "hostname"}
    for destination, source in sources.items():
        if destination in ("/models", "/run/inferops-snapshot"):
            source.mkdir(parents=True, exist_ok=True)
        else:
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text("per pod")
    spec = {"ociVersion": "1.0.2-dev",
            "process": {"args": ["python3", "-m", "inferops_agent", "--", "engine.py"], "cwd": "/",
                        "user": {"uid": 0, "gid": 0}, "env": ["PATH=/usr/bin", "TOKEN=s3cret-value"]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}] + [
                {"destination": d, "type": "bind", "source": str(s),
                 "options": ["rbind", "rprivate", "ro" if d == "/models" else "rw"]} for d, s in sorted(sources.items())],
            "linux": {"devices": [{"path": "/dev/davinci0", "type": "c", "major": 10, "minor": 237},
                                  {"path": "/dev/davinci_manager", "type": "c", "major": 10, "minor": 238}],
                      "namespaces": [{"type": "network", "path": "/proc/4100/ns/net"}]}}
    directory = tmp_path / "io.containerd.runtime.v2.task" / "k8s.io" / CID
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(spec))
    return directory


def driver(tmp_path, **params):
    defaults = {name: spec.get("default") for name, spec in host_checkpoint.ARGUMENT_SPEC.items()}
    defaults.update(engine="containerd", container="containerd://" + CID, containerd_address=SOCKET)
    defaults.update(params)
    made = CriContainer(defaults, criu_cli([(["/usr/bin/criu", "--version"], (0, "Version: 4.2.1\n", ""))]))
    socket = tmp_path / "containerd.sock"
    socket.write_text("")
    made.containerd = cli([])
    made.containerd.address = str(socket)
    return made


def answer(made, directory, status="running", info=None):
    """What ctr and runc answer for the container: its version, its record, runc's state and version."""
    state = json.dumps({"id": CID, "pid": 4242, "status": status, "bundle": str(directory)})
    base = ["/usr/bin/ctr", "--address", made.containerd.address, "--namespace", "k8s.io"]
    made.containerd.runner.answers = [
        (base + ["version"], (0, "Client:\n  Version: 1.6.20~ds1\nServer:\n  Version:  1.6.20~ds1\n", "")),
        (base + ["containers", "info", CID], (0, json.dumps(info or record(options=runc_options(root=ROOT[:-7]))), "")),
        ([RUNC, "--root", ROOT, "state", CID], (0, state, "")),
        ([RUNC, "--root", ROOT, "--version"], (0, "runc version 1.1.5\ncommit: v1.1.5\n", ""))]


def test_preflight_finds_the_pods_container_and_its_world_comes_from_its_oci_config(tmp_path):
    made = driver(tmp_path)
    directory = bundle(tmp_path)
    answer(made, directory)
    versions = {"criu": "4.2.1"}
    made.preflight(versions)
    assert versions == {"criu": "4.2.1", "containerd": "1.6.20~ds1", "runc": "1.1.5"}
    assert (made.pid, made.container_id, made.runc_root) == (4242, CID, ROOT)
    assert made.describe() == "container %s of pod inference/qwen-p0-0" % CID[:12]
    assert made.image() == {"id": IMAGE_ID, "name": "docker.io/inferops/workload:latest"}
    assert made.version(versions) == "1.6.20~ds1"
    assert made.device_keys() == ["c:10:237"], "the manager node is every NPU process's: not a key"
    facts = made.facts(versions)
    assert list(facts["files"]) == ["/models"] and facts["host"]["runc"] == "1.1.5"
    assert sorted(facts["excluded"]) == ["/dev/termination-log", "/etc/hostname", "/etc/hosts",
                                         "/run/inferops-snapshot"]
    assert facts["process"]["devices"] == ["/dev/davinci0", "/dev/davinci_manager"]
    assert "s3cret-value" not in json.dumps(facts), "the environment is never recorded"
    world.add_digests(facts)
    # stale() asks containerd and runc again: the container as it runs now
    assert made.stale({"image": {"id": IMAGE_ID}, "world": facts}) == []
    assert made.stale({"image": {"id": "sha256:" + "cd" * 32}, "world": facts}) == [
        "image_mismatch: snapshot was taken from image sha256:%s, the container would run %s" % ("cd" * 32, IMAGE_ID)]


def test_a_dump_is_runcs_leave_running_checkpoint_on_the_handlers_root(tmp_path):
    made = driver(tmp_path)
    answer(made, bundle(tmp_path))
    made.preflight({})
    made.containerd.runner.answers.append(([RUNC, "--root", ROOT, "checkpoint"], (0, "", "")))
    work = tmp_path / "work"
    work.mkdir()
    made.dump(str(tmp_path / "images"), True, 30, str(work))
    call = made.containerd.runner.calls[-1]
    assert call[:4] == [RUNC, "--root", ROOT, "checkpoint"] and call[-1] == CID and "--leave-running" in call
    assert call[call.index("--image-path") + 1] == str(tmp_path / "images")


@pytest.mark.parametrize("params, message", [
    ({"container": None}, "^container: required with engine=containerd"),
    ({"container": "docker://" + CID}, "^container: 'docker://.*' is no container id of containerd"),
    ({"method": "docker"}, "^method: docker is Docker's own checkpoint"),
])
def test_bad_input_is_refused_naming_the_option_before_containerd_is_asked(tmp_path, params, message):
    made = driver(tmp_path, **params)
    with pytest.raises(ParameterError, match=message):
        made.preflight({})
    assert made.containerd.runner.calls == []


def test_a_container_that_is_not_running_or_whose_config_is_gone_is_refused(tmp_path):
    made = driver(tmp_path)
    directory = bundle(tmp_path)
    answer(made, directory, status="stopped")
    with pytest.raises(ParameterError, match="^container: %s \\(pod inference/qwen-p0-0\\) is stopped" % CID):
        made.preflight({})
    made = driver(tmp_path)
    answer(made, tmp_path / "gone")
    with pytest.raises(ParameterError, match="^container: the OCI config of the container cannot be read at .*gone"):
        made.preflight({})
    made = driver(tmp_path)
    answer(made, directory, info=record(kind="sandbox"))
    with pytest.raises(ParameterError, match="is the pod sandbox"):
        made.preflight({})
    assert [call[5:] for call in made.containerd.runner.calls] == [["version"], ["containers", "info", CID]], \
        "refused on containerd's record, before runc is asked"

"""The world a snapshot belongs to: what is recorded, and every difference that makes a restore a cold start.

Real files and the real /proc; docker inspect and OCI specs as dicts (what dockerd and containerd give)."""

import os
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO

from ansible_collections.inferops.snapshot.plugins.module_utils.core import layout, schema, world


def docker_info(models, args=("python3", "-m", "llama_cpp.server", "--n_ctx", "512")):
    return {"Config": {"Entrypoint": list(args[:1]), "Cmd": list(args[1:]), "WorkingDir": "", "User": ""},
            "HostConfig": {"Devices": [{"PathOnHost": "/dev/davinci0", "PathInContainer": "/dev/davinci0"}]},
            "Mounts": [{"Type": "bind", "Source": str(models), "Destination": "/models", "RW": False},
                       {"Type": "bind", "Source": "/var/cache/x", "Destination": "/cache", "RW": True},
                       {"Type": "tmpfs", "Destination": "/tmp"}]}


def spec(models, args=("python3", "-m", "llama_cpp.server", "--n_ctx", "512"), ro=True):
    return {"process": {"args": list(args), "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/models", "type": "bind", "source": str(models),
                        "options": ["rbind", "rprivate"] + (["ro"] if ro else [])},
                       {"destination": "/cache", "type": "bind", "source": "/var/cache/x", "options": ["rbind"]},
                       {"destination": "/etc/hosts", "type": "bind", "source": "/var/lib/docker/containers/x/hosts",
                        "options": ["rbind"]}],
            "linux": {"devices": [{"path": "/dev/davinci0"}]}}


@pytest.fixture
def models(tmp_path):
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "tiny.gguf").write_bytes(os.urandom(3 * 1024 * 1024))
    (directory / "config.json").write_text('{"n_ctx": 512}')
    return directory


def recorded_world(models):
    facts = world.capture(world.docker_facts(docker_info(models)), "4.2.1", "1.1.5")
    assert schema.errors("manifest", facts, definition="world") == []
    return facts


def test_an_unchanged_world_matches_through_docker_and_through_oci(models):
    recorded = recorded_world(models)
    assert sorted(recorded["files"]["/models"]) == ["config.json", "tiny.gguf"]
    assert world.compare(recorded, world.docker_facts(docker_info(models)), "4.2.1", "1.1.5") == []
    assert world.compare(recorded, world.oci_facts(spec(models)), "4.2.1", "1.1.5") == []


def test_a_model_changed_in_place_with_the_same_size_is_a_mismatch(models):
    recorded = recorded_world(models)
    path = models / "tiny.gguf"
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF  # the first block is always sampled
    path.write_bytes(bytes(data))
    reasons = world.compare(recorded, world.oci_facts(spec(models)), "4.2.1", "1.1.5")
    assert len(reasons) == 1 and reasons[0].startswith("files_mismatch: /models/tiny.gguf changed"), reasons


def test_a_rewrite_that_no_sample_sees_is_caught_by_the_same_files_mtime(models):
    recorded = recorded_world(models)
    path = models / "tiny.gguf"
    size = path.stat().st_size
    with open(path, "r+b") as handle:  # a byte between two sampled blocks, same inode
        handle.seek(world.SAMPLE_BYTES + 17)
        byte = handle.read(1)
        handle.seek(world.SAMPLE_BYTES + 17)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10 ** 9))
    assert path.stat().st_size == size
    reasons = world.compare(recorded, world.oci_facts(spec(models)), "4.2.1", "1.1.5")
    assert reasons == ["files_mismatch: /models/tiny.gguf was modified in place since the snapshot (mtime changed)"]


def test_a_copy_of_the_same_weights_elsewhere_matches(models, tmp_path):
    recorded = recorded_world(models)
    copy = tmp_path / "replica"
    subprocess.run(["cp", "-r", str(models), str(copy)], check=True)  # other inodes, other mtimes
    # mounts are matched where the process sees them: the same weights from another host path are the same world
    assert world.compare(recorded, world.oci_facts(spec(copy)), "4.2.1", "1.1.5") == []
    (copy / "tiny.gguf").write_bytes(os.urandom(3 * 1024 * 1024))
    assert world.compare(recorded, world.oci_facts(spec(copy)), "4.2.1", "1.1.5")[0].startswith(
        "files_mismatch: /models/tiny.gguf changed")


def test_per_pod_volumes_are_compared_by_presence_and_mode_only(models, tmp_path):
    """A downward API volume holds the pod's own name (another in every new pod) and a projected one its rotating
    token: neither is what the engine loaded. Their presence and mode still count."""
    def pod_info(uid, name):
        metadata = tmp_path / uid / "volumes" / "kubernetes.io~downward-api" / "metadata"
        metadata.mkdir(parents=True)
        (metadata / "name").write_text(name)
        info = docker_info(models)
        info["Mounts"].append({"Type": "bind", "Source": str(metadata), "Destination": "/etc/metadata", "RW": False})
        return info
    recorded = world.capture(world.docker_facts(pod_info("uid-a", "engine-0")), "4.2.1", "1.1.5")
    assert "/etc/metadata" not in recorded["files"] and "/models" in recorded["files"]
    assert world.compare(recorded, world.docker_facts(pod_info("uid-b", "engine-1")), "4.2.1", "1.1.5") == []
    writable = pod_info("uid-c", "engine-2")
    writable["Mounts"][-1]["RW"] = True
    assert world.compare(recorded, world.docker_facts(writable), "4.2.1", "1.1.5") == [
        "mounts_mismatch: /etc/metadata was %s (ro), now %s (rw)" % (
            tmp_path / "uid-a" / "volumes" / "kubernetes.io~downward-api" / "metadata", writable["Mounts"][-1]["Source"])]


@pytest.mark.parametrize("change, prefix", [
    (lambda s, m: s["process"].update(args=["python3", "-m", "llama_cpp.server", "--n_ctx", "128", "--seed", "7"]),
     "args_mismatch:"),
    (lambda s, m: s["process"].update(cwd="/srv"), "cwd_mismatch:"),
    (lambda s, m: s["process"].update(user={"uid": 1000, "gid": 1000}), "user_mismatch:"),
    (lambda s, m: s["linux"].update(devices=[{"path": "/dev/davinci1"}]), "devices_mismatch:"),
    (lambda s, m: s["mounts"].pop(1), "mounts_mismatch: /models"),
    (lambda s, m: s["mounts"][1]["options"].remove("ro"), "mounts_mismatch: /models"),
    (lambda s, m: (m / "extra.gguf").write_bytes(b"x"), "files_mismatch: /models/extra.gguf is new"),
    (lambda s, m: (m / "config.json").unlink(), "files_mismatch: /models/config.json is gone"),
])
def test_every_difference_is_named_with_both_values(models, change, prefix):
    recorded = recorded_world(models)
    current = spec(models)
    change(current, models)
    reasons = world.compare(recorded, world.oci_facts(current), "4.2.1", "1.1.5")
    assert reasons and reasons[0].startswith(prefix), reasons


def test_host_versions_and_an_older_snapshot_without_facts(models):
    recorded = recorded_world(models)
    other_kernel = dict(recorded, host=dict(recorded["host"], kernel="5.10.0-old"))
    assert world.compare(other_kernel, None)[0].startswith("kernel_mismatch: snapshot taken on kernel 5.10.0-old")
    assert world.compare(dict(recorded, host=dict(recorded["host"], runc="1.2.0")), None, runc_version="1.1.5")[0] \
        .startswith("runc_mismatch:")
    assert world.compare(dict(recorded, host=dict(recorded["host"], collection="0.1.0")), None)[0] \
        .startswith("collection_mismatch:")
    assert world.compare(None, None)[0].startswith("world_unknown:")


def test_a_bare_process_records_what_it_reads_not_what_it_writes(tmp_path):
    weights, log = tmp_path / "weights.bin", tmp_path / "engine.log"
    weights.write_bytes(os.urandom(200000))
    code = ("import mmap, time; r = open(%r, 'rb'); m = mmap.mmap(r.fileno(), 0, prot=mmap.PROT_READ); "
            "w = open(%r, 'a'); print('ready', flush=True); time.sleep(60)" % (str(weights), str(log)))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        facts = world.capture(world.process_facts(child.pid), "4.2.1", pid=child.pid)
    finally:
        child.kill()
        child.wait()
    assert str(weights) in facts["open_files"] and str(log) not in facts["open_files"]
    assert facts["process"]["args"][:2] == [sys.executable, "-c"]
    assert schema.errors("manifest", facts, definition="world") == []
    assert world.compare(facts, None, "4.2.1") == []
    weights.write_bytes(os.urandom(200000))
    assert world.compare(facts, None, "4.2.1")[0].startswith("files_mismatch: %s changed" % weights)


def test_the_collection_version_is_galaxys():
    assert layout.COLLECTION_VERSION == yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]

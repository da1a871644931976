"""The world a snapshot belongs to: what is recorded, and every difference that makes a restore a cold start.

Real files and the real /proc; docker inspect and OCI specs as dicts (what dockerd and containerd give). The
node's digest cache is the test's own directory (digests.cache_dir)."""

import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, flip_one_byte

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout, schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import digests, world


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


@pytest.fixture(autouse=True)
def digest_cache(tmp_path, monkeypatch):
    cache = tmp_path / "digest-cache"
    monkeypatch.setattr(digests, "cache_dir", str(cache))
    return cache


class Hashes:
    """Counts the files digests.digest reads in full (not from the cache)."""

    def __init__(self, monkeypatch):
        self.read = []
        original = digests.digest

        def counting(path, expected=None, use_cache=True):
            found = original(path, expected, use_cache)
            if not found[2]:
                self.read.append(str(path))
            return found
        monkeypatch.setattr(digests, "digest", counting)


@pytest.fixture
def models(tmp_path):
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "tiny.gguf").write_bytes(os.urandom(3 * 1024 * 1024))
    (directory / "config.json").write_text('{"n_ctx": 512}')
    return directory


def recorded_world(models, info=None, declared=()):
    """What a generation records: the identities beside the checkpoint, the digests once the engine runs again."""
    process = world.docker_facts(info or docker_info(models))
    facts = world.capture(process, "4.2.1", "1.1.5", excluded=world.excluded_mounts(process["mounts"], {}, declared))
    world.add_digests(facts)
    assert schema.errors("manifest", facts, definition="world") == []
    return facts


def test_an_unchanged_world_matches_through_docker_and_through_oci(models):
    recorded = recorded_world(models)
    assert sorted(recorded["files"]["/models"]) == ["config.json", "tiny.gguf"]
    assert world.compare(recorded, world.docker_facts(docker_info(models)), "4.2.1", "1.1.5") == []
    assert world.compare(recorded, world.oci_facts(spec(models)), "4.2.1", "1.1.5") == []


def test_an_unchanged_file_is_matched_by_its_identity_without_reading_it(models, monkeypatch):
    recorded = recorded_world(models)
    hashes = Hashes(monkeypatch)
    assert world.compare(recorded, world.oci_facts(spec(models)), "4.2.1", "1.1.5") == []
    assert hashes.read == [], "an unchanged file was read again"


@pytest.mark.parametrize("offset", [0, 65536 + 17, 1234567, 3 * 1024 * 1024 - 1])
def test_an_in_place_edit_with_its_mtime_put_back_is_a_mismatch(models, offset):
    """One byte anywhere, same inode and size, mtime restored (what `touch -r` or a careful tool does): ctime moved."""
    recorded = recorded_world(models)
    path = models / "tiny.gguf"
    before = path.stat()
    flip_one_byte(path, offset)
    os.utime(str(path), ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    reasons = world.compare(recorded, world.oci_facts(spec(models)), "4.2.1", "1.1.5")
    assert len(reasons) == 1 and reasons[0].startswith("files_mismatch: /models/tiny.gguf changed (size %d, sha256 "
                                                       % before.st_size), reasons


def test_a_same_size_model_renamed_over_the_old_one_is_a_mismatch(models):
    """How model updates are rolled out: a new file written beside, renamed over the old one (another inode)."""
    recorded = recorded_world(models)
    path = models / "tiny.gguf"
    data = bytearray(path.read_bytes())
    data[2 * 1024 * 1024 + 4321] ^= 0x01  # one bit, far from any block an older collection sampled
    (models / ".tiny.gguf.new").write_bytes(bytes(data))
    os.rename(str(models / ".tiny.gguf.new"), str(path))
    reasons = world.compare(recorded, world.oci_facts(spec(models)), "4.2.1", "1.1.5")
    assert len(reasons) == 1 and reasons[0].startswith("files_mismatch: /models/tiny.gguf changed (size"), reasons


def test_a_copy_of_the_same_weights_elsewhere_matches_by_digest_once_then_from_the_cache(
        models, tmp_path, monkeypatch):
    recorded = recorded_world(models)
    copy = tmp_path / "replica"
    subprocess.run(["cp", "-r", str(models), str(copy)], check=True)  # other inodes, other mtimes
    hashes = Hashes(monkeypatch)
    # mounts are matched where the process sees them: the same weights from another host path are the same world
    assert world.compare(recorded, world.oci_facts(spec(copy)), "4.2.1", "1.1.5") == []
    assert sorted(hashes.read) == sorted(str(copy / name) for name in ("config.json", "tiny.gguf"))
    assert world.compare(recorded, world.oci_facts(spec(copy)), "4.2.1", "1.1.5") == []
    assert len(hashes.read) == 2, "the node's cache knew their digests: nothing is read twice"
    (copy / "tiny.gguf").write_bytes(os.urandom(3 * 1024 * 1024))
    assert world.compare(recorded, world.oci_facts(spec(copy)), "4.2.1", "1.1.5")[0].startswith(
        "files_mismatch: /models/tiny.gguf changed")


def test_the_digest_cache_is_private_and_answers_only_for_its_own_identity(models, digest_cache):
    recorded_world(models)
    entries = sorted(os.listdir(str(digest_cache)))
    assert len(entries) == 2 and oct(os.stat(str(digest_cache)).st_mode & 0o777) == "0o700"
    assert all(oct(os.stat(str(digest_cache / name)).st_mode & 0o777) == "0o600" for name in entries)
    path = str(models / "tiny.gguf")
    assert digests.digest(path)[2] is True
    os.chmod(str(digest_cache), 0o755)  # no longer private: not trusted, the file is read
    assert digests.digest(path)[2] is False
    os.chmod(str(digest_cache), 0o700)
    os.chmod(path, 0o640)  # chmod moves ctime: another identity, no entry for it
    assert digests.digest(path)[2] is False


def test_a_read_write_weights_mount_is_compared_and_engine_state_is_left_out(models, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kv.bin").write_bytes(b"kv" * 1000)
    weights = tmp_path / "rw-weights"
    weights.mkdir()
    (weights / "model.bin").write_bytes(os.urandom(100000))
    info = docker_info(models)
    info["Mounts"] = info["Mounts"][:1] + [
        {"Type": "bind", "Source": str(weights), "Destination": "/weights", "RW": True},
        {"Type": "bind", "Source": str(cache), "Destination": "/cache", "RW": True}]
    recorded = recorded_world(models, info, declared=("/cache",))
    assert sorted(recorded["files"]) == ["/models", "/weights"]
    assert recorded["excluded"] == {"/cache": "declared engine state (engine_state_mounts)"}
    (cache / "kv.bin").write_bytes(b"other state")  # the engine's own: not the world
    assert world.compare(recorded, world.docker_facts(info), "4.2.1", "1.1.5") == []
    flip_one_byte(weights / "model.bin", 77777)
    assert world.compare(recorded, world.docker_facts(info), "4.2.1", "1.1.5")[0].startswith(
        "files_mismatch: /weights/model.bin changed (size 100000, sha256")


def test_the_collections_own_mounts_are_left_out():
    mounts = [{"source": "/srv/npu", "destination": "/var/lib/npu", "rw": True},
              {"source": "/srv/npu-snap", "destination": "/npu-snapshots", "rw": True},
              {"source": "/srv/agent", "destination": "/run/inferops-snapshot", "rw": True},
              {"source": "/srv/models", "destination": "/models", "rw": False},
              {"source": "/usr/local/Ascend/driver/lib64", "destination": "/usr/local/Ascend/driver/lib64", "rw": False}]
    env = {"ACL_SIM_DEVICE_DIR": "/var/lib/npu", "VLLM_NPU_SNAPSHOT_PATH": "/npu-snapshots/default/q/p0/q-0"}
    excluded = world.excluded_mounts(mounts, env)
    assert sorted(excluded) == ["/npu-snapshots", "/run/inferops-snapshot", "/usr/local/Ascend/driver/lib64",
                                "/var/lib/npu"], excluded
    assert "npu_driver.py" in excluded["/usr/local/Ascend/driver/lib64"], "the driver's: compared with its versions"
    assert "ACL_SIM_DEVICE_DIR" in excluded["/var/lib/npu"] and "VLLM_NPU_SNAPSHOT_PATH" in excluded["/npu-snapshots"]


def test_a_file_written_while_the_snapshot_is_taken_fails_the_generation_naming_the_fix(models):
    process = world.docker_facts(docker_info(models))
    facts = world.capture(process, "4.2.1", "1.1.5")
    flip_one_byte(models / "config.json", 1)  # the engine wrote it after the checkpoint, before the digests
    with pytest.raises(world.WorldError, match="files_changing: /models/config.json changed while the snapshot was "
                                               "taken.*engine_state_mounts"):
        world.add_digests(facts)


def test_a_record_made_by_an_older_collection_is_never_taken_for_unchanged(models):
    recorded = recorded_world(models)
    for record in recorded["files"]["/models"].values():
        record.pop("sha256")
        record.pop("ctime_ns")
        record["samples"] = "0" * 64
    assert schema.errors("manifest", recorded, definition="world") == []
    reasons = world.compare(recorded, world.oci_facts(spec(models)), "4.2.1", "1.1.5")
    assert reasons and all("sampled fingerprint" in r and "regenerate the snapshot" in r for r in reasons), reasons


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
    process = world.docker_facts(pod_info("uid-a", "engine-0"))
    recorded = world.capture(process, "4.2.1", "1.1.5", excluded=world.excluded_mounts(process["mounts"]))
    world.add_digests(recorded)
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
    assert world.compare(dict(recorded, host=dict(recorded["host"], collection="0.1.0")), None) == [], \
        "another release of the collection is no reason: the snapshot's format is (manifest.format_reason)"
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
        world.add_digests(facts)
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


def cri_spec(models, base, pod_uid, sandbox, uid=0):
    """A container's OCI config as containerd's CRI plugin writes it for a pod: the kubelet's /etc/hosts and
    termination log (below its pod directory), containerd's hostname, resolv.conf and /dev/shm of the sandbox."""
    kubelet = base / "kubelet" / "pods" / pod_uid
    sandbox_dir = base / "state" / "io.containerd.grpc.v1.cri" / "sandboxes" / sandbox
    files = {"/etc/hosts": kubelet / "etc-hosts", "/dev/termination-log": kubelet / "containers" / "engine" / "5e3a",
             "/etc/hostname": sandbox_dir / "hostname", "/etc/resolv.conf": sandbox_dir / "resolv.conf"}
    for destination, path in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("%s of pod %s\n" % (destination, pod_uid))
    (sandbox_dir / "shm").mkdir(exist_ok=True)
    (sandbox_dir / "shm" / "engine.lock").write_text(pod_uid)
    current = spec(models)
    current["process"]["user"] = {"uid": uid, "gid": uid}
    current["mounts"] = [m for m in current["mounts"] if m["destination"] == "/models"]
    current["mounts"] += [{"destination": d, "type": "bind", "source": str(p), "options": ["rbind", "rprivate", "rw"]}
                          for d, p in sorted(files.items())]
    current["mounts"].append({"destination": "/dev/shm", "type": "bind", "source": str(sandbox_dir / "shm"),
                              "options": ["rbind", "ro"]})
    return current


def test_a_pods_own_files_on_containerd_are_left_out_and_its_user_is_compared(models, tmp_path):
    """What the kubelet and containerd write per pod (its /etc/hosts, termination log, hostname, resolv.conf, /dev/shm)
    says who the pod is: left out, so that the pod recreated with another uid and sandbox matches. The OCI config's
    uid/gid is recorded (the manifest's schema takes them) and compared, with an OCI config and with Docker's User."""
    process = world.oci_facts(cri_spec(models, tmp_path, "uid-a", "sandbox-a"))
    recorded = world.capture(process, "4.2.1", "1.1.5", excluded=world.excluded_mounts(process["mounts"]))
    world.add_digests(recorded)
    assert schema.errors("manifest", recorded, definition="world") == []
    assert sorted(recorded["excluded"]) == ["/dev/shm", "/dev/termination-log", "/etc/hostname", "/etc/hosts",
                                            "/etc/resolv.conf"], recorded["excluded"]
    assert list(recorded["files"]) == ["/models"] and (recorded["process"]["uid"], recorded["process"]["gid"]) == (0, 0)
    assert world.compare(recorded, world.oci_facts(cri_spec(models, tmp_path, "uid-b", "sandbox-b")), "4.2.1",
                         "1.1.5") == []
    assert world.compare(recorded, world.oci_facts(cri_spec(models, tmp_path, "uid-c", "sandbox-c", uid=1000)),
                         "4.2.1", "1.1.5") == ["user_mismatch: user '0:0' in the snapshot, '1000:1000' now"]
    # the same snapshot restored into a Docker container: its User against the recorded uid/gid ('' is root)
    oci_only = dict(recorded, process=dict(recorded["process"], mounts=[
        m for m in recorded["process"]["mounts"] if m["destination"] == "/models"]))
    for user, reasons in (("", []), ("0:0", []), ("1000", ["user_mismatch: user '0:0' in the snapshot, '1000' now"])):
        info = docker_info(models)
        info["Config"]["User"] = user
        assert world.compare(oci_only, world.docker_facts(info), "4.2.1", "1.1.5") == reasons, user


def test_a_kubelet_like_path_outside_a_pod_directory_is_no_per_pod_file():
    assert world.volatile("/var/lib/kubelet/pods/0d3f/etc-hosts")
    assert world.volatile("/var/lib/kubelet/pods/0d3f/containers/engine/5e3a")
    assert world.volatile("/run/containerd/io.containerd.grpc.v1.cri/sandboxes/ab12/shm")
    assert not world.volatile("/srv/models/etc-hosts")
    assert not world.volatile("/srv/pods/a/containers/engine")  # a directory of the operator's, not a log file
    assert not world.volatile("/srv/models")

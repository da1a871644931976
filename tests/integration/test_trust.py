"""Trust on the real dockerd + CRIU: a signed snapshot with a canary restores; every file is private;
a consistent rewrite (unsigned, or re-signed by another key) and a canary that answers otherwise end
in a cold start with the reason; bad options are refused before anything is created."""

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.checkpoint import CHECKPOINT_NAME
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, seal, statement
from conftest import WorkloadContainer, docker, free_port, reset_device, run_module

PROMPT = "snapshot me"
SECRET = "s3cr3t-%s" % uuid.uuid4().hex  # an engine credential: must never be shown anywhere


def identity(pod):
    return {"namespace": "default", "service": "trust", "instance": "p0", "pod": pod}


def pem(key, public=False):
    if public:
        return key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


@pytest.fixture(scope="module")
def signed(docker_env, tmp_path_factory):
    """A warmed-up workload, its canary, its device and host snapshot signed by our key; the engine keeps serving."""
    base = tmp_path_factory.mktemp("trust")
    device_dir = base / "npu"
    device_dir.mkdir(mode=0o700)
    pod = "trust-%s" % uuid.uuid4().hex[:6]
    snap = str(base / "store" / "default" / "trust" / "p0" / pod)
    ours, theirs = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    key_file = base / "keys" / "signing.pem"
    key_file.parent.mkdir(mode=0o700)
    key_file.write_text(pem(ours))
    os.chmod(key_file, 0o600)
    container = WorkloadContainer(pod, docker_env, device_dir, free_port(), SECRET_TOKEN=SECRET)
    container.run()
    container.wait_ready()
    expected = container.generate(PROMPT)
    target = {"container": pod}
    recorded = run_module("snapshot_canary", dict(target, snapshot_dir=snap, identity=identity(pod),
                                                  url="http://127.0.0.1:%d/v1/generate?prompt=snapshot%%20me" % container.port,
                                                  compare="json:answer"))
    assert recorded["changed"] and recorded["answer"] == {"status": 200, "field": expected}, recorded
    backup = run_module("npu_snapshot_backup", dict(target, lock=True, snapshot_dir=snap, identity=identity(pod)))
    assert backup["state"] == "BACKED_UP", backup
    checkpoint = run_module("host_checkpoint", dict(target, snapshot_dir=snap, identity=identity(pod),
                                                    signing_key=str(key_file)))
    assert checkpoint["status"] == "completed", checkpoint
    assert run_module("npu_snapshot_lock", dict(target, state="unlocked"))["state"] == "RUNNING"
    data = dict(base=base, device_dir=device_dir, pod=pod, snap=snap, container=container, expected=expected,
                ours=ours, theirs=theirs, key_file=key_file, checkpoint=checkpoint, image=docker_env,
                trusted=[pem(ours, public=True)])
    yield data
    container.remove()


def restore(s, snap, name, **extra):
    args = {"method": "docker", "snapshot_dir": snap, "identity": identity(s["pod"]), "container": name,
            "health_url": "http://127.0.0.1:%d/health" % s["container"].port, "health_timeout": 60,
            "trusted_keys": s["trusted"], "env": {"POD_IP": "10.1.1.1"}}
    args.update(extra)
    return run_module("snapshot_restore", args)


def copy_of(s, name, mutate, key=None):
    """A copy of the snapshot under another pod name's path, changed by ``mutate`` and sealed again (a
    consistent rewrite: checksums and manifest match the new bytes), signed by ``key`` or not at all."""
    dst = os.path.join(os.path.dirname(s["snap"]), name)
    staging = layout.staging_dir(dst)
    shutil.copytree(s["snap"], staging)
    os.unlink(os.path.join(staging, layout.SIGNATURE))
    recorded = json.loads(open(os.path.join(staging, layout.MANIFEST)).read())
    recorded["identity"] = identity(name)
    mutate(staging, recorded)
    seal.seal(staging, {k: v for k, v in recorded.items() if k not in ("files", "total_bytes", "schema_version")},
              signing_key=key)
    seal.publish(staging, dst)
    if key is not None:  # and its statement of the latest generation, as the controller writes one with each
        statement.write(dst, statement.make(identity(name), recorded["generation"], hashing.fingerprint(dst), key))
    return dst


def test_every_file_of_a_real_snapshot_is_private_and_it_is_signed(signed):
    s = signed
    assert s["checkpoint"]["signed_by"]
    for directory, dirs, files in os.walk(s["snap"]):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
        for name in files:
            assert stat.S_IMODE(os.lstat(os.path.join(directory, name)).st_mode) == 0o600, (directory, name)
    assert sorted(os.listdir(s["snap"])) == ["canary.json", "checksum.sha256", "device", "host", "manifest.json",
                                             "signature.json"]
    verify = run_module("snapshot_verify", {"snapshot_dir": s["snap"], "identity": identity(s["pod"]),
                                            "trusted_keys": s["trusted"]})
    assert verify["valid"] and verify["authenticated"] and verify["key_id"] == s["checkpoint"]["signed_by"], verify


def test_a_signed_snapshot_restores_and_its_canary_answers(signed):
    s = signed
    name = s["pod"] + "-r"
    s["container"].remove()
    reset_device(s["device_dir"])
    try:
        result = restore(s, s["snap"], name)
        assert result["restored"] is True and result["reason"] is None, result
        assert result["verify"]["authenticated"] is True
        assert "canary" in result["durations"], result["durations"]
        c = WorkloadContainer(name, s["image"], s["device_dir"], s["container"].port)
        assert c.generate(PROMPT) == s["expected"]
    finally:
        docker("rm", "-f", name, check=False)
    shown = json.dumps(result)
    assert SECRET not in shown


def test_a_consistent_rewrite_unsigned_or_signed_by_another_key_starts_cold(signed):
    s = signed

    def poison(staging, recorded):
        pages = os.path.join(staging, "host", "criu")
        path = os.path.join(pages, sorted(f for f in os.listdir(pages) if f.startswith("pages-"))[0])
        with open(path, "r+b") as handle:
            handle.seek(4096)
            handle.write(b"attacker's code")

    for key, reason in ((None, "unsigned:"), (s["theirs"], "signature_untrusted:")):
        name = "%s-x%s" % (s["pod"], "u" if key is None else "t")
        forged = copy_of(s, name, poison, key)
        reset_device(s["device_dir"])
        # the recreated container, created (not started) as an orchestrator would: a cold start needs it
        c = WorkloadContainer(name, s["image"], s["device_dir"], s["container"].port, SECRET_TOKEN=SECRET).create()
        try:
            no_keys = run_module("snapshot_verify", {"snapshot_dir": forged})
            assert no_keys["valid"] and no_keys["authenticated"] is False  # the content checks alone pass it
            result = restore(s, forged, name, identity=identity(name))
            assert result["restored"] is False and result["reason"].startswith(reason), result
            assert c.generate(PROMPT) == s["expected"]  # a cold start: it warmed up again
        finally:
            docker("rm", "-f", name, check=False)


def test_a_restored_engine_that_answers_otherwise_is_started_cold(signed):
    s = signed
    name = s["pod"] + "-c"

    def other_answer(staging, recorded):
        path = os.path.join(staging, layout.CANARY)
        doc = json.loads(open(path).read())
        doc["answer"]["field"] = "an answer the engine never gave"
        open(path, "w").write(json.dumps(doc))

    changed = copy_of(s, name, other_answer, s["ours"])  # signed: only the canary can tell
    reset_device(s["device_dir"])
    try:
        result = restore(s, changed, name, identity=identity(name))
        assert result["restored"] is False and result["reason"].startswith("canary_mismatch:"), result
        assert "an answer the engine never gave" in result["reason"] and s["expected"] in result["reason"]
    finally:
        docker("rm", "-f", name, check=False)


def test_a_page_image_written_during_a_docker_restore_never_runs_for_the_restore_reads_its_private_copy(signed):
    """``docker start --checkpoint`` resumes the restored tasks itself: nothing can ask afterwards whether a lease broke,
    and a lease holds a writer off only for lease-break-time (45 s) -- then the write lands in the inode Docker's
    checkpoint directory had hard-linked, and a large restore may already run it. So this path verifies a private
    copy, made by the read that hashes it (stages.COPY). The writer waits until Docker's checkpoint directory holds the
    images -- after the verification, before ``docker start`` reads them --, then opens the store's page image for
    writing, which no lease holds off now, and writes. The restore still runs the verified bytes (the engine answers as
    it did, its canary too), and its result says ``copied`` and why. Before, the writer was held off, the restore saw
    the broken lease only after docker start had resumed the tasks, and started cold."""
    s = signed
    name = s["pod"] + "-w"
    images = os.path.join(s["snap"], "host", "criu")
    target = os.path.join(images, sorted(f for f in os.listdir(images) if f.startswith("pages-"))[0])
    original = open(target, "rb").read()
    s["container"].remove()  # the snapshotted engine holds the device and the port (gone already after the tests above)
    reset_device(s["device_dir"])
    # the very image of the snapshot: the shared tag may move meanwhile (another session rebuilding the workload image)
    image = json.loads(open(os.path.join(s["snap"], layout.MANIFEST)).read())["image"]["id"]
    c = WorkloadContainer(name, image, s["device_dir"], s["container"].port).create()
    placed = os.path.join(docker("info", "--format", "{{.DockerRootDir}}"), "containers",
                          docker("inspect", "--format", "{{.Id}}", name), "checkpoints", CHECKPOINT_NAME,
                          os.path.basename(target))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, target, placed], stdout=subprocess.PIPE, text=True)
    try:
        result = restore(s, s["snap"], name)
        out, _err = writer.communicate(timeout=120)
        assert writer.returncode == 0 and out.strip() == "wrote", (writer.returncode, out)
        assert open(target, "rb").read() != original, "the write landed in the store during the restore"
        assert result["restored"] is True and result["reason"] is None, result
        held = result["verify"]["held"]
        assert held["mode"] == "copied" and held["why_copied"].startswith("docker start --checkpoint resumes"), held
        assert result["placement"] == "copy" and "canary" in result["durations"], result
        assert c.generate(PROMPT) == s["expected"], "the engine serves the genuine state"
    finally:
        if writer.poll() is None:
            writer.kill()
        docker("rm", "-f", name, check=False)
        with open(target, "wb") as handle:  # the snapshot as it was, for the other tests
            handle.write(original)


# The writer of the store: once Docker's checkpoint directory has the page image, it writes into the store's.
WRITER = """
import os, sys, time
pages, placed = sys.argv[1:3]
deadline = time.monotonic() + 120
while not os.path.exists(placed):
    if time.monotonic() > deadline:
        sys.exit("Docker's checkpoint directory never got %s" % placed)
    time.sleep(0.001)
fd = os.open(pages, os.O_WRONLY)
os.pwrite(fd, b"attacker's code" * 64, 8192)
os.close(fd)
print("wrote", flush=True)
"""


@pytest.mark.parametrize("bad, message", [
    ({"timeout": -1}, "timeout: must be a positive number"),
    ({"health_timeout": 0}, "health_timeout: must be a positive number"),
    ({"health_url": "localhost:8000/health"}, "health_url: 'localhost:8000/health' is not an http(s) URL"),
])
def test_bad_options_are_refused_before_anything_is_created(signed, bad, message):
    s = signed
    name = "%s-bad-%s" % (s["pod"], uuid.uuid4().hex[:4])
    result = restore(s, s["snap"], name, **bad)
    assert result["failed"] and result["msg"].startswith(message), result
    assert docker("ps", "-a", "--filter", "name=^/%s$" % name, "--format", "{{.Names}}") == ""


def test_env_values_are_hidden_and_short_plain_ones_do_not_garble_the_result(docker_env, tmp_path):
    """Ansible masks a no_log value wherever it occurs: an env value "1" turned every 1 of the message into
    ******** and every duration into VALUE_SPECIFIED_IN_NO_LOG_PARAMETER; a secret is still never shown."""
    secret = "tok-%s" % uuid.uuid4().hex
    name = "absent-%s-c1" % uuid.uuid4().hex[:6]
    result = run_module("snapshot_restore", {
        "snapshot_dir": str(tmp_path / "snap-1"), "identity": identity("p1"), "container": name,
        "env": {"WORKERS": "1", "DEBUG": "true", "TOKEN": secret}}, tmp_dir=tmp_path,
        extra_env={"ANSIBLE_VERBOSITY": "3"})  # the result keeps its invocation only when verbose
    assert result["failed"] and result["restored"] is False, result
    assert ("container: %r does not exist" % name) in result["msg"] and str(tmp_path / "snap-1") in result["msg"]
    assert result["invocation"]["module_args"]["env"] == dict.fromkeys(("WORKERS", "DEBUG", "TOKEN"),
                                                                       "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER")
    assert secret not in json.dumps(result)

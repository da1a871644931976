"""The restore-on-create runtime's logic, its shim and its entry point, without Docker.

The only stand-ins are at the process boundary: a fake runc and a fake python (scripts that record
their argv), and os.execv replaced by a recorder where the runtime would replace itself."""

import ast
import base64
import json
import os
import stat
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import BIN, COLLECTIONS, REPO, ensure_collection_link

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import criu_cli as criu, runc_cli as runc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import syscalls
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import runtime as rr
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import on_create, reseed
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.attempt import Attempt
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import metadata

ROLE = REPO / "roles" / "snapshot_node"
CID = "ab" * 32


class RoleLoader(yaml.SafeLoader):
    """YAML as Ansible reads it, as far as the role's vars need (``!unsafe`` strings)."""


RoleLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


CONTAINERD_GLOBALS = ["--root", "/var/run/docker/runtime-runc/moby", "--log", "/b/log.json", "--log-format", "json"]


# -- argv ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (CONTAINERD_GLOBALS + ["create", "--bundle", "/b", "--pid-file", "/b/init.pid", CID],
     (CONTAINERD_GLOBALS, "create", ["--bundle", "/b", "--pid-file", "/b/init.pid", CID])),
    (CONTAINERD_GLOBALS + ["start", CID], (CONTAINERD_GLOBALS, "start", [CID])),
    (["--debug", "--root=/r", "kill", CID, "15"], (["--debug", "--root=/r"], "kill", [CID, "15"])),
    (["--root", "create", "delete", "--force", CID], (["--root", "create"], "delete", ["--force", CID])),
    (["--version"], (["--version"], None, [])),
])
def test_split_argv_finds_the_subcommand_after_global_options(argv, expected):
    assert runc.split_argv(argv) == expected


def test_parse_create_reads_every_form_of_the_options():
    parsed = rr.parse_create(["--bundle=/b", "--pid-file", "/b/p", "--console-socket", "/s", "--no-pivot", CID])
    assert (parsed["bundle"], parsed["pid_file"], parsed["console_socket"], parsed["flags"], parsed["id"]) == \
        ("/b", "/b/p", "/s", ["--no-pivot"], CID)
    parsed = rr.parse_create(["-b", "/c", "--preserve-fds", "2", "--weird", CID])
    assert parsed["bundle"] == "/c" and parsed["preserve_fds"] == "2" and parsed["unknown"] == ["--weird"]
    assert runc.global_value(CONTAINERD_GLOBALS, "--root") == "/var/run/docker/runtime-runc/moby"
    assert runc.global_value(["--root=/x"], "--root") == "/x" and runc.global_value([], "--root", "d") == "d"


# -- the container's request -------------------------------------------------------------------------

CONFIG = rr.load_config(None)


def spec(env=None, annotations=None, mounts=None):
    doc = {"process": {"env": ["%s=%s" % kv for kv in (env or {}).items()], "user": {"uid": 0, "gid": 0}},
           "root": {"path": "rootfs"}, "mounts": mounts or []}
    if annotations is not None:
        doc["annotations"] = annotations
    return doc


def test_no_request_without_the_marker():
    assert rr.restore_request(spec({"PATH": "/bin", "INFEROPS_RESTORE_FROM": ""}), CONFIG) is None
    assert not rr.asks_for_restore(spec({"X": "org.inferops.restore-from"}))


def test_request_from_env_with_node_defaults():
    request = rr.restore_request(spec({"INFEROPS_RESTORE_FROM": "/snap/p"}), CONFIG)
    assert request == {"snapshot": "/snap/p", "timeout": 60.0, "policy": "once", "identity": None, "device": True,
                       "strict": False, "requester": None, "runtime_version": None, "image_id": None, "checksum": None,
                       "metadata_file": "/run/inferops-snapshot/metadata.json",
                       "agent_socket_dir": "/run/inferops-snapshot", "problems": [], "annotated": []}


def test_annotations_win_over_env_and_parse():
    request = rr.restore_request(spec(
        {"INFEROPS_RESTORE_FROM": "/from-env", "INFEROPS_RESTORE_POLICY": "once", "INFEROPS_METADATA_FILE": "/m/x.json"},
        {"org.inferops.restore-from": "/from-annotation", "org.inferops.restore-policy": "always",
         "org.inferops.restore-timeout": "12.5", "org.inferops.restore-identity": "ns/svc/p0/pod-a",
         "org.inferops.restore-device": "false", "org.inferops.restore-image-id": "sha256:" + "0" * 64}), CONFIG)
    assert request["snapshot"] == "/from-annotation" and request["policy"] == "always"
    assert request["timeout"] == 12.5 and request["device"] is False and request["metadata_file"] == "/m/x.json"
    assert request["identity"] == {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "pod-a"}
    assert request["image_id"] == "sha256:" + "0" * 64 and request["problems"] == []
    assert "snapshot" in request["annotated"] and "metadata_file" not in request["annotated"]


def test_the_restored_process_reads_the_paths_of_its_old_environment():
    """A restored process keeps its old env: where it reads metadata and listens is decided there."""
    request = rr.restore_request(spec({"INFEROPS_RESTORE_FROM": "/s", "INFEROPS_METADATA_FILE": "/new/m.json"}), CONFIG)
    old = {"INFEROPS_METADATA_FILE": "/old/m.json", "INFEROPS_AGENT_SOCKET_DIR": "/old/agent"}
    assert on_create.restored_process_paths(request, old, CONFIG) == ("/old/m.json", "/old/agent")
    found = on_create.restored_process_paths(request, {}, CONFIG)
    assert found == ("/run/inferops-snapshot/metadata.json", "/run/inferops-snapshot")
    annotated = rr.restore_request(spec(annotations={"org.inferops.restore-from": "/s",
                                                     "org.inferops.metadata-file": "/a/m.json"}), CONFIG)
    assert on_create.restored_process_paths(annotated, old, CONFIG)[0] == "/a/m.json"
    with pytest.raises(on_create.Fallback, match="bad_request"):
        on_create.restored_process_paths(request, {"INFEROPS_AGENT_SOCKET_DIR": "rel"}, CONFIG)


def test_a_container_may_shorten_its_restore_deadline_never_lengthen_it():
    """A restore holds the snapshot's leases and its plaintext while it waits: a pod asking 3600 s would hold them
    for an hour, whatever the node's operator allowed."""
    asked = dict(CONFIG, timeout=60.0)
    assert rr.restore_request(spec({"INFEROPS_RESTORE_FROM": "/s", "INFEROPS_RESTORE_TIMEOUT": "3600"}),
                              asked)["timeout"] == 60.0
    assert rr.restore_request(spec({"INFEROPS_RESTORE_FROM": "/s", "INFEROPS_RESTORE_TIMEOUT": "12.5"}),
                              asked)["timeout"] == 12.5


@pytest.mark.parametrize("variable, value", [
    ("INFEROPS_RESTORE_POLICY", "A" * 200000),
    ("INFEROPS_RESTORE_FROM", "/s/" + "A" * 200000),
    ("INFEROPS_RESTORE_IDENTITY", "ns/svc/p0/pod\nFORGED LOG LINE"),
])
def test_a_request_value_of_any_length_or_with_line_breaks_is_refused_without_being_repeated(variable, value):
    """Every request value reaches the runtime's log: one of 200 kB (a crash-looping pod writes it at every restart)
    would fill the node's disk, and a line break would forge log lines."""
    env = {"INFEROPS_RESTORE_FROM": "/s", variable: value}
    request = rr.restore_request(spec(env), CONFIG)
    text = " | ".join(request["problems"])
    assert "is refused (at most 4096, one line)" in text and value not in json.dumps(request), text
    assert len(json.dumps(request)) < 4096


def test_unparseable_settings_are_problems_not_guesses():
    request = rr.restore_request(spec({
        "INFEROPS_RESTORE_FROM": "/s", "INFEROPS_RESTORE_TIMEOUT": "0", "INFEROPS_RESTORE_POLICY": "sometimes",
        "INFEROPS_RESTORE_IDENTITY": "a/b", "INFEROPS_RESTORE_DEVICE": "maybe", "INFEROPS_METADATA_FILE": "rel/x"}),
        CONFIG)
    text = " | ".join(request["problems"])
    for word in ("restore-timeout", "restore-policy", "restore-identity", "restore-device", "metadata_file"):
        assert word in text, text


def test_first_error_line_is_the_cause_not_the_noise_or_the_unwinding():
    log = (b"(00.01) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n"
           b"(00.20) 1: info\n(00.26) pie: 1: Error (criu/pie/restorer.c:1907): Can't read pages data (-9)\n"
           b"(00.28) Error (criu/cr-restore.c:2331): Restoring FAILED.\n"
           b"(00.29) Error (criu/cgroup.c:2055): cg: cgroupd: recv req error: No such file or directory\n")
    assert "Can't read pages data" in criu.first_error_line(log)
    assert criu.first_error_line(b"nothing wrong\n") is None


def test_under_mount_names_the_deepest_hiding_mount():
    s = spec(mounts=[{"destination": "/run"}, {"destination": "/run/inferops-snapshot"}, {"destination": "/"}])
    assert on_create.under_mount(s, "/run/inferops-snapshot/metadata.json") == "/run/inferops-snapshot"
    assert on_create.under_mount(s, "/runner/x") is None


# -- writing into a container's root -----------------------------------------------------------------

def test_write_in_root_creates_private_dirs_and_file(tmp_path):
    root = tmp_path / "rootfs"
    root.mkdir()
    fd = os.open(str(root), os.O_RDONLY | os.O_DIRECTORY)
    try:
        syscalls.write_below(fd, "/run/inferops-snapshot/metadata.json", b'{"a": 1}')
    finally:
        os.close(fd)
    target = root / "run" / "inferops-snapshot" / "metadata.json"
    assert json.loads(target.read_text()) == {"a": 1}
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert sorted(os.listdir(target.parent)) == ["metadata.json"]


def test_write_in_root_never_follows_a_planted_link(tmp_path):
    root, outside = tmp_path / "rootfs", tmp_path / "host-etc"
    root.mkdir()
    outside.mkdir()
    (root / "run").symlink_to(outside)
    fd = os.open(str(root), os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError):
            syscalls.write_below(fd, "/run/metadata.json", b"x")
        (root / "etc").mkdir()
        (root / "etc" / "passwd").symlink_to(outside / "passwd")
        with pytest.raises(OSError):
            syscalls.open_dirs_below(fd, ["etc", "passwd"])
    finally:
        os.close(fd)
    assert os.listdir(outside) == []


def test_read_metadata_through_proc_root(tmp_path):
    path = tmp_path / "meta" / "m.json"
    path.parent.mkdir()
    path.write_text('{"restored": true}')
    assert metadata.read_in_process(os.getpid(), str(path)) == {"restored": True}
    assert metadata.read_in_process(os.getpid(), str(tmp_path / "none.json")) is None


# -- the runtime's calls, with a fake runc -----------------------------------------------------------

@pytest.fixture
def fake_node(tmp_path):
    """Node settings pointing at a fake runc that records its argv (one JSON line per call)."""
    calls = tmp_path / "runc-calls"
    runc = tmp_path / "runc"
    runc.write_text("#!/bin/sh\nprintf '%%s\\n' \"$*\" >> %s\nexit 0\n" % calls)
    runc.chmod(0o755)
    roots = tmp_path / "snapshots"
    roots.mkdir(mode=0o700)
    config = dict(rr.DEFAULTS, runc=str(runc), state_dir=str(tmp_path / "state"), log_file=str(tmp_path / "rt.log"),
                  snapshot_roots=[str(roots)], docker_root=str(tmp_path / "docker"))
    (tmp_path / "node.json").write_text(json.dumps(config))
    (tmp_path / "node.json").chmod(0o600)  # as the role writes it: root's, 0600
    docker_container(tmp_path / "docker", CID, {"Name": "/engine", "Config": {}})  # a Docker host's: dockerd made it
    return {"config": rr.load_config(str(tmp_path / "node.json")), "calls": calls, "runc": str(runc),
            "roots": roots, "tmp": tmp_path}


def docker_container(docker_root, container_id, record):
    """dockerd's record of a container it created (config.v2.json below its data root)."""
    path = docker_root / "containers" / container_id / "config.v2.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


class Exec(BaseException):  # like a real execv, never caught by the runtime
    pass


def run(node, argv):
    """Run one runtime call; returns ('exec', argv) when it replaced itself, else ('rc', rc)."""
    def execv(path, args):
        raise Exec(args)
    try:
        return "rc", rr.Runtime(node["config"], argv, execv=execv).main()
    except Exec as exc:
        return "exec", exc.args[0]


def log_records(node):
    path = node["tmp"] / "rt.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def bundle(node, env=None, annotations=None, mounts=None):
    b = node["tmp"] / "bundle"
    (b / "rootfs").mkdir(parents=True, exist_ok=True)
    (b / "config.json").write_text(json.dumps(spec(env, annotations, mounts)))
    return str(b)


def test_unmarked_calls_are_handed_to_runc_unchanged(fake_node):
    b = bundle(fake_node, {"PATH": "/bin"})
    for argv in (CONTAINERD_GLOBALS + ["create", "--bundle", b, "--pid-file", b + "/init.pid", CID],
                 CONTAINERD_GLOBALS + ["start", CID], CONTAINERD_GLOBALS + ["kill", CID, "15"]):
        assert run(fake_node, argv) == ("exec", [fake_node["runc"]] + argv)
    assert log_records(fake_node) == []


def test_start_after_a_restore_is_a_no_op_once(fake_node):
    state = Path(fake_node["config"]["state_dir"]) / CID
    state.mkdir(parents=True)
    (state / "restored").write_text("")
    assert run(fake_node, CONTAINERD_GLOBALS + ["start", CID]) == ("rc", 0)
    assert run(fake_node, CONTAINERD_GLOBALS + ["start", CID]) == ("exec", [fake_node["runc"]] + CONTAINERD_GLOBALS
                                                                   + ["start", CID])


def test_delete_runs_runc_then_drops_the_state(fake_node):
    state = Path(fake_node["config"]["state_dir"]) / CID
    (state / "work").mkdir(parents=True)
    assert run(fake_node, CONTAINERD_GLOBALS + ["delete", "--force", CID]) == ("rc", 0)
    assert fake_node["calls"].read_text().split("\n")[0] == " ".join(CONTAINERD_GLOBALS + ["delete", "--force", CID])
    assert not state.exists()


@pytest.mark.parametrize("case, reason", [
    ("missing", "missing:"), ("outside", "unsafe_path:"), ("bad", "bad_request:"), ("once", "policy_once:")])
def test_unusable_requests_start_cold_with_the_reason(fake_node, case, reason):
    snap = str(fake_node["roots"] / "ns" / "svc" / "p0" / "pod")
    env = {"INFEROPS_RESTORE_FROM": snap, "POD_IP": "10.0.0.9"}
    if case == "outside":
        env["INFEROPS_RESTORE_FROM"] = str(fake_node["tmp"] / "elsewhere" / "pod")
    elif case == "bad":
        env["INFEROPS_RESTORE_POLICY"] = "never"
    elif case == "once":
        once = Path(fake_node["config"]["state_dir"]) / "restored-once"
        once.mkdir(parents=True)
        (once / CID).write_text("")
    b = bundle(fake_node, env)
    argv = CONTAINERD_GLOBALS + ["create", "--bundle", b, "--pid-file", b + "/init.pid", CID]
    assert run(fake_node, argv) == ("exec", [fake_node["runc"]] + argv)
    record = log_records(fake_node)[-1]
    assert record["event"] == "restore" and record["outcome"] == "cold" and record["reason"].startswith(reason), record
    assert record["container"] == CID and "total" in record["durations"]
    assert "10.0.0.9" not in (fake_node["tmp"] / "rt.log").read_text()
    metadata = json.loads((Path(b) / "rootfs/run/inferops-snapshot/metadata.json").read_text())
    assert metadata["restored"] is False and metadata["env"]["POD_IP"] == "10.0.0.9"
    assert metadata["reason"] == record["reason"]
    assert not (Path(fake_node["config"]["state_dir"]) / CID).exists()


CONTAINERD = {"io.kubernetes.cri.sandbox-namespace": "tenant-b", "io.kubernetes.cri.sandbox-name": "pod-b",
              "io.kubernetes.cri.container-name": "engine", "io.kubernetes.cri.container-type": "container"}
CRIO = {"io.kubernetes.pod.namespace": "tenant-b", "io.kubernetes.pod.name": "pod-b",
        "io.kubernetes.container.name": "engine"}


@pytest.mark.parametrize("annotations, expected, problem", [
    (CONTAINERD, {"namespace": "tenant-b", "pod": "pod-b", "container": "engine", "by": "containerd"}, None),
    (CRIO, {"namespace": "tenant-b", "pod": "pod-b", "container": "engine", "by": "cri-o"}, None),
    ({}, None, None),  # dockerd: no tenants, whoever runs docker is root
    (dict(CONTAINERD, **{"io.kubernetes.cri.container-type": "sandbox"}), "any", "pod sandbox"),
    (dict(CONTAINERD, **{"io.kubernetes.pod.namespace": "tenant-a"}), "any", "tenant-a and tenant-b"),
])
def test_the_requester_is_who_the_container_runtime_says_it_is(annotations, expected, problem):
    found, problems = rr.requester(spec({}, annotations))
    if problem is None:
        assert (found, problems) == (expected, [])
    else:
        assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize("asks, reason", [
    ({"INFEROPS_RESTORE_FROM": "{roots}/tenant-a/svc/p0/pod-a"}, "tenant_mismatch: the snapshot's directory is of "
                                                                 "namespace tenant-a, and containerd says"),
    ({"INFEROPS_RESTORE_FROM": "{roots}/tenant-b/svc/p0/pod-b", "INFEROPS_RESTORE_IDENTITY": "tenant-a/svc/p0/pod-a"},
     "tenant_mismatch: the identity is of namespace tenant-a"),
    ({"INFEROPS_RESTORE_FROM": "{roots}/tenant-b/svc/p0/pod-b", "INFEROPS_RESTORE_SOURCE": "tenant-a/svc/p1/pod-c",
      "INFEROPS_RESTORE_IDENTITY": "tenant-b/svc/p0/pod-b"}, "the clone's source is of namespace tenant-a"),
    ({"INFEROPS_RESTORE_FROM": "{roots}/tenant-b/svc/p0"}, "bad_request: restore-from: tenant-b/svc/p0 is not "
     "<namespace>/<service>/<instance>/<pod> below"),
    # the namespace of the last four components, nested in another tenant's directory
    ({"INFEROPS_RESTORE_FROM": "{roots}/tenant-a/svc/p0/pod-a/tenant-b/svc/p0/pod-b"}, "bad_request: restore-from: "
     "tenant-a/svc/p0/pod-a/tenant-b/svc/p0/pod-b is not <namespace>/<service>/<instance>/<pod> below its snapshot "
     "root; on a node with tenants the namespace is the first directory below the root"),
])
def test_a_pod_never_restores_another_namespaces_snapshot_whatever_it_asks(fake_node, asks, reason):
    env = dict((key, value.format(roots=fake_node["roots"])) for key, value in asks.items())
    b = bundle(fake_node, env, annotations=CONTAINERD)
    argv = CONTAINERD_GLOBALS + ["create", "--bundle", b, "--pid-file", b + "/init.pid", CID]
    assert run(fake_node, argv) == ("exec", [fake_node["runc"]] + argv)
    record = log_records(fake_node)[-1]
    assert record["outcome"] == "cold" and reason in record["reason"], record
    assert record["requester"]["namespace"] == "tenant-b"


CRI_DOCKERD = {"io.kubernetes.pod.namespace": "tenant-b", "io.kubernetes.pod.name": "pod-b",
               "io.kubernetes.container.name": "engine", "io.kubernetes.docker.type": "container"}


@pytest.mark.parametrize("labels, expected, problem", [
    (CRI_DOCKERD, {"namespace": "tenant-b", "pod": "pod-b", "container": "engine", "by": "cri-dockerd"}, None),
    (dict(CRI_DOCKERD, **{"io.kubernetes.docker.type": "podsandbox"}), "any", "pod sandbox"),
    ({"maintainer": "someone"}, None, None),  # plain Docker: no tenants
])
def test_under_cri_dockerd_the_kubelets_labels_say_who_asks(labels, expected, problem):
    found, problems = rr.requester(spec({}), labels)
    if problem is None:
        assert (found, problems) == (expected, [])
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_a_pod_under_cri_dockerd_never_restores_another_namespaces_snapshot(fake_node):
    """cri-dockerd puts no annotations in the OCI config: without dockerd's labels the runtime saw no requester and
    took the identity from the path, so a pod of tenant-b could restore tenant-a's snapshot by naming it."""
    docker_container(fake_node["tmp"] / "docker", CID, {"Name": "/k8s_engine_pod-b", "Config": {"Labels": CRI_DOCKERD}})
    b = bundle(fake_node, {"INFEROPS_RESTORE_FROM": str(fake_node["roots"] / "tenant-a" / "svc" / "p0" / "pod-a")})
    argv = CONTAINERD_GLOBALS + ["create", "--bundle", b, "--pid-file", b + "/init.pid", CID]
    assert run(fake_node, argv) == ("exec", [fake_node["runc"]] + argv)
    logged = log_records(fake_node)[-1]
    assert logged["outcome"] == "cold" and logged["reason"].startswith("tenant_mismatch: the snapshot's directory is of "
                                                                       "namespace tenant-a, and cri-dockerd says"), logged
    assert logged["requester"]["namespace"] == "tenant-b"


def create_asking(node, env=None, annotations=None, mounts=None):
    """A create asking for tenant-b's snapshot below the node's root; the runtime's log record of it (the call went
    on to runc: a cold start)."""
    env = dict({"INFEROPS_RESTORE_FROM": str(node["roots"] / "tenant-b" / "svc" / "p0" / "pod-b")}, **(env or {}))
    b = bundle(node, env, annotations=annotations, mounts=mounts)
    argv = CONTAINERD_GLOBALS + ["create", "--bundle", b, "--pid-file", b + "/init.pid", CID]
    assert run(node, argv) == ("exec", [node["runc"]] + argv)
    return log_records(node)[-1]


def unlisted_container(node):
    """A container dockerd has no record of (another container runtime made it, or dockerd keeps it elsewhere)."""
    shutil.rmtree(str(node["tmp"] / "docker" / "containers" / CID))


def test_on_a_node_with_tenants_a_request_nobody_can_place_in_a_namespace_restores_nothing(fake_node):
    """No CRI annotation and no dockerd record: the runtime took such a request for a tenant-less node's and restored
    whatever it named. Tenants are the default; a dockerd container without the kubelet's labels (a Docker host's,
    made by whoever may run docker: root) still asks as before."""
    unlisted_container(fake_node)
    record = create_asking(fake_node)
    assert record["outcome"] == "cold" and record["reason"].startswith(
        "requester_unknown: neither the OCI config's annotations (containerd, CRI-O) nor dockerd's record of container "
        "%s" % CID[:12]), record
    assert record["verify"]["valid"] is None, "refused before a byte of the snapshot was read"
    fake_ctr(fake_node, {CID: cri_container(IMAGE), SANDBOX: cri_sandbox({})})  # containerd's CRI made it
    assert create_asking(fake_node, annotations=CONTAINERD)["reason"].startswith("missing:"), "placed: it goes on"
    fake_node["config"]["tenants"] = False  # a node the operator says has none
    assert create_asking(fake_node)["reason"].startswith("missing:")
    fake_node["config"]["tenants"] = True
    docker_container(fake_node["tmp"] / "docker", CID, {"Name": "/engine", "Config": {"Labels": {"a": "b"}}})
    assert create_asking(fake_node)["reason"].startswith("missing:"), "dockerd made it: its creator may run docker"


def dockerd_mounts(root, container_id=CID):
    return [{"destination": "/etc/%s" % name, "type": "bind", "source": "%s/containers/%s/%s" % (root, container_id, name)}
            for name in ("resolv.conf", "hostname", "hosts")]


def test_a_container_dockerd_keeps_below_another_data_root_is_refused_not_taken_for_one_without_a_record(fake_node):
    """runtime.json's docker_root was the role's default while dockerd ran with another data root: the record of a
    cri-dockerd pod's container was never found, so the pod asked as nobody and got another tenant's snapshot."""
    elsewhere = fake_node["tmp"] / "data-root"
    docker_container(elsewhere, CID, {"Name": "/k8s_engine_pod-b", "Config": {"Labels": CRI_DOCKERD}})
    unlisted_container(fake_node)
    sandbox = "5a" * 32  # cri-dockerd: the files of the pod's sandbox container
    for mounts in (dockerd_mounts(elsewhere), dockerd_mounts(elsewhere, sandbox)):
        record = create_asking(fake_node, mounts=mounts)
        assert record["outcome"] == "cold" and record["reason"] == (
            "docker_record: dockerd keeps container %s below %s (the OCI config mounts its files from there), and this "
            "node's runtime reads dockerd's records below %s (runtime.json docker_root): run the snapshot_node role "
            "again, which takes dockerd's data root from docker info" % (CID[:12], elsewhere, fake_node["tmp"] / "docker")
        ), record
    fake_node["config"]["tenants"] = False  # without tenants too: the record also says which image runs
    assert create_asking(fake_node, mounts=dockerd_mounts(elsewhere))["reason"].startswith("docker_record:")
    fake_node["config"]["docker_root"] = str(elsewhere)
    assert create_asking(fake_node, mounts=dockerd_mounts(elsewhere))["reason"].startswith("missing:"), "its own root"


@pytest.mark.parametrize("content, why", [
    (None, "is larger than %d bytes" % (16 << 20)), (b"[1, 2]", "is not a JSON object"), (b'{"Name": "/tr', "refused")])
def test_a_record_dockerd_cannot_have_written_is_refused_not_ignored(fake_node, content, why):
    """A record over the 16 MiB read limit was read as none: the container asked as nobody."""
    path = fake_node["tmp"] / "docker" / "containers" / CID / "config.v2.json"
    if content is None:
        with open(str(path), "wb") as handle:
            handle.write(b'{"Name": "/engine", "Config": {"Labels": {"x": "' + b"y" * (16 << 20) + b'"}}}')
    else:
        path.write_bytes(content)
    record = create_asking(fake_node, annotations=CONTAINERD)
    assert record["outcome"] == "cold" and record["reason"].startswith("docker_record:") and why in record["reason"]


@pytest.mark.parametrize("case", ["missing", "not JSON", "truncated", "not root's", "0644", "not a number", "a link"])
def test_settings_the_runtime_cannot_trust_make_every_restore_a_cold_start_never_an_unsigned_one(fake_node, case):
    """A missing runtime.json gave the defaults, which trust no key: signatures went unchecked. A truncated one made
    every restoring create fail with a traceback. Either is now a cold start with the reason; calls that restore
    nothing still go to the runc the settings name, when they are root's and nobody else can write them."""
    path = fake_node["tmp"] / "node.json"
    settings = json.loads(path.read_text())
    if case == "missing":
        path.unlink()
    elif case == "not JSON":
        path.write_text("{not json")
    elif case == "truncated":
        path.write_text(json.dumps(settings)[:40])
    elif case == "not root's":
        os.chown(str(path), 1000, 1000)
    elif case == "0644":
        path.chmod(0o644)
    elif case == "not a number":
        path.write_text(json.dumps(dict(settings, timeout="soon")))
    elif case == "a link":
        os.rename(str(path), str(path) + ".real")
        os.symlink(str(path) + ".real", str(path))
    config = rr.load_config(str(path))
    assert config["unusable"].startswith("settings_unreadable: %s " % path), config["unusable"]
    assert config["trusted_keys"] == [] or case == "0644"
    node = dict(fake_node, config=dict(config, state_dir=fake_node["config"]["state_dir"],
                                       log_file=fake_node["config"]["log_file"], runc=fake_node["runc"]))
    record = create_asking(node, annotations=CONTAINERD)
    assert record["outcome"] == "cold" and record["reason"] == config["unusable"], record
    assert record["verify"]["valid"] is None, "nothing of the snapshot was read"
    assert (config["runc"] == fake_node["runc"]) is (case == "0644"), "the runc of root's settings only"


def test_a_restore_whose_engine_was_not_told_says_reseed_not_told_in_the_runtimes_log(fake_node):
    """The runtime's log line of a restored container whose engine has no agent socket: ``reseed`` said ``told:
    false`` among the details, and no warning; copies of the snapshot may share their random streams."""
    b = bundle(fake_node, {"INFEROPS_RESTORE_FROM": "/s"})
    spec_ = json.loads((Path(b) / "config.json").read_text())
    node = rr.Runtime(fake_node["config"], CONTAINERD_GLOBALS + ["create", "--bundle", b, CID]).node
    driver = on_create.OnCreate(node, spec_, b, rr.parse_create(["--bundle", b, CID]),
                                rr.restore_request(spec_, fake_node["config"]), {}, "4.2.1")
    attempt = Attempt("/s", 5)
    attempt.restored = True
    attempt.details["reseed"] = reseed.tell(os.getpid(), str(fake_node["tmp"] / "no-agent"), "0" * 32, 5)
    driver.commit(attempt)
    record = log_records(fake_node)[-1]
    assert record["outcome"] == "restored" and record["reseed"]["told"] is False
    assert record["warning"] == reseed.not_told(attempt.details["reseed"]), record
    assert record["warning"].startswith("reseed: not_told: the restored process has no agent socket at ")


def test_settings_as_the_role_writes_them_are_used():
    assert CONFIG["unusable"] is None and CONFIG["tenants"] is True


IMAGE = "sha256:" + "e" * 64
SANDBOX = "cd" * 32


def fake_ctr(node, records):
    """containerd's client on the node's settings: ``ctr ... containers info ID`` prints records[ID] (ctr's form: each
    extension the base64 of its JSON), any other id is not found, as ctr says it. dockerd has no record of CID:
    containerd's CRI plugin made it."""
    shutil.rmtree(str(node["tmp"] / "docker" / "containers" / CID), ignore_errors=True)
    folder = node["tmp"] / "ctr-records"
    folder.mkdir(exist_ok=True)
    for container_id, record in records.items():
        record = dict(record, Extensions=dict((name, {"type_url": "x", "value": base64.b64encode(
            json.dumps(value).encode()).decode()}) for name, value in record.get("Extensions", {}).items()))
        (folder / (container_id + ".json")).write_text(json.dumps(record))
    ctr = node["tmp"] / "ctr"
    ctr.write_text('#!/bin/sh\nfor last; do :; done\nif [ -f "%s/$last.json" ]; then cat "%s/$last.json"; else '
                   'echo "ctr: container \\"$last\\" in namespace \\"k8s.io\\": not found" >&2; exit 1; fi\n'
                   % (folder, folder))
    ctr.chmod(0o755)
    node["config"].update(containerd_socket=str(node["tmp"] / "containerd.sock"), ctr=str(ctr))
    return ctr


def cri_container(image_ref, sandbox_id=SANDBOX):
    return {"Image": "docker.io/inferops/workload:latest", "Extensions": {"io.cri-containerd.container.metadata": {
        "Version": "v1", "Metadata": {"ID": CID, "SandboxID": sandbox_id, "ImageRef": image_ref}}}}


def cri_sandbox(annotations, handler="inferops-restore"):
    return {"Extensions": {"io.cri-containerd.sandbox.metadata": {"Version": "v1", "Metadata": {
        "RuntimeHandler": handler, "Config": {"metadata": {"name": "pod-b"}, "annotations": annotations}}}}}


def test_without_an_identity_the_path_below_the_root_is_the_identity_checked(fake_node):
    fake_ctr(fake_node, {CID: cri_container(IMAGE), SANDBOX: cri_sandbox({})})
    snap = fake_node["roots"] / "tenant-b" / "svc" / "p0" / "pod-b"
    b = bundle(fake_node, {"INFEROPS_RESTORE_FROM": str(snap)}, annotations=CONTAINERD)
    run(fake_node, CONTAINERD_GLOBALS + ["create", "--bundle", b, CID])
    record = log_records(fake_node)[-1]
    assert record["identity"] == {"namespace": "tenant-b", "service": "svc", "instance": "p0", "pod": "pod-b"}
    assert record["verify"]["identity_checked"] is True and record["reason"].startswith("missing:"), record


def test_cold_metadata_is_not_written_under_a_mount(fake_node):
    b = bundle(fake_node, {"INFEROPS_RESTORE_FROM": str(fake_node["roots"] / "x")},
               mounts=[{"destination": "/run", "type": "tmpfs"}])
    run(fake_node, ["create", "--bundle", b, CID])
    assert not (Path(b) / "rootfs" / "run").exists()
    assert any(r["event"] == "metadata" and "/run" in r["action"] for r in log_records(fake_node))


# -- on a containerd CRI node: the sandbox, the image containerd runs, the annotations that reached the runtime ----

def create(node, env=None, annotations=None):
    """A create of CID by containerd's CRI plugin (dockerd has no record of it)."""
    shutil.rmtree(str(node["tmp"] / "docker" / "containers" / CID), ignore_errors=True)
    b = bundle(node, env, annotations=annotations)
    argv = CONTAINERD_GLOBALS + ["create", "--bundle", b, "--pid-file", b + "/init.pid", CID]
    return argv, run(node, argv)


def snapshot(node):
    return str(node["roots"] / "tenant-b" / "svc" / "p0" / "pod-b")


def test_a_pod_sandbox_is_handed_to_runc_and_never_an_attempt(fake_node):
    """The handler lets the pod's annotations through to the sandbox's OCI config as well: the pause container carries
    the restore request, and used to be a cold attempt (a record in the snapshot's history, a metadata file) of its
    own before the pod's container was restored."""
    annotations = dict(CONTAINERD, **{"io.kubernetes.cri.container-type": "sandbox",
                                      "org.inferops.restore-from": snapshot(fake_node)})
    argv, outcome = create(fake_node, annotations=annotations)
    assert outcome == ("exec", [fake_node["runc"]] + argv)
    assert log_records(fake_node) == []


def test_the_image_checked_is_the_one_containerd_says_the_container_runs(fake_node):
    fake_ctr(fake_node, {CID: cri_container(IMAGE), SANDBOX: cri_sandbox({})})
    _argv, outcome = create(fake_node, {"INFEROPS_RESTORE_FROM": snapshot(fake_node)}, CONTAINERD)
    record = log_records(fake_node)[-1]
    assert outcome[0] == "exec" and record["reason"].startswith("missing:"), record
    assert record["verify"]["image_checked"] is True and record["name"] == "tenant-b/pod-b/engine"


def test_a_pod_cannot_name_another_image_than_the_one_it_runs(fake_node):
    fake_ctr(fake_node, {CID: cri_container(IMAGE), SANDBOX: cri_sandbox({})})
    other = "sha256:" + "f" * 64
    create(fake_node, {"INFEROPS_RESTORE_FROM": snapshot(fake_node)},
           dict(CONTAINERD, **{"org.inferops.restore-image-id": other}))
    record = log_records(fake_node)[-1]
    assert record["outcome"] == "cold" and record["reason"] == (
        "image_mismatch: the pod names image %s (restore-image-id), containerd runs %s" % (other, IMAGE)), record


@pytest.mark.parametrize("records, configured, cause", [
    ({}, False, "the node's runtime settings name no containerd socket to ask"),
    ({}, True, 'container \\"%s\\" in namespace \\"k8s.io\\": not found' % CID),
    ({CID: cri_container(None)}, True, "containerd's record of container %s names no image" % CID[:12]),
])
def test_a_restore_whose_image_containerd_cannot_name_starts_cold(fake_node, records, configured, cause):
    if configured:
        fake_ctr(fake_node, records)
    create(fake_node, {"INFEROPS_RESTORE_FROM": snapshot(fake_node)}, CONTAINERD)
    record = log_records(fake_node)[-1]
    assert record["outcome"] == "cold" and record["reason"].startswith(
        "image_unknown: cannot ask containerd which image container %s runs" % CID[:12]), record
    assert cause.replace('\\"', '"') in record["reason"], record


def test_pod_annotations_the_handler_did_not_let_through_are_a_cold_start_naming_them(fake_node):
    """The pod asked for a fingerprint check (org.inferops.restore-checksum) that its runtime handler dropped: restoring
    without it would skip the check the pod asked for."""
    asked = {"org.inferops.restore-from": snapshot(fake_node), "org.inferops.restore-checksum": "a" * 64,
             "team": "b"}
    fake_ctr(fake_node, {CID: cri_container(IMAGE), SANDBOX: cri_sandbox(asked, handler="narrow")})
    create(fake_node, {"INFEROPS_RESTORE_FROM": snapshot(fake_node)},
           dict(CONTAINERD, **{"org.inferops.restore-from": snapshot(fake_node)}))
    record = log_records(fake_node)[-1]
    assert record["outcome"] == "cold" and record["reason"].startswith(
        "bad_request: the pod's annotations org.inferops.restore-checksum did not reach the runtime: its runtime "
        "handler narrow lets them through"), record
    assert "team" not in record["reason"] and "a" * 64 not in record["reason"]


def test_only_a_container_of_containerd_s_cri_has_a_cri_record():
    config = rr.load_config(None)
    assert rr.cri_record(config, CID, {"annotations": {}}) == {}
    sandbox = dict(CONTAINERD, **{"io.kubernetes.cri.container-type": "sandbox"})
    assert rr.cri_record(config, CID, {"annotations": sandbox}) == {}
    assert rr.sandbox({"annotations": sandbox}) and not rr.sandbox({"annotations": CONTAINERD})


# -- the role ships the core as one folder, which imports nothing outside itself ------------------------

def role_vars():
    return yaml.load((ROLE / "vars" / "main.yml").read_text(), Loader=RoleLoader)


def test_core_imports_nothing_outside_itself_but_the_standard_library():
    core = REPO / "plugins" / "module_utils" / "core"
    for path in core.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith(("ansible", "ansible_collections")), (path, node.module)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("ansible"), (path, alias.name)


def test_role_installs_the_core_under_the_package_name_the_entry_point_imports():
    variables = role_vars()
    assert variables["__snapshot_node_core_src"].endswith("/plugins/module_utils/core/")
    entry = (ROLE / "files" / "inferops_restore_runtime.py").read_text()
    package = variables["__snapshot_node_core_dest"].rsplit("/", 1)[1]
    assert 'PACKAGE = "%s"' % package in entry


# -- the shim and the entry point, as installed --------------------------------------------------------

@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    """The shim rendered by Ansible's template module, with a fake runc and a fake python."""
    base = tmp_path_factory.mktemp("shim")
    for name in ("runc", "python"):
        script = base / name
        script.write_text("#!/bin/sh\nprintf '%s %%s\\n' \"$*\" >> %s\n" % (name, base / "calls"))
        script.chmod(0o755)
    (base / "lib").mkdir()
    (base / "lib" / "inferops_restore_runtime.py").write_text("")
    ensure_collection_link()
    out = base / "shim.sh"
    variables = {"snapshot_node_runc": str(base / "runc"), "snapshot_node_state_dir": str(base / "state"),
                 "snapshot_node_python": str(base / "python"), "snapshot_node_lib_dir": str(base / "lib")}
    proc = subprocess.run([str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=%s" % sys.executable, "-e", json.dumps(variables),
                           "-m", "ansible.builtin.template",
                           "-a", "src=%s dest=%s mode=0755" % (ROLE / "templates" / "inferops-restore-runtime.sh.j2", out)],
                          env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS)), capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return base


def call_shim(shim, args):
    calls = shim / "calls"
    if calls.exists():
        calls.unlink()
    subprocess.run(["sh", str(shim / "shim.sh")] + args, check=True, cwd=str(shim))
    return calls.read_text().strip()


def test_shim_passes_unmarked_calls_to_runc_and_marked_ones_to_python(shim):
    b = shim / "bundle"
    b.mkdir(exist_ok=True)
    create = CONTAINERD_GLOBALS + ["create", "--bundle", str(b), "--pid-file", str(b / "init.pid"), CID]
    (b / "config.json").write_text(json.dumps(spec({"PATH": "/bin"})))
    assert call_shim(shim, create) == "runc " + " ".join(create)
    (b / "config.json").write_text(json.dumps(spec({"INFEROPS_RESTORE_FROM": "/s"})))
    assert call_shim(shim, create) == "python -I %s %s" % (shim / "lib" / "inferops_restore_runtime.py", " ".join(create))
    eq_form = ["create", "--bundle=%s" % b, CID]
    assert call_shim(shim, eq_form).startswith("python ")
    (b / "config.json").write_text(json.dumps(spec(annotations={"org.inferops.restore-from": "/s"})))
    assert call_shim(shim, ["--debug"] + create).startswith("python ")
    for args in (CONTAINERD_GLOBALS + ["start", CID], CONTAINERD_GLOBALS + ["kill", CID, "9"], ["--version"],
                 ["--root", "/x", "delete", "--force", CID]):
        assert call_shim(shim, args) == "runc " + " ".join(args)
    (shim / "state" / CID).mkdir(parents=True)
    for args in (CONTAINERD_GLOBALS + ["start", CID], ["delete", "--force", CID]):
        assert call_shim(shim, args).startswith("python ")
    assert call_shim(shim, CONTAINERD_GLOBALS + ["kill", CID, "9"]).startswith("runc ")


def test_entry_point_without_ansible_imports_the_copied_core_or_falls_back_to_runc(tmp_path):
    """The node's python3 has no Ansible: the core, copied as one folder, imports on its own; with no
    core at all the entry point logs and hands the call to runc."""
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copytree(REPO / "plugins" / "module_utils" / "core", lib / "inferops_snapshot",
                    ignore=shutil.ignore_patterns("__pycache__"))
    entry = ROLE / "files" / "inferops_restore_runtime.py"
    code = ("import sys; sys.path.insert(0, %r); import inferops_snapshot.node.runtime, "
            "inferops_snapshot.clients.control; print('ok')" % str(lib))
    proc = subprocess.run(["/usr/bin/python3", "-I", "-c", code], capture_output=True, text=True, check=False)
    assert proc.stdout.strip() == "ok", proc.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "inferops_restore_runtime.py").write_bytes(entry.read_bytes())
    runc = tmp_path / "runc"
    runc.write_text("#!/bin/sh\necho \"runc $*\" > %s\n" % (tmp_path / "ran"))
    runc.chmod(0o755)
    (empty / "runtime.json").write_text(json.dumps({"runc": str(runc), "log_file": str(tmp_path / "rt.log")}))
    subprocess.run(["/usr/bin/python3", "-I", str(empty / "inferops_restore_runtime.py"), "create", "--bundle", "/b",
                    CID], check=True, capture_output=True)
    assert (tmp_path / "ran").read_text().strip() == "runc create --bundle /b %s" % CID
    record = json.loads((tmp_path / "rt.log").read_text())
    assert record["event"] == "error" and "cannot load the restore path" in record["error"]

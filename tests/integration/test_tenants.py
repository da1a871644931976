"""Tenants and the record that builds a container, attacked on the real dockerd + CRIU through the
node's restore-on-create runtime as the snapshot_node role installs it (signatures required: the controller's key).

(a) **A pod of namespace B asking for namespace A's snapshot.** The runtime takes the requester from the OCI config's
annotations that the container runtime sets (layout.CRI_REQUESTER_KEYS, runtime.requester), never from the pod's own
annotations or env. This machine's dockerd (20.10) cannot put annotations into a container's OCI config at all
(``docker run --annotation`` came with docker 24), so the test does what containerd's CRI plugin does, at the same
place and time: it registers a runtime of its own in dockerd (daemon.json ``runtimes`` and SIGHUP, with the
snapshot_node role's own tasks and under the lock every test that registers one holds), whose binary, on ``create``,
writes the CRI annotations of that container into ``annotations`` of the bundle's ``config.json`` and then execs the
node's runtime with the same arguments. That is containerd's order exactly: CreateContainer builds the OCI spec
with the pod annotations the runtime handler passes through first and ``DefaultCRIAnnotations`` last
(``io.kubernetes.cri.container-type``, ``sandbox-id``, ``sandbox-namespace``, ``sandbox-uid``, ``sandbox-name``,
``container-name``, ``image-name``, from the sandbox metadata the kubelet sent; a later option wins, so a pod cannot
replace them), stores that spec with the container, and on start its runtime v2 writes it as ``config.json`` into
the task's bundle before the runc shim runs ``<runtime> create --bundle <bundle> <id>``: the runtime reads exactly
those bytes. The annotations of each container come from a root-only file the test writes after ``docker create``
and before ``docker start`` (what the kubelet tells containerd about the pod), so nothing the container asks for
can set them. The registered runtime is removed at the end with the role (state=absent).

Refused with ``tenant_mismatch:`` (a cold start: the container serves, warmed up again), restored only for the
snapshot's own namespace: B naming A's identity; B naming none (the identity is the one the path spells, and still
bound: OnCreate.bind_to_requester); B naming an identity of its own on A's path; a strict request of B (a cold start
too: the container is the pod's own, nothing of A's snapshot was read). And a copy of A's signed snapshot put in B's
directory carries A's signed identity: refused too (identity_mismatch:).

Under cri-dockerd the kubelet's labels in dockerd's record of the container say who asks (``docker create --label``
as cri-dockerd creates it): B is refused by them, A restored. The role takes dockerd's data root from ``docker info``
and refuses another one; a runtime.json naming another data root than dockerd's (the old default on a node whose
dockerd keeps its data elsewhere) found no record, and B asked as nobody: now refused by dockerd's own mounts
(docker_record:), and -- where the pod mounts files of its own over them -- as a requester nobody can place on a node
with tenants (requester_unknown:).

(b) **A same-size edit of ``host/container.json`` with signing on** (the record a hand-over creates the container
from): ``"Privileged": false`` made ``true`` in place, the file's size unchanged. The signed checksum list no
longer matches it: on the runtime path a cold start (a strict request: a refusal, nothing runs) with
``checksum_mismatch: host/container.json``, and through ``snapshot_restore`` (method=runtime and method=docker) a
failed task with that reason and no container created -- never a restore, and never a container built from the
edited record."""

import json
import os
import shutil
import stat
import uuid

import pytest

from _runtime_helpers import Node, WarmEngine, installed_runtime, read_daemon_json, runtimes
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from conftest import WorkloadContainer, docker, reset_device, run_module

PROMPT = "whose engine is this?"
SERVICE = "tenants"
A, B = "tenant-a", "tenant-b"

# containerd's CRI plugin for the test: the annotations of the container being created, then the node's runtime.
CRI_RUNTIME = '''#!/usr/bin/python3 -I
"""Containerd's CRI plugin, emulated for a test of inferops.snapshot (tests/integration/test_tenants.py): on create,
the CRI annotations of the container (ANNOTATIONS/<id>.json) go into its bundle's config.json, as containerd puts
them there, and the call goes on, unchanged, to the node's runtime."""
import json
import os
import sys

sys.path.insert(0, %(lib)r)
from inferops_snapshot.clients.runc_cli import split_argv
from inferops_snapshot.node.runtime import parse_create

NODE_RUNTIME = %(node_runtime)r
ANNOTATIONS = %(annotations)r

_globals, command, args = split_argv(sys.argv[1:])
if command == "create":
    create = parse_create(args)
    given = os.path.join(ANNOTATIONS, "%%s.json" %% create["id"])
    if create["id"] and os.path.isfile(given):
        with open(given) as handle:
            annotations = json.load(handle)
        config = os.path.join(create["bundle"] or os.getcwd(), "config.json")
        with open(config) as handle:
            spec = json.load(handle)
        spec["annotations"] = dict(spec.get("annotations") or {}, **annotations)  # the CRI's own last: they win
        with open(config + ".cri", "w") as handle:
            json.dump(spec, handle)
        os.replace(config + ".cri", config)
os.execv(NODE_RUNTIME, [NODE_RUNTIME] + sys.argv[1:])
'''

REGISTER = ("- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
            "    - name: Register the runtime as the snapshot_node role does\n"
            "      ansible.builtin.include_role:\n        name: inferops.snapshot.snapshot_node\n"
            "        tasks_from: docker.yml\n")


class CriRuntime(Node):
    """A runtime registered in dockerd whose binary plays containerd's CRI plugin in front of ``node``'s runtime.
    Registered with the snapshot_node role's own daemon.json and reload tasks (docker.yml, under conftest.node_wide),
    removed by the role (state=absent: unregistered, its binary removed)."""

    def __init__(self, base, node):
        super(CriRuntime, self).__init__(base)
        self.name = self.name.replace("inferops-test-", "inferops-cri-")
        self.runtime_path = base / "bin" / "cri-runtime"
        self.annotations = base / "annotations"
        self.vars.update(snapshot_node_runtime_name=self.name, snapshot_node_runtime_path=str(self.runtime_path))
        self.node = node

    def install(self):
        self.annotations.mkdir(mode=0o700)
        self.runtime_path.parent.mkdir(mode=0o700)
        self.runtime_path.write_text(CRI_RUNTIME % dict(lib=str(self.node.lib_dir), annotations=str(self.annotations),
                                                        node_runtime=str(self.node.runtime_path)))
        os.chmod(self.runtime_path, 0o700)
        role, self.playbook = self.playbook, self.base / "register.yml"
        self.playbook.write_text(REGISTER)
        try:
            _ok, changed, failed, out = self.run_role()
        finally:
            self.playbook = role
        assert failed == 0 and changed > 0, out[-5000:]
        assert runtimes().get(self.name, {}).get("path") == str(self.runtime_path), runtimes()

    def annotate(self, container_id, namespace, pod, container="engine"):
        """What the kubelet tells containerd of the pod a container is created for (root-only, before its start)."""
        annotations = {
            "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": uuid.uuid4().hex * 2,
            "io.kubernetes.cri.sandbox-namespace": namespace, "io.kubernetes.cri.sandbox-uid": str(uuid.uuid4()),
            "io.kubernetes.cri.sandbox-name": pod, "io.kubernetes.cri.container-name": container,
            "io.kubernetes.cri.image-name": "inferops/workload:test"}
        path = self.annotations / ("%s.json" % container_id)
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(annotations, handle)


def identity(namespace, pod):
    return {"namespace": namespace, "service": SERVICE, "instance": "p0", "pod": pod}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The controller's signing key pair, as the roles make it on first use."""
    base = tmp_path_factory.mktemp("tenant-keys")
    made = run_module("snapshot_signing_key", {"path": str(base / "controller")})
    assert made["changed"] and made["key_id"], made
    return dict(base=base, controller=made)


@pytest.fixture(scope="module")
def node(docker_env, keys, tmp_path_factory):
    """The node's runtime as the role installs it by default: the controller's key trusted, signatures required."""
    with installed_runtime(tmp_path_factory.mktemp("tenant-node"), snapshot_node_trust_controller_key=True,
                           snapshot_node_keys_dir=str(keys["base"] / "controller")) as n:
        yield n


@pytest.fixture(scope="module")
def cri(node, tmp_path_factory):
    base = tmp_path_factory.mktemp("tenant-cri")
    runtime = CriRuntime(base, node)
    before = read_daemon_json()
    try:
        runtime.install()
    except BaseException:
        runtime.run_role(snapshot_node_state="absent", snapshot_node_force_remove=True)
        raise
    try:
        yield runtime
    finally:
        runtime.remove(before)
    assert node.runtime_path.exists(), "removing the CRI runtime left the node's own in place"


@pytest.fixture(scope="module")
def taken(node, keys, docker_env, tmp_path_factory):
    """One warmed-up engine of tenant A, and its snapshots below the node's root, signed on the controller's key."""
    with WarmEngine(docker_env, tmp_path_factory.mktemp("tenant-snaps"), "tenants", [PROMPT]) as engine:

        def take(pod):
            snap = str(node.roots / A / SERVICE / "p0" / pod)
            result = engine.take(snap, identity(A, pod), signing_key=keys["controller"]["private_key"])
            assert result["signed_by"] == keys["controller"]["key_id"], result
            return snap

        pod = "a-%s" % engine.tag
        snaps = dict(a=take(pod), edited=take(pod + "-edit"))
    yield dict(snaps, pod=pod, tag=engine.tag, device_dir=engine.device_dir, port=engine.container.port,
               expected=engine.expected[0], started_at=engine.started_at, image=engine.image, node=node)


def start(t, runtime, label, namespace=None, cri=None, check=True, **env):
    """A container of the snapshot's image created under ``runtime`` (the node's, or the CRI plugin's with the
    annotations of a pod of ``namespace`` written before its start), then started; returns (the container, the
    runtime's log record of its create); ``check``: docker start must succeed."""
    name = "tenants-%s-%s" % (t["tag"], label)
    c = WorkloadContainer(name, t["image"], t["device_dir"], t["port"], **env)
    reset_device(t["device_dir"])
    docker("create", "--runtime", runtime, *c.create_args())
    container_id = docker("inspect", "--format", "{{.Id}}", name)
    if cri is not None:
        cri.annotate(container_id, namespace, "%s-%s" % (namespace, label))
    docker("start", name, check=check)
    records = t["node"].log_records(container_id)
    assert records, "the node's runtime recorded nothing for %s" % name
    return c, records[-1]


def serves(t, c, restored):
    """The container answers as the snapshotted engine did: its very process (restored), or a new one (cold)."""
    c.wait_ready()
    assert c.generate(PROMPT) == t["expected"]
    info = c.info()
    assert (info["started_at"] == t["started_at"]) is restored, (info["started_at"], t["started_at"])
    assert info["metadata"]["restored"] is restored
    return info


def requested(snap, namespace=None):
    """A restore request (env, as a pod creator writes it), naming the identity of ``namespace``'s pod or none."""
    env = {layout.ENV_RESTORE_FROM: snap}
    if namespace:
        env[layout.ENV_RESTORE_IDENTITY] = layout.identity_string(identity(namespace, os.path.basename(snap)))
    return env


def remove(c):
    docker("rm", "-f", c.name, check=False)


def attempt(t, cri, label, namespace, reason, **env):
    """A container of a pod of ``namespace`` asking for a restore under the CRI runtime: cold for ``reason`` (the start
    of its reason), or restored (``reason`` None) and authenticated; it serves either way. Returns the runtime's
    record."""
    c, record = start(t, cri.name, label, namespace, cri, **env)
    try:
        if reason is None:
            assert record["outcome"] == "restored" and record["authenticated"] is True, record
        else:
            assert record["outcome"] == "cold" and record["reason"].startswith(reason), record
        assert record["requester"] == {"namespace": namespace, "pod": "%s-%s" % (namespace, label),
                                       "container": "engine", "by": "containerd"}, record
        serves(t, c, restored=reason is None)
    finally:
        remove(c)
    return record


# -- (a) a pod of another namespace -------------------------------------------------------------------------------

def test_the_cri_runtime_is_registered_beside_the_nodes_runtime(cri, node):
    """The emulation itself: registered as the role registers, beside the node's runtime, its annotations root-only
    (that a create it wraps reaches the node's runtime with them in config.json: each record's ``requester`` below)."""
    assert stat.S_IMODE(os.stat(cri.annotations).st_mode) == 0o700
    assert read_daemon_json()["runtimes"][cri.name] == {"path": str(cri.runtime_path)}
    assert read_daemon_json()["runtimes"][node.name] == {"path": str(node.runtime_path)}


MISMATCH = "tenant_mismatch: the snapshot's directory is of namespace %s" % A


def test_a_pod_of_another_namespace_naming_the_snapshots_identity_starts_cold_its_own_restores(cri, taken):
    t = taken
    record = attempt(t, cri, "b-named", B, MISMATCH + ", and containerd says this container is of pod %s-b-named in "
                     "namespace %s" % (B, B), **requested(t["a"], A))
    assert record["verify"]["valid"] is None, "refused before a byte of the snapshot was read"
    record = attempt(t, cri, "a-named", A, None, **requested(t["a"], A))
    assert record["identity"] == identity(A, t["pod"]), record


def test_a_request_naming_no_identity_is_bound_to_the_identity_its_path_spells(cri, taken):
    t = taken
    record = attempt(t, cri, "b-none", B, MISMATCH, **requested(t["a"]))
    assert record["identity"] == identity(A, t["pod"]), "the path's identity, never none"
    record = attempt(t, cri, "a-none", A, None, **requested(t["a"]))
    assert record["identity"] == identity(A, t["pod"]) and record["verify"]["identity_checked"] is True, record


def test_a_pod_claiming_an_identity_of_its_own_namespace_on_anothers_path_starts_cold(cri, taken):
    attempt(taken, cri, "b-own", B, MISMATCH, **requested(taken["a"], B))


def test_a_strict_request_of_another_namespace_is_never_restored(cri, taken):
    """Strict (INFEROPS_RESTORE_STRICT) refuses a container built from a snapshot's record that the verification does
    not vouch for. Here nothing of the snapshot was read, and the container is the pod's own (its spec, not A's
    record): the tenant check's cold start, like any request of B."""
    strict = dict(requested(taken["a"], A), **{layout.ENV_RESTORE_STRICT: "true"})
    attempt(taken, cri, "b-strict", B, MISMATCH, **strict)


def test_a_copy_of_the_snapshot_in_the_other_namespaces_directory_keeps_its_signed_identity(cri, taken):
    """A writer of the store copies A's signed snapshot below B's namespace: the path now spells B's identity, the
    signed manifest still A's."""
    t = taken
    copied = str(t["node"].roots / B / SERVICE / "p0" / t["pod"])
    shutil.copytree(t["a"], copied)
    try:
        record = attempt(t, cri, "b-copy", B, "identity_mismatch:", **requested(copied))
        assert record["identity"] == identity(B, t["pod"]), record
    finally:
        shutil.rmtree(copied)


# -- (a) under cri-dockerd: dockerd's record says who asks --------------------------------------------------------

def labelled(t, label, namespace, own_files=None, **env):
    """A container as cri-dockerd creates one for a pod of ``namespace`` -- the kubelet's labels in dockerd's record of it
    -- under the node's runtime, started; ``own_files``: a directory whose hostname, hosts and resolv.conf the pod
    mounts over dockerd's (volumes of its own). Returns (the container, the runtime's record of its create)."""
    name = "tenants-%s-%s" % (t["tag"], label)
    c = WorkloadContainer(name, t["image"], t["device_dir"], t["port"], **env)
    said = (namespace, "%s-%s" % (namespace, label), "engine", "container")
    labels = dict(zip(layout.DOCKER_REQUESTER_LABELS[1:], said))
    args = [arg for key, value in sorted(labels.items()) for arg in ("--label", "%s=%s" % (key, value))]
    for item in ("hostname", "hosts", "resolv.conf") if own_files else ():
        args += ["-v", "%s:/etc/%s:ro" % (own_files / item, item)]
    reset_device(t["device_dir"])
    docker("create", "--runtime", t["node"].name, *(args + c.create_args()))
    container_id = docker("inspect", "--format", "{{.Id}}", name)
    docker("start", name)
    records = t["node"].log_records(container_id)
    assert records, "the node's runtime recorded nothing for %s" % name
    return c, records[-1]


def cold_or_restored(t, c, record, reason):
    try:
        if reason is None:
            assert record["outcome"] == "restored" and record["authenticated"] is True, record
        else:
            assert record["outcome"] == "cold" and record["reason"].startswith(reason), record
        serves(t, c, restored=reason is None)
    finally:
        remove(c)
    return record


@pytest.fixture
def docker_root_elsewhere(taken):
    """The node's runtime.json naming another data root than dockerd's -- the role's old default on a node whose dockerd
    keeps its data elsewhere (the role now asks dockerd; an operator may still edit the file, or move dockerd)."""
    path = taken["node"].lib_dir / "runtime.json"
    kept = path.read_text()
    elsewhere = taken["node"].base / "docker-data-root"
    elsewhere.mkdir(exist_ok=True)
    path.write_text(json.dumps(dict(json.loads(kept), docker_root=str(elsewhere))))  # the same file: root's, 0600
    try:
        yield elsewhere
    finally:
        path.write_text(kept)


def test_the_role_takes_dockerds_data_root_from_dockerd_and_refuses_another(taken):
    node = taken["node"]
    settings = json.loads((node.lib_dir / "runtime.json").read_text())
    assert settings["docker_root"] == docker("info", "--format", "{{.DockerRootDir}}") and settings["tenants"] is True
    before = (node.lib_dir / "runtime.json").read_bytes()
    _ok, _changed, failed, out = node.run_role(snapshot_node_docker_root=str(node.base / "docker-data-root"))
    assert failed == 1 and "is not dockerd's data root, %s (docker info)" % settings["docker_root"] in out, out[-3000:]
    assert "Nothing was written" in out and (node.lib_dir / "runtime.json").read_bytes() == before


def test_under_cri_dockerd_a_pod_of_another_namespace_is_refused_by_the_kubelets_labels(taken):
    t = taken
    record = cold_or_restored(t, *labelled(t, "cd-b", B, **requested(t["a"], A)), reason=MISMATCH + ", and cri-dockerd "
                              "says this container is of pod %s-cd-b in namespace %s" % (B, B))
    assert record["requester"]["by"] == "cri-dockerd" and record["verify"]["valid"] is None, record
    cold_or_restored(t, *labelled(t, "cd-a", A, **requested(t["a"], A)), reason=None)


def test_a_runtime_reading_another_data_root_than_dockerds_refuses_the_pod_it_cannot_place(
        taken, docker_root_elsewhere, tmp_path):
    """Its record not found, the pod of tenant B asked as nobody and got tenant A's snapshot, valid and authenticated.
    dockerd's own mounts in the OCI config say where it keeps the container's files: refused (docker_record:). A pod
    that mounts files of its own over them leaves no trace of dockerd, and asks as nobody: refused on a node with
    tenants, the default (requester_unknown:)."""
    t = taken
    record = cold_or_restored(t, *labelled(t, "root-b", B, **requested(t["a"], A)), reason="docker_record: dockerd "
                              "keeps container ")
    assert "below %s (the OCI config mounts its files from there)" % docker("info", "--format", "{{.DockerRootDir}}") \
        in record["reason"] and str(docker_root_elsewhere) in record["reason"], record
    assert record["verify"]["valid"] is None, "refused before a byte of the snapshot was read"
    for item, text in (("hostname", "pod\n"), ("hosts", "127.0.0.1 localhost\n"), ("resolv.conf", "")):
        (tmp_path / item).write_text(text)
    os.chmod(str(tmp_path), 0o755)
    record = cold_or_restored(t, *labelled(t, "none-b", B, own_files=tmp_path, **requested(t["a"], A)),
                              reason="requester_unknown: neither the OCI config's annotations")
    assert record["requester"] is None and record["verify"]["valid"] is None, record


# -- (b) a same-size edit of the container record, signing on ---------------------------------------------------------

@pytest.fixture(scope="module")
def edited(taken):
    """The signed snapshot's host/container.json made privileged in place, its size unchanged."""
    record = os.path.join(taken["edited"], layout.CONTAINER_RECORD)
    with open(record, "rb") as handle:
        data = handle.read()
    for old, new in ((b'"Privileged": false', b'"Privileged": true '), (b'"Privileged":false', b'"Privileged":true ')):
        if old in data:
            forged = data.replace(old, new, 1)
            break
    else:
        raise AssertionError("no Privileged=false in %s: %r" % (record, data[:400]))
    assert len(forged) == len(data) and json.loads(forged.decode())  # the same size, still a valid record
    with open(record, "r+b") as handle:  # in place: the same inode, as a writer of shared storage would
        handle.write(forged)
    assert os.path.getsize(record) == len(data)
    return taken["edited"]


def test_an_edited_record_on_the_runtime_path_starts_cold_and_a_strict_request_is_refused(cri, taken, edited):
    t = taken
    c, record = start(t, cri.name, "edit", A, cri, **requested(edited))
    try:
        assert record["outcome"] == "cold", record
        assert record["reason"].startswith("checksum_mismatch: %s" % layout.CONTAINER_RECORD), record
        assert record["verify"]["valid"] is False
        serves(t, c, restored=False)
    finally:
        remove(c)
    c, record = start(t, t["node"].name, "edit-strict", check=False,
                      **dict(requested(edited, A), **{layout.ENV_RESTORE_STRICT: "true"}))
    try:
        assert record["outcome"] == "failed", record
        assert record["reason"].startswith("checksum_mismatch: %s" % layout.CONTAINER_RECORD), record
        assert docker("inspect", "--format", "{{.State.Running}} {{.State.Pid}}", c.name) == "false 0", "nothing ran"
    finally:
        remove(c)


@pytest.mark.parametrize("method", ["runtime", "docker"])
def test_snapshot_restore_refuses_an_edited_record_and_creates_nothing(taken, edited, keys, method):
    t = taken
    name = "tenants-%s-module-%s" % (t["tag"], method)
    reset_device(t["device_dir"])
    try:
        result = run_module("snapshot_restore", {
            "snapshot_dir": edited, "identity": identity(A, os.path.basename(edited)), "container": name,
            "method": method, "runtime_name": t["node"].name, "trusted_keys": [keys["controller"]["public_key"]],
            "health_url": "http://127.0.0.1:%d/health" % t["port"], "health_timeout": 60})
        assert result["failed"] is True and result["restored"] is False, result
        assert "checksum_mismatch: %s" % layout.CONTAINER_RECORD in result["reason"], result
        assert "checksum_mismatch: %s" % layout.CONTAINER_RECORD in result["msg"], result["msg"]
        # the checksum list is the signed one (authenticated): the record is not the file it lists
        assert result["verify"]["valid"] is False and result["verify"]["authenticated"] is True, result["verify"]
        assert docker("ps", "--all", "--quiet", "--filter", "name=^%s$" % name) == "", "no container was created"
    finally:
        docker("rm", "-f", name, check=False)

"""The structure the collection promises (docs/architecture.md), checked on the source itself:
one client per external system, one home per contract, one writer per document, one config
normaliser, one waiter; and the drifted pairs it folded, each pinned to the correct behaviour."""

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import (layout, schema,
                                                                                  snapshot_config as config)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import wait_for
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import (ParameterError,
                                                                                         RuntimeRefusedError,
                                                                                         SnapshotTimeout)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.docker_cli import env_dict
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import proc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import verify
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import metadata, status
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s import service as svc
from ansible_collections.inferops.snapshot.plugins.filter import snapshot as snapshot_filter

PLUGINS = REPO / "plugins"
CLIENTS = PLUGINS / "module_utils" / "core" / "clients"
BINARIES = ("docker", "runc", "criu")


def python_files(root):
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def string_lists(path):
    """Every list/tuple literal of the file whose first element is a string constant (argspec choices aside)."""
    tree = ast.parse(path.read_text())
    choices = set(id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.keyword) and node.arg == "choices")
    choices |= set(id(node.values[i]) for node in ast.walk(tree) if isinstance(node, ast.Dict)
                   for i, key in enumerate(node.keys) if isinstance(key, ast.Constant) and key.value == "choices")
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and id(node) not in choices and node.elts \
                and isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str):
            yield node.lineno, node.elts[0].value


def test_no_docker_runc_or_criu_argv_outside_their_clients():
    found = []
    for path in python_files(PLUGINS):
        if CLIENTS in path.parents:
            continue
        for line, first in string_lists(path):
            if os.path.basename(first) in BINARIES:
                found.append("%s:%d %r" % (path.relative_to(REPO), line, first))
        text = path.read_text()
        for match in re.finditer(r"\.executable\b|subprocess\.(run|call|Popen|check_output)\(\s*\[\s*\"(docker|runc|criu)",
                                 text):
            found.append("%s: %s" % (path.relative_to(REPO), match.group(0)))
    assert not found, "build these command lines in plugins/module_utils/core/clients: %s" % found


def test_roles_and_playbooks_run_no_docker_runc_or_criu_command_that_a_module_offers():
    """Roles may read node facts with commands, but every snapshot operation goes through a module."""
    offenders = []
    for path in sorted((REPO / "roles").rglob("*.yml")) + sorted((REPO / "playbooks").rglob("*.yml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"^\s*(argv|cmd|command|shell|ansible\.builtin\.(command|shell)):", line) and \
                    re.search(r"(docker|runc|criu)\b.*\b(checkpoint|restore|dump)\b", line):
                offenders.append("%s:%d" % (path.relative_to(REPO), number))
    assert not offenders, offenders


def test_each_document_has_one_writer():
    """The metadata document is built only by core/store/metadata.py and the status record written only by
    core/store/status.py; everything else calls them."""
    writers = {"status": [], "metadata": []}
    for path in python_files(PLUGINS):
        text = path.read_text()
        rel = str(path.relative_to(REPO))
        if "STATUS_SUFFIX" in text and not rel.endswith(("core/base/layout.py", "core/store/status.py")):
            writers["status"].append(rel)
        if re.search(r"[\"']written_by[\"']\s*:", text) and not rel.endswith(("core/store/metadata.py", "core/base/schemas.py")):
            writers["metadata"].append(rel)
    assert writers == {"status": [], "metadata": []}


def test_every_document_a_writer_makes_is_valid_against_its_schema(tmp_path):
    doc = metadata.document({"POD_IP": "10.0.0.1"}, True, "/s", "restore-on-create runtime", engine="docker",
                            container="c", container_id="a" * 64)
    assert schema.errors("metadata", doc) == []
    record = status.update(str(tmp_path / "ns" / "pod"), "completed", checksum="0" * 64, total_bytes=5,
                           identity={"namespace": "ns", "service": "s", "instance": "i", "pod": "pod"})
    record = status.update(str(tmp_path / "ns" / "pod"), restore=status.restore_entry("runtime", "restored", pid=7))
    assert schema.errors("status", record) == [] and record["last_restore"]["pid"] == 7
    with pytest.raises(ParameterError, match="metadata document is invalid at written_by"):
        metadata.document({}, True, "/s", "someone else")


def test_an_older_record_is_kept_where_the_schema_still_accepts_it(tmp_path):
    target = tmp_path / "ns" / "pod"
    target.parent.mkdir()
    old = {"status": "completed", "reason": None, "updated_at": "2026-11-01T00:00:00.000000Z", "checksum": "1" * 64,
           "last_restore": {"container": "x", "outcome": "restored", "restored_pid": 5},  # 0.1 keys
           "restores": [{"engine": "criu", "outcome": "cold"}]}
    Path(layout.status_path(str(target))).write_text(json.dumps(old))
    record = status.update(str(target), restore=status.restore_entry("docker", "cold", "missing: x"))
    assert record["checksum"] == "1" * 64 and record["status"] == "completed"
    assert [r["path"] for r in record["restores"]] == ["docker"]


def test_the_agent_folder_is_self_contained():
    agent = PLUGINS / "module_utils" / "core" / "agent"
    for path in python_files(agent):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1, "%s imports from outside the agent folder" % path.name
            if isinstance(node, ast.ImportFrom) and not node.level:
                assert node.module.split(".")[0] in sys.stdlib_module_names | {"__future__"}, (path, node.module)


def test_core_imports_the_standard_library_and_the_two_agreed_libraries_only():
    """Core/ runs on the nodes' bare python3 (the restore-on-create runtime): the standard library, jsonschema (every
    document is validated; snapshot_prereqs and snapshot_node install python3-jsonschema) and cryptography (signing,
    encryption; python3-cryptography), each in its one home. Python 2 fallbacks only inside a try."""
    homes = {"jsonschema": {"schema.py"}, "cryptography": {"signature.py", "encryption.py"}}
    found = []
    for path in python_files(PLUGINS / "module_utils" / "core"):
        tree = ast.parse(path.read_text())
        guarded = set(id(inner) for node in ast.walk(tree) if isinstance(node, ast.Try)
                      and any("ImportError" in ast.dump(handler) for handler in node.handlers)
                      for statement in node.body + node.handlers for inner in ast.walk(statement))
        for node in ast.walk(tree):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level else []
            for top in (name.split(".")[0] for name in names):
                if top in sys.stdlib_module_names or top == "__future__":
                    continue
                if path.name not in homes.get(top, set()) and not (top not in homes and id(node) in guarded):
                    found.append("%s imports %s" % (path.relative_to(REPO), top))
                elif top in homes and id(node) not in guarded:
                    found.append("%s imports %s unguarded (a missing library must be a clear error)" % (path.name, top))
    assert not found


def test_the_agent_runs_as_a_package_copied_under_any_name(tmp_path):
    copy = tmp_path / "inferops_agent"
    subprocess.run(["cp", "-r", str(PLUGINS / "module_utils" / "core" / "agent"), str(copy)], check=True)
    engine = tmp_path / "engine.py"
    engine.write_text("from inferops_agent import launcher\nprint(launcher.current_controller() is not None)\n")
    proc_ = subprocess.run(["/usr/bin/python3", "-I", "-c", "import sys; sys.path.insert(0, %r); "
                            "sys.argv = ['x', '--socket', %r, '--', %r]; import runpy; "
                            "runpy.run_module('inferops_agent', run_name='__main__')"
                            % (str(tmp_path), str(tmp_path / "a.sock"), str(engine))],
                           capture_output=True, text=True, timeout=60, check=False)
    assert proc_.returncode == 0 and proc_.stdout.strip() == "True", proc_.stdout + proc_.stderr


# -- drifted pairs, folded into one, pinned -------------------------------------------------------------

def test_one_definition_of_a_live_process():
    """Two alive() disagreed on zombies: a zombie (or a dead task) is not alive, its pid is still taken."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while (proc.stat_fields(child.pid) or ["?"])[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.stat_fields(child.pid)[0] == "Z"
        assert proc.alive(child.pid) is False and proc.exists(child.pid) is True
    finally:
        child.wait()
    assert proc.alive(child.pid) is False and proc.exists(child.pid) is False
    assert proc.alive(os.getpid()) is True


def test_one_device_resume_that_insists_on_running(monkeypatch):
    """Only one of the two device resumes checked the engine ended RUNNING; the one left does."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import device

    class Client:
        path = "/dev/null"

        def __init__(self, end_state):
            self.end_state = end_state

        def wait_listening(self, timeout, gone=None):
            return None, 0.0

        def request(self, op, timeout):
            return {"state": {protocol.OP_STATE: protocol.STATE_BACKED_UP, protocol.OP_RESTORE: protocol.STATE_LOCKED,
                              protocol.OP_UNLOCK: self.end_state}[op]}

    monkeypatch.setattr(device.AgentSocketClient, "for_pid", classmethod(lambda cls, pid, d: Client("BACKED_UP")))
    with pytest.raises(RuntimeRefusedError, match="is BACKED_UP after \\['restore', 'unlock'\\], not RUNNING"):
        device.resume_process(1, "/run/x", 5)
    monkeypatch.setattr(device.AgentSocketClient, "for_pid", classmethod(lambda cls, pid, d: Client("RUNNING")))
    assert device.resume_process(1, "/run/x", 5) == ["restore", "unlock"]


def test_one_docker_env_parser():
    assert env_dict(["A=1", "B=x=y", "NOEQ", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    assert env_dict(None) == {}


def test_one_resolution_of_what_a_restore_expects():
    class Criu:
        def version(self):
            return "4.2.1"

    ident = {"namespace": "n", "service": "s", "instance": "i", "pod": "p"}
    assert verify.expectations(ident, "sha256:x", "auto", "9.1", criu=Criu()) == {
        "identity": ident, "image_id": "sha256:x", "criu_version": "4.2.1", "runtime_version": "9.1"}
    assert verify.expectations(None, None, "skip")["criu_version"] is None
    assert verify.expectations(None, None, "3.17")["criu_version"] == "3.17"


@pytest.mark.parametrize("bad, message", [
    ({"enabled": True, "npuSnapshotPath": "/", "hostSnapshotPath": "/h"}, "'/' cannot be a snapshot root"),
    ({"enabled": True, "npuSnapshotPath": "/x", "hostSnapshotPath": "/x/"}, "separate roots"),
    ({"enabled": True, "hostSnapshotPath": "/h"}, "npuSnapshotPath"),
])
def test_one_config_normaliser_for_docker_hosts_and_kubernetes(bad, message):
    with pytest.raises(ParameterError, match=message):
        config.normalize(bad)
    with pytest.raises(Exception, match=message):  # the roles' filter: an AnsibleFilterError with the same text
        snapshot_filter.FilterModule().filters()["snapshot_config"](bad)
    with pytest.raises(ParameterError, match=message):
        svc.normalize_config(bad)
    good = {"enabled": True, "npuSnapshotPath": "/n/", "hostSnapshotPath": "/h"}
    assert config.normalize(good)["npuSnapshotPath"] == "/n" == svc.normalize_config(good)[1]["npuSnapshotPath"]
    assert svc.normalize_config(None) == (False, None, "no snapshotConfig given: the service runs without snapshots")


def test_one_waiter_on_wall_time_not_attempts():
    """A probe that hangs for a while must not stretch the deadline by its count of attempts."""
    calls = []

    def slow_probe():
        calls.append(time.monotonic())
        time.sleep(0.3)
        return False, "HTTP 503"

    started = time.monotonic()
    with pytest.raises(SnapshotTimeout, match="last: HTTP 503") as info:
        wait_for(slow_probe, 1.0, interval=0.05, what="the engine")
    # one probe past the deadline at most, with a loaded machine's slack; a deadline counted in attempts (20 of 0.35 s)
    # would take 7 s
    assert time.monotonic() - started < 1.0 + 0.3 + 1.0 and info.value.result["last_state"] == "HTTP 503"
    notes = []
    state, _elapsed = wait_for(lambda: (len(notes) >= 2, len(notes)), 5, 0.01,
                               progress=lambda s, e: notes.append(e), progress_every=0.0)
    assert state == 2


def test_no_hand_written_poll_loop_is_left():
    """Every wait is clock.wait_for; a `while` that sleeps is a second waiter."""
    loops = []
    for path in python_files(PLUGINS):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.While):
                body = ast.dump(node)
                if "sleep" in body or "'wait'" in body and "Event" not in body:
                    loops.append("%s:%d" % (path.relative_to(REPO), node.lineno))
    # the Follower waits on its Event for the writer (not a deadline wait): allowed by name
    loops = [loop for loop in loops if not loop.startswith(("plugins/module_utils/core/store/seal.py",
                                                            "plugins/module_utils/core/base/clock.py"))]
    assert not loops, "use core/base/clock.wait_for: %s" % loops


def test_modules_are_docs_argspec_and_a_hand_over():
    for path in sorted((PLUGINS / "modules").glob("*.py")):
        tree = ast.parse(path.read_text())
        docs = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                docs.update(range(node.lineno, node.end_lineno + 1))
        code = [line for number, line in enumerate(path.read_text().splitlines(), 1)
                if number not in docs and line.strip() and not line.strip().startswith("#")]
        assert len(code) <= 150, "%s has %d lines of code outside its documentation" % (path.name, len(code))
        main = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
        assert main and len(main[0].body) <= 2, "%s: main() is the module factory's one call" % path.name


def module_name(path):
    """The name pytest (its default import mode) imports a test file by: dotted from the first folder up without an
    __init__.py -- unit.core.restore.test_pipeline in the package tests/unit, the basename in tests/integration."""
    names = [path.stem]
    while (path.parent / "__init__.py").is_file():
        path = path.parent
        names.insert(0, path.name)
    return ".".join(names)


def test_no_two_test_modules_share_a_module_name():
    """`pytest tests` (the README's command) imports each test module by its module name: two of one name stop it at
    collection."""
    seen = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(module_name(path), []).append(str(path.relative_to(REPO)))
    assert not [paths for paths in seen.values() if len(paths) > 1]
    assert module_name(REPO / "tests" / "unit" / "core" / "restore" / "test_pipeline.py") == \
        "unit.core.restore.test_pipeline"


def test_every_process_is_started_by_the_runner():
    """Clients/commands.py is the process boundary: no other file of the collection starts a process itself."""
    runner = PLUGINS / "module_utils" / "core" / "clients" / "commands.py"
    found = []
    for path in python_files(PLUGINS):
        if path == runner:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bsubprocess\.(run|call|Popen|check_call|check_output)\(|\bos\.(system|popen|spawn\w*|exec\w+)\(",
                         line) and "os.execv" not in line:
                found.append("%s:%d" % (path.relative_to(REPO), number))
    assert not found, "start processes through clients/commands.py: %s" % found


# -- one home per mechanism: a second definition anywhere is a copy --------------------------------

ONE_HOME = {  # module-level function or class -> the one file that defines it
    "alive": "core/linux/proc.py", "env_dict": "core/clients/docker_cli.py", "expectations": "core/restore/verify.py",
    "wait_for": "core/base/clock.py", "Renewer": "core/base/clock.py", "read_json": "core/linux/fs.py",
    "fsync_dir": "core/linux/fs.py", "image_reason": "core/store/world.py", "resume_process": "core/store/device.py",
    "normalize": "core/base/snapshot_config.py", "run_in": "core/linux/netns.py", "record_usable": "core/restore/verify.py",
}


def test_each_mechanism_is_defined_in_one_place_only():
    """Not 'the surviving copy behaves': no second copy exists. Scans every module-level definition of the
    collection's Python (the agent folder too: it is copied into images, but a copy there is still a copy)."""
    homes = {}
    for root in (PLUGINS, REPO / "extensions"):
        for path in python_files(root):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in ONE_HOME:
                    homes.setdefault(node.name, []).append(str(path.relative_to(PLUGINS / "module_utils"))
                                                           if (PLUGINS / "module_utils") in path.parents
                                                           else str(path.relative_to(REPO)))
    assert homes == dict((name, [home]) for name, home in ONE_HOME.items()), homes


def test_one_renewal_timer():
    """Timer threads that renew something are clock.Renewer's (the agent keeps its own watchdog: it is copied into
    images without the rest of core/)."""
    found = [str(path.relative_to(REPO)) for path in python_files(PLUGINS)
             if "threading.Timer(" in path.read_text()
             and str(path.relative_to(PLUGINS / "module_utils" / "core")) not in ("base/clock.py", "agent/lease.py")]
    assert not found, found


def test_every_schema_is_the_contract_of_a_document_the_code_writes(tmp_path):
    """All the schemas are used: each validates what its one writer makes (the manifest here; the metadata file and
    the status record above; the Kubernetes record and annotations in k8s/test_contracts) or the operator's input
    (the snapshot config)."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import seal
    names = sorted(p.name.split(".")[0] for p in (REPO / "schemas").glob("*.schema.json"))
    assert names == ["k8s-annotations", "k8s-record", "manifest", "metadata", "snapshot-config", "status"]
    staging = tmp_path / "ns" / "svc" / "p0" / ".pod.partial"
    (staging / "host" / "criu").mkdir(parents=True)
    (staging / "host" / "criu" / "pages-1.img").write_bytes(b"x" * 2048)
    identity = {"namespace": "ns", "service": "svc", "instance": "p0", "pod": "pod"}
    written = seal.seal(str(staging), {"identity": identity, "created_at": "2026-12-04T00:00:00Z",
                                       "image": {"id": "sha256:" + "a" * 64},
                                       "engine": {"name": "docker", "criu_version": "4.2.1"},
                                       "runtime": {"name": "ascend-acl", "version": None}, "devices": [0]})[0]
    assert schema.errors("manifest", written) == []
    with pytest.raises(ParameterError, match="snapshotUnknown"):  # the operator's config: read through its schema
        config.normalize({"enabled": True, "npuSnapshotPath": "/n", "hostSnapshotPath": "/h", "snapshotUnknown": 1})


def _module_utils_imports(path):
    """The collection's module_utils a file imports, anywhere in it (Ansible's payload builder finds imports inside
    functions too), as paths below plugins/module_utils."""
    found = set()
    prefix = "ansible_collections.inferops.snapshot.plugins.module_utils"
    package = ".".join(path.relative_to(REPO / "plugins" / "module_utils").with_suffix("").parts[:-1]) \
        if "module_utils" in path.parts else ""
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative, inside module_utils
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if package else []
                module = ".".join([part for part in base if part] + ([node.module] if node.module else []))
            elif (node.module or "").startswith(prefix):
                module = node.module[len(prefix):].lstrip(".")
            else:
                if (node.module or "").startswith("ansible_collections.kubernetes"):
                    found.add("kubernetes.core")
                continue
            names = [module + "." + alias.name if module else alias.name for alias in node.names] + [module]
        for name in names:
            for candidate in (name, name.rpartition(".")[0]):
                file = REPO / "plugins" / "module_utils" / (candidate.replace(".", "/") + ".py")
                if candidate and file.is_file():
                    found.add(file)
    return found


def test_modules_outside_kubernetes_need_no_kubernetes_core():
    """Kubernetes.core is needed where the k8s modules run; a Docker host's controller with ansible-core alone
    (and the become test's venv) must run every other module. Ansible bundles every module_util a module's
    code imports, even inside a function, so one stray import makes kubernetes.core a requirement of them all."""
    offenders = {}
    for module in sorted((REPO / "plugins" / "modules").glob("*.py")):
        if module.name.startswith("k8s_"):
            continue
        seen, todo = set(), [module]
        while todo:
            path = todo.pop()
            for dep in _module_utils_imports(path):
                if dep == "kubernetes.core" or (isinstance(dep, Path) and "k8s" in dep.parts):
                    offenders.setdefault(module.name, set()).add(str(path.relative_to(REPO)))
                elif dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
    assert not offenders, offenders

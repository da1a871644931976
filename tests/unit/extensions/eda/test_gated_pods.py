"""The gated_pods event source's test for a pod whose restore the annotations do not tell yet (the collection's own,
k8s/service.requested); and the source loaded by its path alone, as ansible-rulebook loads it, in an interpreter
that cannot import the collection: it takes the names and the client from the collection it lies in, no copy."""

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import REPO, ensure_collection_link

PLUGIN = REPO / "extensions" / "eda" / "plugins" / "event_source" / "gated_pods.py"
ARGS = {"namespace": "ns", "service": "qwen"}


def load():
    spec = importlib.util.spec_from_file_location("gated_pods_predicate", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pod(env=None, annotations=None, phase="Running", gated=False, cid="docker://" + "ab" * 32):
    return {"metadata": {"name": "qwen-p0-0", "namespace": "ns", "uid": "u1", "annotations": dict(annotations or {}),
                         "labels": {"inferops.org/service": "qwen", "inferops.org/instance": "p0"}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "engine", "env": env or []}],
                     "schedulingGates": [{"name": "inferops.org/snapshot-restore"}] if gated else None},
            "status": {"phase": phase, "containerStatuses": [{"name": "engine", "containerID": cid}]}}


FROM_ANNOTATION = [{"name": "INFEROPS_RESTORE_FROM",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['org.inferops.restore-from']"}}}]
SNAP = "/var/lib/inferops/snapshots/ns/qwen/p0/qwen-p0-0"


@pytest.mark.parametrize("case, expected", [
    (pod([{"name": "INFEROPS_RESTORE_FROM", "value": SNAP}]), True),
    (pod(FROM_ANNOTATION, {"org.inferops.restore-from": SNAP}), True),
    (pod(FROM_ANNOTATION, {"org.inferops.restore-from": SNAP, "snapshot.inferops.org/restore": "pending"}), True),
    (pod(FROM_ANNOTATION, {"org.inferops.restore-from": SNAP, "snapshot.inferops.org/restore": "restored"}), False),
    (pod(FROM_ANNOTATION), False),                                           # the annotation it reads is not set
    (pod([{"name": "INFEROPS_RESTORE_FROM", "value": "relative/path"}]), False),
    (pod([{"name": "INFEROPS_RESTORE_FROM", "value": SNAP}], phase="Pending"), False),
    (pod([{"name": "INFEROPS_RESTORE_FROM", "value": SNAP}], gated=True), False),
    (pod([]), False),
    (pod([{"name": "INFEROPS_RESTORE_FROM", "value": SNAP}], cid=None), False),      # no container reported yet
])
def test_which_running_pods_the_catch_up_has_to_annotate(case, expected):
    plugin = load()
    args = plugin.check_args(ARGS)
    assert plugin.unannotated(case, args) is expected


def test_by_its_path_alone_it_imports_the_collection_it_lies_in(tmp_path):
    """ansible-rulebook runs a source by its path: in a fresh interpreter where only kubernetes.core (the
    dependency installed beside the collection) is importable, the source loaded from the installed tree has the
    collection's own names and client."""
    source = ensure_collection_link() / "ansible_collections" / "inferops" / "snapshot" / PLUGIN.relative_to(REPO)
    script = (
        "import json, runpy, sys\n"
        "try:\n    import ansible_collections.inferops\n    sys.exit('the collection is importable already')\n"
        "except ImportError:\n    pass\n"
        "source = runpy.run_path(sys.argv[1])\n"
        "layout = sys.modules['ansible_collections.inferops.snapshot.plugins.module_utils.core.base.layout']\n"
        "print(json.dumps([source['check_args']({'namespace': 'ns'})['gate'] == layout.K8S_RESTORE_GATE,\n"
        "                  source['k8s_client'].connect.__module__, source['k8s_service'].requested.__module__,\n"
        "                  'proxy' in source['ARGUMENTS']]))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(source)], capture_output=True, text=True, timeout=60,
                          cwd=str(tmp_path), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == [True, "ansible_collections.inferops.snapshot.plugins.module_utils.k8s.client",
                                       "ansible_collections.inferops.snapshot.plugins.module_utils.k8s.service", True]
    copied = tmp_path / "gated_pods.py"  # outside an installed collection: a clear error, not a guess
    copied.write_text(PLUGIN.read_text())
    proc = subprocess.run([sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1])", str(copied)],
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path), check=False)
    assert proc.returncode != 0 and "install the collection (ansible-galaxy collection install)" in proc.stderr

"""The gated_pods event source's test for a pod whose restore the annotations do not tell yet, with and without
the collection importable (ansible-rulebook may load the source by its path alone): both say the same."""

import importlib.util

import pytest

from conftest import REPO

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
@pytest.mark.parametrize("importable", [True, False], ids=["with the collection", "by its path alone"])
def test_which_running_pods_the_catch_up_has_to_annotate(case, expected, importable):
    plugin = load()
    if not importable:
        plugin._requested = None
    assert plugin._requested is not None or not importable, "the collection is importable in the tests"
    args = plugin.check_args(ARGS)
    assert plugin.unannotated(case, args) is expected

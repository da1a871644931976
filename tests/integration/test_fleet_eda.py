"""The gated_pods event source (extensions/eda) run as ansible-rulebook runs it -- its async main(queue, args)
with a real asyncio queue -- against the Kubernetes API emulator over real HTTP (kmock, the kubernetes client).
ansible-rulebook itself needs Java, which these machines do not have; the rulebook is checked for shape."""

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest
import yaml

from _k8s_helpers import Api, ApiServer, workload_pod, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "extensions" / "eda" / "plugins" / "event_source" / "gated_pods.py"
RULEBOOK = REPO / "extensions" / "eda" / "rulebooks" / "restore_gated_pods.yml"
pytestmark = pytest.mark.timeout(120)


def load_plugin():
    spec = importlib.util.spec_from_file_location("gated_pods", PLUGIN)  # as ansible-rulebook loads it: by its path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = ApiServer()
    base = tmp_path_factory.mktemp("eda")
    yield {"server": server, "kubeconfig": write_kubeconfig(base / "kubeconfig", server.url), "api": Api(server.url, "eda"),
           "base": base}
    server.stop()


def pod(api, name, service="qwen", gated=True):
    manifest = workload_pod(name, "eda", service, "p0", "inferops/workload:latest", 1, api["base"], api["base"],
                            gated=gated, runtime_class="inferops-restore")
    return api["api"].create(manifest)


async def collect(plugin, args, until, timeout=30):
    """Run the source until ``until(events)`` holds; the events it put, in order."""
    queue = asyncio.Queue()
    task = asyncio.ensure_future(plugin.main(queue, args))
    events = []
    deadline = time.monotonic() + timeout
    try:
        while not until(events):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or task.done():
                state = task.exception() if task.done() else "running"
                raise AssertionError("events so far: %s (source %s)" % (events, state))
            try:
                events.append(await asyncio.wait_for(queue.get(), min(remaining, 1.0)))
            except asyncio.TimeoutError:
                pass
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    return events


def test_a_gated_pod_is_an_event_within_seconds_and_is_released_at_its_deadline(api):
    plugin = load_plugin()
    pod(api, "qwen-p0-0")
    pod(api, "other-p0-0", service="other")     # another service: not this source's
    pod(api, "qwen-p0-1", gated=False)            # nothing to decide
    started = time.monotonic()
    args = {"namespace": "eda", "service": "qwen", "kubeconfig": api["kubeconfig"], "interval": 0.2,
            "release_after": 3}
    events = asyncio.run(collect(plugin, args, lambda e: any("inferops_gate_released" in x for x in e)))
    gated = [e["inferops_gated_pod"] for e in events if "inferops_gated_pod" in e]
    assert [g["name"] for g in gated] == ["qwen-p0-0"], events   # once, and only the gated pod of the service
    assert gated[0]["service"] == "qwen" and gated[0]["instance"] == "p0" and gated[0]["uid"]
    released = [e["inferops_gate_released"] for e in events if "inferops_gate_released" in e]
    assert released[0]["name"] == "qwen-p0-0" and "release_after=3 s" in released[0]["reason"], released
    assert time.monotonic() - started < 3 + 5
    # fail open: the gate is gone, the pod can be scheduled and start (restored or cold, the node decides)
    current = api["api"].pod("qwen-p0-0")
    assert not current["spec"].get("schedulingGates"), current["spec"]
    assert api["api"].pod("other-p0-0")["spec"]["schedulingGates"], "another service's pod is left alone"


def test_without_a_deadline_it_only_reports_and_a_recreated_pod_is_a_new_event(api):
    plugin = load_plugin()
    first = pod(api, "qwen-p0-2")
    args = {"namespace": "eda", "service": "qwen", "kubeconfig": api["kubeconfig"], "interval": 0.2,
            "release_after": 0}

    async def scenario():
        queue = asyncio.Queue()
        task = asyncio.ensure_future(plugin.main(queue, args))
        got = [await asyncio.wait_for(queue.get(), 10)]
        api["api"].delete("qwen-p0-2")               # the controller recreates it: another incarnation, another uid
        pod(api, "qwen-p0-2")
        got.append(await asyncio.wait_for(queue.get(), 10))
        await asyncio.sleep(1.0)                      # and nothing more: no deadline, no repeated events
        assert queue.empty(), await queue.get()
        task.cancel()
        return got

    got = asyncio.run(scenario())
    assert [e["inferops_gated_pod"]["name"] for e in got] == ["qwen-p0-2", "qwen-p0-2"]
    assert got[0]["inferops_gated_pod"]["uid"] == first["metadata"]["uid"] != got[1]["inferops_gated_pod"]["uid"]
    assert api["api"].pod("qwen-p0-2")["spec"]["schedulingGates"], "release_after: 0 never releases"


def running(api, name, restore_from, annotations=None):
    """A pod of the service that the (here absent) kubelet started on node-a: its request comes from the annotation
    the template's INFEROPS_RESTORE_FROM reads, as in docs/fleet.md."""
    manifest = workload_pod(name, "eda", "qwen", "p0", "inferops/workload:latest", 1, api["base"], api["base"],
                            runtime_class="inferops-restore", node="node-a")
    manifest["metadata"].setdefault("annotations", {}).update(annotations or {})
    if restore_from is not None:
        manifest["metadata"]["annotations"]["org.inferops.restore-from"] = restore_from
    created = api["api"].create(manifest)
    core = api["api"].core
    core.patch_namespaced_pod_status(name, "eda", {"status": {"phase": "Running", "containerStatuses": [
        {"name": "engine", "containerID": "docker://" + "ab" * 32, "image": "x", "imageID": "", "ready": True,
         "restartCount": 0, "state": {"running": {}}}]}}, _content_type="application/merge-patch+json",
        _preload_content=False)
    return created


def test_a_pod_restored_on_its_own_request_is_an_event_until_its_annotations_say_what_happened(api):
    """No gate and no job: the node's runtime restored (or cold-started) the pod; the source reports it once, so that
    the rulebook's k8s_restore run annotates it within seconds, and not again once it is annotated."""
    plugin = load_plugin()
    snap = "/var/lib/inferops/snapshots/eda/qwen/p0/qwen-p0-5"
    running(api, "qwen-p0-5", snap)
    running(api, "qwen-p0-6", None)                                               # no request: nothing to tell
    running(api, "qwen-p0-7", snap.replace("5", "7"), {"snapshot.inferops.org/restore": "restored"})  # told already
    args = {"namespace": "eda", "service": "qwen", "kubeconfig": api["kubeconfig"], "interval": 0.2, "release_after": 0}
    started = time.monotonic()
    caught = unannotated(asyncio.run(events_for(plugin, args, 2.0)))
    assert [e["name"] for e in caught] == ["qwen-p0-5"], caught              # once per pod incarnation, only it
    assert caught[0]["service"] == "qwen" and caught[0]["uid"] and "age" in caught[0], caught
    assert time.monotonic() - started < 10
    api["api"].core.patch_namespaced_pod("qwen-p0-5", "eda", {"metadata": {"annotations": {
        "snapshot.inferops.org/restore": "restored"}}}, _content_type="application/merge-patch+json",
        _preload_content=False)                                                 # what the catch-up writes
    assert not unannotated(asyncio.run(events_for(plugin, args, 1.0))), "an annotated pod is not reported"
    api["api"].delete("qwen-p0-5")                                               # recreated: a new incarnation
    running(api, "qwen-p0-5", snap)
    assert not unannotated(asyncio.run(events_for(plugin, dict(args, catch_up=False), 1.0))), "catch_up: false"
    assert [e["name"] for e in unannotated(asyncio.run(events_for(plugin, args, 1.0)))] == ["qwen-p0-5"]


def unannotated(events):
    return [e["inferops_unannotated_pod"] for e in events if "inferops_unannotated_pod" in e]


async def events_for(plugin, args, seconds):
    """Every event the source puts in ``seconds``."""
    queue = asyncio.Queue()
    task = asyncio.ensure_future(plugin.main(queue, args))
    await asyncio.sleep(seconds)
    task.cancel()
    events = []
    while not queue.empty():
        events.append(queue.get_nowait())
    return events


@pytest.mark.parametrize("args, word", [({}, "namespace"), ({"namespace": "x", "interval": "soon"}, "interval"),
                                        ({"namespace": "x", "releas_after": 1}, "releas_after"),
                                        ({"namespace": "x", "catch_up": "maybe"}, "catch_up")])
def test_bad_arguments_are_refused_naming_the_field_before_anything_is_contacted(args, word):
    with pytest.raises(ValueError, match=word):
        asyncio.run(load_plugin().main(asyncio.Queue(), args))


def test_the_sample_rulebook_runs_the_restore_playbook_on_the_sources_events():
    rulebook = yaml.safe_load(RULEBOOK.read_text())
    source = rulebook[0]["sources"][0]
    assert "inferops.snapshot.gated_pods" in source
    assert set(source["inferops.snapshot.gated_pods"]) <= set(load_plugin().ARGUMENTS)
    runs = {rule["condition"]: rule["action"]["run_playbook"]["name"] for rule in rulebook[0]["rules"]
            if "run_playbook" in rule["action"]}
    assert runs == {"event.inferops_gated_pod is defined": "inferops.snapshot.k8s_restore",
                    "event.inferops_unannotated_pod is defined": "inferops.snapshot.k8s_restore"}, runs
    assert (REPO / "playbooks" / "k8s_restore.yml").exists()

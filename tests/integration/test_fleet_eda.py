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


@pytest.mark.parametrize("args, word", [({}, "namespace"), ({"namespace": "x", "interval": "soon"}, "interval"),
                                        ({"namespace": "x", "releas_after": 1}, "releas_after")])
def test_bad_arguments_are_refused_naming_the_field_before_anything_is_contacted(args, word):
    with pytest.raises(ValueError, match=word):
        asyncio.run(load_plugin().main(asyncio.Queue(), args))


def test_the_sample_rulebook_runs_the_restore_playbook_on_the_sources_events():
    rulebook = yaml.safe_load(RULEBOOK.read_text())
    source = rulebook[0]["sources"][0]
    assert "inferops.snapshot.gated_pods" in source
    assert set(source["inferops.snapshot.gated_pods"]) <= set(load_plugin().ARGUMENTS)
    playbooks = [rule["action"]["run_playbook"]["name"] for rule in rulebook[0]["rules"] if "run_playbook" in rule["action"]]
    assert playbooks == ["inferops.snapshot.k8s_restore"] and (REPO / "playbooks" / "k8s_restore.yml").exists()

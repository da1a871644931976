"""Shared storage: one snapshot directory that two hosts mount. Host A generates into it,
host B -- a host of its own, reached over SSH like A (the namespaced sshd hosts of test_multihost) -- restores
from it onto its own device; B's attempt to generate the same pod into the same store while A's generation
holds it is refused cleanly (the claim), changing nothing of A's. Real dockerd + CRIU + the simulated NPU,
the modules run by ansible-playbook over SSH on each host."""

import json
import uuid

import pytest

from conftest import docker, free_port, reset_device
from test_fleet_clone import Instance, wait_answer
from test_multihost import hosts  # two hosts behind sshd in network namespaces of their own
from _runtime_helpers import installed_runtime

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status

FIXTURES = (hosts,)  # pytest finds the imported fixture here

pytestmark = pytest.mark.timeout(900)

PLAY = """
- name: Two hosts, one store
  hosts: all
  gather_facts: false
  tasks:
    - name: A starts its generation of the pod (device part, generation gen-a)
      inferops.snapshot.npu_snapshot_backup:
        {container: "{{ container }}", lock: true, snapshot_dir: "{{ snap }}", identity: "{{ ident }}", generation_id: gen-a}
      when: inventory_hostname == 'npu-a'
    - name: B starts its own generation of the same pod into the same store, meanwhile
      inferops.snapshot.npu_snapshot_backup:
        {container: "{{ container }}", lock: true, snapshot_dir: "{{ snap }}", identity: "{{ ident }}", generation_id: gen-b}
      when: inventory_hostname == 'npu-b'
      register: b_try
      ignore_errors: true
    - name: A finishes its generation
      inferops.snapshot.host_checkpoint:
        {container: "{{ container }}", snapshot_dir: "{{ snap }}", identity: "{{ ident }}", generation_id: gen-a, timeout: 120}
      when: inventory_hostname == 'npu-a'
      register: a_done
    - name: A serves on
      inferops.snapshot.npu_snapshot_lock: {container: "{{ container }}", state: unlocked}
      when: inventory_hostname == 'npu-a'
    - name: Keep what each host saw
      ansible.builtin.copy:
        content: "{{ {'b_try': b_try | default(none), 'a_done': a_done | default(none)} | to_json }}"
        dest: "{{ results }}/{{ inventory_hostname }}.json"
        mode: '0600'
"""

RESTORE = """
- name: The pod comes back on host B, from the store A wrote
  hosts: npu-b
  gather_facts: false
  tasks:
    - name: Restore
      inferops.snapshot.snapshot_restore:
        {snapshot_dir: "{{ snap }}", identity: "{{ ident }}", container: "{{ container }}", method: runtime,
         runtime_name: "{{ runtime }}", timeout: 60}
      register: restored
    - name: Keep it
      ansible.builtin.copy: {content: "{{ restored | to_json }}", dest: "{{ results }}/restore.json", mode: '0600'}
"""


@pytest.fixture(scope="module")
def node(docker_env, tmp_path_factory):
    with installed_runtime(tmp_path_factory.mktemp("shared-node")) as installed:
        yield installed


def test_a_snapshot_generated_on_one_host_restores_on_another_and_a_second_generator_is_refused(
        hosts, node, docker_env, tmp_path):
    tag = uuid.uuid4().hex[:5]
    ident = {"namespace": "shared", "service": "sample", "instance": "p0", "pod": "ss-0"}
    store = node.roots / "shared-store"   # what both hosts mount (here: the same directory of this machine)
    store.mkdir(mode=0o700)
    snap = layout.snapshot_dir(str(store), ident)
    results = tmp_path / "results"
    results.mkdir()
    port = free_port()
    devices = {host: tmp_path / ("npu-" + host) for host in ("npu-a", "npu-b")}
    engines = {}
    for host, device in devices.items():
        device.mkdir(mode=0o700)
        engines[host] = Instance("ss%s-%s" % (tag, host[-1]), docker_env, device, port if host == "npu-a" else free_port(),
                                 network="host", WORKLOAD_WARMUP_SECONDS=2)
    try:
        for engine in engines.values():
            engine.run()
        for engine in engines.values():
            engine.wait_ready()
        expected = [engines["npu-a"].generate(p) for p in ("what is an NPU?", "数据")]
        common = {"snap": snap, "ident": ident, "results": str(results), "runtime": node.name}
        inventory = hosts.inventory(**{host: dict(common, container=engine.name) for host, engine in engines.items()})
        (tmp_path / "play.yml").write_text(PLAY)
        (tmp_path / "restore.yml").write_text(RESTORE)
        run = hosts.run(tmp_path / "runs", tmp_path / "play.yml", inventory)
        assert run.rc == 0, run
        a = json.loads((results / "npu-a.json").read_text())
        b = json.loads((results / "npu-b.json").read_text())
        assert a["a_done"]["status"] == "completed", a
        assert b["b_try"]["failed"] and "another generation of this pod's snapshot is in progress: generation gen-a" \
            in b["b_try"]["msg"], b
        # refused cleanly: B's engine untouched and serving, A's generation published whole
        assert engines["npu-b"].info()["snapshot_state"] == "RUNNING"
        record = status.read(snap)
        assert record["status"] == "completed" and [h["status"] for h in record["history"]] == ["generating",
                                                                                                "completed"], record
        assert engines["npu-a"].info()["snapshot_state"] == "RUNNING"

        # node A goes away with its pod; the pod is recreated on node B, whose NPU is its own
        image = docker("inspect", "--format", "{{.Image}}", engines["npu-a"].name)  # the snapshot's very image
        for engine in engines.values():
            engine.remove()
        reset_device(devices["npu-b"])
        moved = Instance("ss%s-moved" % tag, image, devices["npu-b"], port, network="host", runtime=node.name,
                         INFEROPS_RESTORE_FROM=snap)
        engines["moved"] = moved
        moved.create()
        run = hosts.run(tmp_path / "runs", tmp_path / "restore.yml", inventory, extra_vars=[{"container": moved.name}])
        assert run.rc == 0, run
        restored = json.loads((results / "restore.json").read_text())
        assert restored["restored"] is True and restored["reason"] is None and not restored["created"], restored
        state = docker("inspect", "--format", "{{json .State}}", moved.name)
        assert '"Running":true' in state, (state, docker("logs", moved.name, check=False), node.log_records()[-1:])
        wait_answer(moved)
        assert [moved.generate(p) for p in ("what is an NPU?", "数据")] == expected
        assert status.read(snap)["last_restore"]["outcome"] == "restored"
    finally:
        for engine in engines.values():
            engine.remove()

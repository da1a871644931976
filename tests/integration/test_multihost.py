"""The playbooks over SSH (paramiko) against two inventory hosts, each with its own snapshot state.

The two hosts are the test's own: network namespaces made here, each running Debian's sshd on an
address of a private range that exists only inside the namespaces, reached from a third namespace
where ansible-playbook runs; a key generated for the test. Nothing is added to the machine's own
network. All hosts share this machine's dockerd, so each host gets its own containers, ports and
snapshot roots. Their engines listen on the machine's host network (Docker's host network mode),
so on the hosts the modules run in that network namespace (the interpreter is a wrapper that runs
``nsenter --net=... --mount=... python`` into this test's namespaces), as on a real node where the
engine listens on the node itself.
"""

import os
import subprocess
import sys
import time
import uuid

import pytest

from conftest import free_port, reset_device
from _roles_helpers import run_playbook, status_record

PROMPTS = ["what is an NPU?", "数据"]
SSHD = "/usr/sbin/sshd"
SUBNETS = {"npu-a": "10.213.1", "npu-b": "10.213.2"}  # /30 each: .1 on the controller side, .2 on the host


def sh(*argv, check=True):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError("%s failed (rc=%d): %s" % (" ".join(map(str, argv)), proc.returncode, proc.stderr))
    return proc


class NetnsHosts:
    """A controller namespace and one namespace per host, joined by veth pairs, sshd in each host."""

    def __init__(self, base):
        self.base = base
        tag = uuid.uuid4().hex[:5]
        self.controller = "inft-c-%s" % tag
        self.hosts = {name: "inft-%s-%s" % (name[-1], tag) for name in SUBNETS}
        self.tag = tag
        self.sshd = {}
        self.made = []

    def up(self):
        assert os.path.exists(SSHD), "openssh-server is missing: run scripts/env/setup.sh (it installs it)"
        for namespace in [self.controller] + list(self.hosts.values()):
            sh("ip", "netns", "add", namespace)
            self.made.append(namespace)
            sh("ip", "-n", namespace, "link", "set", "lo", "up")
        key = self.base / "id_ed25519"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "inferops-test", "-f", key)
        (self.base / "authorized_keys").write_text((self.base / "id_ed25519.pub").read_text())
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        # Ansible takes an interpreter path without arguments: a wrapper runs the modules in the host network
        self.python = self.base / "python-host-network"
        # (the machine's network and mount namespaces, referred to through this test process, which lives in
        # them: `ip netns exec` gives sshd a mount namespace of its own, without the cgroup mounts CRIU needs)
        self.python.write_text("#!/bin/sh\nexec nsenter --net=/proc/{0}/ns/net --mount=/proc/{0}/ns/mnt {1} \"$@\"\n"
                               .format(os.getpid(), sys.executable))
        self.python.chmod(0o755)
        for index, (host, namespace) in enumerate(sorted(self.hosts.items())):
            subnet = SUBNETS[host]
            outer, inner = "vc%s%d" % (self.tag, index), "vh%s%d" % (self.tag, index)
            # created inside the controller namespace with its peer in the host's: never in the machine's own
            sh("ip", "-n", self.controller, "link", "add", outer, "type", "veth", "peer", "name", inner,
               "netns", namespace)
            sh("ip", "-n", self.controller, "addr", "add", subnet + ".1/30", "dev", outer)
            sh("ip", "-n", self.controller, "link", "set", outer, "up")
            sh("ip", "-n", namespace, "addr", "add", subnet + ".2/30", "dev", inner)
            sh("ip", "-n", namespace, "link", "set", inner, "up")
            host_key = self.base / ("host_key_" + host)
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key)
            config = self.base / ("sshd_config_" + host)
            config.write_text("\n".join([
                "ListenAddress %s.2" % subnet, "Port 22", "HostKey %s" % host_key,
                "PidFile %s" % (self.base / ("sshd_%s.pid" % host)),
                "AuthorizedKeysFile %s" % (self.base / "authorized_keys"),
                "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "UsePAM no", "StrictModes no", "Subsystem sftp internal-sftp", ""]))
            log = open(self.base / ("sshd_%s.log" % host), "wb")
            self.sshd[host] = subprocess.Popen(["ip", "netns", "exec", namespace, SSHD, "-D", "-e", "-f", str(config)],
                                               stdout=log, stderr=subprocess.STDOUT)
        for host in self.hosts:
            self.wait_port(SUBNETS[host] + ".2", 22)
        return self

    def wait_port(self, address, port, timeout=20):
        probe = ("import socket, sys\ns = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)\n"
                 "print(s.recv(64).decode(errors='replace'))")
        deadline = time.monotonic() + timeout
        while True:
            proc = sh("ip", "netns", "exec", self.controller, sys.executable, "-c", probe, address, port, check=False)
            if proc.returncode == 0 and "SSH-" in proc.stdout:
                return
            if time.monotonic() > deadline:
                logs = {h: (self.base / ("sshd_%s.log" % h)).read_text(errors="replace") for h in self.hosts}
                raise AssertionError("sshd on %s:%s did not answer: %s %s" % (address, port, proc.stderr, logs))
            time.sleep(0.2)

    def down(self):
        for host, proc in self.sshd.items():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        for namespace in reversed(self.made):
            sh("ip", "netns", "del", namespace, check=False)  # its veth ends go with it

    def inventory(self, **host_vars):
        hosts = {}
        for host in sorted(self.hosts):
            hosts[host] = dict({
                "ansible_host": SUBNETS[host] + ".2",
                "ansible_connection": "paramiko",
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.base / "id_ed25519"),
                # the engines listen on the machine's host network, where Docker's host-network containers live
                "ansible_python_interpreter": str(self.python),
            }, **host_vars.get(host, {}))
        return {"all": {"hosts": hosts}}

    def run(self, tmp_path, playbook, inventory, **kwargs):
        env = {"ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_PARAMIKO_RECORD_HOST_KEYS": "False",
               "ANSIBLE_PARAMIKO_LOOK_FOR_KEYS": "False"}
        return run_playbook(tmp_path, playbook, inventory, env=env, prefix=("ip", "netns", "exec", self.controller),
                            **kwargs)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    made = NetnsHosts(tmp_path_factory.mktemp("netns"))
    try:
        yield made.up()
    finally:
        made.down()
    left = sh("ip", "netns", "list").stdout
    assert made.tag not in left, "namespaces left behind: %s" % left
    assert all(proc.poll() is not None for proc in made.sshd.values())


def host_state(tmp_path, host, containers, image, name=None):
    """A host's own state: snapshot roots, simulated NPU, one container on its own port."""
    base = tmp_path / host
    (base / "dev").mkdir(parents=True, mode=0o700)
    name = name or "mh-%s-%s" % (host[-1], uuid.uuid4().hex[:5])
    c = containers(name, image, base / "dev", free_port(), WORKLOAD_DEVICE_MB="16", WORKLOAD_HOST_MB="4")
    config = {"enabled": True, "hostSnapshotPath": str(base / "host"), "npuSnapshotPath": str(base / "npu"),
              "timeoutSeconds": 120}
    return base, c, config


def test_two_hosts_over_ssh_keep_their_own_state_and_one_failing_leaves_the_other_alone(
        hosts, docker_env, containers, tmp_path):
    state = {host: host_state(tmp_path, host, containers, docker_env) for host in sorted(hosts.hosts)}
    for base, c, config in state.values():
        c.run()
    for base, c, config in state.values():
        c.wait_ready()
    expected = [state["npu-a"][1].generate(p) for p in PROMPTS]
    host_vars = {}
    for host, (base, c, config) in state.items():
        host_vars[host] = {
            "snapshot_config": config, "snapshot_service": {"namespace": "mh", "name": "svc"},
            # one instance per host: their generations are independent of each other
            "snapshot_instances": [{"name": "p-" + host, "pods": [
                {"name": c.name, "readiness_url": c.url + "/health", "env": {"NODE": host}}]}]}
    host_vars["npu-b"]["snapshot_generate_runc_root"] = "/run/inferops-test-no-such-runc"  # b's host snapshot fails
    inventory = hosts.inventory(**host_vars)

    run = hosts.run(tmp_path / "runs", "generate.yml", inventory)
    assert run.rc != 0, run
    assert run.recap["npu-a"]["failed"] == 0 and run.recap["npu-b"]["failed"] == 1, run
    a, b = run.facts["npu-a"], run.facts["npu-b"]
    assert a["snapshot_generate_outcome"]["status"] == "completed", run
    assert b["snapshot_generate_outcome"]["status"] == "failed", run
    assert b["snapshot_generate_results"][0]["reason"].startswith("host snapshot of pod %s failed" % state["npu-b"][1].name)
    snap_a = a["snapshot_generate_results"][0]["snapshot_dir"]
    snap_b = b["snapshot_generate_results"][0]["snapshot_dir"]
    assert snap_a.startswith(str(tmp_path / "npu-a" / "host")) and snap_b.startswith(str(tmp_path / "npu-b" / "host"))
    record_a = status_record(snap_a)
    assert record_a["status"] == "completed" and os.path.isdir(snap_a)
    assert status_record(snap_b)["status"] == "failed" and not os.path.exists(snap_b)
    assert sorted(os.listdir(os.path.dirname(snap_b))) == [".%s.status.json" % state["npu-b"][1].name]
    for host, (base, c, config) in state.items():
        assert [c.generate(p) for p in PROMPTS] == expected and c.info()["snapshot_state"] == "RUNNING", host

    again = hosts.run(tmp_path / "runs", "generate.yml", inventory, extra_vars=[{"snapshot_hosts": "npu-a"}])
    assert again.rc == 0 and again.recap["npu-a"]["changed"] == 0 and "npu-b" not in again.recap, again
    assert status_record(snap_a)["updated_at"] == record_a["updated_at"]

    # Both pods deleted, their NPUs wiped. a's container is recreated from its snapshot; b has none, so its
    # container is recreated the ordinary way (as kubelet or compose would) and starts normally.
    for host, (base, c, config) in state.items():
        c.remove()
        reset_device(base / "dev")
    state["npu-b"][1].create()
    restored = hosts.run(tmp_path / "runs", "restore.yml", inventory)
    assert restored.rc == 0, restored
    result_a = restored.facts["npu-a"]["snapshot_restore_results"][0]
    result_b = restored.facts["npu-b"]["snapshot_restore_results"][0]
    assert result_a["restored"] is True and result_a["reason"] is None, result_a
    assert result_b["restored"] is False and result_b["reason"].startswith("missing: "), result_b
    for host, (base, c, config) in state.items():
        assert [c.generate(p) for p in PROMPTS] == expected, host
        assert c.info()["metadata"]["env"]["NODE"] == host
    assert state["npu-a"][1].info()["metadata"]["restored"] is True


def test_an_instance_spread_over_two_hosts_is_undone_on_both_when_one_fails(hosts, docker_env, containers, tmp_path):
    state = {host: host_state(tmp_path, host, containers, docker_env) for host in sorted(hosts.hosts)}
    for base, c, config in state.values():
        c.run()
    for base, c, config in state.values():
        c.wait_ready()
    pods = [{"name": c.name, "host": host, "readiness_url": c.url + "/health"} for host, (b, c, cfg) in state.items()]
    host_vars = dict((host, {"snapshot_config": config}) for host, (base, c, config) in state.items())
    host_vars["npu-b"]["snapshot_generate_runc_root"] = "/run/inferops-test-no-such-runc"
    inventory = hosts.inventory(**host_vars)
    run = hosts.run(tmp_path / "runs", "generate.yml", inventory, extra_vars=[{
        "snapshot_service": {"namespace": "mh", "name": "spread"}, "snapshot_instances": [{"name": "p0", "pods": pods}],
        "snapshot_generate_fail_on_error": False}])
    assert run.rc == 0, run
    a = run.facts["npu-a"]
    assert a["snapshot_generate_outcome"]["status"] == "failed", run
    result = a["snapshot_generate_results"][0]
    assert result["reason"].startswith("instance p0 failed on host npu-b: host snapshot of pod"), result
    assert result["snapshot_dir"] in result["removed"] and not os.path.exists(result["snapshot_dir"])
    assert [h["status"] for h in status_record(result["snapshot_dir"])["history"]][-2:] == ["completed", "failed"]
    for host, (base, c, config) in state.items():
        assert c.info()["snapshot_state"] == "RUNNING" and c.generate(PROMPTS[0]), host

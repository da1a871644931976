"""The snapshot_prereqs role (playbooks/node_setup.yml) on a Debian 12 and a Debian 13 node, for real: each node
is a container of an image built offline from Debian's packages (Debian 12: the base image of
scripts/env/setup.sh; Debian 13: scripts/build-debian-image.sh, debootstrap from this machine's Debian mirror,
cached in /var/cache/inferops/rootfs), prepared the way a node is (its package lists fetched, procps), reached
with the community.docker.docker connection. The role installs what the modules need there from the
distribution's packages (python3-jsonschema, python3-cryptography), CRIU from where it must (Debian 12 offers
3.17 and Debian 13 4.1: the private build of criu 4.2.x from a newer suite, downloaded from the mirror), writes
runc's CRIU options and daemon.json, and a second run changes nothing. On Debian 13 the private build's update
path too: once the node's package lists offer a criu >= 4.2 (here: forky's added, as a release upgrade would),
the next run installs the distribution's package and removes the private build.

The containers get the capabilities `criu check` needs (no --privileged: this machine's dockerd cannot grant
every capability) and talk to this machine's dockerd through its socket with its docker CLI (the role only
asks `docker info`); every file the role writes is the container's own."""

import os
import subprocess

import pytest

from conftest import REPO, docker
from _roles_helpers import run_playbook

NO_RUNTIME = {"snapshot_node_setup_runtime": False}
# `criu check` in a container: namespaces, ptrace, netlink, /proc/sys writable, a tun device; unconfined profiles.
CRIU_CHECK_OPTIONS = ["--cap-add", "SYS_ADMIN", "--cap-add", "SYS_PTRACE", "--cap-add", "NET_ADMIN",
                      "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
                      "--security-opt", "systempaths=unconfined", "--device", "/dev/net/tun"]
# How this machine reaches its Debian mirror (a frozen mirror's expired Release files, a proxy): the node too.
APT_ACQUIRE = ("Check-Valid-Until", "Check-Date", "http::Proxy", "https::Proxy")


def debian_image(suite):
    if suite == "bookworm":  # the base image has the same recipe (debootstrap --variant=minbase, python3)
        return "inferops/base:bookworm"
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-debian-image.sh"), suite], capture_output=True,
                         text=True, timeout=1200, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split()[-1]


class Node:
    """A Debian container as a node: root, python3, its package lists, procps; dockerd through the socket."""

    def __init__(self, suite):
        self.name = "inferops-prereqs-%s-%d" % (suite, os.getpid())
        docker("rm", "-f", self.name, check=False)
        docker("run", "-d", "--name", self.name, "--network", "host", *CRIU_CHECK_OPTIONS,
               "-v", "/var/run/docker.sock:/var/run/docker.sock", "-v", "/usr/bin/docker:/usr/bin/docker:ro",
               debian_image(suite), "sleep", "infinity")
        settings = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, check=True).stdout
        acquire = "".join(line + "\n" for line in settings.splitlines()
                          if line.startswith(tuple("Acquire::%s " % key for key in APT_ACQUIRE)))
        self.sh("cat > /etc/apt/apt.conf.d/99host-mirror", stdin=acquire)
        self.sh("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends procps")

    def sh(self, script, stdin=None, check=True):
        proc = subprocess.run(["docker", "exec", "-i", self.name, "bash", "-c", script], input=stdin,
                              capture_output=True, text=True, timeout=600, check=False)
        assert not check or proc.returncode == 0, "%s: %s%s" % (script, proc.stdout, proc.stderr)
        return proc.stdout

    def inventory(self):
        return {"all": {"hosts": {"node": {"ansible_connection": "community.docker.docker", "ansible_host": self.name,
                                           "ansible_python_interpreter": "/usr/bin/python3"}}}}

    def setup(self, tmp_path, *extra):
        return run_playbook(tmp_path / "runs", "node_setup.yml", self.inventory(), extra_vars=[NO_RUNTIME] + list(extra))

    def remove(self):
        docker("rm", "-f", self.name, check=False)


@pytest.fixture(params=["bookworm", "trixie"], ids=["debian12", "debian13"])
def node(request, docker_env):
    made = Node(request.param)
    yield request.param, made
    made.remove()


def test_prepares_a_fresh_node_from_debian_packages_and_a_second_run_changes_nothing(node, tmp_path):
    suite, host = node
    first = host.setup(tmp_path)
    assert first.rc == 0, first
    assert first.recap["node"]["changed"] >= 4, first  # packages, criu, runc.conf, daemon.json
    # CRIU: the distribution's is older than 4.2 on both, so the private build from a newer Debian suite.
    assert "criu 4.2" in first.stdout and "(a private prefix from Debian (/opt/inferops/criu))" in first.stdout, first
    assert "Version: 4.2" in host.sh("criu --version") and host.sh("command -v criu").strip() == "/usr/local/bin/criu"
    host.sh("criu check")
    # The modules' libraries come from the distribution: its packages, importable by the node's python3 -I.
    for package in ("python3-jsonschema", "python3-cryptography"):
        assert "Status: install ok installed" in host.sh("dpkg -s %s" % package), package
    host.sh("python3 -I -c 'import jsonschema, cryptography.hazmat.primitives.ciphers.aead'")
    assert host.sh("cat /etc/criu/runc.conf").split() == ["tcp-close", "skip-in-flight"]
    assert '"experimental": true' in host.sh("cat /etc/docker/daemon.json")

    again = host.setup(tmp_path)
    assert again.rc == 0 and again.recap["node"]["changed"] == 0, again

    if suite != "trixie":
        return
    # The update path: the node's lists offer a criu >= 4.2 now; the distribution's replaces the private build.
    host.sh("sed 's/ trixie / forky /' /etc/apt/sources.list > /etc/apt/sources.list.d/forky.list && apt-get update -q")
    upgraded = host.setup(tmp_path)
    assert upgraded.rc == 0, upgraded
    assert "criu 4.2" in upgraded.stdout and "at /usr/sbin/criu (the node)" in upgraded.stdout, upgraded
    assert host.sh("command -v criu").strip() == "/usr/sbin/criu"
    assert "Status: install ok installed" in host.sh("dpkg -s criu")
    assert host.sh("ls -d /opt/inferops/criu /usr/local/bin/criu 2>/dev/null || true").strip() == ""
    host.sh("criu check")

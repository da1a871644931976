# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for the Docker CLI. PRIVATE to the inferops.snapshot collection.

No docker argv is built anywhere else. Every call runs through the Runner (list argv, a time limit
where one applies) and fails with the command, rc and stderr attached; the values of environment
variables given to ``create`` are masked in all of them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import shutil

from ..errors import CommandError, ParameterError
from . import runner as runner_mod


def env_dict(items):
    """Docker's ``Env`` list (``KEY=value``) as a dict; entries without '=' are dropped."""
    env = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return env


class DockerCli:
    def __init__(self, executable="docker", runner=None):
        self.executable = shutil.which(executable) or executable
        self.runner = runner or runner_mod.DEFAULT

    def run(self, args, check=True, timeout=None, what=None, secrets=(), data=None):
        return self.runner.run([self.executable] + list(args), timeout=timeout, check=check, data=data,
                               what=what or "docker %s" % args[0], secrets=secrets)

    def _unreachable(self, what, rc, out, err):
        return CommandError("cannot talk to the Docker daemon (%s): %s (is dockerd running?)"
                            % (what, (err or out).strip()), cmd=[self.executable, what], rc=rc, stdout=out, stderr=err)

    # -- containers -------------------------------------------------------------------------------
    def inspect_container(self, name):
        rc, out, err = self.run(["container", "inspect", "--", name], check=False)
        if rc != 0:
            if "No such" in err or "no such" in err:
                raise ParameterError("container: no container named %r on this host" % name, container=name)
            raise CommandError("docker container inspect %s failed (rc=%d): %s" % (name, rc, err.strip()),
                               cmd=[self.executable, "container", "inspect", name], rc=rc, stdout=out, stderr=err)
        return json.loads(out)[0]

    def inspect_containers(self, ids):
        """`docker inspect` of several containers; one removed meanwhile is simply not listed."""
        if not ids:
            return []
        rc, out, err = self.run(["container", "inspect", "--"] + list(ids), check=False)
        return json.loads(out or "[]")

    def running_ids(self):
        rc, out, err = self.run(["ps", "--quiet", "--no-trunc"])
        return out.split()

    def all_ids(self):
        rc, out, err = self.run(["ps", "--all", "--quiet", "--no-trunc"])
        return out.split()

    def container_id(self, name):
        """Full id of a container, or None when there is none by that name."""
        rc, out, err = self.run(["container", "inspect", "--format", "{{.Id}}", "--", name], check=False)
        return out.strip() if rc == 0 else None

    def running_pid(self, name):
        """Host pid of the container's main process; a clear error when it is not running."""
        info = self.inspect_container(name)
        state = info.get("State") or {}
        if not state.get("Running") or not state.get("Pid"):
            raise ParameterError("container: %r is not running (status %s); start it first"
                                 % (name, state.get("Status", "unknown")), container=name)
        return int(state["Pid"])

    def is_running(self, name):
        return bool((self.inspect_container(name).get("State") or {}).get("Running"))

    def create(self, args, env=None):
        """`docker create` with ``args`` (from container.create_args); env values are masked in errors."""
        secrets = [value for value in (env or {}).values() if value]
        rc, out, err = self.run(["create"] + list(args), what="docker create", secrets=secrets)
        return out.strip()

    def start(self, container, timeout, checkpoint=None, what="docker start"):
        args = ["start"] + (["--checkpoint", checkpoint] if checkpoint else []) + [container]
        return self.run(args, timeout=timeout, what=what)

    def stop(self, container, grace=10):
        return self.run(["stop", "--time", str(int(grace)), container])

    def copy_into(self, container, source, destination):
        """`docker cp SOURCE CONTAINER:DESTINATION` (works on a created, not yet started container)."""
        return self.run(["cp", source, "%s:%s" % (container, destination)])

    def checkpoint_create(self, container, checkpoint_dir, name, leave_running, timeout):
        """Docker's own (slow) checkpoint path: it round-trips containerd's content store."""
        args = ["checkpoint", "create", "--checkpoint-dir", checkpoint_dir]
        if leave_running:
            args.append("--leave-running")
        return self.run(args + [container, name], timeout=timeout, what="docker checkpoint create of %s" % container)

    # -- images -----------------------------------------------------------------------------------
    def image_id(self, reference):
        """The sha256 id of a local image name or id."""
        rc, out, err = self.run(["image", "inspect", "--format", "{{.Id}}", "--", reference], check=False)
        if rc != 0:
            raise ParameterError("image: %r is not an image on this host: %s" % (reference, err.strip()), image=reference)
        return out.strip()

    def has_image(self, reference):
        rc, out, err = self.run(["image", "inspect", "--format", "{{.Id}}", "--", reference], check=False)
        return rc == 0

    def image_ids(self):
        rc, out, err = self.run(["image", "ls", "--quiet", "--no-trunc"])
        return set(out.split())

    # -- the daemon -------------------------------------------------------------------------------
    def server_info(self):
        """(server version, experimental flag) of the daemon, with a clear error when it is unreachable."""
        rc, out, err = self.run(["version", "--format", "{{.Server.Version}} {{.Server.Experimental}}"], check=False)
        if rc != 0:
            raise self._unreachable("version", rc, out, err)
        version, _sep, experimental = out.strip().partition(" ")
        return version, experimental == "true"

    def remove(self, container):
        """`docker rm --force`: a container that must not run (and must not be left behind)."""
        return self.run(["rm", "--force", container])

    def checkpoint_support(self):
        """(data root, experimental flag): where `docker start --checkpoint` looks for checkpoints
        (``<root>/containers/<id>/checkpoints``; not always /var/lib/docker), and whether it offers them."""
        rc, out, err = self.run(["info", "--format", "{{.DockerRootDir}}|{{.ExperimentalBuild}}"], check=False)
        if rc != 0:
            raise self._unreachable("info", rc, out, err)
        root, _sep, experimental = out.strip().partition("|")
        return root or None, experimental == "true"

    def runtimes(self):
        """{name: settings} of the OCI runtimes dockerd knows ({} when it cannot say)."""
        rc, out, err = self.run(["info", "--format", "{{json .Runtimes}}"], check=False)
        try:
            return json.loads(out) if rc == 0 else {}
        except ValueError:
            return {}

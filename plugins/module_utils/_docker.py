# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for the Docker CLI. PRIVATE to the inferops.snapshot collection.

Every docker invocation goes through ``DockerCli.run`` (list argv, never a shell string) and fails
with the quoted command, rc, stdout and stderr attached.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.inferops.snapshot.plugins.module_utils._errors import CommandError, ParameterError


class DockerCli:
    def __init__(self, module, executable="docker"):
        self.module = module
        self.executable = module.get_bin_path(executable, required=False) or executable

    def run(self, args, check=True, data=None):
        cmd = [self.executable] + list(args)
        rc, out, err = self.module.run_command(cmd, data=data, binary_data=data is not None)
        if check and rc != 0:
            raise CommandError("%s failed (rc=%d): %s" % (" ".join(cmd), rc, (err or out).strip()),
                               cmd=cmd, rc=rc, stdout=out, stderr=err)
        return rc, out, err

    def inspect_container(self, name):
        rc, out, err = self.run(["container", "inspect", "--", name], check=False)
        if rc != 0:
            if "No such" in err or "no such" in err:
                raise ParameterError("container: no container named %r on this host" % name, container=name)
            raise CommandError("docker container inspect %s failed (rc=%d): %s" % (name, rc, err.strip()),
                               cmd=[self.executable, "container", "inspect", name], rc=rc, stdout=out, stderr=err)
        return json.loads(out)[0]

    def running_pid(self, name):
        """Host pid of the container's main process; a clear error when it is not running."""
        info = self.inspect_container(name)
        state = info.get("State") or {}
        if not state.get("Running") or not state.get("Pid"):
            raise ParameterError("container: %r is not running (status %s); start it first"
                                 % (name, state.get("Status", "unknown")), container=name)
        return int(state["Pid"])

    def image_id(self, reference):
        """The sha256 id of a local image name or id."""
        rc, out, err = self.run(["image", "inspect", "--format", "{{.Id}}", "--", reference], check=False)
        if rc != 0:
            raise ParameterError("image: %r is not an image on this host: %s" % (reference, err.strip()), image=reference)
        return out.strip()

    def server_info(self):
        """(server version, experimental flag) of the daemon, with a clear error when it is unreachable."""
        rc, out, err = self.run(["version", "--format", "{{.Server.Version}} {{.Server.Experimental}}"], check=False)
        if rc != 0:
            raise CommandError("cannot talk to the Docker daemon: %s (is dockerd running?)" % (err or out).strip(),
                               cmd=[self.executable, "version"], rc=rc, stdout=out, stderr=err)
        version, _sep, experimental = out.strip().partition(" ")
        return version, experimental == "true"

    def checkpoint_support(self):
        """(data root, experimental flag) of the daemon: where `docker start --checkpoint` looks for
        checkpoints (``<root>/containers/<id>/checkpoints``; not always /var/lib/docker) and whether it
        offers checkpoints at all."""
        rc, out, err = self.run(["info", "--format", "{{.DockerRootDir}}|{{.ExperimentalBuild}}"], check=False)
        if rc != 0:
            raise CommandError("cannot talk to the Docker daemon: %s (is dockerd running?)" % (err or out).strip(),
                               cmd=[self.executable, "info"], rc=rc, stdout=out, stderr=err)
        root, _sep, experimental = out.strip().partition("|")
        return root or None, experimental == "true"

    def container_id(self, name):
        """Full id of a container, or None when there is none by that name."""
        rc, out, err = self.run(["container", "inspect", "--format", "{{.Id}}", "--", name], check=False)
        return out.strip() if rc == 0 else None

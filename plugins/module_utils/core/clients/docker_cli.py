# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for the Docker CLI. PRIVATE to the inferops.snapshot collection.

No docker argv is built anywhere else. Every call runs through the Runner (list argv, a time limit
where one applies) and fails with the command, rc and stderr attached. The environment ``create`` gives a
container never goes on a command line: it is handed over in a 0600 file of a private directory, removed
right after, and its values are masked in every error and result (runner.remember).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shutil
import tempfile

from ..base import layout
from ..base.errors import CommandError, ParameterError
from ..linux import plaintext
from . import commands, criu_cli

ENV_FILE_PARENT = layout.TMPFS  # the values never reach a disk (the temp dir where there is no tmpfs)


def env_dict(items):
    """Docker's ``Env`` list (``KEY=value``) as a dict; entries without '=' are dropped."""
    env = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return env


def write_env_file(directory, env):
    """Write ``env`` as docker's --env-file (``KEY=value`` lines, 0600) into ``directory``; returns (its path,
    {key: value} of the values it names only, by ``KEY`` alone: docker reads those from its own environment)."""
    lines, by_name = [], {}
    for key in sorted(env):
        value = env[key]
        if "\n" in value or "\r" in value or key.startswith("#"):
            by_name[key] = value
            lines.append(key)
        else:
            lines.append("%s=%s" % (key, value))
    path = os.path.join(directory, "env")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return path, by_name


class DockerCli:
    def __init__(self, executable="docker", runner=None):
        self.executable = shutil.which(executable) or executable
        self.runner = runner or commands.DEFAULT

    def run(self, args, check=True, timeout=None, what=None, secrets=(), data=None, env=None):
        try:
            return self.runner.run([self.executable] + list(args), timeout=timeout, check=check, data=data,
                                   what=what or "docker %s" % args[0], secrets=secrets, env=env)
        except CommandError as exc:
            if exc.result.get("rc") is None and shutil.which(self.executable) is None:  # not started: no such CLI
                raise ParameterError("docker_cli: %r is no executable on this host (%s); install the Docker CLI, or "
                                     "give its name or path in docker_cli" % (self.executable, exc.msg),
                                     field="docker_cli", cmd=exc.result.get("cmd"), rc=None)
            raise

    def _unreachable(self, what, rc, out, err):
        return CommandError("cannot talk to the Docker daemon (%s): %s (is dockerd running?)"
                            % (what, (err or out).strip()), cmd=[self.executable, what], rc=rc, stdout=out, stderr=err)

    # -- containers -------------------------------------------------------------------------------
    def network_address(self, network, container_id):
        """The IPv4 address ``network`` gives container ``container_id`` (`docker network inspect`: dockerd answers it
        while it starts the container, unlike `docker inspect`), or None."""
        rc, out, _err = self.run(["network", "inspect", "--format", "{{json .Containers}}", network], check=False,
                                 timeout=30)
        try:
            endpoint = (json.loads(out) or {}).get(container_id) if rc == 0 else None
        except ValueError:
            return None
        address = ((endpoint or {}).get("IPv4Address") or "").split("/")[0]
        return address or None

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
        """`docker create` with ``args`` (container.create_args) and their environment (``args.env``, ``env`` on top),
        given through ``--env-file``: a 0600 file in a private directory (plaintext.PrivateDir, swept after a killed
        run), removed as soon as docker has read it. A value the file cannot carry (a line break) reaches docker
        through its own environment, by name. Never on the command line; masked everywhere (runner.remember)."""
        environment = dict(getattr(args, "env", None) or {})
        environment.update(env or {})
        environment = dict((key, "%s" % value) for key, value in environment.items())  # a YAML number is a value too
        commands.remember(environment.values())
        scratch = plaintext.PrivateDir(ENV_FILE_PARENT if os.path.isdir(ENV_FILE_PARENT) else tempfile.gettempdir())
        try:
            env_file, by_name = write_env_file(scratch.path, environment)
            rc, out, err = self.run(["create", "--env-file", env_file] + list(args), what="docker create",
                                    secrets=list(environment.values()),
                                    env=dict(os.environ, **by_name) if by_name else None)
        finally:
            scratch.remove()
        return out.strip()

    def start(self, container, timeout, checkpoint=None, what="docker start"):
        """`docker start`; with ``checkpoint`` (a restore: ``container`` is the full id), a failure names CRIU's
        cause and a kept copy of its log, caught while containerd still had it (criu_cli.LogCatcher)."""
        args = ["start"] + (["--checkpoint", checkpoint] if checkpoint else []) + [container]
        if not checkpoint:
            return self.run(args, timeout=timeout, what=what)
        catcher = criu_cli.LogCatcher([os.path.join(root, container, "work", "restore.log")
                                       for root in layout.CONTAINERD_TASK_ROOTS], timeout or 600).start()
        try:
            return self.run(args, timeout=timeout, what=what)
        except CommandError as exc:
            raise criu_cli.failure(exc, criu_cli.named_log(exc.result.get("stderr")), "restore", container[:12],
                                   data=catcher.read())
        finally:
            catcher.close()

    def stop(self, container, grace=10):
        return self.run(["stop", "--time", str(int(grace)), container])

    def remove(self, container):
        """`docker rm --force`: a container that must not run (and must not be left behind)."""
        return self.run(["rm", "--force", container])

    def copy_into(self, container, source, destination):
        """`docker cp SOURCE CONTAINER:DESTINATION` (works on a created, not yet started container)."""
        return self.run(["cp", source, "%s:%s" % (container, destination)])

    def checkpoint_create(self, container, checkpoint_dir, name, leave_running, timeout):
        """Docker's own (slow) checkpoint path: it round-trips containerd's content store."""
        args = ["checkpoint", "create", "--checkpoint-dir", checkpoint_dir]
        if leave_running:
            args.append("--leave-running")
        try:
            return self.run(args + [container, name], timeout=timeout, what="docker checkpoint create of %s" % container)
        except CommandError as exc:  # containerd's criu-dump.log goes with the task: keep a copy, name it
            named = criu_cli.named_log(exc.result.get("stderr"))
            raise criu_cli.failure(exc, named, "dump", container[:12]) if named else exc

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

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generate driver: a Docker container (``engine=docker``). PRIVATE to the inferops.snapshot collection.

Found by ``docker inspect``, dumped by runc on Docker's runc root (``method=runc``, the fast path) or by ``docker
checkpoint create``; its container record (host/container.json) lets the Docker restore path recreate it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..base.errors import ParameterError
from ..clients.docker_cli import DockerCli, env_dict
from ..clients.runc_cli import RuncCli, check_criu_config
from ..store import container_record, fleet, world
from .driver import Driver


class DockerContainer(Driver):
    engine = "docker"

    def __init__(self, params, criu):
        Driver.__init__(self, params, criu)
        self.docker = DockerCli(params["docker_cli"])
        self.runc = RuncCli(global_args=["--root", params["runc_root"]])
        self.work_dir = params["method"] == "runc"  # docker checkpoint create makes its own
        self.info = None  # docker inspect of the container

    def preflight(self, versions):
        params = self.params
        if not params["container"]:
            raise ParameterError("container: required with engine=docker")
        versions["docker"], experimental = self.docker.server_info()
        if params["method"] == "docker" and not experimental:
            raise ParameterError("method=docker needs the Docker daemon in experimental mode: set "
                                 "\"experimental\": true in /etc/docker/daemon.json and restart dockerd, "
                                 "or use method=runc")
        if params["method"] == "runc":
            check_criu_config()
        self.info = self.docker.inspect_container(params["container"])
        self.pid = self.docker.running_pid(params["container"])
        self.container_id = self.info["Id"]
        versions["runc"] = self.runc.version()

    def describe(self):
        return self.params["container"]

    def dump(self, image_dir, leave_running, seconds, work):
        if self.params["method"] == "runc":
            self.runc.checkpoint(self.info["Id"], image_dir, leave_running, seconds, work=work)
        else:
            self.docker.checkpoint_create(self.info["Id"], os.path.dirname(image_dir), os.path.basename(image_dir),
                                          leave_running, seconds)

    def facts(self, versions):
        process = world.docker_facts(self.info)
        excluded = world.excluded_mounts(process["mounts"], env_dict((self.info.get("Config") or {}).get("Env")),
                                         self.params.get("engine_state_mounts") or ())
        return world.capture(process, versions.get("criu"), versions.get("runc"), excluded=excluded)

    def image(self):
        return {"id": self.info["Image"], "name": (self.info.get("Config") or {}).get("Image")}

    def version(self, versions):
        return versions.get("docker")

    def write_record(self, directory):
        container_record.write_container_record(directory, self.info)

    def device_keys(self):
        return fleet.docker_device_keys(self.info)

    def stale(self, recorded):
        return world.stale(recorded, self.docker.inspect_container(self.params["container"]), self.criu.version(),
                           self.runc.version())

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The container record of a snapshot (``host/container.json``) and the container it recreates. PRIVATE.

The record is the part of ``docker inspect`` a restore needs to recreate the container when the
original is gone: same image, command, environment, mounts, network and devices.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ..base import layout
from ..clients.docker_cli import env_dict
from ..linux import fs

# What is needed to recreate a container with the same process environment and mounts.
CONFIG_KEYS = ("Image", "Cmd", "Entrypoint", "Env", "WorkingDir", "User", "Labels")
HOST_CONFIG_KEYS = ("NetworkMode", "Binds", "ShmSize", "Runtime", "IpcMode", "PidMode", "Privileged", "CapAdd",
                    "Devices", "SecurityOpt", "Tmpfs")


def container_record(info):
    """The part of `docker inspect` a restore needs to recreate the container."""
    config = info.get("Config") or {}
    host = info.get("HostConfig") or {}
    return {
        "name": info["Name"].lstrip("/"),
        "id": info["Id"],
        "image_id": info["Image"],
        "config": {key: config.get(key) for key in CONFIG_KEYS},
        "host_config": {key: host.get(key) for key in HOST_CONFIG_KEYS},
    }


def write_container_record(staging_dir, info):
    """The record, into a snapshot's staging directory; not fsync'd here: the seal flushes the whole directory."""
    fs.ensure_dir(os.path.join(staging_dir, layout.HOST_DIR))
    target = os.path.join(staging_dir, layout.CONTAINER_RECORD)
    fs.write_file_atomic(target, (json.dumps(container_record(info), indent=2, sort_keys=True) + "\n").encode(),
                         durable=False)
    return target


def parse_container_record(data):
    return json.loads(data.decode("utf-8"))


def read_container_record(directory):
    with open(os.path.join(directory, layout.CONTAINER_RECORD)) as handle:
        return json.load(handle)


class CreateArgs(list):
    """`docker create` arguments, and ``env``: the environment they go with, which is never an argument (its values
    would show in every process listing and error): DockerCli.create hands it over in a file."""

    def __init__(self, args, env):
        super(CreateArgs, self).__init__(args)
        self.env = env


def create_args(record, name, env_overrides=None):
    """`docker create` arguments (after ``create``) that rebuild the recorded container (same mounts, network, env):
    a CreateArgs, the recorded environment with ``env_overrides`` on top in its ``env``."""
    config, host = record["config"], record["host_config"]
    args = ["--name", name]
    env = env_dict(config.get("Env"))
    env.update(env_overrides or {})
    for bind in host.get("Binds") or []:
        args += ["--volume", bind]
    if host.get("NetworkMode"):
        args += ["--network", host["NetworkMode"]]
    if host.get("ShmSize"):
        args += ["--shm-size", str(host["ShmSize"])]
    for key, flag in (("IpcMode", "--ipc"), ("PidMode", "--pid"), ("Runtime", "--runtime")):
        if host.get(key) and host[key] not in ("private", "runc", ""):
            args += [flag, host[key]]
    if host.get("Privileged"):
        args.append("--privileged")
    for cap in host.get("CapAdd") or []:
        args += ["--cap-add", cap]
    for opt in host.get("SecurityOpt") or []:
        args += ["--security-opt", opt]
    for device in host.get("Devices") or []:
        args += ["--device", "%s:%s:%s" % (device["PathOnHost"], device["PathInContainer"],
                                           device.get("CgroupPermissions") or "rwm")]
    for path, options in sorted((host.get("Tmpfs") or {}).items()):
        args += ["--tmpfs", "%s:%s" % (path, options) if options else path]
    for key, value in sorted((config.get("Labels") or {}).items()):
        args += ["--label", "%s=%s" % (key, value)]
    if config.get("WorkingDir"):
        args += ["--workdir", config["WorkingDir"]]
    if config.get("User"):
        args += ["--user", config["User"]]
    entrypoint = config.get("Entrypoint") or []
    if entrypoint:
        args += ["--entrypoint", entrypoint[0]]
    args += ["--", record["image_id"]] + entrypoint[1:] + list(config.get("Cmd") or [])
    return CreateArgs(args, env)

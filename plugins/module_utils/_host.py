# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host part of a snapshot: checkpointing a container or a bare process with CRIU, and putting
it back. PRIVATE to the inferops.snapshot collection.

Layout inside a snapshot: ``host/criu/`` holds the CRIU images; ``host/container.json`` the
container's configuration (engine docker), enough to recreate it when the original is gone.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shutil
import tempfile

from ansible_collections.inferops.snapshot.plugins.module_utils import _paths as paths
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import CommandError, ParameterError, SnapshotTimeout

HOST_DIR = "host"
IMAGES_DIR = "criu"
CONTAINER_FILE = "container.json"
DOCKER_RUNC_ROOT = "/var/run/docker/runtime-runc/moby"
DOCKER_ROOT = "/var/lib/docker"
TIMEOUT_RC = 124

# What is needed to recreate a container with the same process environment and mounts.
CONFIG_KEYS = ("Image", "Cmd", "Entrypoint", "Env", "WorkingDir", "User", "Labels")
HOST_CONFIG_KEYS = ("NetworkMode", "Binds", "ShmSize", "Runtime", "IpcMode", "PidMode", "Privileged", "CapAdd",
                    "Devices", "SecurityOpt", "Tmpfs")


def images_dir(directory):
    return os.path.join(directory, HOST_DIR, IMAGES_DIR)


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
    host_dir = paths.ensure_dir(os.path.join(staging_dir, HOST_DIR))
    target = os.path.join(host_dir, CONTAINER_FILE)
    paths.write_file_atomic(target, (json.dumps(container_record(info), indent=2, sort_keys=True) + "\n").encode())
    return target


def read_container_record(directory):
    with open(os.path.join(directory, HOST_DIR, CONTAINER_FILE)) as handle:
        return json.load(handle)


def create_args(record, name, env_overrides=None):
    """`docker create` arguments that rebuild the recorded container (same mounts, network, env)."""
    config, host = record["config"], record["host_config"]
    args = ["create", "--name", name]
    env = dict(item.split("=", 1) for item in (config.get("Env") or []) if "=" in item)
    env.update(env_overrides or {})
    for key in sorted(env):
        args += ["--env", "%s=%s" % (key, env[key])]
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
    return args


def whole_seconds(seconds):
    """coreutils `timeout` takes whole seconds: round up, at least 1."""
    return max(1, int(seconds + 0.999))


def timed(argv, seconds):
    """Wrap argv in coreutils `timeout` so a hung checkpoint or restore cannot hang the task."""
    return ["timeout", "--kill-after=10", "%d" % whole_seconds(seconds)] + list(argv)


def run_timed(module, argv, seconds, what):
    rc, out, err = module.run_command(timed(argv, seconds))
    if rc in (TIMEOUT_RC, 137):
        raise SnapshotTimeout("%s did not finish within %d s and was stopped" % (what, whole_seconds(seconds)), cmd=argv, rc=rc,
                              stdout=out, stderr=err)
    if rc != 0:
        raise CommandError("%s failed (rc=%d): %s" % (what, rc, (err or out).strip()[-2000:]), cmd=argv, rc=rc,
                           stdout=out, stderr=err)
    return out


def _tail(path, lines=30):
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except (IOError, OSError):
        return None


RUNC_CRIU_CONF = "/etc/criu/runc.conf"


def check_runc_criu_conf(path=RUNC_CRIU_CONF):
    """runc passes this file to CRIU on checkpoint and restore (docker start --checkpoint too).

    Without tcp-close a checkpoint taken while requests are in flight fails, or cannot be restored
    through Docker, which offers no --tcp-established on restore.
    """
    try:
        with open(path) as handle:
            if "tcp-close" in (line.strip() for line in handle):
                return
    except (IOError, OSError):
        pass
    raise ParameterError(
        "%s must contain the line 'tcp-close': requests in flight during a leave-running snapshot then stay with "
        "the running process and are closed in the restored one (the snapshot_node role and scripts/env/setup.sh "
        "set it). See docs/troubleshooting.md" % path, runc_criu_config=path)


def runc_checkpoint(module, container_id, image_dir, leave_running, seconds, runc="runc", root=DOCKER_RUNC_ROOT):
    """The fast path: runc (CRIU) checkpoint of a Docker container straight into ``image_dir``."""
    work = tempfile.mkdtemp(prefix="inferops-dump-")
    argv = [runc, "--root", root, "checkpoint", "--image-path", image_dir, "--work-path", work]
    if leave_running:
        argv.append("--leave-running")
    argv.append(container_id)
    try:
        run_timed(module, argv, seconds, "runc checkpoint of container %s" % container_id[:12])
    except (CommandError, SnapshotTimeout) as exc:
        exc.result["criu_log_tail"] = _tail(os.path.join(work, "dump.log"))
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def docker_checkpoint(module, docker, container, image_dir, leave_running, seconds):
    """Docker's own path (`docker checkpoint create`), slower: it round-trips containerd's content store."""
    parent = os.path.dirname(image_dir)
    name = os.path.basename(image_dir)
    argv = [docker.executable, "checkpoint", "create", "--checkpoint-dir", parent]
    if leave_running:
        argv.append("--leave-running")
    argv += [container, name]
    run_timed(module, argv, seconds, "docker checkpoint create of %s" % container)


def criu_dump(module, criu, pid, image_dir, leave_running, seconds):
    """Checkpoint a bare process tree (no container) with CRIU."""
    work = tempfile.mkdtemp(prefix="inferops-dump-")
    argv = [criu, "dump", "--tree", str(pid), "--images-dir", image_dir, "--work-dir", work,
            "--log-file", "dump.log", "-v4", "--tcp-close", "--ext-unix-sk", "--file-locks"]
    if leave_running:
        argv.append("--leave-running")
    try:
        run_timed(module, argv, seconds, "criu dump of pid %d" % pid)
    except (CommandError, SnapshotTimeout) as exc:
        exc.result["criu_log_tail"] = _tail(os.path.join(work, "dump.log"))
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def place_checkpoint(snapshot_dir, container_id, name, docker_root=DOCKER_ROOT):
    """Put the verified CRIU images where `docker start --checkpoint NAME` looks for them.

    Hard links when the snapshot and Docker's root share a filesystem (no copy of multi-GB
    images), a copy otherwise. Docker deletes that directory with the container; the snapshot's
    own files are untouched because CRIU only reads images.
    """
    source = images_dir(snapshot_dir)
    target = os.path.join(docker_root, "containers", container_id, "checkpoints", name)
    if os.path.lexists(target):
        shutil.rmtree(target)
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    try:
        shutil.copytree(source, target, copy_function=os.link)
        return target, "hardlink"
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    return target, "copy"

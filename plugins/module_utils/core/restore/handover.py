# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``snapshot_restore method=runtime``: hand the restore to the node's restore-on-create runtime. PRIVATE.

The module creates the container with ``--runtime <name>`` and ``INFEROPS_RESTORE_FROM`` and starts
it; the runtime runs the restore pipeline (with its own verification: every file is hashed right
before it is used, so the module checks everything but the content) inside that start. What it did
is read back from the snapshot's status record, or from the metadata file it wrote.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shlex

from .. import container as container_record
from .. import layout, metadata, status
from ..clients.docker import env_dict
from ..errors import ParameterError


def runtime_settings(registered):
    """The node settings (runtime.json) of a restore-on-create runtime, from what dockerd knows of it ({"path"}):
    its wrapper (the snapshot_node role's template) names the directory they live in on its ``LIB=`` line.
    None when they cannot be read."""
    try:
        with open(registered["path"]) as handle:
            for line in handle:
                if line.startswith("LIB="):
                    lib = shlex.split(line[len("LIB="):])[0]
                    with open(os.path.join(lib, "runtime.json")) as settings:
                        found = json.load(settings)
                    return found if isinstance(found, dict) else None
    except (IOError, OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return None


def covers(settings, snapshot_dir):
    """Whether ``snapshot_dir`` lies below one of the runtime's snapshot roots (it restores nothing elsewhere)."""
    roots = settings.get("snapshot_roots") or []
    roots = [roots] if isinstance(roots, str) else roots
    target = os.path.normpath(snapshot_dir)
    return any(target.startswith(os.path.normpath(root).rstrip("/") + "/") for root in roots if isinstance(root, str))


class RuntimeHandover:
    def __init__(self, docker, container, env, runtime_name, metadata_path, device_restore):
        self.docker = docker
        self.container = container
        self.env = dict(env or {})
        self.runtime_name = runtime_name
        self.metadata_path = metadata_path
        self.device_restore = device_restore
        self.container_id = docker.container_id(container)
        self.created = False

    def require_runtime(self):
        known = self.docker.runtimes()
        if self.runtime_name not in known:
            raise ParameterError(
                "runtime_name: dockerd has no runtime %r (it knows %s); install it on this node with the "
                "inferops.snapshot.snapshot_node role, or use method=docker"
                % (self.runtime_name, ", ".join(sorted(known)) or "none"), runtimes=sorted(known))

    def ensure_container(self, snapshot_dir, record=None):
        """The container, created with the restore-on-create runtime and the snapshot it restores from
        (``record``: its container record, as read -- and decrypted -- by the caller)."""
        if self.container_id:
            info = self.docker.inspect_container(self.container_id)
            env = env_dict((info.get("Config") or {}).get("Env"))
            if (info.get("HostConfig") or {}).get("Runtime") != self.runtime_name or \
                    env.get(layout.ENV_RESTORE_FROM) != snapshot_dir:
                raise ParameterError(
                    "container: %r exists but was not created with --runtime %s and %s=%s, so the runtime would "
                    "not restore it; remove it and let this module create it, or use method=docker"
                    % (self.container, self.runtime_name, layout.ENV_RESTORE_FROM, snapshot_dir))
            return
        record = record or container_record.read_container_record(snapshot_dir)
        record = dict(record, host_config=dict(record["host_config"], Runtime=self.runtime_name))
        env = dict(self.env)
        env[layout.ENV_RESTORE_FROM] = snapshot_dir
        if not self.device_restore:
            env["INFEROPS_RESTORE_DEVICE"] = "false"
        self.docker.create(container_record.create_args(record, self.container, env), env=self.env)
        self.container_id = self.docker.container_id(self.container)
        self.created = True

    def start(self, snapshot_dir, timeout):
        """`docker start`; the runtime restores (or starts cold) inside it. Returns what it recorded."""
        before = (status.read(snapshot_dir) or {}).get("last_restore")
        self.docker.start(self.container_id, timeout, what="docker start with the restore-on-create runtime")
        last = (status.read(snapshot_dir) or {}).get("last_restore")
        if last and last != before and last.get("container") == self.container_id:
            return last
        # No status record (the runtime refused the path, or could not write it): ask the metadata file.
        doc = metadata.read_in_process(self.docker.running_pid(self.container_id), self.metadata_path)
        if doc and doc.get("container_id") == self.container_id:
            return {"container": self.container_id, "outcome": "restored" if doc.get("restored") else "cold",
                    "reason": doc.get("reason"), "source": "metadata file"}
        return {"container": self.container_id, "outcome": "unknown",
                "reason": "runtime %r recorded nothing for this container; is it the inferops restore-on-create "
                          "runtime?" % self.runtime_name}

    def env_keys(self):
        info = self.docker.inspect_container(self.container_id)
        return sorted(env_dict((info.get("Config") or {}).get("Env")))

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restore driver: ``snapshot_restore method=runtime`` hands the restore to the node's restore-on-create runtime.
PRIVATE to the inferops.snapshot collection.

The pipeline's verification here hashes what this side acts on -- the manifest and the container record, from
which the container is created -- and takes the CRIU images as listed: the runtime hashes them right before it
restores (no file is read twice). The container is created from the verified bytes of the record with
``--runtime <name>``, the restore request and ``INFEROPS_RESTORE_STRICT`` (the runtime refuses the create, rather
than starting it cold, when the snapshot does not verify there: nothing built from a record that may be forged
ever runs), and ``docker start`` makes the runtime run this same pipeline with the on-create driver. Its outcome,
which the runtime writes (status record), is what this driver reports; it writes one itself only when the
runtime was never reached.

A snapshot that does not verify here: a container the operator made is started (the runtime decides, and starts
it cold); one that does not exist is created from the record only when the record is intact and merely stale
(verify.record_usable), without the request, and started cold; otherwise nothing is created and the task fails.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shlex

from ..base import layout
from ..base.errors import CommandError, ParameterError, SnapshotError
from ..clients.docker_cli import env_dict
from ..linux import fs
from ..store import manifest, metadata, status
from . import verify
from .attempt import Fallback
from .docker_container import DockerContainer
from .stages import HANDOVER


def runtime_settings(registered):
    """The node settings (runtime.json) of a restore-on-create runtime, from what dockerd knows of it ({"path"}):
    its wrapper (the snapshot_node role's template) names the directory they live in on its ``LIB=`` line.
    None when they cannot be read."""
    try:
        with open(registered["path"]) as handle:
            for line in handle:
                if line.startswith("LIB="):
                    lib = shlex.split(line[len("LIB="):])[0]
                    return fs.read_json(os.path.join(lib, "runtime.json"))
    except (IOError, OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return None


def covers(settings, snapshot_dir):
    """Whether ``snapshot_dir`` lies below one of the runtime's snapshot roots (it restores nothing elsewhere)."""
    roots = settings.get("snapshot_roots") or []
    roots = [roots] if isinstance(roots, str) else roots
    target = os.path.normpath(snapshot_dir)
    return any(target.startswith(os.path.normpath(root).rstrip("/") + "/") for root in roots if isinstance(root, str))


class Handover(DockerContainer):
    path = "runtime"
    engine = "docker"
    # host_restore hands the snapshot to another run of this pipeline (the node's runtime), which hashes the images,
    # decrypts, checks the devices, restores and resumes: this run hashes what it acts on itself, the documents, and
    # reads no image (the runtime reads the snapshot itself, from its own cache when it has one).
    stages = HANDOVER
    verification = manifest.DOCUMENTS_ONLY
    images_from = ()

    def __init__(self, docker, container, runtime_name, device_restore=True, source=None, **wishes):
        super(Handover, self).__init__(docker, container, **wishes)
        self.runtime_name = runtime_name
        self.device_restore = device_restore
        self.source = source
        self.existed = bool(self.container_id)
        self.started = False            # docker start ran: the runtime decided what happened
        self.runtime_record = None      # what the runtime recorded of it

    # -- what is checked before the pipeline runs (the request, not the snapshot) -----------------------
    def require(self, snapshot_dir):
        """The runtime is registered, and a container that exists was made to be restored by it."""
        known = self.docker.runtimes()
        if self.runtime_name not in known:
            raise ParameterError(
                "runtime_name: dockerd has no runtime %r (it knows %s); install it on this node with the "
                "inferops.snapshot.snapshot_node role, or use method=docker"
                % (self.runtime_name, ", ".join(sorted(known)) or "none"), runtimes=sorted(known))
        if self.container_id:
            info = self.docker.inspect_container(self.container_id)
            env = env_dict((info.get("Config") or {}).get("Env"))
            if (info.get("HostConfig") or {}).get("Runtime") != self.runtime_name or \
                    env.get(layout.ENV_RESTORE_FROM) != snapshot_dir:
                raise ParameterError(
                    "container: %r exists but was not created with --runtime %s and %s=%s, so the runtime would "
                    "not restore it; remove it and let this module create it, or use method=docker"
                    % (self.container, self.runtime_name, layout.ENV_RESTORE_FROM, snapshot_dir), field="container")

    # -- the pipeline's steps -------------------------------------------------------------------------
    def expectations(self, attempt):
        return verify.expectations(self.identity, self.image_id(attempt), self.criu_version, self.runtime_version,
                                   source=self.source)

    def prepare(self, attempt):
        if self.container_id:
            return
        env = dict(self.env)
        env[layout.ENV_RESTORE_FROM] = attempt.snapshot_dir
        env[layout.ENV_RESTORE_IDENTITY] = layout.identity_string(self.identity)  # what the runtime must find signed
        env[layout.ENV_RESTORE_STRICT] = "true"
        if not self.device_restore:
            env[layout.ENV_RESTORE_DEVICE] = "false"
        self.create(attempt, env, runtime=self.runtime_name)

    def host_restore(self, attempt):
        """`docker start`: the runtime restores (or starts cold, or refuses) inside it; returns the restored pid."""
        before = (status.read(attempt.snapshot_dir) or {}).get("last_restore")
        self.started = True
        try:
            self.docker.start(self.container_id, attempt.remaining(1.0),
                              what="docker start with the restore-on-create runtime")
        except CommandError:
            self.runtime_record = self.runtime_outcome(attempt, before)
            attempt.details["runtime_record"] = self.runtime_record
            if self.runtime_record.get("outcome") == "failed":  # the runtime refused it, and said why
                raise Fallback("refused by the restore-on-create runtime: %s" % self.runtime_record.get("reason"))
            raise
        self.runtime_record = self.runtime_outcome(attempt, before)
        attempt.details.update(runtime_record=self.runtime_record, placement="runtime",
                               metadata_env_keys=self.env_keys())
        if self.runtime_record.get("outcome") != "restored":
            raise Fallback("the restore-on-create runtime started the container cold: %s"
                           % self.runtime_record.get("reason"))
        return self.docker.running_pid(self.container_id)

    def undo(self, attempt):
        """Nothing: the runtime undid its own restore, and a container it started cold serves."""

    def cold_start(self, attempt):
        if self.started:
            if self.docker.is_running(self.container_id):
                return  # the runtime started it cold, with its reason
            if self.created:  # refused by the runtime: the container was made from the record, nothing of it runs
                self.docker.remove(self.container_id)
                self.container_id, self.created = None, False
            raise SnapshotError("%s; the container made from the snapshot's record was removed, nothing of it ran"
                                % attempt.reason, restored=False, reason=attempt.reason, verify=attempt.verdict,
                                runtime_record=self.runtime_record)
        if self.create_to_start_cold(attempt):  # without the request: the runtime hands it to runc as it is
            self.write_metadata(attempt, restored=False)
        self.start_cold(attempt)

    def commit(self, attempt):
        """The runtime's own record stands when it wrote one; this side writes only what the runtime never saw."""
        if not (self.runtime_record and self.runtime_record.get("source") == "status record"):
            super(Handover, self).commit(attempt)

    # -- this path's own steps ----------------------------------------------------------------------
    def runtime_outcome(self, attempt, before):
        """What the runtime recorded of this start: the snapshot's status record, else the metadata file."""
        last = (status.read(attempt.snapshot_dir) or {}).get("last_restore")
        if last and last != before and last.get("container") == self.container_id:
            return dict(last, source="status record")
        doc = metadata.read_in_process(self.docker.running_pid(self.container_id), self.metadata_path) \
            if self.docker.is_running(self.container_id) else None
        if doc and doc.get("container_id") == self.container_id:
            return {"container": self.container_id, "outcome": "restored" if doc.get("restored") else "cold",
                    "reason": doc.get("reason"), "source": "metadata file"}
        return {"container": self.container_id, "outcome": "unknown",
                "reason": "runtime %r recorded nothing for this container; is it the inferops restore-on-create "
                          "runtime?" % self.runtime_name}

    def env_keys(self):
        info = self.docker.inspect_container(self.container_id)
        return sorted(env_dict((info.get("Config") or {}).get("Env")))

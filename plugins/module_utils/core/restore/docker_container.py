# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the two drivers of a container dockerd runs share -- ``docker start --checkpoint`` (checkpoint.py) and the
hand-over to the node's runtime (handover.py): the container asked for, or one created from the snapshot's verified
container record; its image; its metadata file; and its cold start. PRIVATE to the inferops.snapshot collection.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil
import tempfile

from ..base import layout
from ..base.errors import ParameterError
from ..clients.docker_cli import env_dict
from ..clients.runc_cli import RuncCli
from ..linux import fs
from ..store import container_record, metadata, world
from . import verify
from .attempt import Fallback
from .driver import Driver


class DockerContainer(Driver):
    """A driver of the container ``container`` (a name): the one that exists (``container_id``), else one this driver
    creates from the snapshot's container record (``created``)."""

    def __init__(self, docker, container, **wishes):
        super(DockerContainer, self).__init__(**wishes)
        self.docker = docker
        self.container = container
        self.container_id = docker.container_id(container)
        self.created = False

    def image_id(self, attempt):
        return self.docker.inspect_container(self.container_id)["Image"] if self.container_id else None

    def world_now(self, recorded):
        return docker_world_now(self.docker, self.container_id, recorded)

    def check(self, attempt):
        """A container to be created from the record needs the record's image on this host."""
        if not self.container_id:
            recorded = self.record(attempt)["image_id"]
            wrong = verify.image_reason(recorded, present=self.docker.has_image(recorded))
            if wrong:
                raise Fallback(wrong)

    def record_fields(self, attempt):
        return {"container": self.container_id, "name": self.container}

    def record(self, attempt):
        return container_record.parse_container_record(attempt.document(layout.CONTAINER_RECORD))

    def create(self, attempt, env, runtime=None):
        """The container, created from the verified record with ``env`` (and ``runtime``: dockerd's runtime)."""
        record = self.record(attempt)
        if runtime:
            record = dict(record, host_config=dict(record["host_config"], Runtime=runtime))
        self.docker.create(container_record.create_args(record, self.container, env), env=env)
        self.container_id = self.docker.container_id(self.container)
        self.created = True

    def create_to_start_cold(self, attempt):
        """A container that does not exist is created from its record -- only one the verification vouches for -- to
        start cold; returns whether it was."""
        if self.container_id:
            return False
        recreate_or_refuse(self.container, attempt)
        self.create(attempt, dict(self.env))
        return True

    def refuses_cold_start(self, attempt):
        if not self.container_id:
            recreate_or_refuse(self.container, attempt)

    def write_metadata(self, attempt, restored):
        write_metadata(self.docker, self.container_id, self.metadata_path, self.env, attempt, restored)

    def start_cold(self, attempt):
        self.docker.start(self.container_id, attempt.remaining(30.0), what="docker start (cold)")


def recreate_or_refuse(container, attempt):
    """A container that does not exist is recreated to start cold only from a record the verification vouches for
    (verify.record_usable: intact, authentic where keys are configured, merely stale): a pod is never left down
    because its snapshot went stale, and nothing of a snapshot that may be forged is ever run."""
    if attempt.verdict is not None and (attempt.verdict["valid"] or verify.record_usable(attempt.verdict,
                                                                                         attempt.documents)):
        return
    raise ParameterError(
        "container: %r does not exist and there is no valid snapshot to recreate it from (%s); create it first (for "
        "example with community.docker.docker_container state=present)" % (container, attempt.reason),
        restored=False, reason=attempt.reason, verify=attempt.verdict)


def docker_world_now(docker, container_id, recorded):
    """The recreated container as it is; one created from the snapshot's record is the recorded one."""
    if container_id:
        process = world.docker_facts(docker.inspect_container(container_id))
    else:
        process = ((recorded or {}).get("world") or {}).get("process")
    return process, RuncCli().version()


def write_metadata(docker, container_id, metadata_path, env, attempt, restored):
    """The new environment, where the engine reads it: `docker cp` into the created (not started) container."""
    info = docker.inspect_container(container_id)
    merged = env_dict((info.get("Config") or {}).get("Env"))
    merged.update(env)
    doc = metadata.document(merged, restored, attempt.snapshot_dir, "snapshot_restore", attempt.reason,
                            engine="docker", container=(info.get("Name") or "").lstrip("/") or container_id,
                            container_id=container_id, restore_nonce=attempt.restore_nonce if restored else None)
    inner_dir, name = os.path.split(metadata_path)
    scratch = tempfile.mkdtemp(prefix="inferops-meta-")
    try:
        staged = os.path.join(scratch, os.path.basename(inner_dir) or "metadata")
        os.mkdir(staged, 0o700)
        fs.write_file_atomic(os.path.join(staged, name), metadata.encode(doc))
        docker.copy_into(container_id, staged, os.path.dirname(inner_dir) or "/")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    attempt.details["metadata_env_keys"] = metadata.env_keys(doc)

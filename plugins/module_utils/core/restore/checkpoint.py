# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restore driver: a Docker container through ``docker start --checkpoint``. PRIVATE to inferops.snapshot.

The container is the recreated one (created, not started) or, when there is none, one created from
the snapshot's container record. Docker restores only from ``<data root>/containers/<id>/checkpoints``
(moby#37344), so the verified images are put there -- copied from the private copy the verification made as
it read them (docker start resumes the tasks before anything could ask whether the store was written meanwhile).
Slower than the node runtime for big states (containerd uploads the checkpoint into its content store,
docs/benchmarks.md), but needs nothing installed on the node.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil

from ..base import layout
from ..base.errors import CommandError
from ..linux import fs
from ..store import device, manifest
from . import interrupted
from .attempt import Fallback
from .containerd_leak import LeakGuard
from .docker_container import DockerContainer
from .stages import COPY, RESTORE

CHECKPOINT_NAME = "inferops-restore"


def place_checkpoint(images_dir, container_id, name, docker_root, held=None):
    """Put the verified CRIU images where `docker start --checkpoint NAME` looks for them.

    Hard links when the snapshot and Docker's root share a filesystem and mount (no copy of multi-GB images), a
    copy otherwise. With ``held`` (held.Held: the descriptors the verification read), the very inodes verified
    are linked, or copied through those descriptors. Docker deletes that directory with the container; the
    snapshot's own files are untouched because CRIU only reads images.
    """
    source = images_dir
    target = os.path.join(docker_root, "containers", container_id, "checkpoints", name)
    if os.path.lexists(target):
        shutil.rmtree(target)
    fs.make_dir_if_missing(os.path.dirname(target))
    if held is not None:
        os.mkdir(target, 0o700)
        return target, held.place(layout.IMAGES_DIR, target)
    try:
        shutil.copytree(source, target, copy_function=os.link)
        return target, "hardlink"
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    return target, "copy"


class DockerCheckpoint(DockerContainer):
    path = "docker"
    engine = "docker"
    stages = RESTORE
    verification = manifest.FULL  # docker start cannot leave the tasks stopped: nothing is hashed after it
    # nor asked after it: a lease only holds a writer off for a while, so the images docker reads are a private copy
    # (not the cache: place_checkpoint copies or links from what the verification held)
    images_from = (COPY,)
    copy_because = ("docker start --checkpoint resumes the restored tasks itself: nothing can check between CRIU's "
                    "read and their run that the store was left alone")

    def __init__(self, docker, container, cold_because=None, **wishes):
        super(DockerCheckpoint, self).__init__(docker, container, **wishes)
        self.cold_because = cold_because  # method=auto found this path slower than a cold start: start cold
        if cold_because:  # it starts cold: only what a cold start may use (the container record) is hashed
            self.verification = manifest.DOCUMENTS_ONLY
        self.docker_root = None

    def check(self, attempt):
        if self.cold_because:
            raise Fallback(self.cold_because)
        if attempt.manifest.get("encryption"):
            raise Fallback("encrypted: docker start --checkpoint copies the images through containerd's content store "
                           "and a temporary directory in plaintext; restore encrypted snapshots with method=runtime")
        super(DockerCheckpoint, self).check(attempt)
        self.docker_root, experimental = self.docker.checkpoint_support()
        if not experimental:
            raise Fallback("docker_not_experimental: method=docker needs the Docker daemon in experimental mode for "
                           "docker start --checkpoint: set \"experimental\": true in /etc/docker/daemon.json and "
                           "restart dockerd, or use method=runtime")

    def prepare(self, attempt):
        if not self.container_id:
            self.create(attempt, self.env)
        self.write_metadata(attempt, restored=True)

    def host_restore(self, attempt):
        target, attempt.details["placement"] = place_checkpoint(attempt.images_dir, self.container_id,
                                                                CHECKPOINT_NAME, self.docker_root or layout.DOCKER_ROOT,
                                                                held=attempt.held)
        targets = self.device_targets(attempt)
        if targets:  # CRIU's NPU plugin reads this node's numbering of the devices beside the images (Docker's copy)
            fs.write_file_atomic(os.path.join(target, layout.NPU_DEVICES_FILE),
                                 device.targets_text(targets).encode("utf-8"))
        interrupted.started(self, attempt)  # before the engine comes back: a run killed after it leaves a record
        with LeakGuard(target):
            try:
                self.docker.start(self.container_id, attempt.remaining(1.0), checkpoint=CHECKPOINT_NAME,
                                  what="docker start --checkpoint")
            except CommandError as exc:
                # Seen after daemon restarts: containerd's content store already holds the upload. Once more.
                if "already exists" not in (exc.result.get("stderr") or ""):
                    raise
                self.docker.start(self.container_id, attempt.remaining(1.0), checkpoint=CHECKPOINT_NAME,
                                  what="docker start --checkpoint (retry)")
        fs.remove_tree(target)  # read by CRIU; Docker would keep it as long as the container exists
        return self.docker.running_pid(self.container_id)

    def undo(self, attempt):
        if self.container_id and self.docker.is_running(self.container_id):
            self.docker.stop(self.container_id)

    def cold_start(self, attempt):
        self.create_to_start_cold(attempt)
        self.write_metadata(attempt, restored=False)
        self.start_cold(attempt)

    def interrupted_run(self, snapshot_dir):
        """The ``restoring`` entry of an earlier run into this container (interrupted.find), or None."""
        if not self.container_id:
            return None
        return interrupted.find(snapshot_dir, self.path, lambda entry: entry.get("container") == self.container_id)

    def take_over(self, found, check_mode):
        """The container a run that is gone left (``found``): what its engine is now; stopped, so that this run
        restores it from the start. Returns (what was found, what is done)."""
        if not self.docker.is_running(self.container_id):
            state = self.docker.inspect_container(self.container_id).get("State") or {}
            return ({"container": "%s, exit code %s" % (state.get("Status"), state.get("ExitCode"))},
                    "restores the container from the start")
        engine = interrupted.engine_now(self.docker.running_pid(self.container_id), self.socket_dir)
        if check_mode:
            return engine, "would stop the container and restore it from the start"
        self.docker.stop(self.container_id)
        return engine, "stopped the container and restores it from the start"

    def device_targets(self, attempt):
        if self.container_id:
            return device.targets_from_docker(self.docker.inspect_container(self.container_id))
        return device.targets_from_docker({"HostConfig": self.record(attempt).get("host_config") or {}})

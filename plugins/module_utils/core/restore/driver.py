# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What differs between restore paths: the driver a path gives the pipeline. PRIVATE to the inferops.snapshot
collection.

Like containerd's shim, which keeps a restore a state of its own with its own ``Start`` and hands runc one typed set
of options, a driver declares what its path is -- ``stages``, ``verification``, ``images_from`` -- and supplies the
steps that differ (how to find the snapshot, what to expect of it, how to put the process back, how to start it cold,
where the outcome is written). Four drivers: ``docker start --checkpoint`` (checkpoint.py), the node's restore-on-create
runtime (on_create.py), a bare process (bare.py), and the hand-over of ``snapshot_restore method=runtime`` to that
runtime (handover.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..base import layout
from ..base.errors import SnapshotError
from ..linux import paths, proc
from ..store import device, manifest, status
from . import verify
from .stages import CACHE, HELD, RESTORE


class Driver:
    """What differs between restore paths. ``path`` names it in status records (docker, runtime, criu).

    The task's wishes common to the paths a module drives: the pod ``identity``, its new ``env``, where
    the engine reads its metadata file and listens for the agent, and the versions to expect.
    """

    path = None
    engine = "docker"
    # What a path does, declared: the stages it runs (stages.py), what its verification checks of each file
    # (manifest.Plan; DEFER only where host_restore honours attempt.leave_stopped and release() lets the tasks run),
    # and what its host_restore reads the images from (stages.CACHE: the node's verified copy, when there is one;
    # stages.HELD: the files as verified, held open and leased -- where the plan defers the page images, i.e. the
    # tasks wait for the check --; stages.COPY: a private copy made by the verifying read, for a path whose tasks may
    # run before the images are read to the end, ``copy_because`` saying why; none: this run restores no image itself).
    stages = RESTORE
    verification = manifest.FULL
    images_from = (CACHE, HELD)
    copy_because = None

    def __init__(self, identity=None, env=None, metadata_path=None, agent_socket_dir=None, criu_version="auto",
                 runtime_version=None):
        self.identity = identity
        self.env = dict(env or {})
        self.metadata_path = metadata_path
        self.socket_dir = agent_socket_dir
        self.criu_version = criu_version
        self.runtime_version = runtime_version

    def locate(self, attempt):
        """The validated snapshot directory of ``attempt.requested`` (raise Fallback when it may not be used)."""
        return paths.validate_snapshot_dir(attempt.requested)

    def image_id(self, attempt):
        """The image the restored process would run with (None: not checked)."""
        return None

    def expectations(self, attempt):
        """What the snapshot must match: identity, image_id, criu_version, runtime_version (None: unchecked)."""
        return verify.expectations(self.identity, self.image_id(attempt), self.criu_version, self.runtime_version)

    def world_now(self, recorded):
        """(process facts of what would run now, or None when the process keeps its own; this host's runc
        version): what the recorded world is compared with (world.py)."""
        return None, None

    def check(self, attempt):
        """Refuse before anything is touched when this host cannot succeed (raise Fallback)."""

    def prepare(self, attempt):
        """Everything before the process comes back (a container to restore into, its metadata file)."""

    def host_restore(self, attempt):
        """Bring the process back from the CRIU images; return its host pid."""
        raise NotImplementedError

    def release(self, attempt):
        """Let the tasks a leave-stopped host restore left stopped run (the whole snapshot is verified)."""
        proc.continue_tree(attempt.pid)

    def after_host_restore(self, attempt):
        """What needs the restored process but must come before its device state (its metadata file)."""

    def failure_cause(self, attempt):
        """What, of this path's own, explains a failure better than the stage that saw it (a lazy-pages daemon that
        died: the tasks then fault on its holes), or None."""
        return None

    def pages_in(self, attempt):
        """Return once all of the restored process's memory is in (a lazy restore copies it in after
        host_restore); raise Fallback when it will never be. Called before the engine is unlocked."""

    def device_resume(self, attempt):
        """The device state back through the restored process's agent; the versions it is checked against are the
        device part's verified bytes (a file read again after the verification could be anyone's)."""
        return device.resume_process(attempt.pid, self.agent_socket_dir(attempt), attempt.remaining(1.0),
                                     gone=lambda: not self.alive(attempt), before_unlock=lambda: self.pages_in(attempt),
                                     recorded=device.parse_device_part(attempt.document(layout.DEVICE_PART)))

    def device_targets(self, attempt):
        """{path in the restored process: (type, major, minor)} of the NPU device nodes its new container has
        (device.targets_from_oci/_docker), or None: the nodes at those paths on this host (a bare process)."""
        return None

    def agent_socket_dir(self, attempt):
        return self.socket_dir

    def alive(self, attempt):
        return proc.alive(attempt.pid)

    def undo(self, attempt):
        """Remove a half-restored process: it holds the pids, ports and device a cold start needs."""

    def cold_start(self, attempt):
        """Start the engine normally (the reason is in ``attempt.reason``)."""
        raise NotImplementedError

    def refuses_cold_start(self, attempt):
        """Check mode: raise what ``cold_start`` would raise before it starts anything, so that a dry run fails where
        the run will (a container that cannot be recreated); nothing to refuse by default."""

    def complete(self, attempt):
        """The last step of a restore, after the canary: what makes it stick (the node runtime's marker that the
        next ``start`` is done). Raising here is a cold start like any other failure."""

    def record_fields(self, attempt):
        """Fields of this path for the status record's restore entry (container, name, policy)."""
        return {}

    def commit(self, attempt):
        """Write the outcome -- restored, cold with the reason, or failed -- once, after everything else; nothing
        else writes it. The default: the attempt in the snapshot's status record (informative: a failure to write
        it is not one of the restore)."""
        record_attempt(self, attempt)


def record_attempt(driver, attempt):
    """The attempt in the snapshot's status record; informative, so a failure to write it is not one of the restore."""
    if not attempt.snapshot_dir or not os.path.isdir(os.path.dirname(attempt.snapshot_dir.rstrip("/"))):
        return
    fields = dict(driver.record_fields(attempt))
    outcome = attempt.outcome
    entry = status.restore_entry(driver.path, outcome, attempt.reason,
                                 pid=attempt.pid, pid_start_time=attempt.pid_start_time,
                                 device_actions=attempt.device_actions, durations=attempt.watch.durations,
                                 runner=attempt.details.get("runner"), **fields)  # over its restoring entry
    try:
        status.update(attempt.snapshot_dir, restore=entry)
        attempt.details["record"] = entry
    except (IOError, OSError, SnapshotError) as exc:
        attempt.details["record_error"] = str(getattr(exc, "msg", exc))

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one ``host_checkpoint`` task does. PRIVATE to the inferops.snapshot collection.

The module hands its parameters here: refuse what cannot work before anything is written, keep or replace what is
already published (``if_exists``), and run the Checkpointer -- or, under the controller's signing, its publish or abort
phase."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..base.clock import check_seconds
from ..base.errors import ParameterError
from ..store import manifest, status
from .checkpointer import ABORT, PUBLISH, Checkpointer


def host_checkpoint(params, check_mode=False, log=None):
    """The result of a host_checkpoint task."""
    check_seconds(params, "timeout", "generation_lease")
    if params.get("signing_key"):
        raise ParameterError("signing_key: is read on the controller by host_checkpoint's action plugin, which signs "
                             "there, and is never sent to the node; this run reached the module without it (run the "
                             "module as inferops.snapshot.host_checkpoint in a task)", field="signing_key")
    signing = params.get("controller_signing") or {}
    if signing.get("phase") in (PUBLISH, ABORT):
        if not params.get("generation_id"):
            raise ParameterError("generation_id: the %s phase of controller_signing needs the seal phase's generation_id"
                                 % signing["phase"], field="generation_id")
        job = Checkpointer(params, log)
        return job.publish_signed() if signing["phase"] == PUBLISH else job.abort_signing()
    check_seconds(params, "max_age")
    job = Checkpointer(params, log)
    result = dict(snapshot_dir=job.snapshot_dir, durations=job.watch.durations)
    published = os.path.lexists(job.snapshot_dir)
    if published and params["if_exists"] == "fail" and not params.get("force"):
        raise ParameterError("snapshot_dir: a snapshot is already published at %s (if_exists=fail); use "
                             "if_exists=replace to take a new one" % job.snapshot_dir, **result)
    if published and params["if_exists"] == "keep" and not params.get("force"):
        stale = stale_reasons(job)
        if not stale:
            record = status.read(job.snapshot_dir) or {}
            return dict(result, changed=False, status=record.get("status", "completed"),
                        checksum=record.get("checksum"), replaced_because=[],
                        msg="a snapshot of this world is already published at %s; kept (if_exists=keep)"
                            % job.snapshot_dir)
        result["replaced_because"] = stale  # a snapshot of another world: a restore would refuse it anyway
    elif published:
        result["replaced_because"] = ["force" if params.get("force") else "if_exists=replace"]
    with job.watch.timed("preflight"):
        job.preflight()
    if check_mode:
        if params.get("device_backup"):
            job.back_up_device(result, check_mode=True)
        return dict(result, changed=True, status="completed", versions=job.versions)
    return dict(job.run(), **result)


def stale_reasons(job):
    """Why the published snapshot does not belong to the process as it runs now ([] when it does)."""
    try:
        recorded = manifest.load_manifest(job.snapshot_dir)
    except (IOError, OSError, ValueError) as exc:
        return ["unreadable: %s: %s" % (manifest.MANIFEST, exc)]
    return job.driver.stale(recorded)

#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: host_checkpoint
short_description: Take the host (CRIU) snapshot of an inference container or process and publish the snapshot
version_added: 0.1.0
description:
  - Checkpoints the processes of a Docker container (O(engine=docker)) or of a bare process tree
    (O(engine=criu)) with CRIU into the snapshot's staging directory, next to the device part that
    M(inferops.snapshot.npu_snapshot_backup) recorded there, then writes C(manifest.json) (valid against
    the collection's manifest schema) and C(checksum.sha256) (C(sha256sum -c) compatible) and publishes
    the whole snapshot at O(snapshot_dir) with one atomic rename.
  - When the checkpoint, sealing or publishing fails or runs past O(timeout), everything it wrote (the
    staging directory, device part included) is removed, and the status beside the snapshot
    (C(.<name>.status.json)) says C(failed) with the reason. On success the status is C(completed) with
    the checksum. A failed preflight check (bad parameters, CRIU or Docker unusable, no device part)
    changes nothing on disk.
  - The process must be BACKED_UP (device memory copied into host memory) so that the checkpoint
    carries the device state; a leave-running checkpoint leaves it BACKED_UP, resume it with
    M(inferops.snapshot.npu_snapshot_lock) C(state=unlocked).
requirements:
  - jsonschema (Python library) on the target host
  - CRIU >= 4.2 on PATH, C(criu check) passing; root
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.identity.REQUIRED
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
    details: With O(if_exists=keep) an existing snapshot is left alone and the task reports no change.
options:
  engine:
    description: C(docker) checkpoints a container; C(criu) a bare process tree.
    type: str
    choices: [docker, criu]
    default: docker
  container:
    description: Name or id of the running container (O(engine=docker)).
    type: str
  pid:
    description: Host pid of the root of the process tree (O(engine=criu)).
    type: int
  snapshot_dir:
    description:
      - Absolute path of this pod's snapshot, unique per pod identity. Same rules as in
        M(inferops.snapshot.npu_snapshot_backup).
    type: path
    required: true
  leave_running:
    description: Keep the process running after the checkpoint (it stays BACKED_UP until resumed).
    type: bool
    default: true
  timeout:
    description: Seconds the whole generation may take; past it the checkpoint is stopped and cleaned up.
    type: float
    default: 300
  if_exists:
    description:
      - What to do when a snapshot is already published at O(snapshot_dir).
      - C(keep) leaves it and reports no change; C(replace) publishes the new one in its place (the old one
        is removed only after the new one is in place); C(fail) fails the task.
    type: str
    choices: [keep, replace, fail]
    default: keep
  method:
    description:
      - For O(engine=docker), how the checkpoint is taken. C(runc) calls runc (CRIU) directly on the
        container, the fast path; C(docker) uses C(docker checkpoint create), which needs an experimental
        daemon and round-trips containerd's content store.
    type: str
    choices: [runc, docker]
    default: runc
  require_device_part:
    description:
      - Require the device part recorded by M(inferops.snapshot.npu_snapshot_backup) and the process in
        state BACKED_UP (checked through its control endpoint). Set false for processes without an NPU.
    type: bool
    default: true
  agent_socket_dir:
    description: Where the target's agent keeps its socket (see M(inferops.snapshot.npu_snapshot_lock)).
    type: path
    default: /run/inferops-snapshot
  runc_root:
    description: State directory of the runc instance Docker uses.
    type: path
    default: /var/run/docker/runtime-runc/moby
  docker_cli:
    description: Docker CLI executable.
    type: str
    default: docker
  workers:
    description: Files and chunks hashed in parallel while sealing. Default is the number of CPUs.
    type: int
  hash_during_checkpoint:
    description:
      - Hash the big image files while CRIU writes them, reading them from the page cache while they are
        still there, so that sealing does not read them a second time. V(false) hashes everything after
        the checkpoint.
    type: bool
    default: true
notes:
  - Environment values of the container are stored (0600) in C(host/container.json) to recreate it; they
    are never returned or logged.
seealso:
  - module: inferops.snapshot.npu_snapshot_backup
  - module: inferops.snapshot.snapshot_verify
  - module: inferops.snapshot.snapshot_restore
"""

EXAMPLES = r"""
- name: Host snapshot of the warmed-up engine, published with manifest and checksums
  inferops.snapshot.host_checkpoint:
    container: vllm-0
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}
    timeout: 300
  register: host_snapshot
"""

RETURN = r"""
snapshot_dir:
  description: Where the snapshot was published.
  returned: always
  type: str
  sample: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
status:
  description: Status recorded beside the snapshot (C(completed), or C(failed) when a started generation failed).
  returned: when a generation ran, or a snapshot was kept
  type: str
  sample: completed
checksum:
  description: SHA-256 of C(checksum.sha256), a fingerprint of the whole snapshot.
  returned: success
  type: str
  sample: 5f2b...e1
total_bytes:
  description: Bytes in the snapshot's files (manifest and checksum file excluded).
  returned: success
  type: int
  sample: 120586240
files:
  description: Number of files in the snapshot.
  returned: success
  type: int
  sample: 31
versions:
  description: Versions of the pieces involved (docker, criu, runc, acl runtime).
  returned: success
  type: dict
  sample: {docker: 20.10.24, criu: 4.2.1, runc: 1.1.5, runtime: 9.1.0}
manifest_path:
  description: Path of the published manifest.
  returned: success
  type: str
  sample: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0/manifest.json
progress:
  description: Progress lines (stage, bytes hashed, elapsed time); shown at -v.
  returned: when a generation ran
  type: list
  elements: str
durations:
  description: Seconds per stage (C(preflight), C(checkpoint), C(seal), C(publish)) and C(total).
  returned: always
  type: dict
  sample: {checkpoint: 0.29, seal: 0.1, total: 0.6}
hashing:
  description:
    - Hashing statistics of the seal (bytes, seconds, workers, throughput_mb_s), and how many files and bytes
      were already hashed during the checkpoint (followed_files, followed_bytes).
  returned: success
  type: dict
criu_log_tail:
  description: The end of CRIU's log when the checkpoint failed.
  returned: failure
  type: str
"""

import os
import re
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.inferops.snapshot.plugins.module_utils import _control as control
from ansible_collections.inferops.snapshot.plugins.module_utils import _device as device
from ansible_collections.inferops.snapshot.plugins.module_utils import _host as host
from ansible_collections.inferops.snapshot.plugins.module_utils import _manifest as manifest_utils
from ansible_collections.inferops.snapshot.plugins.module_utils import _paths as paths
from ansible_collections.inferops.snapshot.plugins.module_utils import _protocol as protocol
from ansible_collections.inferops.snapshot.plugins.module_utils import _schema as schema
from ansible_collections.inferops.snapshot.plugins.module_utils import _snapshot as snapshot
from ansible_collections.inferops.snapshot.plugins.module_utils._common import IDENTITY_OPTIONS, Progress, Stopwatch, run_module
from ansible_collections.inferops.snapshot.plugins.module_utils._criu import CriuCli
from ansible_collections.inferops.snapshot.plugins.module_utils._docker import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import (
    ParameterError,
    RuntimeRefusedError,
    SnapshotError,
    SnapshotTimeout,
)


def runc_version(module):
    rc, out, err = module.run_command(["runc", "--version"])
    match = re.search(r"runc version (\S+)", out)
    return match.group(1) if rc == 0 and match else None


class Checkpointer:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.watch = Stopwatch()
        self.started = time.monotonic()
        self.snapshot_dir = paths.validate_snapshot_dir(self.params["snapshot_dir"])
        self.staging_dir = paths.staging_dir_for(self.snapshot_dir)
        paths.validate_snapshot_dir(self.staging_dir, field="snapshot_dir (staging sibling)")
        self.identity = device.check_identity(self.params["identity"], self.snapshot_dir)
        self.versions = {}
        self.info = None
        self.pid = None
        self.follower = None

    def remaining(self, stage):
        left = self.params["timeout"] - (time.monotonic() - self.started)
        if left <= 0:
            raise SnapshotTimeout("generation ran past its timeout of %.0f s before %s" % (self.params["timeout"], stage))
        return left

    def preflight(self):
        params = self.params
        self.versions["criu"] = CriuCli(self.module).require()
        if params["engine"] == "docker":
            if not params["container"]:
                raise ParameterError("container: required with engine=docker")
            docker = self.docker = DockerCli(self.module, params["docker_cli"])
            self.versions["docker"], experimental = docker.server_info()
            if params["method"] == "docker" and not experimental:
                raise ParameterError("method=docker needs the Docker daemon in experimental mode: set "
                                     "\"experimental\": true in /etc/docker/daemon.json and restart dockerd, "
                                     "or use method=runc")
            if params["method"] == "runc":
                host.check_runc_criu_conf()
            self.info = docker.inspect_container(params["container"])
            self.pid = docker.running_pid(params["container"])
            self.versions["runc"] = runc_version(self.module)
        else:
            if not params["pid"]:
                raise ParameterError("pid: required with engine=criu")
            self.pid = params["pid"]
            if not os.path.exists("/proc/%d" % self.pid):
                raise ParameterError("pid: process %d does not exist" % self.pid)
        self.device_part = device.read_device_part(self.staging_dir)
        if params["require_device_part"]:
            self._check_device_part()
        self.versions["runtime"] = (self.device_part or {}).get("runtime", {}).get("version")

    def _check_device_part(self):
        if self.device_part is None:
            raise RuntimeRefusedError(
                "no device part at %s: back up the NPU state first with inferops.snapshot.npu_snapshot_backup "
                "(same snapshot_dir), or set require_device_part=false for a process without an NPU"
                % device.device_part_path(self.staging_dir))
        client = control.AgentSocketClient(control.agent_socket_for_pid(self.pid, self.params["agent_socket_dir"]))
        reply = client.request(protocol.OP_STATE, 30)
        if reply["state"] != protocol.STATE_BACKED_UP:
            raise RuntimeRefusedError(
                "the process is %s, not BACKED_UP: its device memory would not be in the checkpoint. Run "
                "inferops.snapshot.npu_snapshot_backup first" % reply["state"], state=reply["state"])
        if reply["pid"] != self.device_part.get("pid"):
            recorded = self.device_part.get("pid")
            raise RuntimeRefusedError(
                "the device part in %s was recorded for pid %s, but the target process is pid %s: it belongs to "
                "another process; take the device snapshot again" % (self.staging_dir, recorded, reply["pid"]))

    def checkpoint(self):
        params = self.params
        image_dir = host.images_dir(self.staging_dir)
        if os.path.lexists(image_dir):
            paths.remove_tree(image_dir)  # a leftover of an interrupted run: never mix two checkpoints
        paths.ensure_dir(os.path.dirname(image_dir))
        seconds = self.remaining("the checkpoint")
        if params["engine"] == "criu" or params["method"] == "runc":
            paths.ensure_dir(image_dir)  # docker checkpoint create makes its own
        if params["hash_during_checkpoint"]:
            self.follower = manifest_utils.Follower(image_dir, prefix=os.path.relpath(image_dir, self.staging_dir),
                                                    workers=params["workers"]).start()
        try:
            if params["engine"] == "docker":
                if params["method"] == "runc":
                    host.runc_checkpoint(self.module, self.info["Id"], image_dir, params["leave_running"], seconds,
                                         root=params["runc_root"])
                else:
                    host.docker_checkpoint(self.module, self.docker, self.info["Id"], image_dir, params["leave_running"],
                                           seconds)
                os.chmod(image_dir, paths.DIR_MODE)
                host.write_container_record(self.staging_dir, self.info)
            else:
                host.criu_dump(self.module, CriuCli(self.module).executable, self.pid, image_dir,
                               params["leave_running"], seconds)
        except Exception:
            if self.follower:
                self.follower.abort()
                self.follower = None
            raise

    def hashed_during_checkpoint(self):
        """Digests of the files hashed while the checkpoint wrote them ({} when not following)."""
        return self.follower.finish() if self.follower else {}

    def fields(self):
        image = None
        if self.info is not None:
            image = {"id": self.info["Image"], "name": (self.info.get("Config") or {}).get("Image")}
        part = self.device_part or {}
        return {
            "identity": self.identity,
            "created_at": device.utc_now(),
            "image": image,
            "engine": {"name": self.params["engine"], "version": self.versions.get("docker"),
                       "criu_version": self.versions.get("criu"), "oci_runtime_version": self.versions.get("runc")},
            "runtime": part.get("runtime") or {"name": device.RUNTIME_NAME, "version": None},
            "devices": part.get("devices") or [],
            "device": part or None,
            "durations": dict(self.watch.durations),
        }


def main_logic(module):
    params = module.params
    job = Checkpointer(module)
    result = dict(snapshot_dir=job.snapshot_dir, durations=job.watch.durations)
    if os.path.lexists(job.snapshot_dir) and params["if_exists"] != "replace":
        if params["if_exists"] == "fail":
            raise ParameterError("snapshot_dir: a snapshot is already published at %s (if_exists=fail); use "
                                 "if_exists=replace to take a new one" % job.snapshot_dir, **result)
        status = snapshot.read_status(job.snapshot_dir) or {}
        module.exit_json(changed=False, status=status.get("status", "completed"), checksum=status.get("checksum"),
                         msg="a snapshot is already published at %s; kept (if_exists=keep)" % job.snapshot_dir,
                         **result)

    with job.watch.stage("preflight"):
        job.preflight()
    if module.check_mode:
        module.exit_json(changed=True, status="completed", versions=job.versions, **result)

    snapshot.write_status(job.snapshot_dir, "generating", identity=job.identity)
    progress = Progress(module, "host_checkpoint %s" % job.snapshot_dir)
    result["progress"] = progress.lines
    try:
        progress.note("checkpoint of %s started" % (params["container"] or "pid %s" % params["pid"]), force=True)
        with job.watch.stage("checkpoint"):
            job.checkpoint()
        progress.note("checkpoint done in %.2f s; sealing" % job.watch.durations["checkpoint"], force=True)
        job.remaining("sealing")
        with job.watch.stage("seal"):
            fields = job.fields()
            if fields["device"] is None:
                del fields["device"]
            manifest, digest, hashing = snapshot.seal(job.staging_dir, fields, workers=params["workers"],
                                                      progress=progress.bytes_done, known=job.hashed_during_checkpoint())
        job.remaining("publishing")
        with job.watch.stage("publish"):
            snapshot.publish(job.staging_dir, job.snapshot_dir)
        progress.lines.append(progress.final("published %d bytes" % manifest["total_bytes"]))
    except Exception as exc:
        if job.follower:
            job.follower.abort()
        snapshot.discard(job.staging_dir)
        reason = exc.msg if isinstance(exc, SnapshotError) else "%s: %s" % (type(exc).__name__, exc)
        snapshot.write_status(job.snapshot_dir, "failed", reason=reason)
        if not isinstance(exc, SnapshotError):
            raise
        exc.result.update(result, status="failed", cleaned=[job.staging_dir])
        raise
    job.watch.durations["total"] = round(time.monotonic() - job.started, 6)
    snapshot.write_status(job.snapshot_dir, "completed", checksum=digest, total_bytes=manifest["total_bytes"])
    module.exit_json(changed=True, status="completed", checksum=digest, total_bytes=manifest["total_bytes"],
                     files=len(manifest["files"]), versions=job.versions, hashing=hashing,
                     manifest_path=os.path.join(job.snapshot_dir, manifest_utils.MANIFEST), **result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine=dict(type="str", default="docker", choices=["docker", "criu"]),
            container=dict(type="str"),
            pid=dict(type="int"),
            snapshot_dir=dict(type="path", required=True),
            identity=dict(type="dict", required=True, options=IDENTITY_OPTIONS),
            leave_running=dict(type="bool", default=True),
            timeout=dict(type="float", default=300.0),
            if_exists=dict(type="str", default="keep", choices=["keep", "replace", "fail"]),
            method=dict(type="str", default="runc", choices=["runc", "docker"]),
            require_device_part=dict(type="bool", default=True),
            agent_socket_dir=dict(type="path", default=control.DEFAULT_AGENT_SOCKET_DIR),
            runc_root=dict(type="path", default=host.DOCKER_RUNC_ROOT),
            docker_cli=dict(type="str", default="docker"),
            workers=dict(type="int"),
            hash_during_checkpoint=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("container", "pid")],
        supports_check_mode=True,
    )
    if not schema.HAS_JSONSCHEMA:
        module.fail_json(msg=missing_required_lib("jsonschema"), exception=schema.JSONSCHEMA_IMPORT_ERROR)
    if module.params["timeout"] <= 0:
        module.fail_json(msg="timeout: must be a positive number of seconds, got %s" % module.params["timeout"])
    run_module(module, main_logic)


if __name__ == "__main__":
    main()

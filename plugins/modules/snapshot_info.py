#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_info
short_description: Everything the roles need to know about one pod's snapshot and container, in one read-only call
version_added: 0.1.0
description:
  - Reports whether the pod's snapshot is published, its status record (C(generating), C(completed),
    C(failed)), whether it verifies (as M(inferops.snapshot.snapshot_verify) does, against the image the
    container runs), and the pod's container - whether it exists and runs, its image, the device snapshot
    path it was started with (C(VLLM_NPU_SNAPSHOT_PATH)), the snapshot it was restored from - and the
    snapshot state of its engine (C(RUNNING), C(LOCKED), C(BACKED_UP)) through the engine's control endpoint.
  - RV(usable) is true when the snapshot verifies and its status is C(completed) (or there is no record);
    a generation can then be skipped and a restore can use it.
  - Changes nothing. Container environment values are never returned, only the device snapshot path.
requirements:
  - jsonschema (Python library) on the target host
  - cryptography (Python library) on the target host, with O(trusted_keys)
  - the Docker CLI (O(docker_cli)) on the target host, with O(container) or an O(image) given by name
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.trust
  - inferops.snapshot.identity.REQUIRED
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: Read-only; runs in check mode too.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  snapshot_dir:
    description: The pod's snapshot directory.
    type: path
    required: true
  container:
    description: Name of the pod's container, if it has one on this host.
    type: str
  npu_dir:
    description: The pod's device (NPU) snapshot path; reported as RV(npu_dir_exists).
    type: path
  verify:
    description: Hash every file and compare with the manifest (as M(inferops.snapshot.snapshot_verify)).
    type: bool
    default: true
  image:
    description:
      - Image the snapshot must have been taken from (id or name). Default is the image the container runs,
        when it exists.
    type: str
  min_size:
    description: Minimum total size of the snapshot's files.
    type: int
    default: 1024
  criu_version:
    description: As in M(inferops.snapshot.snapshot_verify); C(auto) asks this host's CRIU, C(skip) does not check.
    type: str
    default: auto
  runtime_version:
    description: ACL runtime version the engine would load, checked when given.
    type: str
  device_state:
    description: Ask the running engine for its snapshot state through its agent socket.
    type: bool
    default: true
  agent_socket_dir:
    description: Where the engine's agent keeps its socket, inside the container.
    type: path
    default: /run/inferops-snapshot
  metadata_path:
    description: Path inside the container of the metadata file a restore writes (read for RV(container.restored_from)).
    type: path
    default: /run/inferops-snapshot/metadata.json
  docker_cli:
    description: Docker CLI executable.
    type: str
    default: docker
  workers:
    description: Files hashed in parallel.
    type: int
seealso:
  - module: inferops.snapshot.snapshot_verify
  - module: inferops.snapshot.snapshot_status
"""

EXAMPLES = r"""
- name: Is there a usable snapshot of vllm-0, and is its engine ready for one?
  inferops.snapshot.snapshot_info:
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}
    container: vllm-0
  register: info

- name: Skip the generation when it is there
  ansible.builtin.debug:
    msg: "usable snapshot {{ info.status.checksum }}; engine {{ info.device_state }}"
  when: info.usable
"""

RETURN = r"""
published:
  description: Whether a snapshot directory is published at O(snapshot_dir).
  returned: always
  type: bool
staging:
  description: Whether a C(.partial) staging sibling exists (a generation is running, or crashed).
  returned: always
  type: bool
status:
  description: The status record beside the snapshot (null when there is none).
  returned: always
  type: dict
  sample: {status: completed, checksum: 5f2b..., updated_at: "2026-11-29T12:00:00.000000Z"}
valid:
  description: Whether the snapshot verifies (null when O(verify=false)).
  returned: always
  type: bool
reasons:
  description: Why it does not, as in M(inferops.snapshot.snapshot_verify).
  returned: always
  type: list
  elements: str
authenticated:
  description: Whether the verification found a valid signature by one of O(trusted_keys) (false without them or O(verify)).
  returned: always
  type: bool
stale_reasons:
  description:
    - Why the published snapshot does not belong to the pod's container as it runs now (another image, a changed
      file in one of its mounts, other arguments, another kernel, ...; as a restore would compare them). A stale
      snapshot is not RV(usable); a generation replaces it. Empty when it belongs, or when there is no container.
  returned: always
  type: list
  elements: str
usable:
  description: Verifies, belongs to the container as it runs now, and its status is C(completed) (or there is no status record).
  returned: always
  type: bool
checksum:
  description: SHA-256 of the snapshot's C(checksum.sha256) (null when not published).
  returned: always
  type: str
bytes:
  description: Bytes hashed by the verification.
  returned: always
  type: int
throughput_mb_s:
  description: Hashing throughput of the verification.
  returned: always
  type: float
container:
  description: The pod's container; only RV(container.exists=false) (and the name) when there is none.
  returned: always
  type: dict
  contains:
    exists:
      description: Whether the container exists.
      type: bool
    id:
      description: Container id.
      type: str
    name:
      description: Container name.
      type: str
    running:
      description: Whether it runs.
      type: bool
    status:
      description: Docker's status (C(running), C(exited), C(created), ...).
      type: str
    pid:
      description: Host pid of its main process (null when it does not run).
      type: int
    image_id:
      description: Id of the image it runs; the snapshot is verified against it.
      type: str
    image:
      description: Image name it was created with.
      type: str
    npu_snapshot_path:
      description: Its C(VLLM_NPU_SNAPSHOT_PATH) (the only environment value ever read), null when not set.
      type: str
    restored_from:
      description: The snapshot it was restored from, read from the metadata file in it (null when not restored).
      type: str
device_state:
  description: Snapshot state of the running engine (C(RUNNING), C(LOCKED), C(BACKED_UP)), null when unknown.
  returned: always
  type: str
  sample: RUNNING
device_busy_with:
  description:
    - A snapshot operation that timed out for its caller but still runs inside the ACL runtime (C(lock),
      C(backup), ...); the engine's state can still change when it ends. Null when none.
  returned: always
  type: str
  sample: lock
device_state_error:
  description: Why the state is unknown (engine not running, agent not reachable).
  returned: always
  type: str
device_lease:
  description:
    - The lease the engine's agent holds for whoever locked it (see M(inferops.snapshot.npu_snapshot_lock)'s
      O(inferops.snapshot.npu_snapshot_lock#module:lease)); null when none. C(remaining_s) says how long until
      the agent resumes the engine by itself.
  returned: always
  type: dict
  sample: {seconds: 120.0, remaining_s: 87.5, expired: false, expires_at: "2026-11-29T12:02:00.000000Z", by: lock}
device_abandoned:
  description:
    - What the engine's agent did the last time a lease ran out without an unlock -- the controller that
      locked it died or lost the connection -- until a later lock or unlock clears it. C(previous_state)
      is the state it found, C(actions) what it did (C(restore), C(unlock)), C(errors) what failed,
      C(state) where it left the engine, C(at) and C(expired_at) when. Null when that did not happen.
    - A generation that was abandoned this way left its status record at C(generating); the generate role
      records it as failed with what the agent did.
  returned: always
  type: dict
  sample: {at: "2026-11-29T12:02:00.100000Z", previous_state: BACKED_UP, actions: [restore, unlock], errors: [],
           state: RUNNING, lease_s: 120.0, lease_by: lock, lease_granted_at: "2026-11-29T12:00:00.000000Z",
           lease_renewed_at: "2026-11-29T12:00:00.000000Z", expired_at: "2026-11-29T12:02:00.000000Z", overdue_s: 0.1}
generation:
  description:
    - Whether a generation holds the pod now, from its claim (C(.<pod>.generation.json)) - C(claim), the claim itself
      (id, holder, C(started_at), C(expires_at); null when none), C(live), whether a run still holds it,
      C(why_ended), why a claim no longer does (its lease lapsed, or the run that held it on this host is gone), and
      C(stale), true when the status record says C(generating) but no live claim backs it - a run killed before it
      recorded its outcome; the next generation takes the pod over.
  returned: always
  type: dict
  sample: {claim: null, live: false, why_ended: null, stale: true}
npu_dir_exists:
  description: Whether O(npu_dir) exists (null when not given).
  returned: always
  type: bool
"""

import os

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError, SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.control import AgentSocketClient
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.docker_cli import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import paths
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import retention
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import verify
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.docker_container import docker_world_now
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, manifest, signature, status

ARGUMENT_SPEC = dict(
    trusted_keys=_module.TRUST_ARGS["trusted_keys"],
    snapshot_dir=dict(type="path", required=True),
    identity=dict(type="dict", required=True, options=_module.IDENTITY_OPTIONS),
    container=dict(type="str"),
    npu_dir=dict(type="path"),
    verify=dict(type="bool", default=True),
    image=dict(type="str"),
    min_size=dict(type="int", default=1024),
    criu_version=dict(type="str", default="auto"),
    runtime_version=dict(type="str"),
    device_state=dict(type="bool", default=True),
    agent_socket_dir=dict(type="path", default=layout.DEFAULT_AGENT_SOCKET_DIR),
    metadata_path=dict(type="path", default=layout.DEFAULT_METADATA_FILE),
    docker_cli=dict(type="str", default="docker"),
    workers=dict(type="int"),
)


def container_info(params, docker):
    if not params["container"]:
        return {"exists": False}
    try:
        info = docker.inspect_container(params["container"])
    except ParameterError:  # no such container
        return {"exists": False, "name": params["container"]}
    return retention.container_facts(info, params["metadata_path"])


def engine_state(params, container):
    """The device_* return values: state, operation still running inside the runtime, error, lease, abandoned."""
    found = dict(device_state=None, device_busy_with=None, device_state_error=None, device_lease=None,
                 device_abandoned=None)
    if not container.get("running"):
        return dict(found, device_state_error="the container is not running")
    try:
        reply = AgentSocketClient.for_pid(container["pid"], params["agent_socket_dir"]).request(protocol.OP_STATE, 10)
    except SnapshotError as exc:
        return dict(found, device_state_error=exc.msg)
    return dict(found, device_state=reply["state"], device_busy_with=reply.get("busy_with"),
                device_lease=reply.get("lease"), device_abandoned=reply.get("abandoned"))


def generation(snapshot_dir, record):
    """The RV(generation) of the pod: its claim, whether it is live, and whether a generating record is a dead run's."""
    held = claim.read(snapshot_dir)
    why = claim.ended(held) if held else None
    live = bool(held) and why is None
    return dict(claim=held, live=live, why_ended=why, stale=(record or {}).get("status") == "generating" and not live)


def main_logic(module):
    params = module.params
    _module.sizes(params)
    snapshot_dir = paths.validate_snapshot_dir(params["snapshot_dir"])
    identity = paths.check_identity(params["identity"], snapshot_dir)
    docker = DockerCli(params["docker_cli"])
    container = container_info(params, docker)
    published = os.path.isdir(snapshot_dir) and not os.path.islink(snapshot_dir)
    record = status.read(snapshot_dir)
    result = dict(changed=False, snapshot_dir=snapshot_dir, published=published, status=record,
                  staging=os.path.lexists(layout.staging_dir(snapshot_dir)), container=container,
                  valid=None, reasons=[], bytes=0, throughput_mb_s=None, usable=False, authenticated=False,
                  checksum=hashing.fingerprint(snapshot_dir) if published else None,
                  generation=generation(snapshot_dir, record))
    result["npu_dir_exists"] = (os.path.isdir(paths.validate_snapshot_dir(params["npu_dir"], field="npu_dir"))
                                if params["npu_dir"] else None)
    if published:
        # The restore pipeline's own verdict (hashing only with verify): valid, why not, and which of its reasons
        # say the snapshot no longer belongs to the container as it runs now (a new model, other arguments) -- a
        # stale snapshot is never restored, so it is not usable and the next generation replaces it.
        image = params["image"]
        if image and not image.startswith("sha256:"):
            image = docker.image_id(image)
        elif not image and container.get("exists"):
            image = container["image_id"]
        expect = verify.expectations(identity, image, params["criu_version"], params["runtime_version"])
        trusted = signature.load_public_keys(params["trusted_keys"], "trusted_keys")
        world_now = (lambda recorded: docker_world_now(docker, params["container"], recorded)) \
            if container.get("exists") else None
        verdict = verify.for_restore(snapshot_dir, None, expect, params["min_size"], params["workers"],
                                     trusted=trusted, world_now=world_now,
                                     plan=manifest.FULL if params["verify"] else manifest.SIZES_ONLY)
        result["stale_reasons"] = verify.stale_reasons(verdict) if container.get("exists") else []
        if params["verify"]:
            result.update(valid=verdict["valid"], reasons=verdict["reasons"], bytes=verdict["bytes"],
                          throughput_mb_s=verdict["throughput_mb_s"], authenticated=verdict["authenticated"])
            result["usable"] = bool(verdict["valid"] and (record is None or record.get("status") == "completed"))
            if verdict["valid"] and record is not None and record.get("status") != "completed":
                result["reasons"] = ["status: the record says %s, not completed" % record.get("status")]
        elif result["stale_reasons"]:
            result["reasons"] = list(result["stale_reasons"])
    else:
        result["stale_reasons"] = []
    if params["device_state"]:
        result.update(engine_state(params, container))
    else:
        result.update(device_state=None, device_busy_with=None, device_state_error="not asked (device_state=false)",
                      device_lease=None, device_abandoned=None)
    return result


def main():
    _module.run(ARGUMENT_SPEC, main_logic)


if __name__ == "__main__":
    main()

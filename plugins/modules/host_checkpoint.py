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
  - Checkpoints the processes of a Docker container (O(engine=docker)), of a Kubernetes pod's container on containerd
    (O(engine=containerd)) or of a bare process tree (O(engine=criu)) with CRIU into the snapshot's staging directory, next to the device part that
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
    M(inferops.snapshot.npu_snapshot_lock) C(state=unlocked), or let O(resume) do it right after the checkpoint.
  - With O(signing_key) the snapshot is signed on the controller by the action plugin of the same name, and the node
    never holds the key. The module then runs twice under the generation's claim, as one task - the first run seals the
    snapshot into its staging directory and sends its checksum list and manifest up, the plugin checks them (the
    manifest listed, of O(identity), with the generation it gave out) and signs the list, the second run writes the
    signature and publishes. Until then nothing is published and the status record says C(generating); a snapshot is
    never published unsigned when O(signing_key) is given.
  - Every manifest carries a C(generation) that only grows per identity (with O(signing_key) from the signer's record
    O(signing_ledger) on the controller; without it one above the published snapshot's), and with O(max_age) an
    C(expires). A node refuses a generation older than one it has restored (C(rollback:)) and an expired snapshot
    (C(expired:)). See docs/security.md.
  - With O(signing_key) the controller also signs a statement that this generation is now the identity's latest
    (C(.<pod>.latest.json) beside the snapshot, good for O(statement_validity)), written once the snapshot is published.
    A node that trusts signing keys restores a snapshot only while such a statement names it or an older generation
    as the latest - so an older generation put back in the store is refused on every node (C(rollback:)), also on one
    that never restored the identity. M(inferops.snapshot.snapshot_refresh) signs the statements again, on a schedule.
  - With O(device_backup) the task takes the device part itself, as M(inferops.snapshot.npu_snapshot_backup)
    C(lock=true) would, but only once its own checks have passed and the generation's claim is held; the engine is
    then locked for the backup, the checkpoint and the resume alone, not for the start of a second task.
requirements:
  - jsonschema (Python library) on the target host
  - cryptography (Python library) on the target host with O(encryption_key), and on the controller with O(signing_key)
  - CRIU >= 4.2 on PATH, C(criu check) passing; root
  - With O(engine=containerd), C(ctr) (containerd's CLI, in containerd's package) and runc on PATH
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.generation
  - inferops.snapshot.identity.REQUIRED
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - What it writes - the published snapshot's files (from its C(checksum.sha256)) and the status record, and why a
        snapshot that was there is replaced; in check mode, that a snapshot would be published.
  idempotent:
    support: full
    details:
      - With O(if_exists=keep) an existing snapshot of the process as it runs now is left alone and the task reports
        no change.
options:
  engine:
    description:
      - C(docker) checkpoints a Docker container; C(criu) a bare process tree.
      - C(containerd) checkpoints a container of a Kubernetes pod on a containerd node (the CRI plugin's, namespace
        C(k8s.io)) - found in containerd's records through C(ctr) on O(containerd_address) and dumped by runc on the
        root of the pod's runtime handler, leave-running (containerd 1.6 has no CRI checkpoint call; see
        docs/kubernetes.md). The manifest records the image containerd runs it from (the CRI's C(image_ref)) and the
        OCI config runc runs it with.
    type: str
    choices: [docker, containerd, criu]
    default: docker
  container:
    description:
      - Name or id of the running container (O(engine=docker)); with O(engine=containerd) the id of the pod's
        container, as its C(status.containerStatuses[].containerID) has it (C(containerd://<id>) or the id alone).
    type: str
  containerd_address:
    description: With O(engine=containerd), the socket of the node's containerd (the one that serves the CRI).
    type: path
    default: /run/containerd/containerd.sock
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
  device_backup:
    description:
      - Lock and back up the engine's device state (recording the device part, under O(lease)) right before the
        checkpoint, instead of expecting M(inferops.snapshot.npu_snapshot_backup) to have done it. An engine that
        backed itself up (BACKED_UP) is accepted as that module accepts it. Needs O(require_device_part).
      - RV(device_backup) has what the backup did; a failure there is reported with RV(step) C(device snapshot),
        removes what the task wrote and leaves the status record to the caller, as M(inferops.snapshot.npu_snapshot_backup)
        does (the roles record the generation as failed).
    type: bool
    default: false
  device_memory:
    description:
      - With O(device_backup), what the backup saves of the device memory, as
        O(inferops.snapshot.npu_snapshot_backup#module:device_memory) (the args shape of CANN's snapshot API,
        C(backupFlags) 0 or 1). V(required_and_optional) needs O(device_backup) and, in the engine, a runtime with the
        args shape (the task fails naming the option otherwise).
    type: str
    choices: [required, required_and_optional]
    default: required
  lease:
    description:
      - With O(device_backup), the lease the lock and the backup carry, in seconds, as
        O(inferops.snapshot.npu_snapshot_backup#module:lease) (V(0) for none). This task renews it while it works;
        when the controller dies, the agent restores and unlocks the engine itself once it runs out.
      - It never ends later than 15 s (the margin for a controller's own unlock step) after O(timeout) runs out. A
        module killed with its controller leaves the engine locked for the time left of the generation's timeout
        plus that margin at most, whatever this says.
    type: float
    default: 120
  engine_state_mounts:
    description:
      - Container paths of bind mounts that hold the engine's own state - caches, logs, anything the engine writes -
        rather than its inputs. The files of every other bind mount, read-only or not, are part of the world the
        snapshot records (each file's identity and SHA-256) and a restore compares; a mount listed here is left
        out (only its presence and mode are compared; the manifest's C(world.excluded) lists what was left out, and
        why). A path the container does not mount excludes nothing (the roles give one list to every pod). A file
        that changes while the snapshot is taken fails the generation, naming it and this option.
      - Left out without it - volumes the kubelet, dockerd or containerd write per pod (downward API, projected,
        secrets, emptyDir, dockerd's hosts files, the kubelet's C(/etc/hosts) and termination log, containerd's
        C(/etc/hostname), C(/etc/resolv.conf) and C(/dev/shm) of the pod) and the collection's own mounts (the
        simulated NPU's device files, the NPU snapshot path, the agent's socket dir, the metadata file's dir).
    type: list
    elements: str
    default: []
  resume:
    description:
      - Resume the engine (restore its device memory and unlock it, as M(inferops.snapshot.npu_snapshot_lock)
        C(state=unlocked) does) right after the checkpoint, before the snapshot is encrypted, hashed, flushed and
        published, so that the engine is locked only for the device backup and the checkpoint. Needs O(leave_running) and
        O(require_device_part). When the resume fails the snapshot is still completed and RV(resumed) says why;
        resume the engine then as without this option.
      - V(false) leaves the engine BACKED_UP for the caller to resume (the roles resume it at once).
    type: bool
    default: false
  timeout:
    description: Seconds the whole generation may take; past it the checkpoint is stopped and cleaned up.
    type: float
    default: 300
  if_exists:
    description:
      - What to do when a snapshot is already published at O(snapshot_dir).
      - C(keep) leaves it and reports no change while it belongs to the process as it runs now; when it does not
        (another image, another model file in one of its mounts, other arguments, another kernel, ... -- the facts a
        restore compares), it is replaced and RV(replaced_because) says why. C(replace) publishes the new one in
        its place (the old one is removed only after the new one is in place); C(fail) fails the task.
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
    description:
      - State directory of the runc instance Docker uses. With O(engine=containerd) the container's runtime handler in
        containerd names it (its C(Root), C(/run/containerd/runc) by default, plus C(/k8s.io)) and this is not used.
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
  encryption_key:
    description:
      - A 256-bit key (32 bytes as base64 or hex, for example from Ansible Vault, or the absolute path of a root-owned
        0600 file holding them, outside the snapshot store) that encrypts the snapshot at rest, AES-256-GCM in 4 MiB
        chunks. The CRIU images, the container record (the environment) and the canary are stored encrypted; the
        manifest, checksums and signature cover the ciphertext, so any node can verify the snapshot and only a node
        with the key can restore it (O(inferops.snapshot.snapshot_restore#module:encryption_keys)).
      - CRIU writes the plaintext into a private directory below O(encryption_workdir), removed right after the
        encryption, also on failure; what a killed run left there is removed by the next one. Needs the Python
        library C(cryptography) on the target. See docs/security.md.
    type: str
  encryption_workdir:
    description: Where the plaintext lives while it is encrypted (a tmpfs keeps it off every disk). Needs room for the images.
    type: path
    default: /dev/shm
  force:
    description: Take a new snapshot even when the published one belongs to the process as it runs now.
    type: bool
    default: false
  signing_key:
    description:
      - The Ed25519 private key that signs the snapshot (C(signature.json) over C(checksum.sha256)), so that nodes
        holding only the public key (O(inferops.snapshot.snapshot_restore#module:trusted_keys)) can tell it from a
        forged one - PEM text (for example from Ansible Vault or an AWX credential), or the path of a PEM file B(on
        the controller) owned by the user running Ansible, mode 0600 (M(inferops.snapshot.snapshot_signing_key)
        makes one; C(~) is expanded).
      - Read and used by the action plugin on the controller only; it is never sent to the node. A run of the module
        that did not go through the plugin and still has it fails naming this option.
      - Needs the Python library C(cryptography) on the controller. See docs/security.md.
    type: str
  signing_ledger:
    description:
      - With O(signing_key), the signer's record on the controller of the last generation it signed per identity
        (a JSON file, 0600, made on first use). The next generation of an identity is above it and never below the
        time in seconds since 1970, so a lost record or a second controller with a right clock still counts upwards.
      - Default - C(generations.json) beside the key file, or in C(~/.inferops/keys) for a key given as text.
    type: path
  max_age:
    description:
      - Seconds the snapshot may be restored for. The manifest (covered by the signature) then carries C(expires), and
        every restore after that time refuses it (C(expired:)) - by the restoring node's clock. Default - no expiry.
    type: float
  statement_validity:
    description:
      - With O(signing_key), seconds the statement of the latest generation is good for unless signed again (by the
        next generation or M(inferops.snapshot.snapshot_refresh)); after it nodes that trust signing keys start the
        identity cold (C(stale:)). Read by the action plugin on the controller.
      - Default - a week (604800). docs/security.md says why.
    type: float
  controller_signing:
    description:
      - Set by the action plugin when O(signing_key) is given - the phase of the two runs (C(seal), C(publish), C(abort)),
        the generation and expiry the signer gave out, the signature, or why it refused to sign. Never set it in a
        task; the plugin refuses a task that does.
    type: dict
    suboptions:
      phase:
        description: C(seal), C(publish) or C(abort).
        type: str
        required: true
        choices: [seal, publish, abort]
      generation:
        description: The generation the signer gave out.
        type: int
      expires:
        description: The expiry the signer gave out.
        type: str
      signature:
        description: The signature document (JSON) for the publish phase.
        type: str
      reason:
        description: Why the controller refused to sign (the abort phase).
        type: str
      statement:
        description: The controller's statement that this generation is the latest (JSON), for the publish phase.
        type: str
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
generation_id:
  description: The generation this snapshot was taken in (O(generation_id), or one made for the task).
  returned: when a generation ran
  type: str
  sample: 0f6c1d2e3a4b4c5d8e9f00112233aabb
took_over:
  description:
    - The claim of another generation this task took over because that run was over (its lease ran out, or the process
      that stood for it on this host is gone), with C(why) and what the task C(cleaned) up of what it left. Null when
      there was none.
  returned: when a generation ran
  type: dict
work_dirs_swept:
  description: CRIU work directories that killed checkpoints (of any pod) had left in the temp dir, removed by this task.
  returned: when a generation ran
  type: list
  elements: str
world_digests:
  description:
    - The content digests of the mounted files the snapshot records, taken after the engine resumed - C(files),
      C(hashed_bytes) (read now) and C(cached_files) (known from the node's cache for the same file identity).
  returned: when a generation ran
  type: dict
  sample: {files: 3, hashed_bytes: 0, cached_files: 3}
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
  description: Versions of the pieces involved (docker or containerd, criu, runc, acl runtime).
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
  description:
    - Seconds per stage (C(preflight), C(device_backup), C(checkpoint), C(resume), C(encrypt), C(seal), C(publish))
      and C(total); C(dump) is the runc, Docker or CRIU call alone, part of C(checkpoint).
  returned: always
  type: dict
  sample: {checkpoint: 0.29, seal: 0.1, total: 0.6}
replaced_because:
  description:
    - Why a published snapshot was replaced (C(image_mismatch:), C(files_mismatch:), ... C(force)); empty when it
      was kept.
  returned: when a snapshot was already published
  type: list
  elements: str
device_backup:
  description:
    - What O(device_backup) did, as M(inferops.snapshot.npu_snapshot_backup) returns it (C(previous_state),
      C(actions), C(device_memory_bytes), C(durations), C(lease), ...).
  returned: when O(device_backup) ran
  type: dict
  sample: {previous_state: RUNNING, state: BACKED_UP, actions: [lock, backup], device_memory_bytes: 67108864}
step:
  description: The step that failed, C(device snapshot) (the backup of O(device_backup)) or C(host snapshot).
  returned: failure of a started generation
  type: str
  sample: host snapshot
resumed:
  description:
    - What O(resume) did (C(actions), the engine's C(state) after them, C(error) when it failed); null when the engine
      was left to the caller.
  returned: when a generation ran
  type: dict
  sample: {actions: [restore, unlock], state: RUNNING, error: null}
signed_by:
  description: Id of the key that signed the snapshot (null when O(signing_key) was not given).
  returned: success
  type: str
generation:
  description: The snapshot's generation (its manifest's C(generation)), a number that only grows per identity.
  returned: success
  type: int
  sample: 1764892800
expires:
  description: When the snapshot expires (its manifest's C(expires)); null without O(max_age).
  returned: success
  type: str
  sample: "2026-12-31T12:00:00Z"
to_sign:
  description:
    - In the seal phase of O(controller_signing) only - the checksum list and the manifest the controller signs. The
      action plugin takes it out of the task's result.
  returned: in the seal phase
  type: dict
hashing:
  description:
    - Hashing statistics of the seal (bytes, seconds, workers, throughput_mb_s), and how many files and bytes
      were already hashed during the checkpoint (followed_files, followed_bytes), and how long flushing the
      files to stable storage took, overlapped with the hashing (fsync_seconds).
  returned: success
  type: dict
criu_error:
  description: The first C(Error) line of CRIU's log when the checkpoint failed (the cause; also in the task's message).
  returned: failure
  type: str
criu_log:
  description:
    - Where CRIU's log of the failed checkpoint was kept (0600, the newest 20 in C(/var/log/inferops-snapshot/criu)).
  returned: failure
  type: str
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _diff, _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import task

ARGUMENT_SPEC = dict(
    generation_id=_module.GENERATION_ARGS["generation_id"],
    generation_lease=_module.GENERATION_ARGS["generation_lease"],
    engine=dict(type="str", default="docker", choices=["docker", "containerd", "criu"]),
    container=dict(type="str"),
    containerd_address=dict(type="path", default=layout.CONTAINERD_ADDRESS),
    pid=dict(type="int"),
    snapshot_dir=dict(type="path", required=True),
    identity=dict(type="dict", required=True, options=_module.IDENTITY_OPTIONS),
    leave_running=dict(type="bool", default=True),
    resume=dict(type="bool", default=False),
    device_backup=dict(type="bool", default=False),
    device_memory=dict(type="str", default="required", choices=["required", "required_and_optional"]),
    lease=dict(type="float", default=120.0),
    engine_state_mounts=dict(type="list", elements="str", default=[]),
    timeout=dict(type="float", default=300.0),
    if_exists=dict(type="str", default="keep", choices=["keep", "replace", "fail"]),
    method=dict(type="str", default="runc", choices=["runc", "docker"]),
    require_device_part=dict(type="bool", default=True),
    agent_socket_dir=dict(type="path", default=layout.DEFAULT_AGENT_SOCKET_DIR),
    runc_root=dict(type="path", default=layout.DOCKER_RUNC_ROOT),
    docker_cli=dict(type="str", default="docker"),
    workers=dict(type="int"),
    hash_during_checkpoint=dict(type="bool", default=True),
    signing_key=dict(type="str", no_log=True),
    signing_ledger=dict(type="path"),
    max_age=dict(type="float"),
    controller_signing=dict(type="dict", options=dict(
        phase=dict(type="str", required=True, choices=["seal", "publish", "abort"]), generation=dict(type="int"),
        expires=dict(type="str"), signature=dict(type="str"), reason=dict(type="str"), statement=dict(type="str"))),
    statement_validity=dict(type="float"),
    force=dict(type="bool", default=False),
    encryption_key=dict(type="str", no_log=True),
    encryption_workdir=dict(type="path", default=layout.TMPFS),
)


def main():
    _module.run(ARGUMENT_SPEC, lambda module: task.host_checkpoint(module.params, module.check_mode, module.log),
                mutually_exclusive=[("container", "pid")], diff=_diff.checkpoint)


if __name__ == "__main__":
    main()

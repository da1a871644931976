#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_restore
short_description: Start a recreated inference container from its verified snapshot, or cold when there is none
version_added: 0.1.0
description:
  - Verifies the snapshot first (as M(inferops.snapshot.snapshot_verify) does, against the image the container
    runs). A snapshot that is missing or invalid is never used; the container is started normally (a cold
    start) and the result says RV(restored=false) with the RV(reason).
  - With a valid snapshot it takes the recreated container O(container) (created, not started) or, when no
    container of that name exists, creates it from the configuration recorded in the snapshot; places the
    CRIU images where Docker starts from them, starts it from the checkpoint, then restores and unlocks the
    device state through the control endpoint inside the process, and waits for O(health_url). Docker resumes
    the restored process itself, before anything could check that nobody wrote the store meanwhile, so the
    verification copies the snapshot's files to a private directory in C(/dev/shm) as it hashes them, and
    Docker gets those bytes (the result's RV(verify) says C(held.mode=copied) and why).
  - Before the process starts it writes a metadata file (O(metadata_path)) with the recreated container's
    environment into the container, because a restored process keeps the environment of the process that
    was checkpointed.
  - Any failure of the restore itself (CRIU error, device busy) also ends in a cold start with the reason.
  - With O(method=runtime) the host and device restore, the metadata file and the fallback are done by the
    restore-on-create runtime that the P(inferops.snapshot.snapshot_node#role) role installs on the node. The
    module creates the container with that runtime and C(INFEROPS_RESTORE_FROM), starts it normally and reports
    what the runtime did (from the snapshot's status record). This skips Docker's checkpoint upload and is much
    faster for large snapshots.
  - With O(engine=criu) it restores a bare process tree (no container) that
    M(inferops.snapshot.host_checkpoint) checkpointed with O(engine=criu). After the same verification it checks
    that the snapshot was taken with that engine and that the pids recorded in it are free (CRIU restores the
    process with its original pids), restores it detached with CRIU within O(timeout), restores and unlocks the
    device state through the agent, and waits for O(health_url). When the snapshot cannot be used or the restore
    fails it runs O(cold_start), or fails with the reason when there is none.
requirements:
  - jsonschema (Python library) on the target host
  - cryptography (Python library) on the target host, with O(trusted_keys) or O(encryption_keys)
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
    details: Verifies and reports whether it would restore or cold start; changes nothing.
  diff_mode:
    support: full
    details:
      - The container (or process) before and after - absent, stopped or not running; recreated from the snapshot's
        record, restored from the snapshot (method, device actions) or started cold with the reason; the metadata file
        written into it (the names of its variables, never their values).
  idempotent:
    support: full
    details:
      - A container that is already running is left alone.
      - With O(engine=criu), a process that this module restored or cold started from the snapshot and that still
        runs (same pid and start time, from the snapshot's status record) is left alone.
options:
  engine:
    description:
      - V(docker) restores a Docker container; V(criu) a bare process tree checkpointed by
        M(inferops.snapshot.host_checkpoint) with O(engine=criu). A snapshot taken with the other engine is not used.
    type: str
    choices: [docker, criu]
    default: docker
  snapshot_dir:
    description:
      - The published snapshot of this pod. Required unless O(source) is given.
      - With O(source), leave it out (or give the source's snapshot, which is then checked).
    type: path
  source:
    description:
      - Restore a snapshot of another instance of the same service (a clone, for a scale-out) instead of the pod's
        own. Pod k of the new instance restores from pod k of the source instance (the pods' names end in their
        ordinal). The identity check then accepts exactly that source, and only of the same namespace and
        service as O(identity); every other check (image, arguments, mounts, devices, versions) applies.
      - Only with O(method=runtime), into an existing O(container) created for the clone with the restore-on-create
        runtime, a device and a network namespace of its own, and the env C(INFEROPS_RESTORE_FROM) (the source's
        snapshot), C(INFEROPS_RESTORE_IDENTITY) (O(identity)) and C(INFEROPS_RESTORE_SOURCE) (the source's
        identity); the module says what is missing. The runtime writes the clone's identity, its source and a fresh
        C(restore_nonce) into its metadata file, and never restores one snapshot onto one device twice at once.
    type: dict
    suboptions:
      instance:
        description: The source instance, or V(newest) for the instance whose matching pod has the newest completed
          snapshot below O(source.root) (never the clone's own instance).
        type: str
        default: newest
      pod:
        description: The source pod. Default is the source instance's pod with the ordinal of O(identity.pod).
        type: str
      root:
        description: The snapshot root, C(<root>/<namespace>/<service>/<instance>/<pod>).
        type: path
        default: /var/lib/inferops/snapshots
  container:
    description: Name of the recreated container. Required with O(engine=docker); not used with O(engine=criu).
    type: str
  env:
    description:
      - Environment of the recreated container, merged over the recorded one when the module creates it.
        Written to the metadata file either way. Values are never returned or logged.
      - With O(engine=criu), the environment written to the metadata file, and added to the module's own
        environment for O(cold_start).
    type: dict
    default: {}
  metadata_path:
    description:
      - Path inside the container of the metadata file the engine reads its new environment from.
      - With O(engine=criu), a path on the host; give each process its own.
    type: path
    default: /run/inferops-snapshot/metadata.json
  cold_start:
    description:
      - With O(engine=criu), the command (argv list) that starts the process normally when the snapshot cannot be
        restored. It runs detached (its own session, stdin from C(/dev/null), output to O(cold_start_log)) with
        the module's environment plus O(env).
      - Without it, a bare process that cannot be restored fails the task with the reason.
    type: list
    elements: str
  encryption_keys:
    description:
      - The keys (as O(inferops.snapshot.host_checkpoint#module:encryption_key), in base64, hex, or root-owned 0600 files) an
        encrypted snapshot may be decrypted with; several for rotation. The snapshot's manifest names its key by id; without
        that key the engine starts cold with the reason (C(encrypted:)), and a chunk that does not authenticate (a wrong
        key, a changed byte) is a cold start too (C(decrypt_failed:)).
      - The plaintext lives in a private directory in C(/dev/shm) while CRIU reads it, removed right after the restore,
        also on failure; what a killed restore left there is removed by the next one. O(method=docker) refuses
        encrypted snapshots (Docker copies the images through containerd in the clear); the restore-on-create
        runtime (O(method=runtime)) takes its keys from the node's settings.
      - An entry may be a dict of C(key) (the key) and C(identities) (C(<namespace>/<service>) patterns) - a key that may decrypt only
        snapshots of those identities (C(encrypted:) otherwise). Every chunk is bound to its snapshot's identity and
        generation (a chunk of another pod's or another generation's snapshot does not decrypt); a snapshot of the
        collection's older encryption format is refused (C(encryption_format:)).
    type: list
    elements: raw
    default: []
  require_signature:
    description:
      - Restore only a snapshot signed by one of O(trusted_keys). Null (the default) - on as soon as any key is given
        (O(trusted_keys) or O(encryption_keys)); on without O(trusted_keys) is an error naming this option.
      - V(false) restores unsigned snapshots; a restore nothing authenticated then warns (the result's C(warnings)).
    type: bool
  require_encryption:
    description:
      - Restore only an encrypted snapshot, with every file that holds process memory or the environment encrypted; a
        plaintext one is refused (C(unencrypted:)). Null (the default) - on as soon as O(encryption_keys) is given.
    type: bool
  generations_file:
    description:
      - This host's record of the highest generation it has restored per identity (root's, 0600 in a 0700 directory,
        made on first use). A snapshot older than one of its identity restored here is refused (C(rollback:)); the
        node's restore-on-create runtime keeps the same record (C(snapshot_node_generations_file)).
    type: path
    default: /var/lib/inferops/state/generations.json
  cold_start_log:
    description: File the output of O(cold_start) is appended to (0600); default C(/dev/null).
    type: path
  health_url:
    description: HTTP URL that answers 200 once the engine serves; waited for after the start.
    type: str
  health_timeout:
    description: Seconds to wait for O(health_url).
    type: float
    default: 600
  timeout:
    description:
      - Seconds each restore step (host start, device restore) may take. A CRIU restore that runs longer is
        stopped (a truncated image can make it spin) and the process is started cold (O(cold_start)).
    type: float
    default: 120
  min_size:
    description: Minimum total size of the snapshot's files, as in M(inferops.snapshot.snapshot_verify).
    type: int
    default: 1024
  criu_version:
    description: As in M(inferops.snapshot.snapshot_verify).
    type: str
    default: auto
  runtime_version:
    description: ACL runtime version the engine would load, checked against the snapshot when given.
    type: str
  device_restore:
    description: Restore and unlock the device state through the control endpoint once the process is back.
    type: bool
    default: true
  agent_socket_dir:
    description: Where the engine's agent keeps its socket, inside the container (on the host for O(engine=criu)).
    type: path
    default: /run/inferops-snapshot
  docker_cli:
    description: Docker CLI executable.
    type: str
    default: docker
  workers:
    description: Files hashed in parallel during verification.
    type: int
  method:
    description:
      - How the host part is restored.
      - V(auto) takes V(runtime), the fast path, when dockerd has the restore-on-create runtime O(runtime_name) and
        its snapshot roots hold O(snapshot_dir) (or an existing O(container) was created with it). Otherwise it takes
        V(docker) only for a snapshot of at most O(docker_path_max_bytes), and above that starts the container cold
        at once with the reason C(docker_path_slower_than_cold:) (without hashing the images); RV(method) and
        RV(method_reason) say which and why. The roles install the runtime first (C(snapshot_restore_install_runtime)).
      - V(docker) places the CRIU images in the container's C(checkpoints/) directory below the daemon's data
        root (C(docker info) C(DockerRootDir)) and runs C(docker start --checkpoint); it needs dockerd's
        experimental mode, and starts the container cold with that reason without it.
      - V(runtime) creates the container with C(--runtime) O(runtime_name) and C(INFEROPS_RESTORE_FROM) and
        starts it; the restore-on-create runtime verifies the snapshot's checksums (the module checks all else
        and leaves the hashing to it, so each file is read once), restores host and device state, writes the
        metadata file, or starts the container cold. The snapshot must lie below one of the node's
        C(snapshot_node_snapshot_roots). An existing O(container) must have been created that way.
      - Only for O(engine=docker).
    type: str
    choices: [auto, docker, runtime]
    default: auto
  stage_dir:
    description:
      - The node's cache of verified snapshots (module M(inferops.snapshot.snapshot_stage)). When it holds a copy of
        the snapshot that is still exactly the one verified (every file's inode, size, mtime and ctime), the restore
        reads the copy and skips hashing the content; the snapshot's checksum list, signature, manifest, identity
        and world are still checked. Any other copy is dropped and the snapshot verified in full.
      - Used by O(engine=criu). O(method=runtime) uses the node runtime's own cache (C(snapshot_node_stage_dir));
        O(method=docker) never uses one, since it restores from the private copy its own verification makes.
    type: path
  runtime_name:
    description: Name of the restore-on-create runtime in dockerd (the role's C(snapshot_node_runtime_name)), for O(method=runtime).
    type: str
    default: inferops-restore
  docker_path_max_bytes:
    description:
      - With O(method=auto) on a node where the runtime cannot restore the snapshot, the largest snapshot (bytes)
        restored with V(docker). C(docker start --checkpoint) copies the images twice through containerd's content
        store; on the 2-core test machine a 2 GiB state took 52 s to the first answer against a 30 s cold start of the
        sample engine, and the two meet at about 1 GiB (docs/benchmarks.md). An engine whose cold start takes minutes
        gains from the Docker path at far larger sizes, so raise it for one; V(0) never takes it.
    type: int
    default: 1073741824
notes:
  - The engine's listening ports must be free (the original container deleted) before the restore, as its
    sockets are restored as they were.
  - With O(engine=criu) the original process must be gone (its pids free) and the files it had open (its
    executable, libraries, log files) must be where they were; start it with C(setsid) and stdin/stdout on
    C(/dev/null) or a file, as CRIU restores a session leader without a terminal.
seealso:
  - module: inferops.snapshot.snapshot_verify
  - module: inferops.snapshot.host_checkpoint
"""

EXAMPLES = r"""
- name: Bring vllm-0 back from its snapshot, or cold when it is unusable
  inferops.snapshot.snapshot_restore:
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}
    container: vllm-0
    env:
      POD_IP: 10.0.0.12
    health_url: http://127.0.0.1:8000/health
  register: restore

- name: Say which path was taken
  ansible.builtin.debug:
    msg: "{{ 'restored' if restore.restored else 'cold start: ' ~ restore.reason }}"

- name: The same through the restore-on-create runtime (role inferops.snapshot.snapshot_node on the node)
  inferops.snapshot.snapshot_restore:
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}
    container: vllm-0
    method: runtime
    health_url: http://127.0.0.1:8000/health

- name: Scale out -- pod 0 of instance p1 starts from the newest completed snapshot of pod 0 of another instance
  inferops.snapshot.snapshot_restore:
    identity: {namespace: default, service: qwen, instance: p1, pod: qwen-p1-0}
    source: {instance: newest, root: /var/lib/inferops/snapshots}
    container: qwen-p1-0      # created for the clone: --runtime inferops-restore, its own device and network
    method: runtime
  register: clone

- name: Bring a bare engine process back (checkpointed with host_checkpoint engine=criu), or start it normally
  inferops.snapshot.snapshot_restore:
    engine: criu
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/engine-0
    identity: {namespace: default, service: qwen, instance: p0, pod: engine-0}
    metadata_path: /run/inferops-snapshot/engine-0/metadata.json
    cold_start: [/usr/bin/python3, -m, inferops_agent, --, /opt/engine/serve.py]
    cold_start_log: /var/log/engine-0.log
    health_url: http://127.0.0.1:8000/health
"""

RETURN = r"""
method:
  description: The method O(method=auto) chose (C(runtime), C(docker), or C(cold) when the Docker path would be slower
    than a cold start).
  returned: with O(method=auto) and O(engine=docker)
  type: str
  sample: runtime
method_reason:
  description: Why O(method=auto) chose it (the runtime is missing, its snapshot roots do not hold the snapshot, ...).
  returned: with O(method=auto) and O(engine=docker)
  type: str
source:
  description: A clone's source, the identity whose snapshot was restored (see O(source)).
  returned: with O(source)
  type: dict
  sample: {namespace: default, service: qwen, instance: p0, pod: qwen-p0-0}
restored:
  description: Whether the container (or process) came back from the snapshot (false means a normal cold start).
  returned: always
  type: bool
  sample: true
reason:
  description: Why the snapshot was not used (null when it was).
  returned: always
  type: str
  sample: "checksum_mismatch: host/criu/pages-1.img"
verify:
  description:
    - The verification result (valid, reasons, authenticated, key_id, fingerprint, bytes, throughput_mb_s, checksums).
    - C(authenticated) says whether the snapshot carried a valid signature by one of O(trusted_keys).
    - C(checksums) is C(verified) when the module hashed every file, C(sizes only) with O(method=runtime) outside
      check mode, where the restore-on-create runtime hashes every file right before it restores (a checksum
      mismatch then shows as the runtime's cold start, in RV(reason) and RV(runtime_record)).
    - C(held) says how the restore read the files it verified (C(mode)) - C(leased), the very files it hashed, held
      open and leased, CRIU getting them through a folder of hard links the restore holds and watches; or C(copied),
      a private copy made by the read that hashed them (C(why_copied) - no lease on that filesystem, or a path whose
      restored process may run before anything could check the leases, like O(method=docker)).
  returned: always
  type: dict
container_id:
  description: Id of the started container.
  returned: success with O(engine=docker)
  type: str
created:
  description: Whether the module created the container from the snapshot's recorded configuration.
  returned: success with O(engine=docker)
  type: bool
pid:
  description: Pid of the restored or cold started process (O(engine=criu)); of the running one when left alone.
  returned: success with O(engine=criu)
  type: int
  sample: 4242
device_actions:
  description: What the device restore did through the agent (C(restore), C(unlock)).
  returned: when restored and O(device_restore=true)
  type: list
  elements: str
placement:
  description: How the images were placed for Docker (C(copy) of the verified copy); C(runtime) with O(method=runtime).
  returned: when restored
  type: str
runtime_record:
  description:
    - With O(method=runtime), what the runtime recorded for this container (outcome, reason, per-stage durations),
      from the snapshot's status record (C(last_restore)) or the metadata file it wrote into the container.
  returned: when O(method=runtime)
  type: dict
file_locks:
  description:
    - The POSIX file locks the checkpointed process held (C(checkpointed)) and how many of them its agent took back
      after the restore (C(taken_back)). CRIU releases a lock on a file the process also maps (an SQLite C(-shm) file)
      while it restores; a lock that cannot be held again is a cold start with a C(file_locks_failed) reason.
  returned: when restored from a checkpoint that held POSIX locks
  type: dict
  sample: {checkpointed: 2, taken_back: 2}
reseed:
  description:
    - What the restored engine's agent was told after the restore, so that no two copies of one snapshot share their
      random streams (docs/security.md). C(told) true, with what the agent re-seeded in the interpreter (C(reseeded))
      and how many RESTORE_POST hooks of the engine it called with the restore's nonce (C(hooks)); or C(told) false
      with C(why) (no agent in the process, or one that predates this). An agent that fails to is a cold start with a
      C(reseed_failed) reason.
  returned: when restored (with O(method=runtime), in RV(runtime_record))
  type: dict
  sample: {told: true, reseeded: [random, ssl], hooks: 1}
interrupted:
  description:
    - An earlier run of this restore (O(method=docker), O(engine=criu)) that was killed after it started the engine from
      the snapshot and before it recorded an outcome, as this run found it, and what this run did about it. Every such
      run records itself C(restoring) in the snapshot's status record right before it starts the engine.
    - C(at), C(runner) (the killed run's process) and C(gone) (why it is over). C(engine) is what the engine's agent
      said (C(state), the C(lease) it holds, C(abandoned) when its restore lease ran out and it finished the restore
      itself, C(resumed_by)), or C(container) or C(process) when there was no engine to ask. C(done) is what this run
      did (stopped the container or killed the process tree, to restore it from the start), C(reason) the killed run's
      entry, now C(interrupted), as recorded.
    - A run that is still going is left alone instead (C(changed) false, and RV(reason) says so).
  returned: when an earlier run was found interrupted
  type: dict
  sample:
    at: "2026-12-07T10:00:00.000000Z"
    gone: "its process (pid 4242, python3 ...) is gone"
    engine: {state: RUNNING, lease: null, resumed_by: lease,
             abandoned: {lease_by: restore, actions: [resumed, restore, unlock], state: RUNNING}}
    done: stopped the container and restores it from the start
metadata_env_keys:
  description: Names (not values) of the variables written to the metadata file.
  returned: success
  type: list
  elements: str
durations:
  description:
    - Seconds per stage (C(verify), C(prepare), C(host_restore), C(device_restore), C(cold_start), C(health))
      and C(total).
  returned: always
  type: dict
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _diff, _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import task

ARGUMENT_SPEC = dict(
    trusted_keys=_module.TRUST_ARGS["trusted_keys"],
    snapshot_dir=dict(type="path"),
    source=dict(type="dict", options=dict(instance=dict(type="str", default="newest"), pod=dict(type="str"),
                                          root=dict(type="path", default=layout.DEFAULT_SNAPSHOT_ROOT))),
    identity=dict(type="dict", required=True, options=_module.IDENTITY_OPTIONS),
    engine=dict(type="str", default="docker", choices=["docker", "criu"]),
    container=dict(type="str"),
    env=dict(type="dict", default={}, no_log=True),
    metadata_path=dict(type="path", default=layout.DEFAULT_METADATA_FILE),
    health_url=dict(type="str"),
    health_timeout=dict(type="float", default=600.0),
    timeout=dict(type="float", default=120.0),
    min_size=dict(type="int", default=1024),
    criu_version=dict(type="str", default="auto"),
    runtime_version=dict(type="str"),
    device_restore=dict(type="bool", default=True),
    agent_socket_dir=dict(type="path", default=layout.DEFAULT_AGENT_SOCKET_DIR),
    docker_cli=dict(type="str", default="docker"),
    workers=dict(type="int"),
    method=dict(type="str", default="auto", choices=["auto", "docker", "runtime"]),
    runtime_name=dict(type="str", default="inferops-restore"),
    docker_path_max_bytes=dict(type="int", default=1 << 30),
    stage_dir=dict(type="path"),
    cold_start=dict(type="list", elements="str"),
    cold_start_log=dict(type="path"),
    encryption_keys=dict(type="list", elements="raw", default=[], no_log=True),
    require_signature=dict(type="bool"),
    require_encryption=dict(type="bool"),
    generations_file=dict(type="path", default=layout.GENERATIONS_FILE),
)


def main_logic(module):
    _module.sizes(module.params)
    return task.restore(module.params, module.check_mode, module.warn)


def main():
    _module.run(ARGUMENT_SPEC, main_logic,
                required_if=[("engine", "docker", ("container",))], diff=_diff.restore)


if __name__ == "__main__":
    main()

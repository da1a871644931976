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
    CRIU images where Docker starts from them (hard links, no copy), starts it from the checkpoint, then
    restores and unlocks the device state through the control endpoint inside the process, and waits for
    O(health_url).
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
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.identity.REQUIRED
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: Verifies and reports whether it would restore or cold start; changes nothing.
  diff_mode:
    support: none
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
    description: The published snapshot of this pod.
    type: path
    required: true
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
    choices: [docker, runtime]
    default: docker
  runtime_name:
    description: Name of the restore-on-create runtime in dockerd (the role's C(snapshot_node_runtime_name)), for O(method=runtime).
    type: str
    default: inferops-restore
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

- name: Bring a bare engine process back (checkpointed with host_checkpoint engine=criu), or start it normally
  inferops.snapshot.snapshot_restore:
    engine: criu
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/engine-0
    identity: {namespace: default, service: qwen, instance: p0, pod: engine-0}
    metadata_path: /run/inferops-snapshot/engine-0/metadata.json
    cold_start: [/usr/bin/python3, /opt/inferops/agent/_agent.py, --, /opt/engine/serve.py]
    cold_start_log: /var/log/engine-0.log
    health_url: http://127.0.0.1:8000/health
"""

RETURN = r"""
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
    - The verification result (valid, reasons, bytes, throughput_mb_s, checksums).
    - C(checksums) is C(verified) when the module hashed every file, C(sizes only) with O(method=runtime) outside
      check mode, where the restore-on-create runtime hashes every file right before it restores (a checksum
      mismatch then shows as the runtime's cold start, in RV(reason) and RV(runtime_record)).
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
  description: How the images were placed for Docker (C(hardlink) or C(copy)); C(runtime) with O(method=runtime).
  returned: when restored
  type: str
runtime_record:
  description:
    - With O(method=runtime), what the runtime recorded for this container (outcome, reason, per-stage durations),
      from the snapshot's status record (C(last_restore)) or the metadata file it wrote into the container.
  returned: when O(method=runtime)
  type: dict
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

import json
import os
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.six.moves.urllib.request import ProxyHandler, build_opener

from ansible_collections.inferops.snapshot.plugins.module_utils import _bare_process as bare
from ansible_collections.inferops.snapshot.plugins.module_utils import _control as control
from ansible_collections.inferops.snapshot.plugins.module_utils import _device as device
from ansible_collections.inferops.snapshot.plugins.module_utils import _host as host
from ansible_collections.inferops.snapshot.plugins.module_utils import _manifest as manifest_utils
from ansible_collections.inferops.snapshot.plugins.module_utils import _paths as paths
from ansible_collections.inferops.snapshot.plugins.module_utils import _restore_runtime as restore_runtime
from ansible_collections.inferops.snapshot.plugins.module_utils import _schema as schema
from ansible_collections.inferops.snapshot.plugins.module_utils import _snapshot as snapshot
from ansible_collections.inferops.snapshot.plugins.module_utils._common import IDENTITY_OPTIONS, Stopwatch, run_module
from ansible_collections.inferops.snapshot.plugins.module_utils._criu import CriuCli
from ansible_collections.inferops.snapshot.plugins.module_utils._containerd_leak import LeakGuard
from ansible_collections.inferops.snapshot.plugins.module_utils._docker import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import (
    CommandError,
    ParameterError,
    SnapshotError,
    SnapshotTimeout,
)

CHECKPOINT_NAME = "inferops-restore"


def wait_healthy(url, timeout, clock=time.monotonic, sleep=time.sleep, gone=None):
    """Poll ``url`` until it answers 200; return seconds waited or raise SnapshotTimeout with the last state.

    ``gone``: optional callable; a text it returns (the process exited) ends the wait at once.
    """
    opener = build_opener(ProxyHandler({}))
    started = clock()
    last = None
    while True:
        exited = gone() if gone else None
        if exited:
            raise SnapshotTimeout("%s will not answer: %s" % (url, exited), last_state=exited)
        try:
            response = opener.open(url, timeout=5)
            if response.getcode() == 200:
                return clock() - started
            last = "HTTP %d" % response.getcode()
        except Exception as exc:  # any failure to answer is "not healthy yet"
            last = str(getattr(exc, "reason", exc))
        if clock() - started >= timeout:
            raise SnapshotTimeout("%s did not answer 200 within %.0f s (last: %s)" % (url, timeout, last),
                                  last_state=last)
        sleep(0.2)


def verify_snapshot(module, snapshot_dir, engine, expect=None, hash_files=True):
    """Verify the snapshot (as snapshot_verify does) and that ``engine`` can restore it."""
    params = module.params
    expect = dict(expect or {}, identity=params["identity"], runtime_version=params["runtime_version"],
                  criu_version=None if params["criu_version"] == "skip" else (
                      CriuCli(module).version() if params["criu_version"] == "auto" else params["criu_version"]))
    valid, reasons, details = manifest_utils.verify(snapshot_dir, params["min_size"], expect, params["workers"],
                                                    hash_files=hash_files)
    mismatch = bare.engine_reason(details["manifest"], engine)
    if mismatch:
        valid, reasons = False, reasons + [mismatch]
    hashing = details["hashing"] or {}
    return {"valid": valid, "reasons": reasons, "bytes": details["bytes"], "files": details["files"],
            "checksums": details.get("checksums"),
            "throughput_mb_s": hashing.get("throughput_mb_s") if hash_files else None}


def use_snapshot_reason(verdict):
    return "; ".join((verdict or {}).get("reasons") or []) or "not verified"


class Restorer:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.watch = Stopwatch()
        self.docker = DockerCli(module, self.params["docker_cli"])
        self.snapshot_dir = paths.validate_snapshot_dir(self.params["snapshot_dir"])
        schema.validate("manifest", self.params["identity"], "identity", definition="identity")
        self.created = False
        self.verdict = None
        self.container_id = self.docker.container_id(self.params["container"])

    def verify(self):
        expect = {}
        if self.container_id:
            expect["image_id"] = self.docker.inspect_container(self.container_id)["Image"]
        # method=runtime: the runtime hashes every file right before it restores; hashing here too would
        # read the whole snapshot twice (0.9 of 6.6 s at 2 GiB). Check mode hashes, to predict truthfully.
        leave_to_runtime = self.params["method"] == "runtime" and not self.module.check_mode
        verdict = verify_snapshot(self.module, self.snapshot_dir, "docker", expect, hash_files=not leave_to_runtime)
        if verdict["valid"] and not self.container_id:
            recorded = host.read_container_record(self.snapshot_dir)
            rc, out, err = self.docker.run(["image", "inspect", "--format", "{{.Id}}", recorded["image_id"]],
                                           check=False)
            if rc != 0:
                verdict.update(valid=False, reasons=["image_mismatch: image %s recorded in the snapshot is not on "
                                                     "this host" % recorded["image_id"]])
        return verdict

    def ensure_container(self, use_snapshot):
        if self.container_id:
            return
        if not use_snapshot:
            raise ParameterError(
                "container: %r does not exist and there is no valid snapshot to recreate it from (%s); create it "
                "first (for example with community.docker.docker_container state=present)"
                % (self.params["container"], use_snapshot_reason(self.verdict)))
        record = host.read_container_record(self.snapshot_dir)
        self.docker.run(host.create_args(record, self.params["container"], self.params["env"]))
        self.container_id = self.docker.container_id(self.params["container"])
        self.created = True

    def write_metadata(self, restored):
        """Put the new environment where the engine reads it (docker cp into the created container)."""
        info = self.docker.inspect_container(self.container_id)
        env = dict(item.split("=", 1) for item in (info.get("Config") or {}).get("Env") or [] if "=" in item)
        env.update(self.params["env"])
        metadata = {"env": env, "container": self.params["container"], "container_id": self.container_id,
                    "restored": restored, "snapshot_dir": self.snapshot_dir, "written_at": device.utc_now()}
        inner_dir, name = os.path.split(self.params["metadata_path"])
        scratch = tempfile.mkdtemp(prefix="inferops-meta-")
        try:
            staged = os.path.join(scratch, os.path.basename(inner_dir) or "metadata")
            os.mkdir(staged, 0o700)
            paths.write_file_atomic(os.path.join(staged, name), json.dumps(metadata, indent=2, sort_keys=True).encode())
            self.docker.run(["cp", staged, "%s:%s" % (self.container_id, os.path.dirname(inner_dir) or "/")])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return sorted(env)

    def start_from_checkpoint(self):
        docker_root, experimental = self.docker.checkpoint_support()
        if not experimental:
            raise SnapshotError("method=docker needs the Docker daemon in experimental mode for docker start "
                                "--checkpoint: set \"experimental\": true in /etc/docker/daemon.json and restart "
                                "dockerd, or use method=runtime")
        target, how = host.place_checkpoint(self.snapshot_dir, self.container_id, CHECKPOINT_NAME,
                                            docker_root=docker_root or host.DOCKER_ROOT)
        argv = [self.docker.executable, "start", "--checkpoint", CHECKPOINT_NAME, self.container_id]
        with LeakGuard(target):
            try:
                host.run_timed(self.module, argv, self.params["timeout"], "docker start --checkpoint")
            except CommandError as exc:
                # Seen after daemon restarts: containerd's content store already holds the upload. Once more.
                if "already exists" not in (exc.result.get("stderr") or ""):
                    raise
                host.run_timed(self.module, argv, self.params["timeout"], "docker start --checkpoint (retry)")
        return how

    def device_resume(self):
        return device_resume_pid(self.docker.running_pid(self.container_id), self.params["agent_socket_dir"],
                                 self.params["timeout"])

    # method=runtime: the restore-on-create runtime does the restore when the container is created
    def require_runtime(self):
        name = self.params["runtime_name"]
        rc, out, err = self.docker.run(["info", "--format", "{{json .Runtimes}}"], check=False)
        try:
            known = json.loads(out) if rc == 0 else {}
        except ValueError:
            known = {}
        if name not in known:
            raise ParameterError(
                "runtime_name: dockerd has no runtime %r (it knows %s); install it on this node with the "
                "inferops.snapshot.snapshot_node role, or use method=docker" % (name, ", ".join(sorted(known)) or "none"),
                runtimes=sorted(known))

    def ensure_runtime_container(self):
        """The container, created with the restore-on-create runtime and the snapshot it restores from."""
        name = self.params["runtime_name"]
        if self.container_id:
            info = self.docker.inspect_container(self.container_id)
            env = dict(item.split("=", 1) for item in (info.get("Config") or {}).get("Env") or [] if "=" in item)
            if (info.get("HostConfig") or {}).get("Runtime") != name or \
                    env.get(restore_runtime.REQUEST_ENV) != self.snapshot_dir:
                raise ParameterError(
                    "container: %r exists but was not created with --runtime %s and %s=%s, so the runtime would "
                    "not restore it; remove it and let this module create it, or use method=docker"
                    % (self.params["container"], name, restore_runtime.REQUEST_ENV, self.snapshot_dir))
            return
        record = host.read_container_record(self.snapshot_dir)
        record = dict(record, host_config=dict(record["host_config"], Runtime=name))
        env = dict(self.params["env"])
        env[restore_runtime.REQUEST_ENV] = self.snapshot_dir
        if not self.params["device_restore"]:
            env["INFEROPS_RESTORE_DEVICE"] = "false"
        self.docker.run(host.create_args(record, self.params["container"], env))
        self.container_id = self.docker.container_id(self.params["container"])
        self.created = True

    def start_through_runtime(self):
        """`docker start`; the runtime restores (or starts cold) inside it. Returns what it recorded."""
        before = (snapshot.read_status(self.snapshot_dir) or {}).get("last_restore")
        host.run_timed(self.module, [self.docker.executable, "start", self.container_id], self.params["timeout"],
                       "docker start with the restore-on-create runtime")
        last = (snapshot.read_status(self.snapshot_dir) or {}).get("last_restore")
        if last and last != before and last.get("container") == self.container_id:
            return last
        # No status record (the runtime refused the path, or could not write it): ask the metadata file.
        metadata = restore_runtime.read_metadata(self.docker.running_pid(self.container_id),
                                                 self.params["metadata_path"])
        if metadata and metadata.get("container_id") == self.container_id:
            return {"container": self.container_id, "outcome": "restored" if metadata.get("restored") else "cold",
                    "reason": metadata.get("reason"), "source": "metadata file"}
        return {"container": self.container_id, "outcome": "unknown",
                "reason": "runtime %r recorded nothing for this container; is it the inferops restore-on-create "
                          "runtime?" % self.params["runtime_name"]}

    def env_keys(self):
        info = self.docker.inspect_container(self.container_id)
        return sorted(item.split("=", 1)[0] for item in (info.get("Config") or {}).get("Env") or [] if "=" in item)

    def cold_start(self):
        state = (self.docker.inspect_container(self.container_id).get("State") or {})
        if state.get("Running"):
            self.docker.run(["stop", "--time", "10", self.container_id])  # a half-restored process
        host.run_timed(self.module, [self.docker.executable, "start", self.container_id], self.params["timeout"],
                       "docker start (cold)")


def restore_bare(module):
    """engine=criu: verify, check the engine and the pids, CRIU restore detached, device resume, health; or cold."""
    params = module.params
    started = time.monotonic()
    watch = Stopwatch()
    snapshot_dir = paths.validate_snapshot_dir(params["snapshot_dir"])
    schema.validate("manifest", params["identity"], "identity", definition="identity")
    result = dict(snapshot_dir=snapshot_dir, durations=watch.durations)

    running = bare.running_from_snapshot(snapshot_dir)
    if running:
        module.exit_json(changed=False, restored=None, pid=running["pid"], verify=None,
                         reason="pid %d, %s from this snapshot at %s, is still running"
                                % (running["pid"], "restored" if running["outcome"] == "restored" else "started cold",
                                   running["at"]), **result)

    with watch.stage("verify"):
        verdict = verify_snapshot(module, snapshot_dir, bare.ENGINE)
        reason = None if verdict["valid"] else use_snapshot_reason(verdict)
        tree = None
        if verdict["valid"]:
            tree, reason = bare.obstacle(snapshot_dir)
    result.update(verify=verdict)
    if reason and not params["cold_start"]:
        raise ParameterError("cold_start: %s cannot be restored (%s) and there is no cold_start command to start the "
                             "process normally; fix the reason or give cold_start" % (snapshot_dir, reason),
                             restored=False, reason=reason, **result)
    if module.check_mode:
        module.exit_json(changed=True, restored=reason is None, reason=reason, **result)

    env_keys = pid = pid_start = None
    if reason is None:
        with watch.stage("prepare"):
            env_keys = bare.write_metadata(params["metadata_path"], params["env"], True, snapshot_dir)
        try:
            with watch.stage("host_restore"):
                pid = CriuCli(module).restore_detached(host.images_dir(snapshot_dir), params["timeout"], tree[0][0])
            pid_start = bare.start_time(pid)
            if params["device_restore"]:
                with watch.stage("device_restore"):
                    result["device_actions"] = device_resume_pid(pid, params["agent_socket_dir"], params["timeout"])
        except SnapshotError as exc:
            reason = "restore failed, cold start instead: %s" % exc.msg
            if pid:  # a half-restored process holds the pids and ports a cold start needs
                bare.stop(pid, pid_start)
            if not params["cold_start"]:
                exc.result.update(result, restored=False, reason=reason)
                raise
            module.warn(reason)
    restored = reason is None
    proc = None
    if not restored:
        with watch.stage("cold_start"):
            env_keys = bare.write_metadata(params["metadata_path"], params["env"], False, snapshot_dir)
            env = dict(os.environ)
            env.update(params["env"])
            proc = bare.start_detached(params["cold_start"], env, params["cold_start_log"])
            pid = proc.pid
    bare.record(snapshot_dir, "restored" if restored else "cold", pid, reason, watch.durations)
    if params["health_url"]:
        def gone():
            code = proc.poll() if proc else (None if bare.alive(pid) else "gone")
            return None if code is None else "process %d exited (%s)" % (pid, code)
        with watch.stage("health"):
            wait_healthy(params["health_url"], params["health_timeout"], gone=gone)
    watch.durations["total"] = round(time.monotonic() - started, 6)
    module.exit_json(changed=True, restored=restored, reason=reason, pid=pid, metadata_env_keys=env_keys, **result)


def device_resume_pid(pid, agent_socket_dir, timeout):
    """Restore and unlock the device state of the restored process ``pid`` through its agent."""
    client = control.AgentSocketClient(control.agent_socket_for_pid(pid, agent_socket_dir))
    deadline = time.monotonic() + timeout
    while not os.path.exists(client.path):  # the restored agent socket comes back with the process
        if time.monotonic() > deadline:
            raise SnapshotTimeout("the restored process's agent socket %s did not appear" % client.path)
        time.sleep(0.05)
    actions, reply = device.resume(client, timeout)
    return actions


def check_engine_options(params):
    """Options that belong to one engine only: say so, naming the field."""
    if params["engine"] == bare.ENGINE:
        for name, wrong in (("container", params["container"]), ("method", params["method"] == "runtime")):
            if wrong:
                raise ParameterError("%s: only for engine=docker; engine=criu restores the bare process recorded in "
                                     "the snapshot" % name)
    elif params["cold_start"] or params["cold_start_log"]:
        raise ParameterError("%s: only for engine=criu; with engine=docker the container itself is started cold"
                             % ("cold_start" if params["cold_start"] else "cold_start_log"))


def main_logic(module):
    params = module.params
    check_engine_options(params)
    if params["engine"] == bare.ENGINE:
        return restore_bare(module)
    started = time.monotonic()
    job = Restorer(module)
    watch = job.watch
    result = dict(snapshot_dir=job.snapshot_dir, container=params["container"], durations=watch.durations)

    if job.container_id and (job.docker.inspect_container(job.container_id).get("State") or {}).get("Running"):
        module.exit_json(changed=False, restored=None, reason="container %s is already running" % params["container"],
                         verify=None, container_id=job.container_id, created=False, **result)

    with watch.stage("verify"):
        verdict = job.verdict = job.verify()
    reason = None if verdict["valid"] else use_snapshot_reason(verdict)
    result.update(verify=verdict)
    if module.check_mode:
        module.exit_json(changed=True, restored=verdict["valid"], reason=reason, **result)

    if verdict["valid"] and params["method"] == "runtime":
        with watch.stage("prepare"):
            job.require_runtime()
            job.ensure_runtime_container()
        with watch.stage("host_restore"):  # the runtime restores host and device state within the start
            record = job.start_through_runtime()
        restored = record.get("outcome") == "restored"
        reason = None if restored else "the restore-on-create runtime started the container cold: %s" % record.get("reason")
        if not restored:
            module.warn(reason)
        if params["health_url"]:
            with watch.stage("health"):
                wait_healthy(params["health_url"], params["health_timeout"])
        watch.durations["total"] = round(time.monotonic() - started, 6)
        module.exit_json(changed=True, restored=restored, reason=reason, container_id=job.container_id,
                         created=job.created, metadata_env_keys=job.env_keys(), placement="runtime",
                         runtime_record=record, **result)

    restored = False
    with watch.stage("prepare"):
        job.ensure_container(verdict["valid"])
        env_keys = job.write_metadata(restored=verdict["valid"])
    if verdict["valid"]:
        try:
            with watch.stage("host_restore"):
                result["placement"] = job.start_from_checkpoint()
            if params["device_restore"]:
                with watch.stage("device_restore"):
                    result["device_actions"] = job.device_resume()
            restored = True
        except SnapshotError as exc:
            reason = "restore failed, cold start instead: %s" % exc.msg
            module.warn(reason)
            job.write_metadata(restored=False)
    if not restored:
        with watch.stage("cold_start"):
            job.cold_start()
    if params["health_url"]:
        with watch.stage("health"):
            wait_healthy(params["health_url"], params["health_timeout"])
    watch.durations["total"] = round(time.monotonic() - started, 6)
    module.exit_json(changed=True, restored=restored, reason=reason, container_id=job.container_id,
                     created=job.created, metadata_env_keys=env_keys, **result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            snapshot_dir=dict(type="path", required=True),
            identity=dict(type="dict", required=True, options=IDENTITY_OPTIONS),
            engine=dict(type="str", default="docker", choices=["docker", "criu"]),
            container=dict(type="str"),
            env=dict(type="dict", default={}, no_log=True),
            metadata_path=dict(type="path", default="/run/inferops-snapshot/metadata.json"),
            health_url=dict(type="str"),
            health_timeout=dict(type="float", default=600.0),
            timeout=dict(type="float", default=120.0),
            min_size=dict(type="int", default=1024),
            criu_version=dict(type="str", default="auto"),
            runtime_version=dict(type="str"),
            device_restore=dict(type="bool", default=True),
            agent_socket_dir=dict(type="path", default=control.DEFAULT_AGENT_SOCKET_DIR),
            docker_cli=dict(type="str", default="docker"),
            workers=dict(type="int"),
            method=dict(type="str", default="docker", choices=["docker", "runtime"]),
            runtime_name=dict(type="str", default="inferops-restore"),
            cold_start=dict(type="list", elements="str"),
            cold_start_log=dict(type="path"),
        ),
        required_if=[("engine", "docker", ("container",))],
        supports_check_mode=True,
    )
    if not schema.HAS_JSONSCHEMA:
        module.fail_json(msg=missing_required_lib("jsonschema"), exception=schema.JSONSCHEMA_IMPORT_ERROR)
    if not module.params["metadata_path"].startswith("/") or module.params["metadata_path"].endswith("/"):
        module.fail_json(msg="metadata_path: give an absolute file path inside the container")
    run_module(module, main_logic)


if __name__ == "__main__":
    main()

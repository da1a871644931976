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
    details: A container that is already running is left alone.
options:
  snapshot_dir:
    description: The published snapshot of this pod.
    type: path
    required: true
  container:
    description: Name of the recreated container.
    type: str
    required: true
  env:
    description:
      - Environment of the recreated container, merged over the recorded one when the module creates it.
        Written to the metadata file either way. Values are never returned or logged.
    type: dict
    default: {}
  metadata_path:
    description: Path inside the container of the metadata file the engine reads its new environment from.
    type: path
    default: /run/inferops-snapshot/metadata.json
  health_url:
    description: HTTP URL that answers 200 once the engine serves; waited for after the start.
    type: str
  health_timeout:
    description: Seconds to wait for O(health_url).
    type: float
    default: 600
  timeout:
    description: Seconds each restore step (host start, device restore) may take.
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
    description: Where the engine's agent keeps its socket, inside the container.
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
      - V(docker) places the CRIU images in the container's C(checkpoints/) directory and runs
        C(docker start --checkpoint) (needs dockerd's experimental mode).
      - V(runtime) creates the container with C(--runtime) O(runtime_name) and C(INFEROPS_RESTORE_FROM) and
        starts it; the restore-on-create runtime verifies the snapshot again, restores host and device state,
        writes the metadata file, or starts the container cold. The snapshot must lie below one of the node's
        C(snapshot_node_snapshot_roots). An existing O(container) must have been created that way.
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
"""

RETURN = r"""
restored:
  description: Whether the container came back from the snapshot (false means a normal cold start).
  returned: always
  type: bool
  sample: true
reason:
  description: Why the snapshot was not used (null when it was).
  returned: always
  type: str
  sample: "checksum_mismatch: host/criu/pages-1.img"
verify:
  description: The verification result (valid, reasons, bytes, throughput_mb_s).
  returned: always
  type: dict
container_id:
  description: Id of the started container.
  returned: success
  type: str
created:
  description: Whether the module created the container from the snapshot's recorded configuration.
  returned: success
  type: bool
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
  description: Seconds per stage (C(verify), C(prepare), C(host_restore), C(device_restore), C(health)) and C(total).
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
from ansible_collections.inferops.snapshot.plugins.module_utils._docker import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import (
    CommandError,
    ParameterError,
    SnapshotError,
    SnapshotTimeout,
)

CHECKPOINT_NAME = "inferops-restore"


def wait_healthy(url, timeout, clock=time.monotonic, sleep=time.sleep):
    """Poll ``url`` until it answers 200; return seconds waited or raise SnapshotTimeout with the last state."""
    opener = build_opener(ProxyHandler({}))
    started = clock()
    last = None
    while True:
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


class Restorer:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.watch = Stopwatch()
        self.docker = DockerCli(module, self.params["docker_cli"])
        self.snapshot_dir = paths.validate_snapshot_dir(self.params["snapshot_dir"])
        schema.validate("manifest", self.params["identity"], "identity", definition="identity")
        self.created = False
        self.container_id = self.docker.container_id(self.params["container"])

    def verify(self):
        params = self.params
        expect = {"identity": params["identity"], "runtime_version": params["runtime_version"],
                  "criu_version": None if params["criu_version"] == "skip" else (
                      CriuCli(self.module).version() if params["criu_version"] == "auto" else params["criu_version"])}
        if self.container_id:
            expect["image_id"] = self.docker.inspect_container(self.container_id)["Image"]
        valid, reasons, details = manifest_utils.verify(self.snapshot_dir, params["min_size"], expect,
                                                        params["workers"])
        if valid and not self.container_id:
            recorded = host.read_container_record(self.snapshot_dir)
            rc, out, err = self.docker.run(["image", "inspect", "--format", "{{.Id}}", recorded["image_id"]],
                                           check=False)
            if rc != 0:
                valid, reasons = False, ["image_mismatch: image %s recorded in the snapshot is not on this host"
                                         % recorded["image_id"]]
        hashing = details["hashing"] or {}
        return {"valid": valid, "reasons": reasons, "bytes": details["bytes"], "files": details["files"],
                "throughput_mb_s": hashing.get("throughput_mb_s")}

    def ensure_container(self, use_snapshot):
        if self.container_id:
            return
        if not use_snapshot:
            raise ParameterError(
                "container: %r does not exist and there is no valid snapshot to recreate it from; create it first "
                "(for example with community.docker.docker_container state=present)" % self.params["container"])
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
        target, how = host.place_checkpoint(self.snapshot_dir, self.container_id, CHECKPOINT_NAME)
        argv = [self.docker.executable, "start", "--checkpoint", CHECKPOINT_NAME, self.container_id]
        try:
            host.run_timed(self.module, argv, self.params["timeout"], "docker start --checkpoint")
        except CommandError as exc:
            # Seen after daemon restarts: containerd's content store already holds the upload. Once more.
            if "already exists" not in (exc.result.get("stderr") or ""):
                raise
            host.run_timed(self.module, argv, self.params["timeout"], "docker start --checkpoint (retry)")
        return how

    def device_resume(self):
        pid = self.docker.running_pid(self.container_id)
        client = control.AgentSocketClient(control.agent_socket_for_pid(pid, self.params["agent_socket_dir"]))
        deadline = time.monotonic() + self.params["timeout"]
        while not os.path.exists(client.path):  # the restored agent socket comes back with the process
            if time.monotonic() > deadline:
                raise SnapshotTimeout("the restored process's agent socket %s did not appear" % client.path)
            time.sleep(0.05)
        actions, reply = device.resume(client, self.params["timeout"])
        return actions

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


def main_logic(module):
    params = module.params
    started = time.monotonic()
    job = Restorer(module)
    watch = job.watch
    result = dict(snapshot_dir=job.snapshot_dir, container=params["container"], durations=watch.durations)

    if job.container_id and (job.docker.inspect_container(job.container_id).get("State") or {}).get("Running"):
        module.exit_json(changed=False, restored=None, reason="container %s is already running" % params["container"],
                         verify=None, container_id=job.container_id, created=False, **result)

    with watch.stage("verify"):
        verdict = job.verify()
    reason = None if verdict["valid"] else "; ".join(verdict["reasons"])
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
            container=dict(type="str", required=True),
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
        ),
        supports_check_mode=True,
    )
    if not schema.HAS_JSONSCHEMA:
        module.fail_json(msg=missing_required_lib("jsonschema"), exception=schema.JSONSCHEMA_IMPORT_ERROR)
    if not module.params["metadata_path"].startswith("/") or module.params["metadata_path"].endswith("/"):
        module.fail_json(msg="metadata_path: give an absolute file path inside the container")
    run_module(module, main_logic)


if __name__ == "__main__":
    main()

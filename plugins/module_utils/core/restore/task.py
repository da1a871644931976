# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one ``snapshot_restore`` task does, for each engine and method. PRIVATE to inferops.snapshot.

The module hands its parameters here (as community.docker's modules hand over to an engine driver):
leave a running engine alone, choose the driver (docker start --checkpoint, the hand-over to the node's
runtime, a bare process), run the restore pipeline with it, wait until the engine serves, and say what
happened and why.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..base import layout, schema
from ..base.errors import ParameterError
from ..clients import engine_http
from ..clients.docker_cli import DockerCli, env_dict
from ..linux import fs, paths
from ..store import fleet
from . import bare, cache, health, interrupted, pipeline, reseed, verify
from .attempt import Trust, new_attempt
from .checkpoint import DockerCheckpoint
from .handover import Handover, covers, runtime_settings


def check_options(params):
    """Options that belong to one engine only, and values that cannot work: say so, naming the field."""
    if params["engine"] == bare.ENGINE:
        for name, wrong in (("container", params["container"]), ("method", params["method"] == "runtime")):
            if wrong:
                raise ParameterError("%s: only for engine=docker; engine=criu restores the bare process recorded in "
                                     "the snapshot" % name)
    elif params["cold_start"] or params["cold_start_log"]:
        raise ParameterError("%s: only for engine=criu; with engine=docker the container itself is started cold"
                             % ("cold_start" if params["cold_start"] else "cold_start_log"))
    for name in ("timeout", "health_timeout"):
        if not params[name] > 0:
            raise ParameterError("%s: must be a positive number of seconds, got %s" % (name, params[name]), field=name)
    if params["health_url"] is not None:
        engine_http.check_url(params["health_url"], "health_url")
    metadata_path = params["metadata_path"]
    if not metadata_path.startswith("/") or metadata_path.endswith("/") or ".." in metadata_path.split("/"):
        raise ParameterError("metadata_path: give an absolute file path (without '..') inside the container")
    if params.get("docker_path_max_bytes") is not None and params["docker_path_max_bytes"] < 0:
        raise ParameterError("docker_path_max_bytes: must be 0 (never the Docker path) or more bytes, got %d"
                             % params["docker_path_max_bytes"], field="docker_path_max_bytes")
    for name, what in (("container", "the name or id of the container"),
                       ("runtime_name", "the name of the restore-on-create runtime in dockerd, e.g. inferops-restore")):
        if params.get(name) is not None and not params[name].strip():
            raise ParameterError("%s: empty; give %s" % (name, what), field=name)
    generations = params.get("generations_file")
    if generations is not None and (not os.path.isabs(generations) or "\x00" in generations
                                    or generations.endswith("/")):
        raise ParameterError("generations_file: %r is not an absolute file path; give one like %s (a relative one "
                             "would be kept below the module's working directory)"
                             % (generations, layout.GENERATIONS_FILE), field="generations_file")
    for key in params.get("env") or {}:  # the names only: a value is never repeated
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key or "\n" in key:
            raise ParameterError("env: %r is no environment variable name; give names without '=', NUL or a line "
                                 "break, each with its value" % (key,), field="env")
    schema.validate("manifest", params["identity"], "identity", definition="identity")
    if params.get("stage_dir"):
        cache.check_root(params["stage_dir"])
    if params.get("source"):
        return clone_source(params)
    if not params["snapshot_dir"]:
        raise ParameterError("snapshot_dir: give the pod's snapshot (or source, to clone another instance's)",
                             field="snapshot_dir")
    return paths.validate_snapshot_dir(params["snapshot_dir"])


def clone_source(params):
    """A clone (fleet.py): the source's snapshot dir, with ``params['source_identity']`` set. Clones are restored by
    the node's runtime into a container the operator made for them (its own device, its own network namespace),
    which carries the request: anything else is refused here, naming the field, before anything is done."""
    wanted = params["source"]
    if params["method"] == "auto":
        params["method"] = "runtime"
    if params["engine"] != "docker" or params["method"] != "runtime":
        raise ParameterError("source: a clone is restored by the node's restore-on-create runtime: give engine=docker "
                             "and method=runtime (the runtime writes the clone's identity and nonce into its metadata "
                             "file and keeps two restores of one snapshot off one device)", field="source")
    identity = params["identity"]
    source, snapshot_dir = fleet.choose_source(wanted["root"], identity, wanted.get("instance"), wanted.get("pod"))
    refused = fleet.clone_reason(identity, source)
    if refused:
        raise ParameterError(refused, field="source")
    if params["snapshot_dir"] and os.path.normpath(params["snapshot_dir"]) != snapshot_dir:
        raise ParameterError("snapshot_dir: %s is not the source's snapshot %s; leave snapshot_dir out with source"
                             % (params["snapshot_dir"], snapshot_dir), field="snapshot_dir")
    params["source_identity"] = source
    return paths.validate_snapshot_dir(snapshot_dir, field="source")


def clone_request_problems(env, snapshot_dir, identity, source):
    """What the clone's container lacks for the runtime to restore it as the clone (names of the env entries)."""
    wanted = {layout.ENV_RESTORE_FROM: snapshot_dir, layout.ENV_RESTORE_IDENTITY: layout.identity_string(identity),
              layout.ENV_RESTORE_SOURCE: layout.identity_string(source)}
    return ["%s=%s" % (key, value) for key, value in sorted(wanted.items()) if env.get(key) != value]


def restore(params, check_mode=False, warn=lambda text: None):
    """The result of a snapshot_restore task (raises the collection's typed errors)."""
    snapshot_dir = check_options(params)
    trust = Trust.load(params)  # once: a key that cannot be loaded is an error before anything is done
    requirements(params)
    if params["engine"] == bare.ENGINE:
        return _bare(params, snapshot_dir, check_mode, warn, trust)
    docker = DockerCli(params["docker_cli"])
    chosen = {}
    if params["method"] == "auto":
        method, why = choose_method(params, snapshot_dir, docker)
        params = dict(params, method=DOCKER if method == COLD else method)
        chosen = dict(method=method, method_reason=why)
        if method == COLD:
            chosen["cold_because"] = why
    if params["method"] == RUNTIME:
        driver = _handover(params, snapshot_dir, docker)
    else:
        driver = DockerCheckpoint(docker, params["container"], cold_because=chosen.get("cold_because"),
                                  **_wishes(params))
        chosen.pop("cold_because", None)
    return dict(_container(params, snapshot_dir, driver, check_mode, warn, trust), **chosen)


DOCKER = "docker"    # snapshot_restore's methods
RUNTIME = "runtime"
COLD = "cold"        # what auto chooses where the only path would be slower than a cold start


def choose_method(params, snapshot_dir, docker):
    """method=auto: (method, why). The node's restore-on-create runtime is the fast path; ``docker start
    --checkpoint`` copies every image twice through containerd, so it is taken only up to
    ``docker_path_max_bytes`` -- above that a cold start is sooner (COLD, ``docker_path_slower_than_cold:``)."""
    name = params["runtime_name"]
    existing = docker.container_id(params["container"])
    if existing:
        runtime = (docker.inspect_container(existing).get("HostConfig") or {}).get("Runtime")
        if runtime == name:
            return RUNTIME, "container %s exists, created with the runtime %s" % (params["container"], name)
        return _docker_or_cold(params, snapshot_dir, "container %s exists, created with the runtime %s, not %s"
                               % (params["container"], runtime, name))
    known = docker.runtimes()
    if name not in known:
        return _docker_or_cold(params, snapshot_dir, "dockerd has no runtime %s; the snapshot_node role installs it "
                                                     "(the fast path)" % name)
    settings = runtime_settings(known[name])
    if settings is None:
        return _docker_or_cold(params, snapshot_dir, "the settings of the runtime %s (runtime.json) cannot be read"
                               % name)
    if not covers(settings, snapshot_dir):
        return _docker_or_cold(params, snapshot_dir, "the snapshot is below none of the runtime %s's snapshot roots "
                               "(%s; snapshot_node_snapshot_roots)" % (name, settings.get("snapshot_roots") or "none"))
    return RUNTIME, "the restore-on-create runtime %s is installed and its snapshot roots hold the snapshot" % name


def _docker_or_cold(params, snapshot_dir, why_not_runtime):
    size = fs.tree_bytes(snapshot_dir)
    limit = params.get("docker_path_max_bytes", 1 << 30)
    if size <= limit:
        return DOCKER, "%s; docker start --checkpoint for %d MiB (docker_path_max_bytes: %d MiB)" % (
            why_not_runtime, size >> 20, limit >> 20)
    return COLD, ("docker_path_slower_than_cold: %s, and docker start --checkpoint copies the images twice through "
                  "containerd: for %d MiB (more than docker_path_max_bytes, %d MiB) a cold start is sooner; install the "
                  "node runtime (snapshot_node) for the fast path" % (why_not_runtime, size >> 20, limit >> 20))


def _handover(params, snapshot_dir, docker):
    """The runtime's driver, once the request is one it can take: the runtime is installed, a container that exists
    was made for it, and a clone has a container of its own that carries the clone's request."""
    source = params.get("source_identity")
    driver = Handover(docker, params["container"], params["runtime_name"], params["device_restore"], source=source,
                      **_wishes(params))
    if source is not None:
        lacking = ["the container"] if not driver.container_id else clone_request_problems(
            env_dict((docker.inspect_container(driver.container_id).get("Config") or {}).get("Env")),
            snapshot_dir, params["identity"], source)
        if lacking:
            raise ParameterError(
                "container: a clone needs a container of its own, created with --runtime %s, its own device and its "
                "own network namespace (a clone on the source's device or port would break both), and the env %s; "
                "it lacks %s" % (params["runtime_name"], " ".join(clone_request_problems({}, snapshot_dir,
                                                                                         params["identity"], source)),
                                 ", ".join(lacking)), field="container")
    if not (driver.container_id and docker.is_running(driver.container_id)):
        driver.require(snapshot_dir)
    return driver


def _container(params, snapshot_dir, driver, check_mode, warn, trust):
    """A container's restore through ``driver`` (docker start --checkpoint, or the hand-over to the runtime)."""
    docker = driver.docker
    base = dict(snapshot_dir=snapshot_dir, container=params["container"])
    if params.get("source_identity") is not None:
        base["source"] = params["source_identity"]
    found = driver.interrupted_run(snapshot_dir) if isinstance(driver, DockerCheckpoint) else None
    if found and not found.gone:
        return dict(base, changed=False, restored=None, reason=interrupted.in_progress(found), verify=None,
                    container_id=driver.container_id, created=False, durations={})
    if found:
        base["interrupted"] = _take_over(driver, snapshot_dir, found, "container %s" % params["container"], check_mode,
                                         warn)
    elif driver.container_id and docker.is_running(driver.container_id):
        return dict(base, changed=False, restored=None, reason="container %s is already running" % params["container"],
                    verify=None, container_id=driver.container_id, created=False, durations={})
    # a hand-over raises no high-water mark: the runtime's own run does, with its settings
    attempt = new_attempt(snapshot_dir, params["timeout"], params, trust, params["device_restore"], check_mode,
                          keeps_record=not isinstance(driver, Handover))
    pipeline.run(driver, attempt)
    result = _result(attempt, base, warn)
    if check_mode:
        return result
    result.update(container_id=driver.container_id, created=driver.created)
    _wait_serving(params, attempt)
    return result


def _wishes(params):
    return dict((key, params[key]) for key in ("identity", "env", "metadata_path", "agent_socket_dir", "criu_version",
                                               "runtime_version"))


def requirements(params):
    """(require_signature, require_encryption) of this task: on as soon as a key is configured, unless turned off. A
    signature required with no key to check it against is a parameter error here (the runtime refuses the snapshot)."""
    trusted = params.get("trusted_keys") or []
    keys = params.get("encryption_keys") or []
    wanted = verify.requirements(trusted, keys, params.get("require_signature"), params.get("require_encryption"))
    if wanted[0] and not trusted:
        raise ParameterError("require_signature: %s, but no trusted_keys are given to check a signature with; give the "
                             "public key of the signing key (trusted_keys), or set require_signature=false to restore "
                             "unsigned snapshots" % ("is true" if params.get("require_signature") else
                                                     "is on because encryption_keys are given (any key turns it on)"),
                             field="require_signature")
    return wanted


def _result(attempt, base, warn):
    if attempt.reason and not attempt.check_mode:
        warn("cold start instead of a restore: %s" % attempt.reason)
    unauthenticated = verify.unauthenticated_warning(attempt.verdict, attempt.require_signature)
    if unauthenticated and attempt.restored:
        warn(unauthenticated)
    not_told = reseed.not_told(attempt.details.get("reseed"))
    if not_told and attempt.restored:
        warn(not_told)
    result = dict(base, changed=True, restored=attempt.restored, reason=attempt.reason, verify=attempt.verdict,
                  durations=attempt.watch.durations)
    for key in ("placement", "metadata_env_keys", "file_locks", "reseed", "runtime_record"):
        if key in attempt.details:
            result[key] = attempt.details[key]
    if attempt.device_actions is not None:
        result["device_actions"] = attempt.device_actions
    return result


def _take_over(driver, snapshot_dir, found, where, check_mode, warn):
    """A run killed after its host restore left a half-restored engine (interrupted.py): say what it found, and make
    way for a restore from the start (the driver's ``take_over``); the killed run's entry says so."""
    engine, done = driver.take_over(found, check_mode)
    what = "%s: %s; this run %s" % (where, interrupted.summary(engine), done)
    reason = interrupted.reason(found, what) if check_mode else interrupted.close(snapshot_dir, found, what)
    warn(reason)
    return {"at": found.entry.get("at"), "runner": found.entry.get("runner"), "gone": found.gone, "engine": engine,
            "done": done, "reason": reason}


def _wait_serving(params, attempt, gone=None):
    if params["health_url"]:
        with attempt.watch.timed("health"):
            health.wait_serving(params["health_url"], params["health_timeout"], gone=gone)
        attempt.watch.total()


def _bare(params, snapshot_dir, check_mode, warn, trust):
    base = dict(snapshot_dir=snapshot_dir)
    running = bare.running_from_snapshot(snapshot_dir)
    if running:
        return dict(base, changed=False, restored=None, pid=running["pid"], verify=None, durations={},
                    reason="pid %d, %s from this snapshot at %s, is still running"
                           % (running["pid"], "restored" if running["outcome"] == "restored" else "started cold",
                              running["at"]))
    driver = bare.BareProcess(params["cold_start"], params["cold_start_log"], **_wishes(params))
    found = interrupted.find(snapshot_dir, bare.ENGINE)
    if found and not found.gone:
        return dict(base, changed=False, restored=None, reason=interrupted.in_progress(found), verify=None,
                    durations={})
    if found:
        base["interrupted"] = _take_over(driver, snapshot_dir, found, "the process tree", check_mode, warn)
    attempt = new_attempt(snapshot_dir, params["timeout"], params, trust, params["device_restore"], check_mode)
    pipeline.run(driver, attempt)
    result = _result(attempt, base, warn)
    if check_mode:
        if attempt.reason and not params["cold_start"]:
            driver.cold_start(attempt)  # raises: no way to start it, say so before anything is done
        return result
    result["pid"] = attempt.pid
    _wait_serving(params, attempt, gone=lambda: driver.exited(attempt))
    result["durations"] = attempt.watch.durations
    return result

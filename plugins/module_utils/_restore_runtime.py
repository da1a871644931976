# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restore-on-create OCI runtime: the restore path. PRIVATE to the inferops.snapshot collection.

Docker and containerd call the runtime shim that the ``snapshot_node`` role installs
(``roles/snapshot_node/templates/inferops-restore-runtime.sh.j2``) exactly as they call runc. The
shim hands every call straight to runc except three, which come here (``main``):

``create`` of a container whose OCI config asks for a restore
    (annotation ``org.inferops.restore-from`` or env ``INFEROPS_RESTORE_FROM``): verify the snapshot
    with ``_manifest.verify`` (the same checks as snapshot_verify), ``runc restore --detach`` it
    within a time limit, write the metadata file with the new environment into the container,
    restore and unlock the device state through the agent inside the restored process, and record
    the container as restored. Anything wrong: undo what was done and ``exec runc create`` (a cold
    start), with the reason in the log and in the snapshot's status record.
``start`` of a container restored on create
    the process already runs: nothing to do.
``delete`` of a container this runtime holds state for
    runc delete, then drop that state (never through a mount).

Nothing here may write to stdout or stderr: those are the container's stdio pipes. Every attempt
appends one JSON line to the runtime's log; errors are logged, never raised to the caller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import signal
import subprocess
import time
import traceback

from ansible_collections.inferops.snapshot.plugins.module_utils import _criu as criu_utils
from ansible_collections.inferops.snapshot.plugins.module_utils import _host as host
from ansible_collections.inferops.snapshot.plugins.module_utils import _manifest as manifest_utils
from ansible_collections.inferops.snapshot.plugins.module_utils import _paths as paths
from ansible_collections.inferops.snapshot.plugins.module_utils import _snapshot as snapshot
from ansible_collections.inferops.snapshot.plugins.module_utils._device import utc_now
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import SnapshotError

REQUEST_ANNOTATION = "org.inferops.restore-from"
REQUEST_ENV = "INFEROPS_RESTORE_FROM"
# What a container's OCI config may carry: (setting, annotation, environment variable). The
# annotation wins when both are set: orchestrators set annotations, image authors set env.
REQUEST_KEYS = (
    ("snapshot", REQUEST_ANNOTATION, REQUEST_ENV),
    ("timeout", "org.inferops.restore-timeout", "INFEROPS_RESTORE_TIMEOUT"),
    ("policy", "org.inferops.restore-policy", "INFEROPS_RESTORE_POLICY"),
    ("identity", "org.inferops.restore-identity", "INFEROPS_RESTORE_IDENTITY"),
    ("device", "org.inferops.restore-device", "INFEROPS_RESTORE_DEVICE"),
    ("runtime_version", "org.inferops.restore-runtime-version", "INFEROPS_RESTORE_RUNTIME_VERSION"),
    ("image_id", "org.inferops.restore-image-id", None),
    ("metadata_file", "org.inferops.metadata-file", "INFEROPS_METADATA_FILE"),
    ("agent_socket_dir", "org.inferops.agent-socket-dir", "INFEROPS_AGENT_SOCKET_DIR"),
)
POLICIES = ("once", "always")

# Node settings (the role writes them to runtime.json; see roles/snapshot_node/defaults/main.yml).
DEFAULTS = {
    "runc": "/usr/bin/runc",
    "criu": None,                      # runc's --criu; None: runc finds criu on its PATH
    "state_dir": "/run/inferops-restore",
    "log_file": "/var/log/inferops-restore-runtime.log",
    "timeout": 60.0,
    "policy": "once",
    "snapshot_roots": ["/var/lib/inferops/snapshots"],
    "docker_root": host.DOCKER_ROOT,
    "min_size": 1024,
    "device_restore": True,
    "metadata_file": "/run/inferops-snapshot/metadata.json",
    "agent_socket_dir": "/run/inferops-snapshot",
}
ONCE_DIR = "restored-once"     # <state_dir>/restored-once/<id>: this container id was restored once
FAILED_DIR = "failed"          # <state_dir>/failed/<id>.<time>.restore.log: CRIU log tails of failed restores
RESTORED_FILE = "restored"     # <state_dir>/<id>/restored: the next `start` is a no-op
KEEP_FAILED_LOGS = 20
ONCE_MARKER_DAYS = 30
FAILED_LOG_TAIL = 1024 * 1024
STOP_GRACE = 10.0

# runc's global options that take a value (the subcommand is the first other non-option word).
GLOBAL_WITH_VALUE = ("--root", "--log", "--log-format", "--criu", "--rootless")
# create options runc restore accepts as well, and which of them take a value.
CREATE_VALUE_OPTIONS = ("--bundle", "-b", "--pid-file", "--console-socket", "--preserve-fds")
CREATE_FLAGS = ("--no-pivot", "--no-new-keyring")


class Fallback(Exception):
    """The snapshot cannot be used: start the container cold, for ``reason``."""

    def __init__(self, reason):
        super(Fallback, self).__init__(reason)
        self.reason = reason


def load_config(path):
    """Node settings from ``path`` (JSON) over DEFAULTS; a missing file gives the defaults."""
    config = dict(DEFAULTS)
    if path:
        try:
            with open(path) as handle:
                config.update(json.load(handle))
        except (IOError, OSError):
            pass
    config["timeout"] = float(config["timeout"])
    config["min_size"] = int(config["min_size"])
    if isinstance(config["snapshot_roots"], str):
        config["snapshot_roots"] = [config["snapshot_roots"]]
    return config


# -- argv ------------------------------------------------------------------------------------------

def split_argv(argv):
    """(global options, subcommand, the subcommand's arguments) of a runc command line."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word in GLOBAL_WITH_VALUE:
            index += 2
        elif word.startswith("-"):
            index += 1
        else:
            return list(argv[:index]), word, list(argv[index + 1:])
    return list(argv), None, []


def global_value(globals_, name, default=None):
    for index, word in enumerate(globals_):
        if word == name and index + 1 < len(globals_):
            return globals_[index + 1]
        if word.startswith(name + "="):
            return word[len(name) + 1:]
    return default


def parse_create(args):
    """Options of ``runc create``: dict with bundle, pid_file, console_socket, flags, unknown, id."""
    parsed = {"bundle": None, "pid_file": None, "console_socket": None, "preserve_fds": None, "flags": [],
              "unknown": [], "id": None}
    names = {"--bundle": "bundle", "-b": "bundle", "--pid-file": "pid_file", "--console-socket": "console_socket",
             "--preserve-fds": "preserve_fds"}
    index = 0
    while index < len(args):
        word = args[index]
        option, has_value, value = word.partition("=")
        if word in CREATE_VALUE_OPTIONS and index + 1 < len(args):
            parsed[names[word]] = args[index + 1]
            index += 2
            continue
        if has_value and option in CREATE_VALUE_OPTIONS:
            parsed[names[option]] = value
        elif word in CREATE_FLAGS:
            parsed["flags"].append(word)
        elif word.startswith("-"):
            parsed["unknown"].append(word)
        else:
            parsed["id"] = word
        index += 1
    return parsed


# -- the container's request -------------------------------------------------------------------------

def env_map(spec):
    env = {}
    for item in (spec.get("process") or {}).get("env") or []:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return env


def asks_for_restore(spec):
    annotations = spec.get("annotations") or {}
    return bool(annotations.get(REQUEST_ANNOTATION) or env_map(spec).get(REQUEST_ENV))


def _bool(text):
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false, got %r" % text)


def restore_request(spec, config):
    """What the container asks for, with the node's defaults filled in; None when it asks nothing.

    Values that cannot be parsed are returned in ``problems``: the attempt then starts cold, as an
    operator who asked for a check must not get a restore without it.
    """
    annotations = spec.get("annotations") or {}
    env = env_map(spec)
    raw = {}
    for key, annotation, variable in REQUEST_KEYS:
        if annotations.get(annotation) not in (None, ""):
            raw[key] = annotations[annotation]
        elif variable and env.get(variable) not in (None, ""):
            raw[key] = env[variable]
    if not raw.get("snapshot"):
        return None
    request = {"snapshot": raw["snapshot"], "timeout": config["timeout"], "policy": config["policy"],
               "identity": None, "device": config["device_restore"], "runtime_version": raw.get("runtime_version"),
               "image_id": raw.get("image_id"), "metadata_file": raw.get("metadata_file") or config["metadata_file"],
               "agent_socket_dir": raw.get("agent_socket_dir") or config["agent_socket_dir"], "problems": [],
               "annotated": sorted(key for key, annotation, _variable in REQUEST_KEYS if annotations.get(annotation))}
    problems = request["problems"]
    if "timeout" in raw:
        try:
            request["timeout"] = float(raw["timeout"])
            if not 0 < request["timeout"] <= 3600:
                raise ValueError
        except ValueError:
            problems.append("restore-timeout: %r is not a number of seconds in (0, 3600]" % raw["timeout"])
    if "policy" in raw:
        if raw["policy"] in POLICIES:
            request["policy"] = raw["policy"]
        else:
            problems.append("restore-policy: %r is not one of %s" % (raw["policy"], ", ".join(POLICIES)))
    if "device" in raw:
        try:
            request["device"] = _bool(raw["device"])
        except ValueError as exc:
            problems.append("restore-device: %s" % exc)
    if "identity" in raw:
        parts = raw["identity"].split("/")
        if len(parts) == 4 and all(parts):
            request["identity"] = dict(zip(("namespace", "service", "instance", "pod"), parts))
        else:
            problems.append("restore-identity: %r is not namespace/service/instance/pod" % raw["identity"])
    for key in ("metadata_file", "agent_socket_dir"):
        if not request[key].startswith("/") or ".." in request[key].split("/"):
            problems.append("%s: %r must be an absolute path without '..'" % (key, request[key]))
    return request


# -- small helpers -----------------------------------------------------------------------------------

class Log:
    """One JSON object per line, appended to the runtime's log file (0600). Never raises."""

    def __init__(self, path):
        self.path = path

    def write(self, record):
        try:
            line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
            directory = os.path.dirname(self.path)
            if directory and not os.path.isdir(directory):
                paths.ensure_dir(directory)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except Exception:  # logging must never break a container start
            pass

    def event(self, event, **fields):
        record = {"ts": utc_now(), "event": event, "pid": os.getpid()}
        record.update(fields)
        self.write(record)


def read_json(path):
    with open(path) as handle:
        return json.load(handle)


def docker_record(config, container_id):
    """Name and image id of a Docker container from dockerd's own record (config.v2.json).

    Read from disk: asking dockerd (docker inspect) from inside a runtime call would wait on the
    container lock dockerd holds while it starts the container.
    """
    if not re.match(r"^[0-9a-f]{64}$", container_id or ""):
        return {}
    try:
        record = read_json(os.path.join(config["docker_root"], "containers", container_id, "config.v2.json"))
    except (IOError, OSError, ValueError):
        return {}
    return {"name": (record.get("Name") or "").lstrip("/") or None, "image_id": record.get("Image")}


def criu_version(config):
    argv = [config["criu"] or "criu", "--version"]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parsed = criu_utils.parse_version(proc.stdout.decode("utf-8", "replace"))
    return ".".join(str(part) for part in parsed) if parsed else None


def proc_children():
    """{ppid: [pid, ...]} of every process, from /proc."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as handle:
                stat = handle.read()
        except (IOError, OSError):
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(name))
    return children


def descendants(pid, children=None):
    children = proc_children() if children is None else children
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (IOError, OSError):
        return False


def kill_quietly(pids, sig=signal.SIGKILL):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def tail_bytes(path, limit):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read()
    except (IOError, OSError):
        return b""


# CRIU error lines that are not the cause: a harmless early one, and the unwinding after the cause.
NOT_THE_CAUSE = ("rlimit: Can't setup RLIMIT_NOFILE", "Restoring FAILED", "cgroupd: recv req error")


def first_error_line(log_bytes):
    """The cause in a CRIU log: its first error line that is not known noise or unwinding."""
    for line in log_bytes.decode("utf-8", "replace").splitlines():
        if "Error (" in line and not any(noise in line for noise in NOT_THE_CAUSE):
            return line.strip()[:300]
    return None


def open_dirs_in_root(root_fd, parts, uid=None, gid=None, create=True):
    """An fd of the directory ``parts`` below ``root_fd``, created 0700 where missing; no symlink followed.

    An image or a process cannot redirect the walk out of its root with a planted link.
    """
    if ".." in parts:
        raise ValueError("bad path %r" % "/".join(parts))
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                nxt = os.open(part, flags, dir_fd=fd)
                if uid is not None:
                    os.fchown(nxt, uid, gid if gid is not None else -1)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_in_root(root_fd, inner_path, data, uid=None, gid=None):
    """Write ``data`` at ``inner_path`` below ``root_fd`` without ever following a symlink.

    The file is written through a temporary name and renamed; missing directories are created 0700.
    """
    parts = [part for part in inner_path.split("/") if part]
    if not parts:
        raise ValueError("bad path %r" % inner_path)
    fd = open_dirs_in_root(root_fd, parts[:-1], uid, gid)
    try:
        name = parts[-1]
        tmp = ".%s.tmp.%d" % (name, os.getpid())
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600,
                      dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            if uid is not None:
                os.fchown(out, uid, gid if gid is not None else -1)
            os.fsync(out)
        finally:
            os.close(out)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def read_metadata(pid, inner_path):
    """The metadata file the runtime wrote into a running container (via /proc/PID/root), or None."""
    parts = [part for part in inner_path.split("/") if part]
    try:
        root_fd = os.open("/proc/%d/root" % pid, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        try:
            directory = open_dirs_in_root(root_fd, parts[:-1], create=False)
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=directory)
            finally:
                os.close(directory)
            with os.fdopen(fd, "rb") as handle:
                return json.loads(handle.read(1024 * 1024).decode("utf-8"))
        finally:
            os.close(root_fd)
    except (IOError, OSError, ValueError, IndexError):
        return None


def restored_process_paths(request, recorded_env, config):
    """(metadata file, agent socket dir) as the *restored* process sees them.

    It keeps the environment it was checkpointed with, so unless an annotation says otherwise,
    its old environment (recorded in the snapshot's host/container.json) decides, not the new one.
    """
    found = []
    for key, variable in (("metadata_file", "INFEROPS_METADATA_FILE"), ("agent_socket_dir", "INFEROPS_AGENT_SOCKET_DIR")):
        value = request[key] if key in request["annotated"] else (recorded_env.get(variable) or config[key])
        if not value.startswith("/") or ".." in value.split("/"):
            raise Fallback("bad_request: %s of the snapshotted process, %r, is not an absolute path" % (variable, value))
        found.append(value)
    return tuple(found)


def under_mount(spec, inner_path):
    """The mount destination of the OCI config that would hide ``inner_path`` in the rootfs, if any."""
    best = None
    for mount in spec.get("mounts") or []:
        dest = (mount.get("destination") or "").rstrip("/") or "/"
        if dest != "/" and (inner_path == dest or inner_path.startswith(dest + "/")):
            if best is None or len(dest) > len(best):
                best = dest
    return best


# -- the runtime ----------------------------------------------------------------------------------

class Runtime:
    def __init__(self, config, argv, execv=os.execv, clock=time.monotonic):
        self.config = config
        self.argv = list(argv)
        self.globals, self.command, self.args = split_argv(argv)
        self.log = Log(config["log_file"])
        self._execv = execv
        self._clock = clock

    # runc ------------------------------------------------------------------------------------------
    def runc_argv(self, *args):
        return [self.config["runc"]] + self.globals + list(args)

    def exec_runc(self, argv=None):
        argv = argv or [self.config["runc"]] + self.argv
        self._execv(argv[0], argv)
        return 127  # only reached when execv is replaced (tests)

    def run_runc(self, *args, **kwargs):
        """Run runc with the caller's stdio (the container's); its output never reaches us."""
        try:
            return subprocess.call(self.runc_argv(*args), **kwargs)
        except OSError:
            return 127

    @property
    def runc_root(self):
        return global_value(self.globals, "--root", "/run/runc")

    def state_path(self, *parts):
        return os.path.join(self.config["state_dir"], *parts)

    # entry point -----------------------------------------------------------------------------------
    def main(self):
        try:
            if self.command == "create":
                return self.create()
            if self.command == "start":
                return self.start()
            if self.command == "delete":
                return self.delete()
        except Exception:  # a bug here must never cost the container: log it, behave like runc
            self.log.event("error", command=self.command, traceback=traceback.format_exc()[-4000:])
            if self.command == "create" and getattr(self, "_restore_started", False):
                self._undo_restore(getattr(self, "_create", {}).get("id"))
        return self.exec_runc()

    def start(self):
        container_id = self.args[-1] if self.args else None
        marker = self.state_path(container_id or "-", RESTORED_FILE)
        if container_id and os.path.exists(marker):
            os.unlink(marker)
            self.log.event("start", container=container_id, action="noop: restored on create, already running")
            return 0
        return self.exec_runc()

    def delete(self):
        container_id = self.args[-1] if self.args else None
        rc = self.run_runc("delete", *self.args)
        if container_id and rc == 0:
            self._drop_state(container_id)
        return rc

    def _drop_state(self, container_id):
        path = self.state_path(container_id)
        if os.path.isdir(path) and not criu_utils.remove_work_dir(path):
            self.log.event("cleanup", container=container_id,
                           action="left %s in place: mounts below it (%s)" % (path, criu_utils.mounts_below(path)))

    # create ----------------------------------------------------------------------------------------
    def create(self):
        started = self._clock()
        create = parse_create(self.args)
        self._create = create
        bundle = create["bundle"] or os.getcwd()
        try:
            spec = read_json(os.path.join(bundle, "config.json"))
        except (IOError, OSError, ValueError):
            return self.exec_runc()
        request = restore_request(spec, self.config)
        if request is None or not create["id"]:
            return self.exec_runc()
        container_id = create["id"]
        docker = docker_record(self.config, container_id)
        record = {"container": container_id, "name": docker.get("name"), "snapshot": request["snapshot"],
                  "outcome": None, "reason": None, "policy": request["policy"], "durations": {}}
        durations = record["durations"]
        snapshot_dir = None
        self._restore_started = False
        try:
            mark = self._clock()
            snapshot_dir = self.check_request(request, create, container_id)
            durations["prepare"] = round(self._clock() - mark, 6)
            mark = self._clock()
            manifest, verified = self.verify(snapshot_dir, request, docker)
            record["verify"] = verified
            durations["verify"] = round(self._clock() - mark, 6)
            try:
                recorded = host.read_container_record(snapshot_dir)
                old_env = env_map({"process": {"env": (recorded.get("config") or {}).get("Env") or []}})
            except (IOError, OSError, ValueError):
                old_env = {}
            restored_request = dict(request)
            restored_request["metadata_file"], restored_request["agent_socket_dir"] = restored_process_paths(
                request, old_env, self.config)
            deadline = self._clock() + request["timeout"]
            mark = self._clock()
            self.prepare_rootfs(spec, bundle, restored_request)
            self._restore_started = True
            pid = self.host_restore(snapshot_dir, create, bundle, deadline)
            durations["host_restore"] = round(self._clock() - mark, 6)
            record["restored_pid"] = pid
            stage = "metadata_failed"
            try:
                mark = self._clock()
                self.write_metadata(spec, restored_request, record, snapshot_dir, restored=True, pid=pid)
                durations["metadata"] = round(self._clock() - mark, 6)
                stage = "device_restore_failed"
                if request["device"] and manifest.get("device"):
                    mark = self._clock()
                    record["device_actions"] = self.device_resume(pid, restored_request, deadline)
                    durations["device_restore"] = round(self._clock() - mark, 6)
                else:
                    record["device_actions"] = None  # no device part, or device restore turned off
            except Exception as exc:  # the restored process must not stay: undo, then start cold
                self._undo_restore(container_id)
                if isinstance(exc, Fallback):
                    raise
                raise Fallback("%s: %s" % (stage, getattr(exc, "msg", exc)))
            paths.ensure_dir(self.state_path(container_id))
            with open(self.state_path(container_id, RESTORED_FILE), "w"):
                pass
            if request["policy"] == "once":
                paths.ensure_dir(self.state_path(ONCE_DIR))
                with open(self.state_path(ONCE_DIR, container_id), "w") as handle:
                    handle.write(utc_now() + "\n")
            record["outcome"] = "restored"
        except Fallback as fallback:
            record["outcome"] = "cold"
            record["reason"] = fallback.reason
        durations["total"] = round(self._clock() - started, 6)
        self._finish(record, snapshot_dir)
        if record["outcome"] == "restored":
            return 0
        self._drop_state(container_id)
        self.write_metadata(spec, request, record, snapshot_dir, restored=False, rootfs=self._rootfs(spec, bundle))
        return self.exec_runc()

    def _finish(self, record, snapshot_dir):
        record.update(ts=utc_now(), event="restore", pid=os.getpid())
        self.log.write(record)
        if snapshot_dir and os.path.isdir(os.path.dirname(snapshot_dir)):
            keys = ("container", "name", "outcome", "reason", "durations", "restored_pid", "device_actions", "policy")
            entry = dict((key, record.get(key)) for key in keys)
            entry["at"] = record["ts"]
            entry["node"] = os.uname()[1]
            try:
                snapshot.record_restore(snapshot_dir, entry)
            except Exception as exc:  # the status record is informative; the restore stands
                self.log.event("status_write_failed", container=record["container"], error=str(exc))

    def check_request(self, request, create, container_id):
        """Everything that can be decided before touching the snapshot's contents."""
        if request["problems"]:
            raise Fallback("bad_request: %s" % "; ".join(request["problems"]))
        if create["unknown"] or create["preserve_fds"] or "--no-new-keyring" in create["flags"]:
            raise Fallback("unsupported: runc create options %s have no restore equivalent"
                           % (create["unknown"] + (["--preserve-fds"] if create["preserve_fds"] else [])
                              + [f for f in create["flags"] if f == "--no-new-keyring"]))
        if request["policy"] == "once" and os.path.exists(self.state_path(ONCE_DIR, container_id)):
            raise Fallback("policy_once: container %s was restored before; its restarts start cold (set "
                           "restore-policy=always to restore on every start)" % container_id[:12])
        self._prune()
        roots = self.config["snapshot_roots"] or []
        last = None
        for root in roots:
            try:
                return paths.validate_snapshot_dir(request["snapshot"], field="restore-from", root=root)
            except SnapshotError as exc:
                last = exc.msg
        if not roots:
            last = "no snapshot root is configured on this node (snapshot_node_snapshot_roots)"
        raise Fallback("unsafe_path: %s; allowed roots: %s" % (last, ", ".join(roots) or "none"))

    def verify(self, snapshot_dir, request, docker):
        image_id = request["image_id"] or docker.get("image_id")
        expect = {"identity": request["identity"], "image_id": image_id, "criu_version": criu_version(self.config),
                  "runtime_version": request["runtime_version"]}
        valid, reasons, details = manifest_utils.verify(snapshot_dir, self.config["min_size"], expect)
        hashing = details.get("hashing") or {}
        verified = {"valid": valid, "bytes": details.get("bytes"), "files": details.get("files"),
                    "throughput_mb_s": hashing.get("throughput_mb_s"), "image_checked": image_id is not None,
                    "identity_checked": request["identity"] is not None}
        if not valid:
            raise Fallback("; ".join(reasons))
        manifest = details["manifest"]
        if manifest["engine"]["name"] != "docker":
            raise Fallback("engine_mismatch: the snapshot holds a bare process (engine %s), not a container"
                           % manifest["engine"]["name"])
        if not os.path.isfile(os.path.join(host.images_dir(snapshot_dir), "inventory.img")):
            raise Fallback("incomplete: %s holds no CRIU images (inventory.img)" % host.images_dir(snapshot_dir))
        return manifest, verified

    def prepare_rootfs(self, spec, bundle, request):
        """Recreate what the process had made in its old container's writable layer and needs back.

        The new container's rootfs is the image's: the directory of the agent's listening socket
        (created at run time) is missing there, and CRIU cannot re-bind the socket without it.
        """
        inner = request["agent_socket_dir"]
        if under_mount(spec, inner):
            return  # a volume or tmpfs of the new container provides it
        user = (spec.get("process") or {}).get("user") or {}
        try:
            root_fd = os.open(self._rootfs(spec, bundle), os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
            try:
                os.close(open_dirs_in_root(root_fd, [p for p in inner.split("/") if p], user.get("uid"), user.get("gid")))
            finally:
                os.close(root_fd)
        except (IOError, OSError, ValueError) as exc:
            raise Fallback("rootfs: cannot create %s in the new container's rootfs: %s" % (inner, exc))

    def host_restore(self, snapshot_dir, create, bundle, deadline):
        """runc restore --detach within the deadline; returns the restored pid or raises Fallback."""
        container_id = create["id"]
        state = paths.ensure_dir(self.state_path(container_id))
        work = os.path.join(state, "work")
        if os.path.lexists(work) and not criu_utils.remove_work_dir(work):
            raise Fallback("busy: %s has mounts below it from an earlier restore; unmount them" % work)
        paths.ensure_dir(work)
        pid_file = create["pid_file"] or os.path.join(state, "restored.pid")
        args = ["restore", "--detach", "--image-path", host.images_dir(snapshot_dir), "--work-path", work,
                "--bundle", bundle, "--pid-file", pid_file]
        if create["console_socket"]:
            args += ["--console-socket", create["console_socket"]]
        if "--no-pivot" in create["flags"]:
            args.append("--no-pivot")
        args.append(container_id)
        argv = self.runc_argv(*args)
        if self.config.get("criu") and global_value(self.globals, "--criu") is None:
            argv[1:1] = ["--criu", self.config["criu"]]
        # The container's stdio is ours: runc hands it to CRIU for the restored process's pipes.
        proc = subprocess.Popen(argv, close_fds=False)
        remaining = max(0.1, deadline - self._clock())
        try:
            rc = proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            self.stop_restore(proc, container_id)
            self._save_failed_log(container_id, work)
            self._undo_restore(container_id)
            raise Fallback("timeout: runc restore did not finish within %.0f s and was stopped" % remaining)
        if rc != 0:
            failed_log = self._save_failed_log(container_id, work)
            detail = first_error_line(tail_bytes(os.path.join(work, "restore.log"), FAILED_LOG_TAIL))
            self._undo_restore(container_id)
            raise Fallback("criu_failed: runc restore exited %d%s (CRIU log: %s)"
                           % (rc, ": %s" % detail if detail else "", failed_log))
        try:
            with open(pid_file) as handle:
                pid = int(handle.read().strip())
        except (IOError, OSError, ValueError):
            self._undo_restore(container_id)
            raise Fallback("criu_failed: runc restore wrote no pid to %s" % pid_file)
        criu_utils.remove_work_dir(work)
        return pid

    def stop_restore(self, proc, container_id):
        """Stop a hung restore gently: kill the half-restored tasks (the leaves of runc's tree).

        CRIU then reports the restore failed and cleans up after itself (its cgroup yard, runc's
        criu-root mount). Only if runc is still there after STOP_GRACE is the whole tree killed;
        the mounts it leaves are unmounted (never removed through) by _undo_restore.
        """
        children = proc_children()
        tree = descendants(proc.pid, children)
        leaves = [pid for pid in tree if not children.get(pid)]
        self.log.event("restore_stop", container=container_id, action="killing the half-restored tasks",
                       pids=leaves)
        kill_quietly(leaves)
        try:
            proc.wait(timeout=STOP_GRACE)
            return
        except subprocess.TimeoutExpired:
            pass
        tree = descendants(proc.pid)
        self.log.event("restore_stop", container=container_id, action="runc still running, killing its tree",
                       pids=tree)
        kill_quietly(tree)
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass

    def _undo_restore(self, container_id):
        """Remove a half-done or rejected restore so that `runc create` of the same id can follow."""
        if not container_id:
            return
        try:
            state = read_json(os.path.join(self.runc_root, container_id, "state.json"))
            pid = state.get("init_process_pid")
        except (IOError, OSError, ValueError):
            pid = None
        if pid and alive(pid):
            self.run_runc("kill", container_id, "KILL", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = self._clock() + STOP_GRACE
            while alive(pid) and self._clock() < deadline:
                time.sleep(0.02)
        self.run_runc("delete", "--force", container_id, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
        work = self.state_path(container_id, "work")
        runc_state = os.path.join(self.runc_root, container_id)
        for base in (work, runc_state):
            for point in sorted(criu_utils.mounts_below(base), reverse=True):
                rc = subprocess.call(["umount", "-l", point], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
                self.log.event("cleanup", container=container_id, action="umount -l %s" % point, rc=rc)
        if os.path.isdir(runc_state) and not os.path.exists(os.path.join(runc_state, "state.json")):
            criu_utils.remove_work_dir(runc_state)
        if os.path.lexists(work) and not criu_utils.remove_work_dir(work):
            self.log.event("cleanup", container=container_id, action="left %s in place: mounts below it" % work)

    def _save_failed_log(self, container_id, work):
        data = tail_bytes(os.path.join(work, "restore.log"), FAILED_LOG_TAIL)
        if not data:
            return None
        directory = paths.ensure_dir(self.state_path(FAILED_DIR))
        target = os.path.join(directory, "%s.%d.restore.log" % (container_id, int(time.time())))
        paths.write_file_atomic(target, data)
        return target

    def _prune(self):
        """Forget old once-markers and keep only the newest failed-restore logs."""
        now = time.time()
        for directory, keep_newest in ((self.state_path(ONCE_DIR), None), (self.state_path(FAILED_DIR), KEEP_FAILED_LOGS)):
            try:
                entries = [os.path.join(directory, name) for name in os.listdir(directory)]
            except (IOError, OSError):
                continue
            entries.sort(key=lambda p: os.lstat(p).st_mtime)
            for index, path in enumerate(entries):
                old = now - os.lstat(path).st_mtime > ONCE_MARKER_DAYS * 86400
                extra = keep_newest is not None and index < len(entries) - keep_newest
                if old or extra:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass

    # after the process is back ---------------------------------------------------------------------
    def _rootfs(self, spec, bundle):
        root = (spec.get("root") or {}).get("path") or "rootfs"
        return root if os.path.isabs(root) else os.path.join(bundle, root)

    def write_metadata(self, spec, request, record, snapshot_dir, restored, pid=None, rootfs=None):
        """The new environment, where the engine reads it: a restored process keeps its old env.

        Restored: written through /proc/PID/root, which sees the container's own mounts. Cold:
        written into the rootfs before runc create (skipped when a mount of the config would
        hide it). Values are written only into the container, never logged.
        """
        inner = request["metadata_file"]
        user = (spec.get("process") or {}).get("user") or {}
        metadata = {"env": env_map(spec), "container": record.get("name") or record["container"],
                    "container_id": record["container"], "restored": restored,
                    "snapshot_dir": snapshot_dir or request["snapshot"], "reason": record.get("reason"),
                    "written_at": utc_now(), "written_by": "inferops restore runtime"}
        data = (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode("utf-8")
        if not restored:
            hidden = under_mount(spec, inner)
            if hidden:
                self.log.event("metadata", container=record["container"],
                               action="not written: %s is below the mount %s" % (inner, hidden))
                return
        try:
            root_fd = os.open("/proc/%d/root" % pid if restored else rootfs,
                              os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
            try:
                write_in_root(root_fd, inner, data, user.get("uid"), user.get("gid"))
            finally:
                os.close(root_fd)
        except (IOError, OSError, ValueError) as exc:
            if restored:
                raise Fallback("metadata_failed: cannot write %s into the restored container: %s" % (inner, exc))
            self.log.event("metadata", container=record["container"], action="not written: %s" % exc)

    def device_resume(self, pid, request, deadline):
        """RESTORE + UNLOCK through the agent inside the restored process (BACKED_UP -> RUNNING)."""
        # Imported here: only the restore path needs the control clients.
        from ansible_collections.inferops.snapshot.plugins.module_utils import _control as control
        from ansible_collections.inferops.snapshot.plugins.module_utils import _device as device

        client = control.AgentSocketClient(control.agent_socket_for_pid(pid, request["agent_socket_dir"]))
        while not os.path.exists(client.path):  # the restored listening socket comes back with the process
            if self._clock() > deadline:
                raise Fallback("device_restore_failed: the restored process's agent socket %s did not appear"
                               % client.path)
            time.sleep(0.01)
        actions, reply = device.resume(client, max(1.0, deadline - self._clock()))
        if reply.get("state") != "RUNNING":
            raise Fallback("device_restore_failed: the process is %s after %s, not RUNNING"
                           % (reply.get("state"), actions))
        return actions


def main(argv, config_path=None):
    """Run one runtime call (argv without the program name); returns the exit status."""
    config = load_config(config_path)
    return Runtime(config, argv).main()

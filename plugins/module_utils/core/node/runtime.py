# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restore-on-create OCI runtime: the restore path. PRIVATE to the inferops.snapshot collection.

Docker and containerd call the runtime shim that the ``snapshot_node`` role installs
(``roles/snapshot_node/templates/inferops-restore-runtime.sh.j2``) exactly as they call runc. The
shim hands every call straight to runc except three, which come here (``main``):

``create`` of a container whose OCI config asks for a restore
    (annotation ``org.inferops.restore-from`` or env ``INFEROPS_RESTORE_FROM``): the restore pipeline
    (core/restore/pipeline.py) with the on-create driver (core/restore/on_create.py) -- the same
    verification as every other path, ``runc restore --detach`` within a time limit, the metadata
    file with the new environment, the device state through the agent inside the restored process.
    Anything wrong: what was done is undone and the call becomes ``exec runc create`` (a cold start),
    with the reason in the log and in the snapshot's status record.
``start`` of a container restored on create
    the process already runs: nothing to do.
``delete`` of a container this runtime holds state for
    runc delete, then drop that state (never through a mount).

Nothing here may write to stdout or stderr: those are the container's stdio pipes. Every attempt
appends one JSON line to the runtime's log; errors are logged, never raised to the caller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import re
import stat
import time
import traceback

from ..base import layout
from ..base.errors import SnapshotError
from ..clients.containerd_cli import ContainerdCli, ContainerdError, cri_metadata
from ..clients.docker_cli import env_dict
from ..clients.runc_cli import RuncCli, split_argv
from ..linux import fs
from ..restore import pipeline
from ..restore.attempt import Trust, new_attempt
from ..restore.node_state import NodeState
from ..restore.on_create import OnCreate, Refused
from ..store import fleet

# Node settings (the role writes them to runtime.json; see roles/snapshot_node/defaults/main.yml).
DEFAULTS = layout.RUNTIME_DEFAULTS
REQUEST_KEYS = layout.RESTORE_REQUEST_KEYS
REQUEST_VALUE_LIMIT = 4096  # characters of one request value (a path is at most PATH_MAX, 4096)
POLICIES = layout.RESTORE_POLICIES
# create options runc restore accepts as well, and which of them take a value.
CREATE_VALUE_OPTIONS = ("--bundle", "-b", "--pid-file", "--console-socket", "--preserve-fds")
CREATE_FLAGS = ("--no-pivot", "--no-new-keyring")


def load_config(path):
    """Node settings from ``path`` (JSON) over DEFAULTS. ``unusable``: why a restore may not use them -- the file
    missing, unreadable, not root's, open to group or others, not a JSON object, or a value that does not parse --
    and then every restore is a cold start with it, never one under the defaults (which trust no key: a missing
    file turned signature checks off). A root file that nobody else can write still names the runc, log and state
    directory every call needs; otherwise those are the defaults. No ``path`` (tests): the defaults."""
    settings, unusable = (_read_settings(path) if path else ({}, None))
    try:
        config = _normalised(dict(DEFAULTS, **(settings or {})))
    except (TypeError, ValueError) as exc:
        config, unusable = _normalised(dict(DEFAULTS)), unusable or "%s holds a value that does not parse (%s)" % (
            path, exc)
    config["unusable"] = None if unusable is None else (
        "settings_unreadable: %s; every restore on this node starts cold until the snapshot_node role writes the "
        "runtime's settings again" % unusable)
    return config


def _read_settings(path):
    """(the settings in ``path``, or None when nothing of them may be used; why a restore may not use them, or None)."""
    try:
        fd = fs.open_regular(path)
    except (IOError, OSError) as exc:
        return None, "%s cannot be read (%s)" % (path, getattr(exc, "strerror", None) or exc)
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or st.st_mode & 0o022:
            return None, ("%s is owned by uid %d with mode %04o: the runtime takes its settings only from a file of "
                          "root's that nobody else can write (0600)" % (path, st.st_uid, stat.S_IMODE(st.st_mode)))
        data = fs.read_limited(fd, fs.RECORD_LIMIT, path)
    except (IOError, OSError, ValueError) as exc:
        return None, "%s cannot be read (%s)" % (path, exc)
    finally:
        os.close(fd)
    try:
        settings = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        return None, "%s is not JSON (%s): truncated, or edited by hand?" % (path, exc)
    if not isinstance(settings, dict):
        return None, "%s is not a JSON object" % path
    if st.st_mode & 0o077:  # keys may be in it as text
        return settings, "%s has mode %04o, not 0600: it may hold keys as text" % (path, stat.S_IMODE(st.st_mode))
    return settings, None


def _normalised(config):
    config["timeout"] = float(config["timeout"])
    config["min_size"] = int(config["min_size"])
    config["lazy_pages"] = str(config["lazy_pages"]).lower() in ("true", "1", "yes")
    config["tenants"] = _unset(config.get("tenants")) or str(config["tenants"]).lower() not in ("false", "0", "no", "off")
    for name in ("require_signature", "require_encryption"):  # unset: on with keys; only a clear no turns it off
        value = config.get(name)
        config[name] = None if _unset(value) else str(value).lower() not in ("false", "0", "no", "off")
    if isinstance(config["snapshot_roots"], str):
        config["snapshot_roots"] = [config["snapshot_roots"]]
    if _unset(config.get("generations_file")):  # never off
        config["generations_file"] = DEFAULTS["generations_file"]
    return config


def _unset(value):
    """A setting left empty (an older ansible-core templates a null as the text None)."""
    return value is None or str(value).strip().lower() in ("", "none", "null")


# -- argv ------------------------------------------------------------------------------------------

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
    return env_dict((spec.get("process") or {}).get("env"))


def asks_for_restore(spec):
    annotations = spec.get("annotations") or {}
    return bool(annotations.get(layout.ANNOTATION_RESTORE_FROM) or env_map(spec).get(layout.ENV_RESTORE_FROM))


def _bool(text):
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false, got %r" % text)


def requester(spec, labels=None):
    """(who asks, problems): the namespace, pod and container the container runtime says this container belongs to
    (layout.CRI_REQUESTER_KEYS in the OCI annotations; else, under cri-dockerd, layout.DOCKER_REQUESTER_LABELS in
    dockerd's ``labels`` of the container; None on a node without one), and why it cannot be trusted to ask."""
    annotations = spec.get("annotations") or {}
    found, problems = [], []
    sources = [(annotations, keys, "sandbox") for keys in layout.CRI_REQUESTER_KEYS]
    if isinstance(labels, dict):
        sources.append((labels, layout.DOCKER_REQUESTER_LABELS, "podsandbox"))
    for said, (runtime_name, namespace, pod, container, kind), sandbox in sources:
        if said.get(kind) == sandbox:
            problems.append("requester: %s says this is a pod sandbox (%s), which is never restored" % (runtime_name, kind))
        if said.get(namespace):
            found.append({"namespace": said[namespace], "pod": said.get(pod), "container": said.get(container),
                          "by": runtime_name})
    if len(set(item["namespace"] for item in found)) > 1:
        problems.append("requester: the container's annotations name namespaces %s; refusing to guess its tenant"
                        % " and ".join(sorted(set(item["namespace"] for item in found))))
    return (found[0] if found else None), problems


def sandbox(spec):
    """Whether the container runtime says this is a pod sandbox (the pause container), which never asks for a restore:
    its OCI config carries the pod's annotations that the runtime handler lets through, the restore request too."""
    annotations = spec.get("annotations") or {}
    return any(annotations.get(kind) == "sandbox" for _runtime, _ns, _pod, _container, kind in layout.CRI_REQUESTER_KEYS)


def cri_record(config, container_id, spec, cli=None):
    """What containerd's CRI plugin records of a container it created ({} for any other): the image it runs (the CRI's
    ``image_ref``, the image id) and the ``org.inferops.*`` annotations of its pod that its runtime handler did not
    let through to the OCI config (``dropped``); ``error`` when containerd cannot be asked -- then the image cannot be
    checked, and a restore must not go on unchecked."""
    annotations = spec.get("annotations") or {}
    runtime_name, namespace, pod, container, kind = layout.CRI_REQUESTER_KEYS[0]
    if annotations.get(kind) != "container":
        return {}
    name = "%s/%s/%s" % (annotations.get(namespace), annotations.get(pod), annotations.get(container))
    record = {"by": runtime_name, "name": name, "image_id": None, "networks": []}
    if _unset(config.get("containerd_socket")):
        return dict(record, error="the node's runtime settings name no containerd socket to ask (the snapshot_node "
                                  "role with snapshot_node_containerd=true sets it)")
    cli = cli or ContainerdCli(config["containerd_socket"], ctr=config.get("ctr") or "ctr")
    try:
        meta = cri_metadata(cli.container_record(container_id)) or {}
        if not meta.get("ImageRef"):
            return dict(record, error="containerd's record of container %s names no image" % container_id[:12])
        pod_meta = (cri_metadata(cli.container_record(meta["SandboxID"]), sandbox=True) if meta.get("SandboxID") else None) or {}
    except ContainerdError as exc:
        return dict(record, error=exc.msg)
    asked = ((pod_meta.get("Config") or {}).get("annotations")) or {}
    record.update(image_id=meta["ImageRef"], handler=pod_meta.get("RuntimeHandler"),
                  dropped=sorted(key for key in asked if key.startswith(layout.RESTORE_ANNOTATION_PREFIX)
                                 and key not in annotations))
    return record


def restore_request(spec, config):
    """What the container asks for, with the node's defaults filled in; None when it asks nothing.

    Values that cannot be parsed are returned in ``problems``: the attempt then starts cold, as an
    operator who asked for a check must not get a restore without it.
    """
    annotations = spec.get("annotations") or {}
    env = env_map(spec)
    raw, refused = {}, []
    for key, annotation, variable in REQUEST_KEYS:
        if annotations.get(annotation) not in (None, ""):
            raw[key] = annotations[annotation]
        elif variable and env.get(variable) not in (None, ""):
            raw[key] = env[variable]
    if not raw.get("snapshot"):
        return None
    # Every value below reaches the runtime's log (reasons, the restore record): one of any length or with line
    # breaks would let any container fill the node's disk or forge log lines. Refused without being repeated.
    for key in sorted(raw):
        if len(raw[key]) > REQUEST_VALUE_LIMIT or re.search(r"[\x00-\x1f\x7f]", raw[key]):
            refused.append("restore-%s: a value of %d characters%s is refused (at most %d, one line)"
                           % (key.replace("_", "-"), len(raw[key]),
                              " with control characters" if len(raw[key]) <= REQUEST_VALUE_LIMIT else "",
                              REQUEST_VALUE_LIMIT))
            if key == "snapshot":
                raw[key] = "(refused)"  # still a request: it starts cold with the reason
            else:
                del raw[key]
    request = {"snapshot": raw["snapshot"], "timeout": config["timeout"], "policy": config["policy"],
               "identity": None, "device": config["device_restore"], "strict": False,
               "runtime_version": raw.get("runtime_version"),
               "image_id": raw.get("image_id"), "checksum": raw.get("checksum"),
               "metadata_file": raw.get("metadata_file") or config["metadata_file"],
               "agent_socket_dir": raw.get("agent_socket_dir") or config["agent_socket_dir"], "problems": [],
               "annotated": sorted(key for key, annotation, _variable in REQUEST_KEYS if annotations.get(annotation))}
    problems = request["problems"]
    problems.extend(refused)
    request["requester"], refused = requester(spec)
    problems.extend(refused)
    if "timeout" in raw:
        try:
            asked = float(raw["timeout"])
            if not 0 < asked <= 3600:
                raise ValueError
            # never longer than the node allows: a restore holds the snapshot's leases and its plaintext meanwhile
            request["timeout"] = min(asked, config["timeout"])
        except ValueError:
            problems.append("restore-timeout: %r is not a number of seconds in (0, 3600]" % raw["timeout"])
    if "policy" in raw:
        if raw["policy"] in POLICIES:
            request["policy"] = raw["policy"]
        else:
            problems.append("restore-policy: %r is not one of %s" % (raw["policy"], ", ".join(POLICIES)))
    for key in ("device", "strict"):
        if key in raw:
            try:
                request[key] = _bool(raw[key])
            except ValueError as exc:
                problems.append("restore-%s: %s" % (key, exc))
    if "identity" in raw:
        parts = raw["identity"].split("/")
        if len(parts) == 4 and all(parts):
            request["identity"] = dict(zip(("namespace", "service", "instance", "pod"), parts))
        else:
            problems.append("restore-identity: %r is not namespace/service/instance/pod" % raw["identity"])
    if "source" in raw:  # a clone: the snapshot of another pod of the same service (fleet.py)
        try:
            request["source"] = fleet.parse_identity(raw["source"], "restore-source")
        except ValueError as exc:
            problems.append(str(exc))
    if request["checksum"] is not None and not re.match(r"^[0-9a-f]{64}$", request["checksum"]):
        problems.append("restore-checksum: %r is not a SHA-256 in hex" % request["checksum"])
    for key in ("metadata_file", "agent_socket_dir"):
        if not request[key].startswith("/") or ".." in request[key].split("/"):
            problems.append("%s: %r must be an absolute path without '..'" % (key, request[key]))
    return request


# -- small helpers -----------------------------------------------------------------------------------

# dockerd bind-mounts a container's /etc/hostname, /etc/hosts and /etc/resolv.conf from <data root>/containers/<id>/
# (under cri-dockerd, the pod sandbox's id): where its OCI config says dockerd keeps the container's record.
DOCKER_FILES = re.compile(r"^(/.+)/containers/[0-9a-f]{64}/(?:hostname|hosts|resolv\.conf)$")


def docker_roots(spec):
    """The data roots dockerd's own mounts in the OCI config name (none: a container dockerd did not create)."""
    return sorted(set(match.group(1) for match in (DOCKER_FILES.match(mount.get("source") or "")
                                                   for mount in spec.get("mounts") or [] if isinstance(mount, dict))
                      if match))


def docker_record(config, container_id, spec=None):
    """(name, image id, networks and labels of a Docker container from dockerd's own record (config.v2.json), or {}
    when there is none; why it cannot be used, or None). Read from disk: asking dockerd (docker inspect) from inside a
    runtime call would wait on the container lock dockerd holds while it starts the container. A record below
    another data root than dockerd's (its mounts say where), over the read limit or not a JSON object is refused,
    never taken for none: it says who asks (cri-dockerd's labels) and which image runs."""
    if not re.match(r"^[0-9a-f]{64}$", container_id or ""):
        return {}, None
    root = os.path.normpath(config["docker_root"])
    elsewhere = [found for found in docker_roots(spec or {}) if os.path.realpath(found) != os.path.realpath(root)]
    if elsewhere:
        return {}, ("docker_record: dockerd keeps container %s below %s (the OCI config mounts its files from there), "
                    "and this node's runtime reads dockerd's records below %s (runtime.json docker_root): run the "
                    "snapshot_node role again, which takes dockerd's data root from docker info"
                    % (container_id[:12], " and ".join(elsewhere), root))
    path = os.path.join(root, "containers", container_id, "config.v2.json")
    try:
        fd = fs.open_regular(path)
    except (IOError, OSError) as exc:
        if getattr(exc, "errno", None) == errno.ENOENT:
            return {}, None
        return {}, "docker_record: dockerd's record %s cannot be read: %s" % (path, exc)
    try:
        record = json.loads(fs.read_limited(fd, fs.RECORD_LIMIT, path).decode("utf-8"))
    except (IOError, OSError, ValueError) as exc:  # ValueError: over the limit too
        return {}, "docker_record: dockerd's record of container %s is refused, not read: %s" % (container_id[:12], exc)
    finally:
        os.close(fd)
    if not isinstance(record, dict):
        return {}, "docker_record: dockerd's record %s is not a JSON object" % path
    return {"name": (record.get("Name") or "").lstrip("/") or None, "image_id": record.get("Image"),
            "networks": sorted(((record.get("NetworkSettings") or {}).get("Networks") or {})),
            "labels": (record.get("Config") or {}).get("Labels") or {}}, None


def refusal(config, request, record, record_refused, container_id):
    """Why this node may not restore for this request at all, before anything of the snapshot is read: settings it
    cannot trust, dockerd's record it cannot read, or -- on a node with tenants -- a requester nobody can place in a
    namespace (no CRI annotations, no dockerd record); None when it may go on."""
    if config.get("unusable"):
        return config["unusable"]
    if record_refused:
        return record_refused
    if config["tenants"] and request["requester"] is None and not record:
        return ("requester_unknown: neither the OCI config's annotations (containerd, CRI-O) nor dockerd's record of "
                "container %s (below %s) say who asks, and this node has tenants (snapshot_node_tenants): a request "
                "that cannot be placed in a namespace restores nothing" % (container_id[:12], config["docker_root"]))
    return None


# -- the runtime ----------------------------------------------------------------------------------

class Runtime:
    """One call of the runtime: hands it to runc, or (create, start, delete of a container it restores) handles it
    with the node's state (restore/node_state.py) and the restore pipeline's on-create driver."""

    def __init__(self, config, argv, execv=os.execv, clock=time.monotonic):
        self.config = config
        self.argv = list(argv)
        self.globals, self.command, self.args = split_argv(argv)
        self.node = NodeState(config, RuncCli(config["runc"], self.globals, criu=config.get("criu")))
        self.runc = self.node.runc
        self.log = self.node.log
        self._execv = execv
        self._clock = clock

    def exec_runc(self):
        argv = self.runc.exec_argv(self.argv)
        self._execv(argv[0], argv)
        return 127  # only reached when execv is replaced (tests)

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
        return self.exec_runc()

    def start(self):
        container_id = self.args[-1] if self.args else None
        if self.node.take_start_marker(container_id):
            self.log.event("start", container=container_id, action="noop: restored on create, already running")
            return 0
        return self.exec_runc()

    def delete(self):
        container_id = self.args[-1] if self.args else None
        rc = self.runc.call("delete", *self.args, stdin=None, stdout=None, stderr=None)
        if container_id and rc == 0:
            self.node.drop_state(container_id)
        return rc

    # create ----------------------------------------------------------------------------------------
    def create(self):
        """The restore pipeline with the on-create driver, which writes its outcome (status record, log) and the
        markers of a restore that counts; anything but a restore is ``exec runc create`` (a cold start)."""
        create = parse_create(self.args)
        bundle = create["bundle"] or os.getcwd()
        spec = fs.read_json(os.path.join(bundle, "config.json"))
        if spec is None or sandbox(spec):
            return self.exec_runc()
        request = restore_request(spec, self.config)
        if request is None or not create["id"]:
            return self.exec_runc()
        record, record_refused = docker_record(self.config, create["id"], spec)
        if not record and record_refused is None:  # no dockerd record: containerd's CRI plugin may have one
            record = cri_record(self.config, create["id"], spec)
        if record.get("dropped"):  # the pod asked for more than reached the runtime: never restore without it
            request["problems"].append(
                "the pod's annotations %s did not reach the runtime: its runtime handler %s lets them through to the "
                "container's OCI config only with pod_annotations [\"%s*\"] (the snapshot_node role's handler has it)"
                % (", ".join(record["dropped"]), record.get("handler") or "(the node's default)",
                   layout.RESTORE_ANNOTATION_PREFIX))
        if request["requester"] is None:  # cri-dockerd: the kubelet's labels on the container say who asks
            request["requester"], refused = requester(spec, record.get("labels"))
            request["problems"].extend(problem for problem in refused if problem not in request["problems"])
        request["refused"] = refusal(self.config, request, record, record_refused, create["id"])
        driver = OnCreate(self.node, spec, bundle, create, request, record, self.node.criu.version())
        try:
            trust = Trust.load(self.config)
        except SnapshotError as exc:  # fail closed: without the keys it was told to use, nothing is restored
            request["problems"] = request["problems"] + ["keys_unavailable: %s" % exc.msg]
            trust = Trust.load(self.config, load_keys=False)
        attempt = new_attempt(request["snapshot"], request["timeout"], self.config, trust, request["device"],
                              checksum=request["checksum"])
        try:
            pipeline.run(driver, attempt)
        except Refused:  # recorded as failed by the driver's commit; the container does not start
            return 1
        return 0 if attempt.restored else self.exec_runc()


def main(argv, config_path=None):
    """Run one runtime call (argv without the program name); returns the exit status."""
    config = load_config(config_path)
    return Runtime(config, argv).main()

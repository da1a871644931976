# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for containerd: ``ctr``, containerd's own CLI, on the node's containerd socket (the socket that
serves the CRI too), in the CRI plugin's namespace. PRIVATE to the inferops.snapshot collection.

A pod's container on a containerd node is a containerd container in the namespace ``k8s.io``. The CRI plugin keeps
what ContainerStatus reports in the container's extension ``io.cri-containerd.container.metadata`` (JSON, version
``v1``: the image it runs as ``ImageRef`` -- the image's config digest, the CRI's ``image_ref`` and Docker's image id
--, the pod sandbox, the CRI's mounts and devices), and the runtime options of its handler in the container's runtime
record (runc's options, protobuf: ``root`` is where the shim runs runc, per namespace). ``cri_target`` reads both.

Why ``ctr`` and not the CRI's gRPC API or crictl: containerd 1.6 has no CRI checkpoint call (it came with 2.0), so the
CRI could only find the container, not checkpoint it; speaking its gRPC would make grpcio and generated stubs a
requirement of every node; crictl is not packaged for Debian 12. ``ctr`` comes with containerd itself (Debian's
package too) and reads the very records the CRI answers from. No ctr argv is built anywhere else.

For the node runtime and the snapshot_node role the same client asks containerd's own binary for its configuration
(``containerd config dump``: the main file and every file it imports, merged as the daemon will merge them at its next
start) and ``ctr`` which plugins the daemon loaded and the CRI plugin's record of a container or sandbox, decoded
(``container_record``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import re
import shutil

from ..base import layout, protowire
from ..base.errors import CommandError, ParameterError, SnapshotError, SnapshotTimeout
from . import commands
from .runc_cli import RuncCli

NAMESPACE = "k8s.io"            # the CRI plugin's namespace: every pod's containers
METADATA_EXTENSION = "io.cri-containerd.container.metadata"   # the CRI plugin's record of a container, JSON
RUNC_ROOT = "/run/containerd/runc"   # the runc shim's --root (plus the namespace) when its handler sets no Root
RUNC_RUNTIMES = ("io.containerd.runc.v2", "io.containerd.runc.v1")   # the shims whose options are runc's
RUNC_OPTIONS_ROOT = 7           # containerd's runc Options (runtime/v2/runc/options/oci.proto): string root = 7
CRI_METADATA_VERSION = "v1"
# the annotations containerd writes into every OCI config of a pod (layout.CRI_REQUESTER_KEYS): its namespace and name,
# and io.kubernetes.cri.container-type, container or sandbox
_RUNTIME, POD_NAMESPACE, POD_NAME, _CONTAINER_NAME, CONTAINER_TYPE = layout.CRI_REQUESTER_KEYS[0]
IMAGE_NAME = "io.kubernetes.cri.image-name"          # what the pod asked for, as containerd resolved the name
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,75}$")   # containerd's identifiers (what a kubelet reports is 64 hex)
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
CALL_TIMEOUT = 30.0
CRI_NAMESPACE = NAMESPACE
CRI_PLUGIN = ("io.containerd.grpc.v1", "cri")               # (type, id) of the CRI plugin
CRI_CONTAINER_EXTENSION = METADATA_EXTENSION                 # the CRI plugin's record of a container
CRI_SANDBOX_EXTENSION = "io.cri-containerd.sandbox.metadata"       # ... and of a pod sandbox


class ContainerdError(SnapshotError):
    pass


def container_id(reference, field="container"):
    """The id of a CRI container named as the kubelet reports it (``containerd://<id>``) or by its id alone."""
    text = (reference or "").strip()
    if text.startswith(layout.CRI_CONTAINER_ID_PREFIX):
        text = text[len(layout.CRI_CONTAINER_ID_PREFIX):]
    if not _ID.match(text):
        raise ParameterError("%s: %r is no container id of containerd; give the CRI container's id, as the pod's "
                             "status.containerStatuses[].containerID has it (containerd://<id>)" % (field, reference),
                             field=field)
    return text


def _any_value(document):
    """The bytes of a protobuf Any as ctr prints it (``value`` base64, Go's encoding of []byte)."""
    value = (document or {}).get("value") if isinstance(document, dict) else None
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        return None


def proto_string(data, number):
    """The last value of string field ``number`` of a protobuf message (None when absent); ValueError when the bytes
    are no protobuf message."""
    found = None
    for field, wire, value in protowire.fields(data):
        if field == number and wire == 2:
            found = value.decode("utf-8")
    return found


def cri_target(info, namespace=NAMESPACE, field="container"):
    """What containerd's record ``info`` (``ctr containers info``) of a container in ``namespace`` says of it: {id,
    image_ref, image_name, runc_root, sandbox_id, pod}. A ParameterError naming ``field`` when it is no container of a
    pod (a sandbox, a container the CRI plugin did not make) or runs in a runtime whose runc this cannot reach."""
    cid = info.get("ID")
    spec = info.get("Spec") or {}
    notes = spec.get("annotations") or {}
    raw = _any_value((info.get("Extensions") or {}).get(METADATA_EXTENSION))
    try:
        versioned = json.loads(raw.decode("utf-8")) if raw is not None else None
    except ValueError:
        versioned = None
    if not isinstance(versioned, dict) or versioned.get("Version") != CRI_METADATA_VERSION:
        kind = "a pod sandbox" if notes.get(CONTAINER_TYPE) == "sandbox" else "no container the CRI made"
        raise ParameterError("%s: %s is %s (containerd holds no CRI record %s of it): engine=containerd checkpoints a "
                             "container of a Kubernetes pod, by the id in the pod's status.containerStatuses"
                             % (field, cid, kind, CRI_METADATA_VERSION), field=field)
    metadata = versioned.get("Metadata") or {}
    pod = "%s/%s" % (notes.get(POD_NAMESPACE), notes.get(POD_NAME))
    if notes.get(CONTAINER_TYPE) != "container":
        raise ParameterError("%s: %s is the pod sandbox (pause container) of %s, not a container of it: give the "
                             "engine container's id from the pod's status.containerStatuses" % (field, cid, pod),
                             field=field)
    image_ref = metadata.get("ImageRef")
    if not isinstance(image_ref, str) or not _IMAGE_ID.match(image_ref):
        raise ParameterError("%s: containerd records image %r for %s, no image id (sha256:<config digest>): the "
                             "snapshot could not name the image it belongs to" % (field, image_ref, cid), field=field)
    runtime = info.get("Runtime") or {}
    if runtime.get("Name") not in RUNC_RUNTIMES:
        raise ParameterError("%s: %s runs in containerd runtime %r; engine=containerd checkpoints containers of the "
                             "runc shims (%s)" % (field, cid, runtime.get("Name"), ", ".join(RUNC_RUNTIMES)),
                             field=field)
    options = runtime.get("Options")
    try:
        root = proto_string(_any_value(options) or b"", RUNC_OPTIONS_ROOT) if options else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParameterError("%s: containerd's runtime options of %s cannot be read (%s): the runc root of its "
                             "handler is unknown" % (field, cid, exc), field=field)
    return {"id": cid, "image_ref": image_ref,
            "image_name": notes.get(IMAGE_NAME) or info.get("Image") or None,
            "runc_root": os.path.join(root or RUNC_ROOT, namespace),
            "sandbox_id": metadata.get("SandboxID"), "pod": pod}


class ContainerdCli:
    """``ctr`` on the daemon's socket ``address``, and ``containerd`` (the binary the daemon runs, for its
    configuration)."""

    def __init__(self, address=layout.CONTAINERD_ADDRESS, ctr="ctr", runner=None, namespace=NAMESPACE,
                 containerd="containerd"):
        self.address = address
        self.namespace = namespace
        self.executable = shutil.which(ctr) or ctr
        self.containerd = shutil.which(containerd) or containerd
        self.runner = runner or commands.DEFAULT

    def _run(self, argv, what, timeout=CALL_TIMEOUT):
        try:
            return self.runner.run(argv, timeout=timeout, what=what)[1]
        except (CommandError, SnapshotTimeout) as exc:
            raise ContainerdError(exc.msg, cmd=argv)

    def config_dump(self, config):
        """The configuration ``config`` gives containerd with its imports merged, every plugin's defaults filled in
        (TOML text, as ``containerd --config CONFIG config dump`` prints it)."""
        return self._run([self.containerd, "--config", config, "config", "dump"],
                         "containerd --config %s config dump" % config)

    def plugins(self):
        """{(type, id): status} of the plugins the daemon on the socket loaded (``ctr plugins ls``)."""
        out = self._run([self.executable, "--address", self.address, "plugins", "ls"],
                        "ctr --address %s plugins ls" % self.address)
        found = {}
        for line in out.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3:
                found[(fields[0], fields[1])] = fields[-1]
        return found

    def container_record(self, container_id):
        """containerd's record of a container of the namespace (``ctr containers info``), its extensions decoded:
        {"Image", "Labels", "Extensions": {name: decoded JSON}, ...}; ContainerdError when it cannot be read."""
        out = self._run(self.argv("containers", "info", container_id), "ctr containers info %s" % container_id[:12])
        try:
            info = json.loads(out)
        except ValueError as exc:
            raise ContainerdError("ctr containers info %s printed no JSON: %s" % (container_id[:12], exc))
        info["Extensions"] = dict((name, decode_extension(value))
                                  for name, value in (info.get("Extensions") or {}).items())
        return info

    def argv(self, *args):
        return [self.executable, "--address", self.address, "--namespace", self.namespace] + list(args)

    def run(self, *args, **kwargs):
        try:
            return self.runner.run(self.argv(*args), what="ctr %s" % " ".join(args[:2]), **kwargs)
        except CommandError as exc:
            if exc.result.get("rc") is None and shutil.which(self.executable) is None:
                raise ParameterError("ctr, containerd's CLI (it comes with containerd), is no executable on this host "
                                     "(%s): install containerd's package on the node" % exc.msg, rc=None)
            raise

    def version(self):
        """containerd's own version (the daemon's, not ctr's); a clear error when it does not answer on the socket."""
        if not os.path.exists(self.address):
            raise ParameterError("containerd_address: %s does not exist: give the socket of the node's containerd "
                                 "(its config's [grpc] address)" % self.address, field="containerd_address")
        rc, out, err = self.run("version", check=False, timeout=30)
        server = out.split("Server:", 1)[1] if "Server:" in out else ""
        match = re.search(r"^\s*Version:\s*(\S+)", server, re.M)
        if rc != 0 or not match:
            raise ParameterError("containerd_address: containerd does not answer on %s: %s" % (
                self.address, commands.tail(err or out, 300)), field="containerd_address")
        return match.group(1)

    def container(self, cid):
        """containerd's record of container ``cid`` in the CRI namespace (``ctr containers info``), parsed. It holds the
        container's environment: it is read here and never returned as a whole."""
        rc, out, err = self.run("containers", "info", cid, check=False, timeout=30)
        if rc != 0:
            if "not found" in err:
                raise ParameterError("container: containerd on %s has no container %s in namespace %s (the pod's "
                                     "container was replaced, or the pod runs on another node)"
                                     % (self.address, cid, self.namespace), field="container")
            raise CommandError("ctr containers info %s failed (rc=%d): %s" % (cid, rc, commands.tail(err, 500)),
                               cmd=self.argv("containers", "info", cid), rc=rc)
        try:
            return json.loads(out)
        except ValueError as exc:
            raise CommandError("ctr containers info %s printed no JSON: %s" % (cid, exc),
                               cmd=self.argv("containers", "info", cid), rc=rc)

    def find(self, reference, field="container"):
        """(cri_target of the container ``reference`` names, its runc state {pid, status, bundle, ...}, a RuncCli on
        its runc root); a ParameterError naming ``field`` when it does not run."""
        target = cri_target(self.container(container_id(reference, field)), self.namespace, field)
        runc = RuncCli(global_args=["--root", target["runc_root"]], runner=self.runner)
        state = runc.state(target["id"])
        if state is None:
            raise ParameterError("%s: runc has no state of %s below %s (the root containerd names for its runtime "
                                 "handler): it is not running on this node" % (field, target["id"], target["runc_root"]),
                                 field=field)
        if state.get("status") != "running" or not state.get("pid"):
            raise ParameterError("%s: %s (pod %s) is %s, not running; its pod must run for a snapshot"
                                 % (field, target["id"], target["pod"], state.get("status")), field=field)
        return target, state, runc

    def running_pid(self, reference):
        """Host pid of the main process of the CRI container ``reference`` names."""
        return int(self.find(reference)[1]["pid"])


def decode_extension(value):
    """A container extension as ctr prints it ({type_url, value: base64 of the JSON the plugin stored}), decoded;
    None when it is not JSON (a protobuf extension: no plugin the collection reads stores one)."""
    try:
        raw = base64.b64decode((value or {}).get("value") or "")
        return json.loads(raw.decode("utf-8"))
    except (ValueError, TypeError, AttributeError):
        return None


def cri_metadata(info, sandbox=False):
    """The CRI plugin's record of a container or sandbox (the ``Metadata`` of its extension), or None."""
    name = CRI_SANDBOX_EXTENSION if sandbox else CRI_CONTAINER_EXTENSION
    versioned = (info.get("Extensions") or {}).get(name) or {}
    return versioned.get("Metadata") if isinstance(versioned, dict) else None


def daemon_executable(pid, proc="/proc"):
    """The binary the daemon ``pid`` runs (its own version parses the configuration it will read), or None."""
    try:
        path = os.readlink(os.path.join(proc, str(pid), "exe"))
    except (IOError, OSError):
        return None
    return path if os.path.isfile(path) else None  # " (deleted)": upgraded since it started

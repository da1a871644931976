# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for a containerd node: ``containerd config dump`` and ``ctr``. PRIVATE to inferops.snapshot.

containerd's own binary reads its configuration (the main file and every file it imports, merged as the daemon
will merge them at its next start); ``ctr`` asks a running daemon on its socket which plugins it loaded and what it
records of a container -- for a CRI container, the CRI plugin's own record (its image, its sandbox's config) as a
JSON extension of the container.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import shutil

from ..base.errors import CommandError, SnapshotError, SnapshotTimeout
from . import commands

CALL_TIMEOUT = 30.0
CRI_NAMESPACE = "k8s.io"                                    # the containerd namespace of every CRI container
CRI_PLUGIN = ("io.containerd.grpc.v1", "cri")               # (type, id) of the CRI plugin
CRI_CONTAINER_EXTENSION = "io.cri-containerd.container.metadata"   # the CRI plugin's record of a container
CRI_SANDBOX_EXTENSION = "io.cri-containerd.sandbox.metadata"       # ... and of a pod sandbox


class ContainerdError(SnapshotError):
    pass


class ContainerdCli:
    """``containerd`` (the binary the daemon runs, for its configuration) and ``ctr`` on the daemon's ``socket``."""

    def __init__(self, socket, containerd="containerd", ctr="ctr", namespace=CRI_NAMESPACE, runner=None):
        self.socket = socket
        self.containerd = shutil.which(containerd) or containerd
        self.ctr = shutil.which(ctr) or ctr
        self.namespace = namespace
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
        out = self._run([self.ctr, "--address", self.socket, "plugins", "ls"],
                        "ctr --address %s plugins ls" % self.socket)
        found = {}
        for line in out.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3:
                found[(fields[0], fields[1])] = fields[-1]
        return found

    def container(self, container_id):
        """containerd's record of a container of the namespace (``ctr containers info``), its extensions decoded:
        {"Image", "Labels", "Extensions": {name: decoded JSON}, ...}."""
        out = self._run([self.ctr, "--address", self.socket, "--namespace", self.namespace, "containers", "info",
                         container_id], "ctr containers info %s" % container_id[:12])
        try:
            info = json.loads(out)
        except ValueError as exc:
            raise ContainerdError("ctr containers info %s printed no JSON: %s" % (container_id[:12], exc))
        info["Extensions"] = dict((name, decode_extension(value))
                                  for name, value in (info.get("Extensions") or {}).items())
        return info


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

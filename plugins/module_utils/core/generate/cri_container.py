# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generate driver: a container of a Kubernetes pod on containerd (``engine=containerd``). PRIVATE to inferops.snapshot.

containerd 1.6 has no CRI checkpoint call (CheckpointContainer came with containerd 2.0, and it writes a tar for
Kubernetes' forensic checkpointing, not a leave-running dump into a directory of ours). So the container is found in
containerd's own records (clients/containerd_cli.py: the CRI's image_ref, the runc root of its runtime handler) and
dumped as the node's containerd shim would run it: ``runc --root <handler root>/k8s.io checkpoint --leave-running``,
the fast path the Docker driver takes on Docker's runc root. Its world is the OCI config runc runs it with (the bundle's
config.json, which containerd wrote: args, user, mounts, devices) -- what the node's restore-on-create runtime compares
a new container's config with. The pod is recreated by the kubelet: there is no container record to write.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ..base.errors import ParameterError
from ..clients.containerd_cli import ContainerdCli, container_id
from ..clients.runc_cli import check_criu_config
from ..store import fleet, world
from .driver import Driver


def read_bundle_config(bundle, field="container"):
    """The OCI config of a container's bundle (runc state's ``bundle``)."""
    path = os.path.join(bundle or "", "config.json")
    try:
        with open(path) as handle:
            spec = json.load(handle)
    except (IOError, OSError, ValueError) as exc:
        raise ParameterError("%s: the OCI config of the container cannot be read at %s: %s" % (field, path, exc),
                             field=field)
    if not isinstance(spec, dict):
        raise ParameterError("%s: %s holds no OCI config" % (field, path), field=field)
    return spec


def oci_env(spec):
    """The container's environment as a dict (never returned: it may hold secrets)."""
    return dict(item.split("=", 1) for item in (spec.get("process") or {}).get("env") or [] if "=" in item)


class CriContainer(Driver):
    engine = "containerd"

    def __init__(self, params, criu):
        Driver.__init__(self, params, criu)
        self.containerd = ContainerdCli(params["containerd_address"])
        self.target = None  # clients/containerd_cli.cri_target: what containerd says of the container
        self.spec = None    # the OCI config runc runs it with

    def preflight(self, versions):
        params = self.params
        if not params["container"]:
            raise ParameterError("container: required with engine=containerd: the id of the pod's container, as its "
                                 "status.containerStatuses[].containerID has it (containerd://<id>)", field="container")
        container_id(params["container"])  # a bad id is refused before containerd is asked
        if params["method"] != "runc":
            raise ParameterError("method: %s is Docker's own checkpoint; a container on containerd is checkpointed with "
                                 "runc (method=runc)" % params["method"], field="method")
        versions["containerd"] = self.containerd.version()
        check_criu_config()
        self.target, state, self.runc = self.containerd.find(params["container"])
        self.spec = read_bundle_config(state.get("bundle"))
        self.pid = int(state["pid"])
        self.container_id = self.target["id"]
        versions["runc"] = self.runc.version()

    def describe(self):
        return "container %s of pod %s" % (self.container_id[:12], self.target["pod"])

    def dump(self, image_dir, leave_running, seconds, work):
        self.runc.checkpoint(self.container_id, image_dir, leave_running, seconds, work=work)

    def facts(self, versions):
        process = world.oci_facts(self.spec)
        excluded = world.excluded_mounts(process["mounts"], oci_env(self.spec),
                                         self.params.get("engine_state_mounts") or ())
        return world.capture(process, versions.get("criu"), versions.get("runc"), excluded=excluded)

    def image(self):
        return {"id": self.target["image_ref"], "name": self.target["image_name"]}

    def version(self, versions):
        return versions.get("containerd")

    def device_keys(self):
        return fleet.device_keys(self.spec)

    def stale(self, recorded):
        target, state, runc = self.containerd.find(self.params["container"])
        reasons = []
        wrong = world.image_reason((recorded.get("image") or {}).get("id"), target["image_ref"])
        if wrong:
            reasons.append(wrong)
        return reasons + world.compare(recorded.get("world"), world.oci_facts(read_bundle_config(state.get("bundle"))),
                                       self.criu.version(), runc.version())

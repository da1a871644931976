# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What differs between the engines ``host_checkpoint`` takes a host snapshot with: the driver an engine gives the
Checkpointer. PRIVATE to the inferops.snapshot collection.

As restore/driver.py does for the restore paths, the Checkpointer (checkpointer.py) holds every guarantee once -- the
claim, the lease, the device part, the seal, the signature, the publish, the failure record -- and a driver supplies
what its engine does its own way: how the target is found and checked, how it is dumped, the world it runs in, the
image it runs. Three drivers: a Docker container (docker_container.py), a container of a Kubernetes pod on containerd
(cri_container.py), a bare process tree (bare_process.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class Driver:
    engine = None       # the manifest's engine.name and the module's engine option
    work_dir = True     # the dump gets a work dir of ours (criu_cli.make_work_dir), named in the claim

    def __init__(self, params, criu):
        self.params = params
        self.criu = criu
        self.pid = None           # host pid of the target's root process, once preflight found it
        self.container_id = None  # the container runc dumps (None: a bare process)
        self.runc = None          # the RuncCli that dumps it

    @property
    def runc_root(self):
        """The runc root the claim names for a take-over to thaw the container in (leftovers.py)."""
        return self.runc.root if self.runc is not None else self.params["runc_root"]

    def preflight(self, versions):
        """Check the host and find the target, before anything is written: set ``pid``, add to ``versions`` (CRIU's
        is there already)."""
        raise NotImplementedError

    def describe(self):
        """How the progress lines name the target."""
        raise NotImplementedError

    def dump(self, image_dir, leave_running, seconds, work):
        """Checkpoint the target into ``image_dir`` within ``seconds``; ``work``: the work dir (None without one)."""
        raise NotImplementedError

    def facts(self, versions):
        """The manifest's ``world`` (world.capture), taken while the target is dumped."""
        raise NotImplementedError

    def image(self):
        """The manifest's ``image``: {id, name}, or None for a process without one."""
        return None

    def version(self, versions):
        """The manifest's ``engine.version``: the version of the daemon that runs the target."""
        return None

    def write_record(self, directory):
        """What this engine's restore needs to recreate the target, into ``directory`` (after the engine resumed)."""

    def device_keys(self):
        """The devices the target runs on (fleet.py's keys), or None: it is not entered in the record of restores."""
        return None

    def stale(self, recorded):
        """Why the published snapshot (its manifest ``recorded``) does not belong to the target as it runs now; []."""
        raise NotImplementedError

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generate driver: a bare process tree (``engine=criu``), dumped by CRIU itself. PRIVATE to inferops.snapshot.

No container and no image: its world is its command line, working dir and the files it has open or mapped.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..base.errors import ParameterError
from ..store import world
from .driver import Driver


class BareProcess(Driver):
    engine = "criu"

    def preflight(self, versions):
        if not self.params["pid"]:
            raise ParameterError("pid: required with engine=criu")
        self.pid = self.params["pid"]
        if not os.path.exists("/proc/%d" % self.pid):
            raise ParameterError("pid: process %d does not exist" % self.pid)

    def describe(self):
        return "pid %s" % self.params["pid"]

    def dump(self, image_dir, leave_running, seconds, work):
        self.criu.dump(self.pid, image_dir, leave_running, seconds, work=work)

    def facts(self, versions):
        return world.capture(world.process_facts(self.pid), versions.get("criu"), pid=self.pid)

    def stale(self, recorded):
        return world.stale(recorded, None, self.criu.version())

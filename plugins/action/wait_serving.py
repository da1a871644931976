# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of inferops.snapshot.wait_serving: one task for a long wait, with progress.

The module waits on the host until a deadline. A 30-minute warmup as one module run would show
nothing for 30 minutes, and an until/retries loop shows a line per probe (each one a job event in
AWX). So the wait runs as slices of at most ``progress_interval`` seconds, with one line on the
controller between two slices; the deadline is kept here, on the controller's monotonic clock.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.plugins.action import ActionBase

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.engine_http import shown

MODULE = "inferops.snapshot.wait_serving"
DEFAULTS = dict(timeout=300.0, progress_interval=30.0)


def what(args):
    if args.get("url"):
        return shown(args["url"])  # never a user and password given in the URL
    return "%s%s" % (args.get("path"), " in container %s" % args["container"] if args.get("container") else "")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        try:
            timeout = float(args.get("timeout", DEFAULTS["timeout"]))
            every = float(args.get("progress_interval", DEFAULTS["progress_interval"]))
        except (TypeError, ValueError):
            timeout = every = None
        if not (timeout and every and 0 < timeout < float("inf") and 0 < every < float("inf")):  # NaN fails too
            # Not numbers the slicing can use: one run, and the module's argument check says what is wrong.
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
            return result

        host = (task_vars or {}).get("inventory_hostname", "?")
        started = time.monotonic()
        deadline = started + timeout
        attempts = 0
        try:
            while True:
                args["timeout"] = max(0.1, min(every, deadline - time.monotonic()))
                outcome = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
                attempts += outcome.get("attempts") or 0
                left = deadline - time.monotonic()
                if not (outcome.get("failed") and outcome.get("timed_out")) or left <= 0:
                    break  # "not ready within <timeout> s" only once the whole timeout has passed
                self._display.display("[%s] wait_serving: %s: not ready after %d s (last: %s); %s left"
                                      % (host, what(args), time.monotonic() - started, outcome.get("last"),
                                         "%d s" % round(left) if left >= 1 else "under 1 s"))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

        outcome["elapsed"] = round(time.monotonic() - started, 3)
        outcome["attempts"] = attempts
        if outcome.get("failed") and outcome.get("timed_out"):
            outcome["msg"] = "%s: not ready within %g s (%d probes, last: %s)" % (
                what(args), timeout, attempts, outcome.get("last"))
            outcome.pop("exception", None)  # the last slice's error: this message replaces it
        result.update(outcome)
        return result

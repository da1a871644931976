# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark helper callback: when each task started and ended on each host, and what it returned.

Used only by benchmarks/run.py (enabled through ANSIBLE_CALLBACK_PLUGINS and
ANSIBLE_CALLBACKS_ENABLED); writes a JSON list to the file named by INFEROPS_BENCH_TIMING_FILE when
the playbook ends. Times are CLOCK_MONOTONIC seconds, the same clock the benchmark reads, so task
walls can be set against the wall time of the whole ansible-playbook process.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: inferops_bench_timing
type: aggregate
short_description: Per-host task start/end times and results for the inferops.snapshot benchmark
description:
  - Records, for every task and host, the monotonic time the worker started it, the time its result
    arrived, and the result's C(durations) and a few other keys; writes them as JSON when the run ends.
options: {}
requirements:
  - The environment variable INFEROPS_BENCH_TIMING_FILE names the output file.
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase

KEEP = ("changed", "failed", "msg", "durations", "restored", "reason", "valid", "reasons", "bytes", "files",
        "throughput_mb_s", "workers", "total_bytes", "hashing", "state", "actions", "placement", "status",
        "criu_log_tail", "verify", "created", "runtime_record", "method", "method_reason", "resumed", "reader")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "inferops_bench_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super(CallbackModule, self).__init__(*args, **kwargs)
        self.started = {}
        self.records = []

    def v2_runner_on_start(self, host, task):
        self.started[(host.get_name(), task._uuid)] = time.monotonic()

    def _record(self, result, outcome):
        host = result._host.get_name()
        task = result._task
        data = result._result
        self.records.append({
            "host": host, "task": task.get_name(), "action": task.action, "outcome": outcome,
            "start": self.started.pop((host, task._uuid), None), "end": time.monotonic(),
            "result": dict((key, data[key]) for key in KEEP if key in data),
        })

    def v2_runner_on_ok(self, result):
        self._record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "failed")

    def v2_runner_on_unreachable(self, result):
        self._record(result, "unreachable")

    def v2_runner_on_skipped(self, result):
        self._record(result, "skipped")

    def v2_playbook_on_stats(self, stats):
        target = os.environ.get("INFEROPS_BENCH_TIMING_FILE")
        if target:
            with open(target, "w") as handle:
                json.dump(self.records, handle, indent=1, default=str)

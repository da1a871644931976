# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Orchestration overhead: N inventory aliases of localhost, one workload each. Part of benchmarks/run.py's Bench."""

from __future__ import absolute_import, division, print_function

import shutil
import time

from common import FirstAnswer, PROMPTS, docker, generate  # pylint: disable=import-error


class Orchestration:
    """A mixin of benchmarks/run.py's Bench."""

    def orchestration(self, hosts, size_mb, rep):
        workloads = [self.new_workload(size_mb, "o%d" % hosts) for _index in range(hosts)]
        try:
            for w in workloads:
                docker("run", "-d", *self.docker_run_args(w, 1))
            for w in workloads:
                poll = FirstAnswer(w["url"], None, time.monotonic(), 900)
                poll.run()
                if not self.check_answers(w, poll.answer):
                    raise RuntimeError("wrong answers from %s" % w["name"])
            for step in ("generate", "restore"):
                if step == "restore":
                    for w in workloads:
                        self.remove(w)
                        self.reset_device(w)
                extra = {}
                if step == "restore" and self.restore_methods:
                    extra["bench_restore_method"] = self.fastest_method()
                    if self.runtime_installed and extra["bench_restore_method"] in ("runtime", "auto"):
                        extra["bench_runtime_name"] = self.prefix
                result = self.playbook(step, workloads, **extra)
                per_host = {}
                for r in result["records"]:
                    durations = r["result"].get("durations") or {}
                    module = durations.get("total", sum(v for v in durations.values() if isinstance(v, (int, float))))
                    entry = per_host.setdefault(r["host"], {"module_s": 0.0, "task_wall_s": 0.0})
                    entry["module_s"] += module
                    entry["task_wall_s"] += r["end"] - r["start"]
                restores = [r["result"].get("restored") for r in result["records"] if r["action"].endswith("snapshot_restore")]
                self.record("orchestration", "%s_%d_hosts" % (step, hosts), size_mb, rep, result["wall"], hosts=hosts,
                            method=extra.get("bench_restore_method", "runc" if step == "generate" else "docker"),
                            all_restored=all(x is True for x in restores) if step == "restore" else None,
                            sum_module_s=round(sum(e["module_s"] for e in per_host.values()), 3),
                            max_module_s=round(max(e["module_s"] for e in per_host.values()), 3),
                            sum_task_wall_s=round(sum(e["task_wall_s"] for e in per_host.values()), 3),
                            max_task_wall_s=round(max(e["task_wall_s"] for e in per_host.values()), 3))
                if step == "restore":
                    for w in workloads:
                        answer = generate(w["url"], PROMPTS[0])[1]
                        if not self.check_answers(w, answer):
                            raise RuntimeError("wrong answers after restore from %s" % w["name"])
        finally:
            for w in workloads:
                self.remove(w)
                shutil.rmtree(w["snapshot_dir"], ignore_errors=True)
                shutil.rmtree(w["device_dir"], ignore_errors=True)

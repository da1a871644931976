# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restore-on-create runtime (snapshot_node role). Part of benchmarks/run.py's Bench."""

from __future__ import absolute_import, division, print_function

import contextlib
import json
import os
import shutil
import sys
import time

from common import BIN, COLLECTIONS, PLAYBOOKS, log, run, stage_cache  # pylint: disable=import-error
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout


class Runtime:
    """A mixin of benchmarks/run.py's Bench."""

    def node_vars(self):
        base = os.path.join(self.workdir, "node")
        return {"snapshot_node_runtime_name": self.prefix, "snapshot_node_runtime_path": os.path.join(base, "bin", "inferops-restore-runtime"),
                "snapshot_node_lib_dir": os.path.join(base, "lib"), "snapshot_node_state_dir": "/run/%s" % self.prefix,
                "snapshot_node_log_file": os.path.join(base, "log", "restore.log"),
                "snapshot_node_snapshot_roots": [os.path.join(self.workdir, "snapshots")]}

    def staged_restores(self, w, rep):
        """The snapshot copied and verified into a node cache ahead (snapshot_stage's core), then restored from the
        verified copy without hashing: the playbook (method runtime) and docker run --runtime."""
        cache = os.path.join(self.workdir, "stage")
        os.makedirs(cache, mode=0o700, exist_ok=True)
        t0 = time.monotonic()
        staged = stage_cache.stage(w["snapshot_dir"], cache)
        self.record("staging", "snapshot_stage", w["size_mb"], rep, time.monotonic() - t0,
                    bytes=(staged.get("hashing") or {}).get("bytes"))
        # warm as the other warm restores are, with what this one reads: the copy (the snapshot's own small files
        # are read too, a few kB)
        copy = [staged["staged"]["dir"]]
        with self.runtime_settings(stage_dir=cache):
            for variant, restore in (("snapshot_restore_runtime_staged",
                                      lambda: self.module_restore(w, rep, "runtime", tag="_staged", warm=copy)),
                                     ("docker_run_runtime_staged",
                                      lambda: self.runtime_run_restore(w, rep, tag="_staged", warm=copy))):
                restore()
                verdict = (self.runtime_log()[-1:] or [{}])[0].get("verify") or {}
                used = verdict.get("checksums") == "staged"  # the runtime restored from the verified copy, unhashed
                [s for s in self.samples if s["section"] == "ttfa" and s["variant"] == variant][-1]["staged_copy_used"] = used
                if not used:
                    log("WARNING: %s did not restore from the staged copy: %s" % (variant, verdict.get("staged_miss")))
        shutil.rmtree(cache, ignore_errors=True)

    def runtime_log(self):
        """The installed runtime's restore records (its JSON log), oldest first."""
        try:
            with open(self.node_vars()["snapshot_node_log_file"]) as handle:
                records = [json.loads(line) for line in handle if line.strip()]
        except (IOError, OSError, ValueError):
            return []
        return [r for r in records if r.get("event") == "restore"]

    @staticmethod
    def detect_lazy_pages():
        """The restore-on-create runtime of this checkout restores lazily when told (layout's lazy_pages), and CRIU
        can here (userfaultfd)."""
        if "lazy_pages" not in layout.RUNTIME_DEFAULTS:
            return False
        return run(["criu", "check", "--feature", "uffd-noncoop"], check=False).returncode == 0

    @contextlib.contextmanager
    def runtime_settings(self, **settings):
        """The installed runtime's runtime.json with ``settings`` for the block (it reads the file on every call)."""
        path = os.path.join(self.node_vars()["snapshot_node_lib_dir"], "runtime.json")
        with open(path) as handle:
            original = handle.read()
        with open(path, "w") as handle:
            json.dump(dict(json.loads(original), **settings), handle)
        try:
            yield
        finally:
            with open(path, "w") as handle:
                handle.write(original)

    def node(self, state):
        """Install or remove the runtime with the role, as users do (it reloads dockerd with SIGHUP, no restart)."""
        os.makedirs(os.path.join(self.workdir, "snapshots"), mode=0o700, exist_ok=True)
        extra = dict(self.node_vars(), snapshot_node_state=state)
        if self.encryption:
            # one node restores both the plain and the encrypted snapshots of the run: with an encryption key the
            # runtime would otherwise require encryption (the secure default) and start the plain ones cold
            extra.update(snapshot_node_encryption_keys=[self.encryption["key_file"]], snapshot_node_require_encryption=False)
        if state == "absent":
            extra["snapshot_node_force_remove"] = True
        vars_file = os.path.join(self.workdir, "node-vars-%s.json" % state)
        with open(vars_file, "w") as handle:
            json.dump(extra, handle)
        proc = run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-e", "ansible_python_interpreter=%s" % sys.executable,
                    "-e", "@" + vars_file, os.path.join(PLAYBOOKS, "node.yml")], check=False,
                   env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False"))
        if proc.returncode != 0:
            raise RuntimeError("snapshot_node state=%s failed:\n%s" % (state, proc.stdout[-4000:]))
        self.runtime_installed = state == "present"

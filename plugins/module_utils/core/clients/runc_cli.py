# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client for runc: the fast checkpoint path of the modules, and the calls the node's
restore-on-create runtime makes with containerd's global options. PRIVATE to inferops.snapshot.

No runc argv is built anywhere else. A failed checkpoint or restore keeps CRIU's log and names its
first error line (clients/criu_cli.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import shutil
import subprocess

from ..base import layout
from ..base.errors import ParameterError, SnapshotError
from ..linux import fs, proc
from . import commands, criu_cli

# runc's global options that take a value (the subcommand is the first other non-option word).
GLOBAL_WITH_VALUE = ("--root", "--log", "--log-format", "--criu", "--rootless")


def split_argv(argv):
    """(global options, subcommand, the subcommand's arguments) of a runc command line."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word in GLOBAL_WITH_VALUE:
            index += 2
        elif word.startswith("-"):
            index += 1
        else:
            return list(argv[:index]), word, list(argv[index + 1:])
    return list(argv), None, []


def global_value(global_args, name, default=None):
    for index, word in enumerate(global_args):
        if word == name and index + 1 < len(global_args):
            return global_args[index + 1]
        if word.startswith(name + "="):
            return word[len(name) + 1:]
    return default


def check_criu_config(path=layout.RUNC_CRIU_CONFIG):
    """runc passes this file to CRIU on checkpoint and restore (``docker start --checkpoint`` too).

    Without tcp-close a checkpoint taken while requests are in flight fails, or cannot be restored
    through Docker, which offers no --tcp-established on restore. The snapshot_prereqs role writes it.
    """
    try:
        with open(path) as handle:
            present = set(line.strip() for line in handle)
    except (IOError, OSError):
        present = set()
    missing = [option for option in layout.RUNC_CRIU_OPTIONS if option not in present]
    if missing:
        raise ParameterError(
            "%s must contain the line(s) %s: requests in flight during a leave-running snapshot then stay with the "
            "running process and are closed in the restored one (the snapshot_prereqs role and scripts/env/setup.sh "
            "write it). See docs/troubleshooting.md" % (path, ", ".join("'%s'" % o for o in missing)),
            runc_criu_config=path)


CRIU_CONFIG_ANNOTATION = "org.criu.config"  # runc passes this file to CRIU instead of /etc/criu/runc.conf


class StoppedRestore:
    """``runc restore`` with the restored tasks left stopped (CRIU's leave-stopped), for one container.

    runc 1.1 has no option for it, but passes CRIU the configuration file its bundle's annotation names
    (and CRIU ignores one it cannot open). ``enter`` writes, in the runtime's private state directory, a
    file with the options the host's configuration has (tcp-close, ...) plus leave-stopped, and names it
    in the bundle's config.json; ``leave`` puts config.json back as it was and turns the file into a link
    to the host's own configuration: the restored container keeps the annotation in runc's state, so its
    next checkpoint reads the host's options through the link, never leave-stopped.
    """

    def __init__(self, bundle, conf_path):
        self.config_json = os.path.join(bundle, "config.json")
        self.conf_path = conf_path
        self.original = None
        self.source = None

    def enter(self, spec):
        configured = (spec.get("annotations") or {}).get(CRIU_CONFIG_ANNOTATION)
        self.source = layout.RUNC_CRIU_CONFIG if configured is None else configured  # "": none at all
        options = []
        if self.source:
            try:
                with open(self.source) as handle:
                    options = [line.rstrip("\n") for line in handle if line.strip() != "leave-stopped"]
            except (IOError, OSError):
                pass
        fs.write_file_atomic(self.conf_path, ("\n".join(options + ["leave-stopped"]) + "\n").encode("utf-8"))
        with open(self.config_json, "rb") as handle:
            self.original = handle.read()
        changed = dict(spec, annotations=dict(spec.get("annotations") or {}, **{CRIU_CONFIG_ANNOTATION: self.conf_path}))
        fs.write_file_atomic(self.config_json, json.dumps(changed).encode("utf-8"),
                             os.stat(self.config_json).st_mode & 0o777)

    def leave(self):
        if self.original is not None:
            fs.write_file_atomic(self.config_json, self.original, os.stat(self.config_json).st_mode & 0o777)
            self.original = None
        if os.path.lexists(self.conf_path):
            os.unlink(self.conf_path)
        if self.source:
            os.symlink(self.source, self.conf_path)


STOP_GRACE = 10.0  # seconds a stopped restore's runc gets to report and clean up before its tree is killed


class RuncCli:
    def __init__(self, executable="runc", global_args=(), criu=None, runner=None):
        self.executable = executable if os.path.isabs(executable) else (shutil.which(executable) or executable)
        self.global_args = list(global_args)
        if criu and global_value(self.global_args, "--criu") is None:
            self.global_args += ["--criu", criu]
        self.runner = runner or commands.DEFAULT

    @property
    def root(self):
        return global_value(self.global_args, "--root", "/run/runc")

    def argv(self, *args):
        return [self.executable] + self.global_args + [str(arg) for arg in args]

    def version(self):
        rc, out, err = self.runner.run(self.argv("--version"), check=False, timeout=30)
        match = re.search(r"runc version (\S+)", out)
        return match.group(1) if rc == 0 and match else None

    def checkpoint(self, container_id, image_dir, leave_running, timeout, log_dir=None, work=None):
        """CRIU checkpoint of a running container straight into ``image_dir`` (the fast path). ``work``: runc's work
        dir (criu_cli.make_work_dir), one of its own by default; removed after."""
        work = work or criu_cli.make_work_dir("dump")
        args = ["checkpoint", "--image-path", image_dir, "--work-path", work, "--file-locks"]
        if leave_running:
            args.append("--leave-running")
        try:
            self.runner.run(self.argv(*(args + [container_id])), timeout=timeout,
                            what="runc checkpoint of container %s" % container_id[:12])
        except SnapshotError as exc:
            error = criu_cli.failure(exc, os.path.join(work, "dump.log"), "dump", container_id[:12], log_dir)
            # CRIU freezes the container's cgroup for the dump; one stopped before it thawed it (the deadline ran out,
            # it crashed) leaves the engine frozen, and nothing else would thaw a run that is still alive.
            if self.status(container_id) == "paused" and self.resume(container_id):
                error.msg += "; the container the dump left frozen was thawed"
                error.result["thawed"] = container_id[:12]
            raise error
        finally:
            criu_cli.remove_work_dir(work)

    # -- the node runtime's calls: containerd's stdio is the container's, so they inherit it ------
    def restore_argv(self, container_id, bundle, image_dir, work, pid_file, console_socket=None, no_pivot=False,
                     lazy_pages=False):
        """``lazy_pages``: the memory comes from a ``criu lazy-pages`` daemon listening in ``work``
        (criu_cli.LazyPages)."""
        args = ["restore", "--detach", "--image-path", image_dir, "--work-path", work, "--bundle", bundle,
                "--pid-file", pid_file, "--file-locks"]
        if lazy_pages:
            args.append("--lazy-pages")
        if console_socket:
            args += ["--console-socket", console_socket]
        if no_pivot:
            args.append("--no-pivot")
        return self.argv(*(args + [container_id]))

    def restore(self, argv, timeout, env=None, log=None):
        """Run ``argv`` (restore_argv) with the caller's stdio -- CRIU hands it to the restored process's pipes --
        and ``env`` (its environment, which it hands to CRIU and CRIU's plugins; None: ours). Returns runc's exit
        status, or None when it did not finish within ``timeout`` and was stopped (``stop``); ``log(action, pids)``
        says what the stop killed."""
        process = self.runner.spawn(argv, close_fds=False, **({"env": env} if env is not None else {}))
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(process, log or (lambda action, pids: None))
            return None

    @staticmethod
    def stop(process, log, grace=STOP_GRACE):
        """Stop a hung restore gently: kill the half-restored tasks (the leaves of runc's tree). CRIU then reports the
        restore failed and cleans up after itself (its cgroup yard, runc's criu-root mount). Only if runc is still
        there after ``grace`` is the whole tree killed; the mounts it leaves are for the caller to unmount."""
        tree = proc.children()
        leaves = [pid for pid in proc.descendants(process.pid, tree) if not tree.get(pid)]
        log("killing the half-restored tasks", leaves)
        proc.kill_quietly(leaves)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass
        everything = proc.descendants(process.pid)
        log("runc still running, killing its tree", everything)
        proc.kill_quietly(everything)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass

    def call(self, *args, **popen):
        """Run runc quietly with the caller's stdio unless redirected; returns its exit status (127: not run)."""
        return self.runner.call(self.argv(*args), **popen)

    def state(self, container_id):
        """runc's state of the container ({id, pid, status, bundle, ...}), or None when runc does not know it."""
        rc, out, _err = self.runner.run(self.argv("state", container_id), check=False, timeout=30)
        try:
            state = json.loads(out) if rc == 0 else None
        except ValueError:
            return None
        return state if isinstance(state, dict) else None

    def status(self, container_id):
        """runc's status of the container (running, paused, stopped, ...), or None when runc does not know it."""
        return (self.state(container_id) or {}).get("status")

    def resume(self, container_id):
        """Thaw a container whose cgroup is frozen (a CRIU dump killed half-way leaves it so)."""
        return self.runner.run(self.argv("resume", container_id), check=False, timeout=30)[0] == 0

    def kill(self, container_id, signal_name="KILL"):
        return self.call("kill", container_id, signal_name)

    def delete(self, container_id, force=True):
        return self.call("delete", *(["--force"] if force else []) + [container_id])

    def exec_argv(self, args):
        """The argv that hands a whole call (``args``, global options included) to the real runc."""
        return [self.executable] + list(args)

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module plumbing shared by the inferops.snapshot modules. PRIVATE to the collection.

Holds the shared argument specs (matched by doc fragments of the same names) and the single
place where typed errors become ``fail_json``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time
import traceback

from ansible_collections.inferops.snapshot.plugins.module_utils import _control as control
from ansible_collections.inferops.snapshot.plugins.module_utils._docker import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import SnapshotError

# Matches plugins/doc_fragments/control_endpoint.py.
CONTROL_TARGET_ARGS = dict(
    pid=dict(type="int"),
    container=dict(type="str"),
    endpoint=dict(type="str"),
    endpoint_paths=dict(type="dict"),
    agent_socket_dir=dict(type="path", default=control.DEFAULT_AGENT_SOCKET_DIR),
    # Above the real runtime's own 60 s lock wait, so a slow lock reports 507905, not a timeout.
    timeout=dict(type="float", default=90.0),
    docker_cli=dict(type="str", default="docker"),
)
IDENTITY_OPTIONS = dict(
    namespace=dict(type="str", required=True),
    service=dict(type="str", required=True),
    instance=dict(type="str", required=True),
    pod=dict(type="str", required=True),
)
CONTROL_TARGET_EXCLUSIVE = [("pid", "container", "endpoint")]
CONTROL_TARGET_REQUIRED_ONE_OF = [("pid", "container", "endpoint")]


def control_client(module):
    """The endpoint client for the target the task names (pid, container or endpoint)."""
    params = module.params
    if params.get("endpoint_paths") and not params.get("endpoint"):
        module.fail_json(msg="endpoint_paths: only meaningful together with an http(s) `endpoint`")
    if params.get("timeout") is not None and params["timeout"] <= 0:
        module.fail_json(msg="timeout: must be a positive number of seconds, got %s" % params["timeout"])
    if params.get("endpoint"):
        return control.client_for_endpoint(params["endpoint"], params.get("endpoint_paths"))
    pid = params.get("pid")
    if params.get("container"):
        pid = DockerCli(module, params.get("docker_cli") or "docker").running_pid(params["container"])
    return control.AgentSocketClient(control.agent_socket_for_pid(pid, params["agent_socket_dir"]))


class Stopwatch:
    """Per-stage durations on a monotonic clock, reported as ``durations`` in results."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self.durations = {}

    def stage(self, name):
        watch = self

        class _Stage:
            def __enter__(self):
                self.started = watch._clock()
                return self

            def __exit__(self, *exc):
                watch.durations[name] = round(watch._clock() - self.started, 6)
                return False

        return _Stage()


class Progress:
    """Progress of a long step: logged on the target and returned as ``progress`` lines.

    A module cannot stream output to the controller, so the roles print these lines at -v.
    """

    def __init__(self, module, what, every_seconds=2.0, clock=time.monotonic):
        self.module = module
        self.what = what
        self.lines = []
        self._clock = clock
        self._started = clock()
        self._last = None
        self._every = every_seconds

    def note(self, text, force=False):
        now = self._clock()
        if force or self._last is None or now - self._last >= self._every:
            self._last = now
            line = "%s: %s (%.1f s)" % (self.what, text, now - self._started)
            self.lines.append(line)
            self.module.log(line)

    def final(self, text):
        """The closing line, always recorded."""
        line = "%s: %s (%.1f s)" % (self.what, text, self._clock() - self._started)
        self.module.log(line)
        return line

    def bytes_done(self, done_bytes, done_files):
        self.note("%d files, %.1f MiB hashed" % (done_files, done_bytes / 1048576.0))


def run_module(module, main):
    """Run ``main(module)`` and turn the collection's typed errors into fail_json, in one place."""
    try:
        main(module)
    except SnapshotError as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    except Exception as exc:  # an unexpected bug: say so, with the traceback, instead of a bare crash
        module.fail_json(msg="unexpected error in %s: %s" % (module._name, exc), exception=traceback.format_exc())

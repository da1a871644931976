#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: wait_serving
short_description: Wait, as one task with a wall-clock deadline, until an engine serves
version_added: 0.2.0
description:
  - Waits until an inference engine is ready the way its service defines readiness -- its readiness
    URL answers one of O(status_code) (GET, never through a proxy), or a file exists inside its
    container (read through C(/proc/<pid>/root)) -- or until O(timeout) seconds of wall-clock time have
    passed. The timeout counts time, not attempts; a probe that hangs does not stretch it.
  - One task however long the wait. The action plugin of the same name runs this module in slices of
    at most O(progress_interval) seconds and prints one progress line on the controller between two
    slices (elapsed time, the last probe's answer, the time left), so a 30-minute warmup prints a few
    lines instead of a retry line per probe.
  - With O(container) (or O(pid)), the wait ends at once when that process exits or is replaced; a
    crashed engine never answers.
  - The result says how long it waited, how many probes it made and what the last one saw, also when
    it fails.
requirements:
  - the Docker CLI (O(docker_cli)) on the target host, with O(container)
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: It only reads, so it waits in check mode too.
  diff_mode:
    support: none
  idempotent:
    support: full
  action:
    description: Indicates this has a corresponding action plugin, so some parts of the options can be executed on the controller.
    support: full
    details: The action plugin slices the wait and prints the progress lines on the controller.
options:
  url:
    description:
      - The readiness URL to probe, for example C(http://127.0.0.1:8000/health).
      - Exactly one of O(url) and O(path) is required.
    type: str
  path:
    description:
      - A file whose existence means ready. An absolute path inside the filesystem of O(container) or
        O(pid); on the host itself when neither is given.
    type: str
  container:
    description:
      - The Docker container the engine runs in. With O(path), the file is looked for inside it; with
        O(url), the wait fails at once when the container's main process exits.
      - The container must be running when the task starts.
    type: str
  pid:
    description: As O(container), for a process that runs without a container (its host pid).
    type: int
  status_code:
    description: HTTP statuses that mean ready.
    type: list
    elements: int
    default: [200]
  timeout:
    description: Seconds of wall-clock time the whole wait may take.
    type: float
    default: 300
  interval:
    description: Seconds between two probes.
    type: float
    default: 1
  probe_timeout:
    description: Seconds one HTTP probe may take.
    type: float
    default: 5
  progress_interval:
    description:
      - Seconds between two progress lines on the controller (the length of one slice of the wait).
        Each slice is one run of the module on the host, so shorter slices cost more.
    type: float
    default: 30
  docker_cli:
    description: The Docker CLI on the host.
    type: str
    default: docker
notes:
  - Probes go straight to the URL; C(http_proxy) and the like are ignored.
seealso:
  - module: ansible.builtin.wait_for
  - module: ansible.builtin.uri
"""

EXAMPLES = r"""
- name: Wait for the warmup (up to 30 minutes; a progress line every minute)
  inferops.snapshot.wait_serving:
    url: http://127.0.0.1:8000/health
    container: vllm-0
    timeout: 1800
    progress_interval: 60

- name: Wait until the engine drops its ready file inside its container
  inferops.snapshot.wait_serving:
    path: /run/engine/ready
    container: vllm-0
    timeout: 600

- name: Accept a 401 as alive (an endpoint behind authentication)
  inferops.snapshot.wait_serving:
    url: http://127.0.0.1:8000/v1/models
    status_code: [200, 401]
"""

RETURN = r"""
elapsed:
  description: Seconds the wait took (all slices, measured on the controller).
  returned: always
  type: float
  sample: 731.4
attempts:
  description: Probes made.
  returned: always
  type: int
  sample: 730
status:
  description: HTTP status of the last probe; null when it got no answer or O(path) was waited for.
  returned: always
  type: int
  sample: 200
last:
  description: What the last probe saw, for example C(HTTP 503), C(connection refused), C(present) or C(absent).
  returned: always
  type: str
  sample: HTTP 200
timed_out:
  description: Whether the wait ran out of time (only on failure; false when the process exited).
  returned: failure
  type: bool
  sample: true
"""

import os
import time

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import Deadline, wait_for
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import (ParameterError, SnapshotError,
                                                                                         SnapshotTimeout)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import engine_http
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.docker_cli import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import proc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import health

ARGUMENT_SPEC = dict(
    url=dict(type="str"),
    path=dict(type="str"),
    container=dict(type="str"),
    pid=dict(type="int"),
    status_code=dict(type="list", elements="int", default=[200]),
    timeout=dict(type="float", default=300.0),
    interval=dict(type="float", default=1.0),
    probe_timeout=dict(type="float", default=5.0),
    progress_interval=dict(type="float", default=30.0),
    docker_cli=dict(type="str", default="docker"),
)
OPTIONS = dict(mutually_exclusive=[("url", "path"), ("container", "pid")], required_one_of=[("url", "path")])


def watched_process(params):
    """(host pid, its start time) of the process the wait depends on, or None; it must be alive now."""
    pid = params["pid"]
    if params["container"]:
        pid = DockerCli(params["docker_cli"]).running_pid(params["container"])
    if pid is None:
        return None
    started = proc.start_time(pid)
    if started is None or not proc.alive(pid):
        raise ParameterError("pid: no running process %d on this host" % pid, pid=pid)
    return pid, started


def gone(watched, params):
    """Why the watched process will never answer (it exited or its pid was reused), or None."""
    pid, started = watched
    if proc.alive(pid) and proc.start_time(pid) == started:
        return None
    what = "container %s" % params["container"] if params["container"] else "process %d" % pid
    return "%s exited" % what


def probe_for(params, watched, deadline):
    """A wait_for predicate for the URL or the file; it records the last observation in ``seen``."""
    seen = dict(attempts=0, status=None, last="not probed yet")
    if params["path"]:
        root = "/proc/%d/root" % watched[0] if watched else ""
        target = root + params["path"]

        def ready():
            present = os.path.exists(target)
            seen.update(attempts=seen["attempts"] + 1, last="present" if present else "absent")
            return present
    else:
        def ready():
            # a probe that hangs must not carry the wait past its deadline
            status, what = health.probe(params["url"], min(params["probe_timeout"], deadline.remaining(floor=0.1)))
            seen.update(attempts=seen["attempts"] + 1, status=status, last=what)
            return status in params["status_code"]

    def predicate():
        exited = gone(watched, params) if watched else None
        if exited:
            raise SnapshotError("%s, so %s will never be ready (last: %s)" % (exited, what_for(params), seen["last"]),
                                timed_out=False, **seen)
        return ready(), seen["last"]
    return predicate, seen


def what_for(params):
    if params["url"]:
        codes = "/".join(str(code) for code in params["status_code"])
        return "%s answering %s" % (engine_http.shown(params["url"]), codes)  # never a password given in the URL
    where = " in container %s" % params["container"] if params["container"] else ""
    return "%s%s" % (params["path"], where)


def main_logic(module):
    params = module.params
    _module.positive(params, "timeout", "interval", "probe_timeout", "progress_interval")
    if params["path"] and not params["path"].startswith("/"):
        raise ParameterError("path: must be absolute (inside the container when container is set), got %r"
                             % params["path"], field="path")
    if params["path"] and "\x00" in params["path"]:
        raise ParameterError("path: the path contains a NUL byte; give the file's path without it", field="path")
    if params["url"] is not None:
        engine_http.check_url(params["url"], "url")  # at once, not after waiting out the timeout
    started = time.monotonic()
    deadline = Deadline(params["timeout"])
    watched = watched_process(params)
    predicate, seen = probe_for(params, watched, deadline)
    try:
        wait_for(predicate, params["timeout"], params["interval"], what=what_for(params))
    except SnapshotTimeout:
        msg = "%s did not happen within %.1f s (last: %s)" % (what_for(params), params["timeout"], seen["last"])
        raise SnapshotTimeout(msg, timed_out=True, elapsed=round(time.monotonic() - started, 3), **seen)
    except SnapshotError as exc:  # the process exited
        exc.result["elapsed"] = round(time.monotonic() - started, 3)
        raise
    return dict(changed=False, elapsed=round(time.monotonic() - started, 3), **seen)


def main():
    _module.run(ARGUMENT_SPEC, main_logic, requires=(), **OPTIONS)


if __name__ == "__main__":
    main()

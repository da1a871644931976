# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The process boundary: every external command of the collection runs through ``Runner``. PRIVATE.

List argv only, never a shell; a wall-clock limit that kills the command's whole process group; and
errors that carry the command, its exit status and the tail of its output -- with every secret the
caller names (environment values given to ``docker create``, for instance) masked in all of them.
Tests replace ``Runner`` at this boundary and nowhere else.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import signal
import subprocess

from ..base.errors import CommandError, SnapshotTimeout

MASK = "********"
OUTPUT_TAIL = 2000


# Values no one keeps a secret in: masked everywhere they occur, they would garble every message and number
# (an env {"WORKERS": "1"} turned each 1 into ********) and hide nothing. Anything longer stays masked: an
# address or a port may be worth hiding.
_NOT_SECRET = re.compile(r"\A(?:.{0,3}|true|false|yes|no|on|off|none|null)\Z", re.IGNORECASE | re.DOTALL)


_REMEMBERED = set()


def remember(values):
    """Values this process met that must never show (the environment a snapshot recorded): ``mask`` hides them in
    every error of this runner from now on, and _module.py in every field of the task's result."""
    _REMEMBERED.update(value for value in values if may_be_secret(value))


def remembered():
    return set(_REMEMBERED)


def may_be_secret(value):
    """False for values too short or too plain to be a secret: up to 3 characters, and booleans."""
    return bool(value) and not _NOT_SECRET.match(value)


def mask(text, secrets):
    """``text`` (a string or a list of strings) with each secret value replaced by MASK."""
    if isinstance(text, (list, tuple)):
        return [mask(item, secrets) for item in text]
    if not text:
        return text
    for secret in sorted((s for s in set(secrets) | _REMEMBERED if may_be_secret(s)), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def tail(text, limit=OUTPUT_TAIL):
    text = (text or "").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


class Runner:
    """Runs commands; ``run`` returns (rc, stdout, stderr) as text and raises only where told to."""

    def __init__(self, env=None):
        self.env = env

    def run(self, argv, timeout=None, data=None, check=True, what=None, secrets=(), env=None):
        """Run ``argv``; with ``check`` a non-zero exit is a CommandError naming ``what`` (default: the command).

        ``timeout`` (seconds): the command's process group is killed when it runs longer, and a
        SnapshotTimeout is raised whatever ``check`` says.
        """
        argv = [str(arg) for arg in argv]
        what = what or os.path.basename(argv[0])
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or self.env,
                                    start_new_session=True, close_fds=True)
        except OSError as exc:
            raise CommandError("%s could not be started: %s" % (what, exc), cmd=mask(argv, secrets), rc=None)
        try:
            out, err = proc.communicate(data.encode() if isinstance(data, str) else data, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            raise SnapshotTimeout("%s did not finish within %.0f s and was stopped" % (what, timeout),
                                  cmd=mask(argv, secrets), rc=proc.returncode,
                                  stdout=mask(tail(_text(out)), secrets), stderr=mask(tail(_text(err)), secrets))
        out, err = _text(out), _text(err)
        if check and proc.returncode != 0:
            raise CommandError("%s failed (rc=%d): %s" % (what, proc.returncode, mask(tail(err or out, 500), secrets)),
                               cmd=mask(argv, secrets), rc=proc.returncode, stdout=mask(tail(out), secrets),
                               stderr=mask(tail(err), secrets))
        return proc.returncode, out, err

    def spawn(self, argv, **popen):
        """Start ``argv`` and return the Popen object (for a process that must inherit stdio, or outlive us)."""
        return subprocess.Popen([str(arg) for arg in argv], **popen)

    def call(self, argv, **popen):
        """Run ``argv`` to its end quietly (stdio from/to /dev/null unless given) and return its exit status; 127 when
        it cannot be started. For the calls whose output nobody reads (the node runtime's runc passthroughs)."""
        for stream in ("stdin", "stdout", "stderr"):
            popen.setdefault(stream, subprocess.DEVNULL)
        try:
            return subprocess.call([str(arg) for arg in argv], **popen)
        except OSError:
            return 127


def kill_group(proc, grace=5.0):
    """SIGTERM the process group of ``proc``, SIGKILL it after ``grace`` seconds, and reap ``proc``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _text(data):
    return (data or b"").decode("utf-8", "replace")


DEFAULT = Runner()

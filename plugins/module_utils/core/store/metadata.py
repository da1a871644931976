# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The metadata file an engine reads after it was started from a snapshot. PRIVATE to inferops.snapshot.

A restored process keeps the environment it was checkpointed with, so its new environment (pod
name, POD_IP, ...) reaches it through this file (schemas/metadata.schema.json). ``document`` is the
one writer of its content, for every path; where it is put differs by path: into a created container
(``docker cp``), through ``/proc/PID/root`` of a restored one, into a rootfs before a cold start, or a
host path for a bare process -- every one of them without following a symlink the engine could plant.
Values are written only into the file, never logged or returned (only the names are).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ..base import schema
from ..base.clock import utc_now
from ..linux import fs, syscalls


def document(env, restored, snapshot_dir, written_by, reason=None, **fields):
    """The metadata document; ``fields`` are the optional properties of the schema (container, pid, pod, ...)."""
    doc = {"schema_version": 1, "env": dict((str(k), str(v)) for k, v in (env or {}).items()),
           "restored": bool(restored), "snapshot_dir": snapshot_dir, "reason": reason, "written_at": utc_now(),
           "written_by": written_by}
    doc.update((key, value) for key, value in fields.items() if value is not None)
    schema.validate("metadata", doc, "metadata document")
    return doc


def encode(doc):
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")


def decode(data):
    """The document from the bytes of a metadata file, or None when they are not one."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, AttributeError):
        return None
    return doc if isinstance(doc, dict) else None


def write_host(path, doc):
    """A bare process's metadata file on the host (0600, its directory created 0700)."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        fs.ensure_dir(directory)
    fs.write_file_atomic(path, encode(doc))
    return path


def write_in_root(root_fd, inner_path, doc, uid=None, gid=None):
    """Write the document at ``inner_path`` below the directory ``root_fd`` (a container's root), as
    ``uid``/``gid`` so that an engine running as that user can read it. No symlink is followed."""
    syscalls.write_below(root_fd, inner_path, encode(doc), uid, gid)


def read_in_root(root_fd, inner_path):
    data = syscalls.read_below(root_fd, inner_path, 1024 * 1024)
    return decode(data) if data is not None else None


def read_in_process(pid, inner_path, proc="/proc"):
    """The metadata file of a running process, seen through its own root (/proc/PID/root), or None."""
    try:
        root_fd = os.open(os.path.join(proc, str(pid), "root"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (IOError, OSError):
        return None
    try:
        return read_in_root(root_fd, inner_path)
    finally:
        os.close(root_fd)


def env_keys(doc):
    return sorted((doc or {}).get("env") or {})

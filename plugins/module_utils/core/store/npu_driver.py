# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NPU driver a checkpointed process used, recorded with its checkpoint and compared before CRIU runs. PRIVATE to
the inferops.snapshot collection.

The driver's user-space libraries are the node's: the Ascend Docker Runtime bind-mounts /usr/local/Ascend/driver/lib64
read-only from the host into every NPU container, and ``halGetAPIVersion`` is a constant of its libascend_hal.so. A
driver upgrade on the node is therefore another library at the same path, and a restore onto it would fail twice over:
CRIU checks a mapped file by its size ("File ... has bad size") and the ACL runtime refuses device memory across driver
API versions. ``mapped`` records every library the process maps from the directory its libascend_hal.so is in (size and
SHA-256, read through the process's own root); the manifest's device part carries it; ``changed`` compares the files
the restored process would map on this node, before anything is touched. The world (world.py) leaves the driver's
directory to this module, so that the reason names the driver and its versions.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..base import layout
from . import digests
from .fleet import mount_source


def _mapped_paths(pid, proc_root):
    """Paths of the files process ``pid`` maps, as it sees them."""
    found = set()
    with open(os.path.join(proc_root, str(pid), "maps")) as handle:
        for line in handle:
            fields = line.rstrip("\n").split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith(" (deleted)"):
                found.add(fields[5])
    return found


def mapped(pid, proc_root="/proc"):
    """{"directory": where process ``pid`` sees the driver's libraries, "files": {name: {"size", "sha256"}}} of every
    file it maps from the directory of its libascend_hal.so (read through its root: a container's bind mount as it
    reads it; hashed once per file identity on a node, digests.py), or None when it maps no driver library."""
    paths = _mapped_paths(pid, proc_root)
    directories = sorted(set(os.path.dirname(p) for p in paths if os.path.basename(p) == layout.NPU_DRIVER_LIBRARY))
    if not directories:
        return None
    directory, root = directories[0], os.path.join(proc_root, str(pid), "root")
    files = {}
    for path in sorted(p for p in paths if os.path.dirname(p) == directory):
        value, ident, _cached = digests.digest(root + path)
        files[os.path.basename(path)] = {"size": ident["size"], "sha256": value}
    return {"directory": directory, "files": files}


def host_directory(directory, mounts=None):
    """Where this node has the driver directory a restored process will see at ``directory``: below the host source
    of the new container's mount that holds it (``mounts``: [{"destination", "source"}]), the path itself for a bare
    process (``mounts`` None), or None: a container's image holds it (no mount does)."""
    if mounts is None:
        return directory
    pairs = [(m.get("destination"), m.get("source")) for m in mounts]
    return mount_source(pairs, os.path.normpath(directory))


def changed(record, api_version=None, mounts=None):
    """Why this node's NPU driver is not the one the checkpointed process mapped (``record``: what ``mapped`` said;
    ``api_version``: its halGetAPIVersion at the backup), or None. ``mounts``: the new container's, see
    host_directory; a driver in the container's image is the image's, which the world compares (world.py)."""
    where = host_directory(record["directory"], mounts) if record else None
    if not where:
        return None
    for name, was in sorted(record["files"].items()):
        path = os.path.join(where, name)
        try:
            value, ident, _cached = digests.digest(path)
        except (OSError, ValueError) as exc:
            now = "it is missing or unreadable here (%s)" % exc
        else:
            if value == was["sha256"] and ident["size"] == was["size"]:
                continue
            now = "%d bytes, sha256 %s... now" % (ident["size"], value[:12])
        return ("driver_changed: the NPU driver library %s is not the one the checkpointed process mapped (%d bytes, "
                "sha256 %s... at the checkpoint; %s): the node's driver changed since the snapshot (driver API %s "
                "then). CRIU would refuse the mapped file and the runtime device memory across driver versions: "
                "restore on a node with the snapshot's driver, or take a new snapshot"
                % (path, was["size"], was["sha256"][:12], now, api_version))
    return None

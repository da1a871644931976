# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What is mounted where: filesystem types from /proc/self/mountinfo. PRIVATE to the inferops.snapshot collection."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from . import fs


MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")
MOUNTINFO = "/proc/self/mountinfo"


def mounts(mountinfo=None):
    """(mount point, filesystem type) of every line of mountinfo, in its order (the last of stacked mounts
    wins); the octal escapes of the mount point undone. The one reader of mountinfo; IOError when it cannot
    be read."""
    found = []
    with open(mountinfo or MOUNTINFO) as handle:
        for line in handle:
            left, _sep, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 5 or not right:
                continue
            point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
                .replace("\\134", "\\")
            found.append((point, right.split()[0]))
    return found


def filesystem_type(path, mountinfo=None):
    """The type of the filesystem ``path`` (or its nearest existing parent) is on, from mountinfo; None
    when it cannot be read."""
    target, best, kind = fs.existing_ancestor(path), None, None
    try:
        found = mounts(mountinfo)
    except (IOError, OSError):
        return None
    for point, fstype in found:
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best)):  # the last of stacked mounts wins
            best, kind = point, fstype
    return kind


def is_tmpfs(path, mountinfo=None):
    """Whether files below ``path`` take memory (tmpfs, ramfs) rather than disk."""
    return filesystem_type(path, mountinfo) in MEMORY_FILESYSTEMS

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Removes the copy of a checkpoint that containerd leaves behind on `docker start --checkpoint`.
PRIVATE to the inferops.snapshot collection.

containerd (1.6 here, still in later releases: containerd/containerd#10166) writes the checkpoint it
restores from into ``os.MkdirTemp($XDG_RUNTIME_DIR, "ctrd-checkpoint")`` -- ``$TMPDIR`` or ``/tmp``
when unset -- and never removes it, not even with the container. Every docker-method restore would
leave a full copy of the CRIU images (GBs) in containerd's temporary directory until the disk is
full. We list those directories before the start, and afterwards remove the new ones whose content
is this snapshot's images (same names, sizes and inventory), so a concurrent restore of another
snapshot is never touched.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil

from ..base import layout

PREFIX = "ctrd-checkpoint"


def containerd_pids(proc="/proc"):
    pids = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "comm")) as handle:
                if handle.read().strip() == "containerd":
                    pids.append(int(entry))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return sorted(pids)


def _environ(proc, pid):
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"XDG_RUNTIME_DIR", b"TMPDIR"):
            env[key.decode()] = value.decode(errors="replace")
    return env


def temp_dirs(proc="/proc"):
    """Containerd's temporary directories, seen through its own root (it may have a private /tmp)."""
    found = []
    for pid in containerd_pids(proc):
        env = _environ(proc, pid)
        base = env.get("XDG_RUNTIME_DIR") or env.get("TMPDIR") or "/tmp"
        path = os.path.join(proc, str(pid), "root", base.lstrip("/"))
        if path not in found:
            found.append(path)
    return found


def list_copies(dirs):
    copies = set()
    for directory in dirs:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        copies.update(os.path.join(directory, name) for name in names if name.startswith(PREFIX))
    return copies


def _fingerprint(directory):
    """File names and sizes, plus the inventory's bytes: enough to tell one snapshot's images from another's."""
    sizes = {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isfile(path) and not os.path.islink(path):
            sizes[name] = os.path.getsize(path)
    try:
        with open(os.path.join(directory, layout.IMAGES_INVENTORY), "rb") as handle:
            inventory = handle.read()
    except OSError:
        inventory = None
    return sizes, inventory


def _is_copy_of(candidate, images_fingerprint):
    try:
        sizes, inventory = _fingerprint(candidate)
    except OSError:
        return False
    want_sizes, want_inventory = images_fingerprint
    # containerd adds its own descriptors (config.json, spec) next to the images: ours must all be there.
    return want_inventory is not None and inventory == want_inventory and all(
        sizes.get(name) == size for name, size in want_sizes.items())


class LeakGuard:
    """With LeakGuard(images_dir): docker start --checkpoint ...  -- removes the copy containerd leaves."""

    def __init__(self, images_dir, proc="/proc"):
        self.images_dir = images_dir
        self.proc = proc
        self.removed = []
        self._dirs = []
        self._before = set()

    def __enter__(self):
        self._dirs = temp_dirs(self.proc)
        self._before = list_copies(self._dirs)
        return self

    def __exit__(self, *exc_info):
        self.sweep()
        return False

    def sweep(self):
        new = sorted(list_copies(self._dirs) - self._before)
        if not new:
            return self.removed
        wanted = _fingerprint(self.images_dir)
        for candidate in new:
            if os.path.islink(candidate) or not os.path.isdir(candidate):
                continue
            if _is_copy_of(candidate, wanted):
                shutil.rmtree(candidate, ignore_errors=True)
                self.removed.append(candidate)
        return self.removed

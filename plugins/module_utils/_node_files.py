# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tree of files installed on a node in one module run (snapshot_node_files). PRIVATE to inferops.snapshot.

The action plugin reads the tree on the controller (``read_tree``) and sends it in the module's arguments;
``install`` writes, on the node, each file whose bytes, mode or owner differ (through a temporary file and a
rename), and removes the files an earlier run installed there that are no longer in the tree -- only those: the
list of what it installed is kept beside them (``INSTALLED``), so a mistaken ``dest`` never loses other files.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import stat

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import fs

INSTALLED = ".inferops-installed.json"
SKIPPED_DIRS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc", ".pyo")


def read_tree(source):
    """{relative path: base64 of its bytes} of the regular files below ``source`` (no byte code, no links)."""
    files = {}
    for directory, dirnames, filenames in os.walk(source):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in sorted(filenames):
            path = os.path.join(directory, name)
            if name.endswith(SKIPPED_SUFFIXES) or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            with open(path, "rb") as handle:
                files[os.path.relpath(path, source)] = base64.b64encode(handle.read()).decode("ascii")
    return files


def _below(rel):
    """Whether ``rel`` names a file below dest: relative, no empty, '.' or '..' component, not the install list."""
    return isinstance(rel, str) and not rel.startswith("/") and rel != INSTALLED and \
        not any(part in ("", ".", "..") for part in rel.split("/"))


def _checked(files):
    decoded = {}
    for rel, data in sorted(files.items()):
        if not _below(rel):
            raise ParameterError("files: %r is not a relative path below dest; give paths like 'pkg/module.py'" % rel,
                                 field="files")
        try:
            decoded[rel] = base64.b64decode(data.encode("ascii"), validate=True)
        except (ValueError, TypeError, AttributeError):
            raise ParameterError("files: the content of %r is not base64; the action plugin sends it from src" % rel,
                                 field="files")
    return decoded


def _differs(path, data, mode):
    try:
        st = os.lstat(path)
    except OSError:
        return True
    if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != mode or (st.st_uid, st.st_gid) != (
            os.geteuid(), os.getegid()) or st.st_size != len(data):
        return True
    with open(path, "rb") as handle:
        return handle.read() != data


def _previously_installed(dest):
    """What an earlier run installed, from its list; each entry is checked as ``files`` are (the list names what is
    removed: one naming '../' or an absolute path would remove a file outside dest)."""
    listed = (fs.read_json(os.path.join(dest, INSTALLED)) or {}).get("files")
    listed = listed if isinstance(listed, list) else []
    for rel in listed:
        if not _below(rel):
            raise ParameterError("dest: %s lists %r, which is not a relative path below dest: this module never wrote "
                                 "it; remove that entry (or the file) and run again"
                                 % (os.path.join(dest, INSTALLED), rel), field="dest")
    return set(listed)


def check_dest(dest):
    """``dest`` must be an absolute path that is, or can become, a directory: refused, naming it, before anything is
    written (a relative one was resolved against the module's cwd, a file failed half-way with "unexpected error")."""
    if not isinstance(dest, str) or not dest:
        raise ParameterError("dest: a non-empty absolute path is required", field="dest")
    if "\x00" in dest:
        raise ParameterError("dest: the path contains a NUL byte; give the directory's absolute path", field="dest")
    if not os.path.isabs(dest):
        raise ParameterError("dest: %r is relative; give an absolute path, e.g. /usr/local/lib/inferops-snapshot"
                             % dest, field="dest")
    if ".." in dest.split("/"):
        raise ParameterError("dest: %r contains '..'; give the path without parent references" % dest, field="dest")
    head = dest
    while not os.path.lexists(head):
        head = os.path.dirname(head)
    if not os.path.isdir(head):
        raise ParameterError("dest: %s is %s, not a directory; remove it or give another dest"
                             % (head, "a file" if head == dest else "an existing file on its path"), field="dest")


def _check_targets(dest, written, removed):
    """Every path that install writes or removes must be reachable through directories, and what it writes no
    directory: checked for all of them before the first write, so a conflict leaves no half install behind."""
    for rel in written + removed:
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            path = os.path.join(dest, *parts[:depth])
            if not os.path.lexists(path):
                break
            last = depth == len(parts)  # the file itself: a rename replaces a file or a link, never a directory
            # a directory on the way is a real one: through a link, a removal would reach outside dest
            if (os.path.isdir(path) and not os.path.islink(path)) if last else \
                    (os.path.islink(path) or not os.path.isdir(path)):
                raise ParameterError("dest: cannot install %s in %s: %s is %s; remove it or give another dest" % (
                    rel, dest, path, "a directory" if last else "a symbolic link" if os.path.islink(path) else
                    "not a directory"), field="dest", path=rel)


def install(dest, files, mode=0o644, directory_mode=0o755, check_mode=False):
    """Make ``dest`` hold ``files`` ({rel: base64}); returns {written, removed, files}: what changed (or would)."""
    check_dest(dest)
    wanted = _checked(files)
    previous = _previously_installed(dest)
    written = [rel for rel, data in sorted(wanted.items()) if _differs(os.path.join(dest, rel), data, mode)]
    removed = sorted(rel for rel in previous - set(wanted) if os.path.lexists(os.path.join(dest, rel)))
    _check_targets(dest, written, removed)
    if not check_mode and (written or removed or previous != set(wanted)):
        for rel in written:
            path = os.path.join(dest, rel)
            directory = os.path.dirname(path)
            if not os.path.isdir(directory):
                os.makedirs(directory, mode=directory_mode)
                os.chmod(directory, directory_mode)  # makedirs' mode is masked by the umask
            fs.write_file_atomic(path, wanted[rel], mode)
            os.chmod(path, mode)
        for rel in removed:
            os.unlink(os.path.join(dest, rel))
        fs.write_file_atomic(os.path.join(dest, INSTALLED),
                             json.dumps({"files": sorted(wanted)}, indent=0).encode("utf-8"), 0o644)
    return {"written": written, "removed": removed, "files": len(wanted)}

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one ``snapshot_refresh`` task does on the host that holds the store. PRIVATE to inferops.snapshot.

The controller signs (plugins/action/snapshot_refresh.py); this side holds no key and vouches for nothing: ``survey``
sends up what the store holds of each identity's latest generation -- its statement (store/statement.py) and the
published snapshot's checksum list, signature and manifest -- as read, for the controller to check against its own
key; ``write`` puts the statements the controller signed again beside their snapshots, each only where the statement
there is still the one the controller read (a generation that wrote its own meanwhile wins).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat

from ..base import layout, schema
from ..base.errors import ParameterError, SnapshotError
from ..linux import fs, paths
from ..store import statement
from .retention import instance_dirs

# What the controller reads of a published snapshot, with the most it reads of each.
DOCUMENTS = (("checksums", layout.CHECKSUMS, fs.RECORD_LIMIT), ("signature", layout.SIGNATURE, statement.LIMIT),
             ("manifest", layout.MANIFEST, fs.RECORD_LIMIT))


def _text(directory, name, limit):
    """The text of a small file of the snapshot, never through a link; None when it cannot be read."""
    try:
        fd = fs.open_regular(os.path.join(directory, name))
    except (IOError, OSError):
        return None
    try:
        return fs.read_limited(fd, limit, name).decode("utf-8")
    except ValueError:  # too large, or not UTF-8
        return None
    finally:
        os.close(fd)


def _pods(directory):
    """The pods of an instance directory with a published snapshot (a real directory) or a statement."""
    pods = set()
    for name in os.listdir(directory):
        if name.startswith(".") and name.endswith(layout.LATEST_SUFFIX) and len(name) > len(layout.LATEST_SUFFIX) + 1:
            pods.add(name[1:-len(layout.LATEST_SUFFIX)])
        elif not name.startswith(".") and stat.S_ISDIR(os.lstat(os.path.join(directory, name)).st_mode):
            pods.add(name)
    return sorted(pods)


def _identity(prefix, pod):
    identity = dict(prefix, pod=pod)
    try:
        schema.validate("manifest", identity, "identity", definition="identity")
    except SnapshotError:
        return None  # not a name the collection writes: nothing of ours
    return identity


def survey(root):
    """[{identity, statement (its text, or None), statement_sha256, published ({checksums, signature, manifest} as
    text, or None)}] of every pod below ``root`` that has a statement or a published snapshot."""
    found = []
    for prefix, directory in instance_dirs(root):
        for pod in _pods(directory):
            identity = _identity(prefix, pod)
            if identity is None:
                continue
            snapshot_dir = os.path.join(directory, pod)
            data = statement.read(snapshot_dir)
            texts = dict((key, _text(snapshot_dir, name, limit)) for key, name, limit in DOCUMENTS)
            published = texts if all(value is not None for value in texts.values()) else None
            if data is None and published is None:
                continue
            found.append({"identity": identity, "statement": None if data is None else data.decode("utf-8", "replace"),
                          "statement_sha256": statement.digest(data), "published": published})
    return found


def _checked(root, statements):
    """[(snapshot dir, statement bytes, digest it replaces)] of the controller's statements, each checked -- of the
    identity it is for, below ``root`` -- before any is written; ParameterError naming the entry otherwise."""
    checked = []
    for index, item in enumerate(statements):
        field = "statements[%d]" % index
        if not isinstance(item, dict) or set(item) - {"identity", "statement", "replaces"}:
            raise ParameterError("%s: set by snapshot_refresh's action plugin only ({identity, statement, replaces}); "
                                 "run the module as inferops.snapshot.snapshot_refresh in a task" % field, field=field)
        schema.validate("manifest", item.get("identity"), field + ".identity", definition="identity")
        snapshot_dir = paths.validate_snapshot_dir(layout.snapshot_dir(root, item["identity"]), field=field)
        data = statement.accepted(item.get("statement"), item["identity"], field=field + ".statement")
        if data is None:
            raise ParameterError("%s.statement: missing" % field, field=field)
        checked.append((snapshot_dir, data, item.get("replaces")))
    return checked


def refresh(params, check_mode=False):
    """The result of a snapshot_refresh run on the node: the survey (no ``statements``), or the statements written."""
    if params.get("signing_key"):
        raise ParameterError("signing_key: is read on the controller by snapshot_refresh's action plugin, which signs "
                             "there, and is never sent to the node; run the module as inferops.snapshot.snapshot_refresh "
                             "in a task", field="signing_key")
    root = paths.validate_snapshot_dir(params["root"], field="root")
    if params.get("statements") is None:
        return dict(changed=False, found=survey(root) if os.path.isdir(root) else [])
    written, moved = [], []
    for snapshot_dir, data, replaces in _checked(root, params["statements"]):
        if check_mode or statement.write(snapshot_dir, data, replaces):
            written.append(snapshot_dir)
        else:
            moved.append(snapshot_dir)
    return dict(changed=bool(written), written=written, changed_meanwhile=moved)

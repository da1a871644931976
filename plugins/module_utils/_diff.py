# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the modules that change files or containers show with --diff. PRIVATE to the inferops.snapshot collection.

Each function takes the module's parameters and its result and returns Ansible's diff (before/after text, one
line per path or container, with headers), computed from what the module reports it did -- or, in check mode,
would do -- so the diff and the result never disagree. ``_module.run(..., diff=...)`` adds it when Ansible asks
(--diff, or diff: true on the task). A run that changed nothing shows no difference.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout


def _text(lines):
    return "".join("%s\n" % line for line in lines)


def _diff(before, after, before_header, after_header):
    return dict(before=_text(before), after=_text(after), before_header=before_header, after_header=after_header)


def cleanup(params, result):
    """One line per path removed (in check mode: that would be), with its category and why; a snapshot put back."""
    removed = sorted(result.get("removed") or [], key=lambda item: item["path"])
    before = ["%s  (%s %s: %s)" % (item["path"], item["category"], item["kind"], item["reason"]) for item in removed]
    before += ["%s  (the CRIU work dir of a killed checkpoint or restore)" % path
               for path in sorted(result.get("work_dirs_removed") or [])]
    put = sorted(result.get("put_back") or [], key=lambda item: item["path"])
    before += ["%s  (a snapshot a killed publish left aside)" % item["from"] for item in put]
    after = ["%s  (put back from %s)" % (item["path"], item["from"]) for item in put]
    return _diff(before, after, "%s before the cleanup" % params["root"], "%s after the cleanup" % params["root"])


def node_files(params, result):
    """One line per file written or removed (in check mode: that would be)."""
    return _diff(["%s  (differs)" % rel for rel in result["written"]] + ["%s  (removed)" % rel for rel in result["removed"]],
                 result["written"], "%s before" % params["dest"], "%s after" % params["dest"])


def restore(params, result):
    """The container (or process) as it was and as the restore left it: recreated or not, restored from the snapshot
    or started cold with the reason, and the metadata file it wrote into it."""
    if not result.get("changed"):
        return _diff([], [], "unchanged", "unchanged")
    docker = params["engine"] == "docker"
    what = "container %s" % params["container"] if docker else "process of %s" % result["snapshot_dir"]
    check = "created" not in result and "pid" not in result  # check mode: nothing was done
    before = ["%s: %s" % (what, "not running" if check else "absent" if result.get("created") else "stopped")]
    if result.get("restored"):
        method = " (method %s)" % result["method"] if result.get("method") else ""
        device = ", device: %s" % ", ".join(result["device_actions"]) if result.get("device_actions") else ""
        outcome = "restored from %s%s%s" % (result["snapshot_dir"], method, device)
    else:
        outcome = "started cold: %s" % result.get("reason")
    after = ["%s: %s%s" % (what, "would be " if check else "", outcome)]
    if result.get("created"):
        after.append("%s: created from the snapshot's record" % what)
    if docker and (result.get("restored") or check):
        keys = result.get("metadata_env_keys") if not check else sorted(params["env"])
        after.append("%s: %s%s (env %s)" % (what, "would write " if check else "wrote ", params["metadata_path"],
                                            ", ".join(keys or []) or "none"))
    if result.get("pid"):
        after.append("%s: pid %d" % (what, result["pid"]))
    return _diff(before, after, "before the restore", "after the restore%s" % (" (check mode)" if check else ""))


def checkpoint(params, result):
    """The published snapshot's files (from its checksum list) and the status record, replacing what was there."""
    snapshot_dir = result.get("snapshot_dir") or params["snapshot_dir"]
    if not result.get("changed"):
        return _diff([], [], "unchanged", "unchanged")
    replaced = result.get("replaced_because")
    before = ["%s/  (published; replaced because: %s)" % (snapshot_dir, "; ".join(replaced))] if replaced else []
    if not result.get("checksum"):  # check mode: nothing was written, say what would be
        after = ["%s/  (would be published)" % snapshot_dir, "%s: %s" % (layout.status_path(snapshot_dir), "completed")]
        return _diff(before, after, "before the checkpoint", "after the checkpoint (check mode)")
    after = ["%s/  (published: %s files, %s bytes, checksum %s)"
             % (snapshot_dir, result.get("files"), result.get("total_bytes"), result["checksum"])]
    after.extend(os.path.join(snapshot_dir, rel) for rel in _listed(snapshot_dir))
    after.append("%s: %s" % (layout.status_path(snapshot_dir), result.get("status")))
    return _diff(before, after, "before the checkpoint", "after the checkpoint")


def _listed(snapshot_dir):
    """The files checksum.sha256 lists (what was published), sorted; [] if it cannot be read."""
    try:
        with open(os.path.join(snapshot_dir, layout.CHECKSUMS)) as handle:
            return sorted([line.rstrip("\n").split("  ", 1)[1] for line in handle if "  " in line] + [layout.CHECKSUMS])
    except (IOError, OSError):
        return []


def stage(params, result):
    """The cache entry the copy went (or would go) to."""
    if not result.get("changed"):
        return _diff([], [], "unchanged", "unchanged")
    copy = (result.get("staged") or {}).get("dir") or layout.stage_content(result["entry"])
    return _diff([], ["%s  (a verified copy of %s, %s bytes; %s)" % (copy, result["snapshot_dir"], result["bytes"],
                                                                     result.get("reason"))],
                 "%s before staging" % result["stage_dir"], "%s after staging" % result["stage_dir"])


def canary(before, after, path):
    """The recorded request and answer, as canary.json had them and has them now."""
    return _diff(_json_lines(before), _json_lines(after), "%s before" % path, "%s after" % path)


def _json_lines(document):
    return json.dumps(document, indent=2, sort_keys=True).splitlines() if document is not None else []

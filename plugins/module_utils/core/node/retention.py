# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What is on disk under a snapshot root, what uses it, and what a retention policy removes. PRIVATE.

Layout (core/base/layout.py): ``<root>/<namespace>/<service>/<instance>/`` holds per pod ``<pod>/`` (the
published snapshot), ``.<pod>.partial`` (staging), ``.<pod>.old.<pid>`` (a replaced snapshot being
removed) and ``.<pod>.status.json`` (the status record). The device (NPU) root has ``<pod>/`` dirs at
the same depth, written by engines that take the device snapshot themselves.

A snapshot is in use while a running container was restored from it, or while it is being generated;
nothing in use is ever removed. The decision is a pure function of the scan (``decide``), so that it
can be tested without containers.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import os
import stat

from ..base import layout, schema
from ..base.errors import ParameterError
from ..generate import claim
from ..linux import fs
from ..store import fleet, metadata, status

NPU_ENV = layout.ENV_NPU_SNAPSHOT_PATH
DEFAULT_METADATA_PATH = layout.DEFAULT_METADATA_FILE
CATEGORIES = ("failed", "orphaned", "stale")
LEVELS = ("namespace", "service", "instance")


# -- containers ---------------------------------------------------------------------------------

def env_value(info, key):
    """One variable of a container's environment (the others, secrets maybe, are never looked at)."""
    prefix = key + "="
    for item in (info.get("Config") or {}).get("Env") or []:
        if item.startswith(prefix):
            return item[len(prefix):]
    return None


def restored_from(pid, metadata_path=DEFAULT_METADATA_PATH, proc="/proc"):
    """The snapshot a running container was restored from, read from the metadata file the restore
    wrote into it (only its ``restored`` and ``snapshot_dir`` keys; the environment is not read out)."""
    if not pid:
        return None
    doc = metadata.read_in_process(pid, metadata_path, proc)
    if isinstance(doc, dict) and doc.get("restored") and isinstance(doc.get("snapshot_dir"), str):
        return os.path.normpath(doc["snapshot_dir"])
    return None


def container_facts(info, metadata_path=DEFAULT_METADATA_PATH, proc="/proc"):
    """What the roles need to know about a container, from its `docker inspect`; no env values but one."""
    state = info.get("State") or {}
    running = bool(state.get("Running"))
    pid = int(state.get("Pid") or 0) if running else None
    npu = env_value(info, NPU_ENV)
    return {
        "exists": True,
        "id": info.get("Id"),
        "name": (info.get("Name") or "").lstrip("/"),
        "running": running,
        "status": state.get("Status"),
        "pid": pid,
        "image_id": info.get("Image"),
        "image": (info.get("Config") or {}).get("Image"),
        "npu_snapshot_path": os.path.normpath(npu) if npu else None,
        "restored_from": restored_from(pid, metadata_path, proc) if running else None,
    }


def running_containers(docker, metadata_path=DEFAULT_METADATA_PATH):
    """container_facts of every running container (one `docker inspect` for all of them)."""
    facts = []
    for info in docker.inspect_containers(docker.running_ids()):  # one that went away meanwhile is not listed
        item = container_facts(info, metadata_path)
        if item["running"]:
            facts.append(item)
    return facts


# -- scanning -------------------------------------------------------------------------------------

def _age(path, now):
    try:
        return now - os.lstat(path).st_mtime
    except OSError:
        return None


def _parse_time(text):
    if not isinstance(text, str):
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            moment = datetime.datetime.strptime(text, fmt).replace(tzinfo=datetime.timezone.utc)
            return moment.timestamp()
        except ValueError:
            continue
    return None


def _read_manifest(snapshot_dir):
    return fs.read_json(os.path.join(snapshot_dir, layout.MANIFEST))


def _subdirs(path):
    """Real (non-symlink) subdirectories, sorted; a symlink is never followed into."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [name for name in names if not name.startswith(".")
            and stat.S_ISDIR(os.lstat(os.path.join(path, name)).st_mode)]


def instance_dirs(root):
    """(identity prefix, directory) of every <namespace>/<service>/<instance> below ``root``."""
    found = []
    for namespace in _subdirs(root):
        for service in _subdirs(os.path.join(root, namespace)):
            for instance in _subdirs(os.path.join(root, namespace, service)):
                found.append(({"namespace": namespace, "service": service, "instance": instance},
                              os.path.join(root, namespace, service, instance)))
    return found


def mark_published(entry, path, now):
    """``entry`` of scan with the published snapshot at ``path``: its manifest, and its age (from its manifest's
    created_at, else from the directory's mtime)."""
    entry["published"] = True
    entry["manifest"] = _read_manifest(path)
    created = _parse_time((entry["manifest"] or {}).get("created_at"))
    entry["age"] = now - created if created is not None else _age(path, now)


def scan(root, now):
    """Every pod that has anything under ``root``: published snapshot, staging, old copies, status."""
    pods = {}
    for prefix, directory in instance_dirs(root):
        for name in sorted(os.listdir(directory)):
            full = os.path.join(directory, name)
            mode = os.lstat(full).st_mode
            kind, pod = layout.sibling(name) or (None, None)
            if kind is None:
                if name.startswith(".") or not stat.S_ISDIR(mode):
                    continue  # temporary files of an atomic write, or foreign files: not ours to judge
                kind, pod = "snapshot", name
            if stat.S_ISLNK(mode):
                continue  # never follow or remove a symlink planted in a snapshot root
            identity = dict(prefix, pod=pod)
            key = (prefix["namespace"], prefix["service"], prefix["instance"], pod)
            entry = pods.setdefault(key, {"identity": identity, "snapshot_dir": os.path.join(directory, pod),
                                          "published": False, "status": None, "status_path": None, "claim": None,
                                          "leftovers": [], "manifest": None, "age": None, "restores_path": None,
                                          "restoring": []})
            if kind == "snapshot":
                mark_published(entry, full, now)
            elif kind == "status":
                entry["status_path"] = full
                entry["status"] = status.read(entry["snapshot_dir"])
            elif kind == "restores":  # restores in progress, on any node that mounts this store (fleet.py)
                entry["restores_path"] = full
                entry["restoring"] = fleet.in_progress(entry["snapshot_dir"], now)
            elif kind == "claim":
                entry["claim"] = claim.read(entry["snapshot_dir"])
                if not claim.live_other(entry["snapshot_dir"], None, now):
                    entry["leftovers"].append({"path": full, "kind": "claim", "age": _age(full, now)})
            else:
                entry["leftovers"].append({"path": full, "kind": kind, "age": _age(full, now)})
    return [pods[key] for key in sorted(pods)]


def scan_npu(root):
    """Per-pod device (NPU) snapshot dirs below the device root: {identity key: path}."""
    found = {}
    for prefix, directory in instance_dirs(root):
        for pod in _subdirs(directory):
            key = (prefix["namespace"], prefix["service"], prefix["instance"], pod)
            found[key] = os.path.join(directory, pod)
    return found


# -- deciding -------------------------------------------------------------------------------------

def _key(identity):
    return tuple(identity[level] for level in LEVELS + ("pod",))


def check_policy(remove, max_age, generation_grace, known_pods):
    unknown = sorted(set(remove) - set(CATEGORIES))
    if unknown:
        raise ParameterError("remove: unknown categor%s %s; choose from %s"
                             % ("y" if len(unknown) == 1 else "ies", ", ".join(unknown), ", ".join(CATEGORIES)))
    if max_age is not None and max_age <= 0:
        raise ParameterError("max_age: must be a positive number of seconds, got %s" % max_age)
    if generation_grace <= 0:
        raise ParameterError("generation_grace: must be a positive number of seconds, got %s" % generation_grace)
    for index, pod in enumerate(known_pods or []):
        missing = [level for level in LEVELS + ("pod",) if not pod.get(level)]
        if missing:
            raise ParameterError("known_pods[%d]: give namespace, service, instance and pod (missing %s)"
                                 % (index, ", ".join(missing)))
        # as the identity schema, before anything is scanned: "pod0 " (a stray space of templating) would
        # otherwise mark pod0's snapshot orphaned, and a non-string crashed the comparison
        problems = schema.errors("manifest", pod, definition="identity")
        if problems:
            key, _sep, problem = problems[0].partition(": ")
            field = "known_pods[%d]%s" % (index, "" if key == "(top level)" else "." + key)
            raise ParameterError("%s: %s; give the pod's identity exactly as its snapshots record it (see the "
                                 "identity in schemas/manifest.schema.json)" % (field, problem), field=field)


def decide(entries, npu_dirs, policy, in_use, npu_in_use, images, now):
    """Split what the scan found into removals and what stays, with a reason for each.

    ``policy``: remove (categories), max_age, generation_grace, known_pods, check_images.
    ``in_use``: {snapshot_dir: who uses it}; ``npu_in_use``: {npu dir: who uses it};
    ``images``: ids of the images present on the host, or None when not checked.
    Returns (removals, kept): removals are {path, kind, category, identity, reason}.
    """
    remove = set(policy.get("remove") or ())
    grace = policy.get("generation_grace") or 3600
    max_age = policy.get("max_age")
    known = policy.get("known_pods")
    known_keys = set(_key(pod) for pod in known) if known is not None else None
    known_services = set((pod["namespace"], pod["service"]) for pod in known or [])
    removals, kept = [], []
    host_keys = set()

    def drop(entry, category, reason, everything=True):
        items = []
        if everything:
            if entry["published"]:
                items.append((entry["snapshot_dir"], "snapshot"))
            if entry["status_path"]:
                items.append((entry["status_path"], "status"))
            if entry.get("restores_path"):
                items.append((entry["restores_path"], "restores"))
            npu = npu_dirs.get(_key(entry["identity"]))
            if npu and npu not in npu_in_use:
                items.append((npu, "npu"))
        items.extend((item["path"], item["kind"]) for item in entry["leftovers"])
        for path, kind in items:
            removals.append({"path": path, "kind": kind, "category": category, "identity": entry["identity"],
                             "reason": reason})

    for entry in entries:
        key = _key(entry["identity"])
        host_keys.add(key)
        record = entry["status"] or {}
        status = record.get("status")
        summary = {"identity": entry["identity"], "snapshot_dir": entry["snapshot_dir"], "status": status,
                   "published": entry["published"]}
        user = in_use.get(os.path.normpath(entry["snapshot_dir"]))
        if user:
            kept.append(dict(summary, reason="in use: %s was restored from it" % user))
            continue
        if entry.get("restoring"):
            kept.append(dict(summary, reason="in use: being restored (%s)" % "; ".join(
                fleet.describe(item) for item in entry["restoring"])))
            continue
        if entry["claim"] and claim.live_other(entry["snapshot_dir"], None, now):
            kept.append(dict(summary, reason="in use: being generated (%s)" % claim.describe(entry["claim"])))
            continue
        record_age = now - (_parse_time(record.get("updated_at")) or now)
        young_leftover = any(item["age"] is not None and item["age"] < grace and item["kind"] != "claim"
                             for item in entry["leftovers"])
        if (status == "generating" and record_age < grace) or young_leftover:
            kept.append(dict(summary, reason="in use: being generated (status %s, changed %.0f s ago)"
                             % (status or "none", record_age)))
            continue
        if status == "failed":
            if "failed" in remove:
                drop(entry, "failed", "generation failed: %s" % (record.get("reason") or "no reason recorded"))
            else:
                kept.append(dict(summary, reason="failed, but 'failed' is not in remove"))
            continue
        if known_keys is not None and (key[0], key[1]) in known_services and key not in known_keys:
            if "orphaned" in remove:
                drop(entry, "orphaned", "pod %s is not a pod of the service any more" % "/".join(key))
            else:
                kept.append(dict(summary, reason="orphaned, but 'orphaned' is not in remove"))
            continue
        if not entry["published"]:
            if "orphaned" in remove:
                drop(entry, "orphaned", "status says completed but the snapshot is gone" if status == "completed"
                     else "left over by a generation that never finished (status %s)" % (status or "none"))
            else:
                kept.append(dict(summary, reason="no snapshot (status %s)" % (status or "none")))
            continue
        # A published snapshot: leftovers of a crashed regeneration go, the snapshot is judged on its own.
        if entry["leftovers"] and "orphaned" in remove:
            drop(entry, "orphaned", "left over by a generation that never finished", everything=False)
        manifest = entry["manifest"] or {}
        image = (manifest.get("image") or {}).get("id")
        if "stale" in remove and max_age is not None and entry["age"] is not None and entry["age"] > max_age:
            drop(entry, "stale", "older than max_age (%.0f s > %.0f s)" % (entry["age"], max_age))
        elif "stale" in remove and images is not None and image and image not in images:
            drop(entry, "stale", "its image %s is no longer on this host; it can never be restored" % image)
        else:
            kept.append(dict(summary, reason="kept (%s)" % (status or "no status record")))

    for key, path in sorted(npu_dirs.items()):
        if key in host_keys:
            continue
        identity = dict(zip(LEVELS + ("pod",), key))
        user = npu_in_use.get(path)
        if user:
            kept.append({"identity": identity, "snapshot_dir": None, "npu_dir": path, "status": None,
                         "published": False, "reason": "in use: %s engine records its device snapshot here" % user})
        elif "orphaned" in remove:
            removals.append({"path": path, "kind": "npu", "category": "orphaned", "identity": identity,
                             "reason": "device snapshot dir without a host snapshot or status, used by no container"})
        else:
            kept.append({"identity": identity, "snapshot_dir": None, "npu_dir": path, "status": None,
                         "published": False, "reason": "orphaned device dir, but 'orphaned' is not in remove"})
    return removals, kept


def remove_path(path):
    """Remove a directory tree or a file we created; symlinks are unlinked, never followed."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    else:
        fs.remove_tree(path)

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The world a snapshot belongs to, recorded at generation and compared before any restore. PRIVATE.

A restored process is the checkpointed one: it does not read its weights, its arguments or its
config again. So "restored" is only true if the world it comes back into is the one it was taken
in: the same command line, working dir and user; the same mounts with the same files in
them (weights, configs; an engine reads them at start and may have closed them, or maps
them, and CRIU checks only a mapped file's size); the same devices; the same kernel, CRIU and
collection. ``capture`` records these facts (the manifest's ``world``), ``compare`` names every
difference with both values; any difference is a cold start.

Every bind mount's regular files are recorded by their identity -- (device, inode, size, ctime), which a
rename over a file or any write changes and no user can set back (digests.py) -- and, computed after the
engine resumed (``add_digests``, never in its lock window), their SHA-256, cached per identity on the node. A
restore compares the identity first: the same file is the same content, at the cost of a stat. A file whose
identity differs (another node, the same weights copied again) is compared by its full digest (read once per
node and identity: the cache), so a copy of the same weights matches and any changed byte does not.

Mounts are matched by where the process sees them (the destination), not by their host source: a
new pod's volumes live under its own pod directory, and a clone on another node mounts the same
weights from another path. What the process sees must match: read-only or read-write, and the files in
every mount -- an engine that reads its weights from a read-write volume is common. Left out (recorded in
``excluded`` with the reason, and only their presence and mode compared): volumes the kubelet or dockerd write
per pod or container (downward API, projected, secrets, emptyDir, dockerd's hosts files, the kubelet's /etc/hosts and
termination log, containerd's per-sandbox hostname, resolv.conf and /dev/shm: they say who the pod is, not what the
engine loaded); the collection's own mounts in the container (the simulated NPU's device
files, the NPU snapshot path, the agent's socket dir, the metadata file's dir); the node's NPU driver (below
/usr/local/Ascend/driver: the device part records and compares what the process maps of it, npu_driver.py); and
the mounts the operator declares as engine state (``engine_state_mounts``: caches, logs -- written by the engine,
not read as weights).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import platform
import re
import stat
from concurrent.futures import ThreadPoolExecutor

from ..base import layout
from ..linux import proc
from . import digests

MAX_FILES = 10000          # per mount; more is refused at generation rather than half-recorded
COLLECTION_VERSION = layout.COLLECTION_VERSION
SKIP_PREFIXES = ("/proc/", "/sys/", "/dev/")
# Host sources whose content is per pod or per container, written by the kubelet or dockerd, never the engine's
# inputs (the kubelet's volume plugin directories, dockerd's hostname/hosts/resolv.conf).
VOLATILE_SOURCE_PARTS = ("/volumes/kubernetes.io~downward-api/", "/volumes/kubernetes.io~projected/",
                         "/volumes/kubernetes.io~secret/", "/volumes/kubernetes.io~empty-dir/",
                         layout.DOCKER_ROOT + "/containers/",
                         "/io.containerd.grpc.v1.cri/sandboxes/")   # containerd's hostname, resolv.conf, shm of a pod
# The kubelet's own files of a pod (below <kubelet root>/pods/<uid>/): its /etc/hosts and each container's termination log.
KUBELET_POD_FILES = re.compile(r"/pods/[^/]+/(etc-hosts|containers/[^/]+/[^/]+)$")
# The collection's own paths in a container, by the variable that moves them (and where they are without it): a
# mount holding one is written by the snapshot machinery itself, never read by the engine as an input.
OWN_PATHS = ((layout.ENV_SIM_DEVICE_DIR, None), (layout.ENV_NPU_SNAPSHOT_PATH, None),
             (layout.ENV_AGENT_SOCKET_DIR, layout.DEFAULT_AGENT_SOCKET_DIR),
             (layout.ENV_METADATA_FILE, layout.DEFAULT_METADATA_FILE))


class WorldError(ValueError):
    pass


def fingerprint(path):
    """The identity of a regular file (digests.identity; never following a symlink), its digest added later."""
    try:
        return digests.identity(path)
    except ValueError as exc:
        raise WorldError(str(exc))


def tree_fingerprints(source):
    """{relative path: fingerprint} of every regular file below ``source`` ('.' for a file itself)."""
    st = os.lstat(source)
    if stat.S_ISREG(st.st_mode):
        return {".": fingerprint(source)}
    found = {}
    for directory, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(directory, name)
            if stat.S_ISREG(os.lstat(full).st_mode):
                found[os.path.relpath(full, source)] = fingerprint(full)
                if len(found) > MAX_FILES:
                    raise WorldError("the mount %s holds more than %d files; mount less, or declare it engine state "
                                     "(engine_state_mounts) if the engine writes it" % (source, MAX_FILES))
    return found


def host_facts(criu_version=None, runc_version=None):
    return {"kernel": platform.release(), "criu": criu_version, "runc": runc_version, "collection": COLLECTION_VERSION}


def docker_facts(info):
    """What a Docker container's `docker inspect` says the process runs with, in the form ``compare`` takes."""
    config = info.get("Config") or {}
    host = info.get("HostConfig") or {}
    mounts = [{"source": m.get("Source"), "destination": m.get("Destination"), "rw": bool(m.get("RW"))}
              for m in info.get("Mounts") or [] if m.get("Type") in ("bind", "volume")]
    return {"args": list(config.get("Entrypoint") or []) + list(config.get("Cmd") or []),
            "cwd": config.get("WorkingDir") or "/", "user": config.get("User") or "",
            "mounts": sorted(mounts, key=lambda m: m["destination"]),
            "devices": sorted(d.get("PathInContainer") for d in host.get("Devices") or [])}


def oci_facts(spec):
    """The same facts from an OCI runtime spec (config.json) that runc is asked to create."""
    process = spec.get("process") or {}
    user = process.get("user") or {}
    mounts = []
    for mount in spec.get("mounts") or []:
        options = mount.get("options") or []
        if mount.get("type") in ("bind", None) and ("bind" in options or "rbind" in options):
            mounts.append({"source": mount.get("source"), "destination": mount.get("destination"),
                           "rw": "ro" not in options})
    return {"args": list(process.get("args") or []), "cwd": process.get("cwd") or "/",
            "uid": user.get("uid"), "gid": user.get("gid"),
            "mounts": sorted(mounts, key=lambda m: m["destination"]),
            "devices": sorted(d.get("path") for d in (spec.get("linux") or {}).get("devices") or [])}


def process_facts(pid):
    """{args, cwd} of a bare process, from /proc."""
    with open("/proc/%d/cmdline" % pid, "rb") as handle:
        args = [part.decode("utf-8", "replace") for part in handle.read().split(b"\0")[:-1]]
    return {"args": args, "cwd": os.readlink("/proc/%d/cwd" % pid)}


def _read_only_fd(pid, fd):
    try:
        with open("/proc/%d/fdinfo/%s" % (pid, fd)) as handle:
            for line in handle:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & 3 == os.O_RDONLY
    except (IOError, OSError, ValueError):
        pass
    return False


def open_files(pid):
    """{host path: fingerprint} of the files a bare process tree reads: mapped without a shared write, or open
    read-only (not /proc, /dev, ...). Files it writes (logs, caches) are its own state, not its world."""
    found = set()
    for member in proc.descendants(pid):
        try:
            with open("/proc/%d/maps" % member) as handle:
                for line in handle:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith("/") and not fields[5].rstrip().endswith("(deleted)") \
                            and not ("w" in fields[1] and "s" in fields[1]):
                        found.add(fields[5].rstrip("\n"))
            fd_dir = "/proc/%d/fd" % member
            for fd in os.listdir(fd_dir):
                try:
                    target = os.readlink(os.path.join(fd_dir, fd))
                except OSError:
                    continue
                if target.startswith("/") and not target.endswith("(deleted)") and _read_only_fd(member, fd):
                    found.add(target)
        except (IOError, OSError):
            continue
    files = {}
    for path in sorted(found):
        if path.startswith(SKIP_PREFIXES) or _holds(layout.NPU_DRIVER_DIR, path):  # the driver: npu_driver.py's
            continue
        try:
            files[path] = fingerprint(path)
        except (OSError, WorldError):
            continue  # a socket, a fifo, a file gone meanwhile: CRIU itself deals with those
    return files


def volatile(source):
    """Whether a mount's host source is written per pod or per container (see VOLATILE_SOURCE_PARTS)."""
    return any(part in (source or "") + "/" for part in VOLATILE_SOURCE_PARTS) or \
        bool(KUBELET_POD_FILES.search(source or ""))


def _holds(destination, path):
    return bool(path) and (path == destination or path.startswith(destination.rstrip("/") + "/"))


def excluded_mounts(mounts, env=None, declared=()):
    """{destination: why} of the mounts whose files are not the world (see the module's docstring): volatile
    ones, the collection's own (by the container's ``env``), and those ``declared`` engine state."""
    env = env or {}
    own = [(name, env.get(name) or default) for name, default in OWN_PATHS]
    found = {}
    for mount in mounts or []:
        destination = mount["destination"]
        if volatile(mount.get("source")):
            found[destination] = "written per pod or container by the kubelet or dockerd"
        elif destination in declared:
            found[destination] = "declared engine state (engine_state_mounts)"
        elif _holds(layout.NPU_DRIVER_DIR, os.path.normpath(destination)):
            found[destination] = "the node's NPU driver (compared with its versions before a restore: npu_driver.py)"
        else:
            holds = [name for name, path in own if _holds(destination, os.path.normpath(path) if path else None)]
            if holds:
                found[destination] = "the collection's own (%s)" % ", ".join(holds)
    return found


def capture(process, criu_version=None, runc_version=None, pid=None, excluded=None):
    """The manifest's ``world``: ``process`` (docker_facts, or for a bare process {args, cwd}) plus the identity of
    every file in its mounts but the ``excluded`` ones ({destination: why}, excluded_mounts; kept in the record)
    and the host's versions. Cheap (a stat per file): it runs beside the checkpoint; ``add_digests`` follows."""
    files, excluded = {}, dict(excluded or {})
    for mount in process.get("mounts") or []:
        if mount["destination"] not in excluded and mount.get("source") and os.path.exists(mount["source"]):
            files[mount["destination"]] = tree_fingerprints(mount["source"])
    facts = {"process": process, "files": files, "host": host_facts(criu_version, runc_version)}
    if excluded:
        facts["excluded"] = excluded
    if pid is not None:  # a bare process: its files are host files, fingerprinted one by one
        facts["open_files"] = open_files(pid)
    return facts


def recorded_files(facts):
    """[(host path, where the process sees it, its record)] of every file ``facts`` records."""
    sources = dict((m["destination"], m.get("source")) for m in (facts.get("process") or {}).get("mounts") or [])
    found = []
    for destination, files in sorted((facts.get("files") or {}).items()):
        for rel, record in sorted(files.items()):
            source = sources.get(destination) or ""
            found.append((source if rel == "." else os.path.join(source, rel),
                          destination if rel == "." else os.path.join(destination, rel), record))
    found.extend((path, path, record) for path, record in sorted((facts.get("open_files") or {}).items()))
    return found


def add_digests(facts, workers=None):
    """Add the SHA-256 of every recorded file to ``facts`` (from the node's cache when its identity was hashed
    before), read from the file whose identity was recorded: WorldError when one changed since -- an engine that
    writes a mount must have it declared engine state, or no restore could ever match it. Returns
    {files, hashed_bytes, cached_files}."""
    todo = recorded_files(facts)

    def one(item):
        path, where, record = item
        try:
            value, _ident, cached = digests.digest(path, expected=record)
        except digests.Changed:
            raise WorldError("files_changing: %s changed while the snapshot was taken: a restore would always find it "
                             "changed. If the engine writes it, declare its mount engine state (engine_state_mounts)"
                             % where)
        except (OSError, ValueError) as exc:
            raise WorldError("cannot read %s to record its digest: %s" % (where, exc))
        record["sha256"] = value
        return 0 if cached else record["size"], cached

    with ThreadPoolExecutor(max_workers=max(1, workers or min(4, os.cpu_count() or 1))) as pool:
        done = list(pool.map(one, todo))
    return {"files": len(todo), "hashed_bytes": sum(size for size, _cached in done),
            "cached_files": sum(1 for _size, cached in done if cached)}


def _user_reason(was, now):
    """Why the process would run as another user than the recorded one (None when the same): Docker's User, an OCI
    config's uid/gid, or one against the other."""
    if "user" in was:
        same = _user_matches(was["user"], now)
    elif "uid" in was:
        same = _user_matches(now["user"], was) if "user" in now and "uid" not in now else \
            (was.get("uid"), was.get("gid")) == (now.get("uid"), now.get("gid"))
    else:
        return None
    if same:
        return None
    return "user_mismatch: user %s in the snapshot, %s now" % (_user_text(was), _user_text(now))


def _user_text(facts):
    if "user" in facts:
        return repr(facts["user"])
    return "'%s:%s'" % (facts.get("uid"), facts.get("gid"))


def _user_matches(recorded_user, current):
    """A Docker User ('' is root, 'uid' or 'uid:gid') against an OCI spec's numeric uid/gid."""
    if "uid" not in current or current.get("uid") is None:
        return current.get("user", recorded_user) == recorded_user
    if recorded_user == "":
        return current["uid"] == 0
    parts = recorded_user.split(":")
    if not all(part.isdigit() for part in parts):
        return True  # a user name: docker resolved it from the image, which the image id already pins
    return int(parts[0]) == current["uid"] and (len(parts) == 1 or int(parts[1]) == current.get("gid"))


def compare(recorded, current_process, criu_version=None, runc_version=None):
    """Reasons (``<fact>_mismatch: ...``, both values) why the world now is not the recorded one; [] when it is.

    ``current_process``: docker_facts or oci_facts of what would run now (None: a bare process, whose
    command line is its own). Files are fingerprinted again at the sources the current mounts name.
    """
    if not recorded:
        return ["world_unknown: the snapshot records no facts about the world it was taken in (an older "
                "collection made it); regenerate it"]
    reasons = []
    was = recorded.get("process") or {}
    if current_process is not None:
        if was.get("args") != current_process.get("args"):
            reasons.append("args_mismatch: the snapshot's process runs %r, the new one would run %r"
                           % (was.get("args"), current_process.get("args")))
        if was.get("cwd", "/") != current_process.get("cwd", "/"):
            reasons.append("cwd_mismatch: working dir %r in the snapshot, %r now"
                           % (was.get("cwd"), current_process.get("cwd")))
        user = _user_reason(was, current_process)
        if user:
            reasons.append(user)
        if (was.get("devices") or []) != (current_process.get("devices") or []):
            reasons.append("devices_mismatch: devices %s in the snapshot, %s now"
                           % (was.get("devices"), current_process.get("devices")))
        reasons.extend(_mount_reasons(was.get("mounts") or [], current_process.get("mounts") or []))
        sources = dict((m["destination"], m["source"]) for m in current_process.get("mounts") or [])
    else:
        sources = dict((m["destination"], m["source"]) for m in was.get("mounts") or [])
    for destination, files in sorted((recorded.get("files") or {}).items()):
        reasons.extend(_file_reasons(destination, sources.get(destination), files))
    for path, was_print in sorted((recorded.get("open_files") or {}).items()):
        reasons.extend(_one_file_reason(path, was_print))
    host = recorded.get("host") or {}
    now = host_facts(criu_version, runc_version)
    if host.get("kernel") != now["kernel"]:
        reasons.append("kernel_mismatch: snapshot taken on kernel %s, this host runs %s" % (host.get("kernel"), now["kernel"]))
    if host.get("runc") and runc_version and _release(host["runc"], 2) != _release(runc_version, 2):
        reasons.append("runc_mismatch: snapshot taken with runc %s, this host has %s" % (host["runc"], runc_version))
    return reasons


def image_reason(recorded, running=None, present=None):
    """The one image check of every path (restore/verify.py exports it): why a snapshot of image ``recorded``
    cannot come back here -- the container would run ``running`` (None: not known), or the image is not on this
    host (``present`` False). None when it can."""
    if running is not None and recorded != running:
        return "image_mismatch: snapshot was taken from image %s, the container would run %s" % (recorded, running)
    if present is False:
        return "image_mismatch: image %s recorded in the snapshot is not on this host" % recorded
    return None


def stale(recorded_manifest, info=None, criu_version=None, runc_version=None):
    """Why a snapshot (its manifest) does not belong to the process as it runs now: the container of
    ``info`` (its `docker inspect`; None for a bare process) and this host. [] when it does."""
    reasons = []
    process = None
    if info is not None:
        wrong = image_reason((recorded_manifest.get("image") or {}).get("id"), info.get("Image"))
        if wrong:
            reasons.append(wrong)
        process = docker_facts(info)
    return reasons + compare(recorded_manifest.get("world"), process, criu_version, runc_version)


def _release(version, parts):
    return tuple((version or "").split("+")[0].split("-")[0].split(".")[:parts])


def _mount_reasons(was, now):
    reasons = []
    current = dict((m["destination"], m) for m in now)
    for mount in was:
        other = current.get(mount["destination"])
        if other is None:
            reasons.append("mounts_mismatch: %s (from %s) is not mounted in the new container"
                           % (mount["destination"], mount["source"]))
        elif other["rw"] != mount["rw"]:
            reasons.append("mounts_mismatch: %s was %s (%s), now %s (%s)" % (
                mount["destination"], mount["source"], "rw" if mount["rw"] else "ro", other["source"],
                "rw" if other["rw"] else "ro"))
    # A mount only the new container has is not compared: the restored process never opened anything in it,
    # and runtimes add their own (dockerd's /etc/hosts, the kubelet's termination log) that inspect never lists.
    return reasons


def _file_reasons(destination, source, recorded):
    if not source or not os.path.exists(source):
        return ["files_mismatch: the mount %s has no source on this host (%s)" % (destination, source)]
    try:
        now = tree_fingerprints(source)
    except (OSError, WorldError) as exc:
        return ["files_mismatch: cannot fingerprint %s: %s" % (source, exc)]
    reasons = []
    for rel in sorted(set(recorded) | set(now)):
        where = destination if rel == "." else os.path.join(destination, rel)
        reasons.extend(_difference(where, source if rel == "." else os.path.join(source, rel), recorded.get(rel),
                                   now.get(rel)))
    return reasons[:20]


def _one_file_reason(path, was):
    try:
        now = fingerprint(path)
    except (OSError, WorldError):
        now = None
    return _difference(path, path, was, now)


def _difference(where, path, was, cur):
    """Why the file the process sees at ``where`` (``path`` on this host) is not the recorded one, or []."""
    if cur is None:
        return ["files_mismatch: %s is gone" % where]
    if was is None:
        return ["files_mismatch: %s is new since the snapshot" % where]
    if not was.get("sha256") or was.get("ctime_ns") is None:
        return ["files_mismatch: %s: the snapshot records only a sampled fingerprint of it (an older collection made "
                "it), which cannot prove it unchanged; regenerate the snapshot" % where]
    if was["size"] != cur["size"]:
        return ["files_mismatch: %s changed (size %d -> %d)" % (where, was["size"], cur["size"])]
    if digests.same(was, cur):
        return []  # the very file, and no write since: its identity's ctime would have moved
    try:
        now, _ident, _cached = digests.digest(path, expected=cur)
    except (OSError, ValueError) as exc:  # digests.Changed included: it is changing as we look
        return ["files_mismatch: %s cannot be compared: %s" % (where, exc)]
    if now != was["sha256"]:
        return ["files_mismatch: %s changed (size %d, sha256 %s -> %s)" % (
            where, cur["size"], was["sha256"][:12], now[:12])]
    return []

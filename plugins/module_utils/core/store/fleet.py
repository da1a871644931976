# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fleet, not a pet: one service's snapshots serving other instances and other nodes. PRIVATE to inferops.snapshot.

Clones. A snapshot belongs to the pod that generated it (namespace/service/instance/pod). A *clone*
restores it into another pod of the same service: pod k of a new instance from pod k of a source
instance. The request names the source explicitly (``source``); the identity check then accepts
exactly that source and nothing else, and only when namespace and service are the clone's own
(``clone_reason``). The new identity, environment and pod name reach the engine through the
metadata file, with a fresh ``restore_nonce`` the engine re-seeds from (``new_nonce``).

Restores in progress, and the processes they made: ``.<pod>.restores.json`` beside the snapshot.
Every restore enters itself (``begin``) before CRIU runs: the host, the devices the new process
uses (``device_keys``), the holder (pid and start time) and a deadline. After the host restore the
entry names the restored process instead (``running``); a failed restore removes it (``end``). Two
rules read it, both under the parent directory's flock (the status record's lock), so that they
hold across processes and, on shared storage with working locks, across nodes:

- a restore is refused (``Busy``) while a live entry of this host holds one of its devices: one
  snapshot is never restored into two processes on the same device at once. A holder that was
  killed does not block: its pid is gone, or has another start time, or its deadline passed.
- retention (``retention.py``) never removes a snapshot while any node's restore of it is in
  progress (``in_progress``: phase ``restoring`` and the deadline not passed).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import binascii
import json
import os
import re
import socket
import time
import uuid

from ..base import layout
from ..base.errors import ParameterError
from ..linux import fs, proc
from .status import locked

KEEP = 50                # entries kept per snapshot (the oldest finished ones go first)
GRACE = 30.0             # seconds a restoring entry outlives its restore's own timeout
_ORDINAL = re.compile(r"^(.*?)(\d+)$")
IDENTITY_KEYS = layout.IDENTITY_KEYS


class Busy(Exception):
    """Another live process restored from this snapshot holds one of the devices."""

    def __init__(self, reason, holder=None):
        super(Busy, self).__init__(reason)
        self.reason = reason
        self.holder = holder


# -- identities -------------------------------------------------------------------------------------
def parse_identity(text, field="identity"):
    """{namespace, service, instance, pod} from ``ns/service/instance/pod``; ValueError naming ``field``."""
    parts = (text or "").split("/")
    if len(parts) != 4 or not all(parts) or any(not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", p) for p in parts):
        raise ValueError("%s: %r is not namespace/service/instance/pod" % (field, text))
    return dict(zip(IDENTITY_KEYS, parts))


def same_identity(one, other):
    return all((one or {}).get(key) == (other or {}).get(key) for key in IDENTITY_KEYS)


def clone_reason(identity, source):
    """Why ``identity`` may not be restored from a snapshot of ``source`` (None when it may).

    A clone stays within its service: the same namespace and service, another instance or pod. Without a
    target identity nothing proves it is the same service, so that is refused too.
    """
    if source is None:
        return None
    if identity is None:
        return ("clone_refused: a clone of %s needs the identity it is restored into (restore-identity), to check that "
                "it is of the same service" % layout.identity_string(source))
    for key in ("namespace", "service"):
        if identity.get(key) != source.get(key):
            return ("clone_refused: %s may only be cloned into pods of %s %s, not into %s (%s %s); a snapshot of one "
                    "service never seeds another" % (layout.identity_string(source), key, source.get(key),
                                                     layout.identity_string(identity), key, identity.get(key)))
    return None


def expected_identity(identity, source):
    """The identity the snapshot's manifest must hold: the declared source for a clone, else the pod's own."""
    return source if source is not None else identity


def ordinal(pod):
    """(stem, k) of a pod name ending in its ordinal (``qwen-p1-3`` -> ``('qwen-p1-', 3)``), or None."""
    match = _ORDINAL.match(pod or "")
    return (match.group(1), int(match.group(2))) if match else None


def source_pod(pod, source_pods):
    """Pod k of the source instance for pod k of the clone: the source pod with the same ordinal."""
    wanted = ordinal(pod)
    if wanted is None:
        raise ParameterError("identity.pod: %r does not end in an ordinal (like qwen-p1-0); name the source pod "
                             "explicitly (source.pod)" % pod, field="identity.pod")
    matches = [name for name in source_pods if (ordinal(name) or (None, None))[1] == wanted[1]]
    if len(matches) != 1:
        raise ParameterError("source: the source instance has %s pod with ordinal %d (it has: %s); name the source "
                             "pod explicitly (source.pod)" % ("no" if not matches else "more than one", wanted[1],
                                                              ", ".join(sorted(source_pods)) or "none"),
                             field="source")
    return matches[0]


def _completed(root, identity):
    """(created_at, snapshot dir) of a published, completed snapshot of ``identity`` below ``root``, or None."""
    snapshot_dir = layout.snapshot_dir(root, identity)
    record = fs.read_json(layout.status_path(snapshot_dir))
    manifest = fs.read_json(os.path.join(snapshot_dir, layout.MANIFEST))
    if record is None or record.get("status") != "completed" or manifest is None:
        return None
    return str(manifest.get("created_at") or ""), snapshot_dir


def _pods(directory):
    try:
        return sorted(name for name in os.listdir(directory)
                      if not name.startswith(".") and os.path.isdir(os.path.join(directory, name))
                      and not os.path.islink(os.path.join(directory, name)))
    except OSError:
        return []


def choose_source(root, identity, instance=None, pod=None):
    """The source identity and its snapshot dir for a clone of ``identity`` below ``root``.

    ``instance``: the source instance; None or ``newest``: the instance whose matching pod has the newest
    completed snapshot (the clone's own instance is never its source). ``pod``: the source pod; None: the
    source instance's pod with the clone's ordinal. ParameterError naming the field when there is none.
    """
    service_dir = os.path.join(root, identity["namespace"], identity["service"])
    if instance in (None, "newest"):
        candidates = []
        for name in _pods(service_dir):
            if name == identity["instance"]:
                continue
            try:
                chosen = pod or source_pod(identity["pod"], _pods(os.path.join(service_dir, name)))
            except ParameterError:
                continue
            found = _completed(root, dict(identity, instance=name, pod=chosen))
            if found:
                candidates.append((found[0], name, chosen, found[1]))
        if not candidates:
            raise ParameterError("source: no other instance of %s/%s has a completed snapshot for pod %s below %s; "
                                 "generate one first, or name the source instance" % (
                                     identity["namespace"], identity["service"], identity["pod"], root), field="source")
        _created, instance, pod, snapshot_dir = max(candidates)
    else:
        pod = pod or source_pod(identity["pod"], _pods(os.path.join(service_dir, instance)))
        snapshot_dir = layout.snapshot_dir(root, dict(identity, instance=instance, pod=pod))
    source = dict(identity, instance=instance, pod=pod)
    if same_identity(source, identity):
        raise ParameterError("source: %s is the pod itself, not another instance; leave source out to restore a "
                             "pod's own snapshot" % layout.identity_string(source), field="source")
    return source, snapshot_dir


def new_nonce():
    """16 fresh random bytes in hex: what one restored process re-seeds from (metadata ``restore_nonce``)."""
    return binascii.hexlify(os.urandom(16)).decode("ascii")


# -- devices ----------------------------------------------------------------------------------------
def mount_source(mounts, inner):
    """The host source of the mount (destination, source) that holds ``inner``, and the path below it."""
    best = None
    for destination, source in mounts:
        dest = (destination or "").rstrip("/") or "/"
        if inner == dest or inner.startswith(dest + "/") or dest == "/":
            if best is None or len(dest) > len(best[0]):
                best = (dest, source)
    if best is None or best[0] == "/" or not best[1]:
        return None
    rest = inner[len(best[0]):].lstrip("/")
    return os.path.normpath(os.path.join(best[1], rest)) if rest else os.path.normpath(best[1])


def _shared(path):
    """An NPU node every NPU process of a node has (davinci_manager, its fallback, devmm_svm, hisi_hdc): it says
    nothing of which device a process uses."""
    return os.path.basename(str(path or "")) in layout.NPU_NODE_WIDE


def _keys(devices, env, mounts):
    keys = set()
    for kind, major, minor, host_path in devices:
        if major is not None and minor is not None:
            keys.add("%s:%s:%s" % (kind or "c", major, minor))
        elif host_path:
            keys.add("dev:%s" % os.path.normpath(host_path))
    sim = env.get(layout.ENV_SIM_DEVICE_DIR)
    if sim and sim.startswith("/"):
        source = mount_source(mounts, os.path.normpath(sim))
        keys.add("sim:%s" % os.path.realpath(source) if source else "sim:%s" % os.path.normpath(sim))
    return sorted(keys)


def device_keys(spec):
    """The devices a container of this OCI config would use, as keys comparable on one host: ``c:<major>:<minor>``
    for device nodes (an NPU's /dev/davinciN), ``sim:<host dir>`` for the simulated NPU's device directory."""
    linux = spec.get("linux") or {}
    devices = [(d.get("type"), d.get("major"), d.get("minor"), None) for d in linux.get("devices") or []
               if not str(d.get("path") or "").startswith(("/dev/pts", "/dev/null", "/dev/zero", "/dev/tty"))
               and not _shared(d.get("path"))]
    env = dict(item.split("=", 1) for item in (spec.get("process") or {}).get("env") or [] if "=" in item)
    mounts = [(m.get("destination"), m.get("source")) for m in spec.get("mounts") or []
              if m.get("type") in ("bind", None) and m.get("source")]
    return _keys(devices, env, mounts)


def docker_device_keys(info):
    """The same keys from a container's `docker inspect` (or the record host/container.json keeps of it)."""
    host = info.get("HostConfig") or {}
    devices = []
    for device in host.get("Devices") or []:
        path = device.get("PathOnHost")
        if _shared(device.get("PathInContainer") or path):
            continue
        try:
            st = os.stat(path)
            devices.append(("c", os.major(st.st_rdev), os.minor(st.st_rdev), path))
        except (OSError, TypeError):
            devices.append((None, None, None, path))
    env = dict(item.split("=", 1) for item in (info.get("Config") or {}).get("Env") or [] if "=" in item)
    mounts = [(m.get("Destination"), m.get("Source")) for m in info.get("Mounts") or [] if m.get("Source")]
    for bind in host.get("Binds") or []:
        parts = bind.split(":")
        if len(parts) >= 2:
            mounts.append((parts[1], parts[0]))
    return _keys(devices, env, mounts)


# -- the record of restores ---------------------------------------------------------------------------
def read(snapshot_dir):
    doc = fs.read_json(layout.restores_path(snapshot_dir))
    entries = doc.get("entries") if doc is not None else None
    return [entry for entry in entries or [] if isinstance(entry, dict) and entry.get("id")]


def _write(snapshot_dir, entries):
    fs.write_file_atomic(layout.restores_path(snapshot_dir),
                         (json.dumps({"entries": entries[-KEEP:]}, indent=1, sort_keys=True) + "\n").encode())


def _holder_alive(entry, host, proc_root="/proc"):
    """Whether the process an entry names still runs (only answerable on its own host: None elsewhere)."""
    if entry.get("host") != host:
        return None
    pid = entry.get("pid")
    if not pid or not proc.alive(pid, proc_root):
        return False
    started = entry.get("pid_start_time")
    return started is None or proc.start_time(pid, proc_root) == started


def live(entry, host, now, proc_root="/proc"):
    """An entry that still counts: a restore before its deadline whose holder runs (or runs elsewhere), or a
    restored process of this host that runs (a restored process of another host: until its deadline)."""
    alive = _holder_alive(entry, host, proc_root)
    if entry.get("phase") == "running":
        return bool(alive) if alive is not None else False
    return float(entry.get("deadline") or 0) > now and alive is not False


def describe(entry):
    return "%s %s on %s (pid %s, devices %s) since %s" % (
        "a restore of" if entry.get("phase") == "restoring" else "the process restored as",
        entry.get("identity"), entry.get("host"), entry.get("pid"), ", ".join(entry.get("devices") or []) or "none",
        entry.get("since"))


def begin(snapshot_dir, devices, timeout, identity=None, pid=None, host=None, now=None, proc_root="/proc"):
    """Enter a restore of ``snapshot_dir`` onto ``devices``; returns its entry id. Busy when a live entry of
    this host holds one of the devices. Entries of dead holders are dropped on the way."""
    host = host or socket.gethostname()
    now = time.time() if now is None else now
    pid = pid or os.getpid()
    with locked(snapshot_dir):
        # what another node's restored process does cannot be seen from here: its entries stay (KEEP bounds them)
        entries = [entry for entry in read(snapshot_dir) if live(entry, host, now, proc_root)
                   or (entry.get("host") != host and entry.get("phase") == "running")]
        for entry in entries:
            shared = sorted(set(entry.get("devices") or []) & set(devices or []))
            if entry.get("host") == host and shared and live(entry, host, now, proc_root):
                raise Busy("device_busy: %s is already restored into device %s: %s; one snapshot is never restored "
                           "into two processes on the same device (give the clone another device)"
                           % (snapshot_dir, ", ".join(shared), describe(entry)), entry)
        entry = {"id": uuid.uuid4().hex, "phase": "restoring", "host": host, "pid": pid,
                 "pid_start_time": proc.start_time(pid, proc_root),
                 "devices": sorted(devices or []), "deadline": now + float(timeout) + GRACE,
                 "identity": layout.identity_string(identity) if identity else None,
                 "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
        _write(snapshot_dir, entries + [entry])
    return entry["id"]


def running(snapshot_dir, entry_id, pid, pid_start_time=None, proc_root="/proc"):
    """The restore ``entry_id`` made process ``pid``: it now holds the devices for as long as it runs."""
    with locked(snapshot_dir):
        entries = read(snapshot_dir)
        for entry in entries:
            if entry["id"] == entry_id:
                entry.update(phase="running", pid=pid, pid_start_time=pid_start_time if pid_start_time is not None
                             else proc.start_time(pid, proc_root))
        _write(snapshot_dir, entries)


def end(snapshot_dir, entry_id):
    """Forget entry ``entry_id`` (its restore failed or was undone). Never raises."""
    try:
        with locked(snapshot_dir):
            entries = read(snapshot_dir)
            kept = [entry for entry in entries if entry["id"] != entry_id]
            if len(kept) != len(entries):
                _write(snapshot_dir, kept)
    except (IOError, OSError):
        pass


def in_progress(snapshot_dir, now=None, host=None, proc_root="/proc"):
    """The restores of ``snapshot_dir`` still under way, on any node (what retention must not pull away)."""
    host = host or socket.gethostname()
    now = time.time() if now is None else now
    return [entry for entry in read(snapshot_dir)
            if entry.get("phase") == "restoring" and live(entry, host, now, proc_root)]

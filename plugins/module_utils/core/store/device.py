# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device (NPU) part of a snapshot. PRIVATE to the inferops.snapshot collection.

The ACL runtime keeps a backup of device memory in the host memory of the inference process, so
the bytes travel inside the host (CRIU) snapshot. What is written to disk here is the device
part's metadata: which process and devices, which runtime version, how much device memory.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import stat

from ..agent import protocol
from ..base import layout, schema
from ..base.clock import Deadline, Stopwatch, utc_now
from ..base.errors import RuntimeRefusedError, SnapshotError
from ..clients.control import AgentSocketClient
from ..linux import fs, proc
from . import criu_images

RUNTIME_NAME = "ascend-acl"


def device_part_path(directory):
    return os.path.join(directory, layout.DEVICE_PART)


def snapshot_facts(reply):
    """What the agent says of the snapshot API (absent from an agent that predates it: all None): its shape
    (``args`` or ``legacy``), the device memory the backup asked for, and the runtime and driver API versions
    the args shape compares at restore."""
    told = reply.get("snapshot") or {}
    versions = told.get("api_versions") or {}
    return {"api": told.get("api"), "device_memory": told.get("device_memory"),
            "runtime_api_version": versions.get("runtime"), "driver_api_version": versions.get("driver")}


def build_device_part(reply, identity=None, durations=None):
    part = {
        "schema_version": 1,
        "pid": reply["pid"],
        "state": protocol.STATE_BACKED_UP,
        "devices": list(reply.get("devices") or []),
        "runtime": {"name": RUNTIME_NAME, "version": reply.get("runtime_version")},
        "device_memory_bytes": (reply.get("engine") or {}).get("device_memory_bytes"),
        "created_at": utc_now(),
        "durations": dict(durations or {}),
        "note": "device memory is held in the process's host memory and travels in the host snapshot",
        "snapshot_api": snapshot_facts(reply),
    }
    if identity:
        part["identity"] = identity
    schema.validate("manifest", part, "device part", definition="device_part")
    return part


def read_device_part(directory):
    return fs.read_json(device_part_path(directory))


def parse_device_part(data):
    """The device part from its bytes -- a restore's are the verified ones (attempt.document), never the file read
    again after the verification; SnapshotError when they are not a JSON object."""
    try:
        part = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise SnapshotError("the device part %s is not JSON: %s" % (layout.DEVICE_PART, exc))
    if not isinstance(part, dict):
        raise SnapshotError("the device part %s is not a JSON object" % layout.DEVICE_PART)
    return part


def write_device_part(staging_dir, part):
    """Write device.json into the snapshot's staging directory (0700 dirs, 0600 file, atomic)."""
    fs.ensure_dir(staging_dir)
    fs.ensure_dir(os.path.join(staging_dir, layout.DEVICE_DIR))
    target = device_part_path(staging_dir)
    fs.write_file_atomic(target, (json.dumps(part, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return target


def back_up(client, staging_dir, identity, lease, lock, timeout, check_mode=False, device_memory=None):
    """Take the device part: the process LOCKED (when ``lock``) and BACKED_UP under ``lease``, its record written.
    ``device_memory``: what the backup saves (protocol.DEVICE_MEMORY_CHOICES; None: the default, ``required``).

    The one home of the device snapshot, for npu_snapshot_backup and for host_checkpoint's ``device_backup``
    (which runs it right before the checkpoint, so that the engine's lock window holds no module start).
    A process already BACKED_UP with its part recorded for this identity is left alone (its lease renewed); one
    the engine backed up itself gets its record and the lease. Returns the task's result fields.
    """
    reply = client.request(protocol.OP_STATE, timeout)
    previous = reply["state"]
    recorded = read_device_part(staging_dir)
    result = dict(previous_state=previous, staging_dir=staging_dir, device_part=device_part_path(staging_dir),
                  endpoint=client.where)
    if previous == protocol.STATE_BACKED_UP and recorded and recorded.get("pid") == reply["pid"] \
            and recorded.get("identity") == identity:
        if lease and not check_mode:
            reply = client.request(protocol.OP_RENEW, timeout, lease)
        return dict(changed=False, state=previous, actions=[], pid=reply["pid"], devices=reply.get("devices", []),
                    runtime_version=reply.get("runtime_version"), lease=reply.get("lease"),
                    device_memory_bytes=recorded.get("device_memory_bytes"), durations={},
                    snapshot_api=recorded.get("snapshot_api"),
                    diff=dict(before=dict(state=previous), after=dict(state=previous)), **result)
    if previous == protocol.STATE_RUNNING and not lock:
        raise RuntimeRefusedError(
            "the process is RUNNING; backup needs it LOCKED: lock it first with inferops.snapshot.npu_snapshot_lock "
            "(state=locked) or set lock=true", state=previous, **result)

    operations = []
    if previous == protocol.STATE_RUNNING:
        operations.append(protocol.OP_LOCK)
    if previous != protocol.STATE_BACKED_UP:
        operations.append(protocol.OP_BACKUP)
    if check_mode:
        return dict(changed=True, state=protocol.STATE_BACKED_UP, actions=operations, pid=reply["pid"],
                    devices=reply.get("devices", []), runtime_version=reply.get("runtime_version"),
                    device_memory_bytes=(reply.get("engine") or {}).get("device_memory_bytes"), lease=None,
                    snapshot_api=snapshot_facts(reply),
                    durations={}, diff=dict(before=dict(state=previous), after=dict(state=protocol.STATE_BACKED_UP)),
                    **result)
    if lease and not operations:  # backed up by the engine itself: the lease starts with this record
        operations.append(protocol.OP_RENEW)

    watch = Stopwatch()
    done = []
    try:
        for op in operations:
            with watch.timed(op):
                if op == protocol.OP_BACKUP and device_memory not in (None, protocol.DEFAULT_DEVICE_MEMORY):
                    reply = client.request(op, timeout, lease, device_memory=device_memory)
                else:
                    reply = client.request(op, timeout, lease)
            done.append(op)
        with watch.timed("record"):
            part = build_device_part(reply, identity, watch.durations)
            write_device_part(staging_dir, part)
    except SnapshotError as exc:
        exc.result.update(actions=done, durations=watch.durations, **result)
        raise
    return dict(changed=True, state=reply["state"], actions=done, pid=reply["pid"], lease=reply.get("lease"),
                devices=reply.get("devices", []), runtime_version=reply.get("runtime_version"),
                device_memory_bytes=part["device_memory_bytes"], durations=watch.durations,
                snapshot_api=part["snapshot_api"],
                diff=dict(before=dict(state=previous), after=dict(state=reply["state"])), **result)


def version_mismatch(recorded, reply):
    """Why the process's runtime and driver now cannot restore what was backed up (the args shape records the
    Runtime and Driver API versions at backup and refuses a restore where they differ: hicann/runtime snapshot.md,
    CheckSnapShotVersionInfo), or None. Only a backup taken with the args shape is compared, as the runtime does."""
    was = (recorded or {}).get("snapshot_api") or {}
    if was.get("api") != "args":
        return None
    now = snapshot_facts(reply)
    differ = ["%s %s at the backup, %s now" % (name.replace("_", " "), was.get(key), now.get(key))
              for key, name in (("runtime_api_version", "runtime API"), ("driver_api_version", "driver API"))
              if was.get(key) != now.get(key)]
    if not differ:
        return None
    return ("device_version_mismatch: %s; the runtime refuses to restore device memory across versions: restore "
            "on a node with the snapshot's CANN runtime and NPU driver, or take a new snapshot" % "; ".join(differ))


def resume(client, timeout, restore=True, before_unlock=None, recorded=None):
    """Bring a locked or backed-up process back to RUNNING with its device memory intact.

    BACKED_UP: RESTORE (copies the backup back onto the device) then UNLOCK. LOCKED: UNLOCK.
    RUNNING: nothing. ``before_unlock()`` runs between the two (and may raise to keep it locked).
    ``recorded``: the snapshot's device part; a restore its versions refuse is refused here, before the device
    is touched (RuntimeRefusedError). Returns (actions, last reply).
    """
    reply = client.request(protocol.OP_STATE, timeout)
    actions = []
    if reply["state"] == protocol.STATE_BACKED_UP and restore:
        why = version_mismatch(recorded, reply)
        if why:
            raise RuntimeRefusedError(why, state=reply["state"])
        reply = client.request(protocol.OP_RESTORE, timeout)
        actions.append(protocol.OP_RESTORE)
    if before_unlock is not None:
        before_unlock()
    if reply["state"] in (protocol.STATE_LOCKED, protocol.STATE_BACKED_UP):
        reply = client.request(protocol.OP_UNLOCK, timeout)
        actions.append(protocol.OP_UNLOCK)
    return actions, reply


def resume_process(pid, socket_dir, timeout, gone=None, before_unlock=None, recorded=None):
    """Restore and unlock the device state of a restored process through its agent; it must end RUNNING.

    The agent's listening socket comes back with the restored process: wait for it first. Returns the
    actions taken. ``gone()`` says whether the process died meanwhile (the wait then ends at once).

    The restored process holds the lease of the process it was checkpointed from in its memory; its agent
    drops that lease rather than act on it (a lease belongs to the incarnation that took it: see the
    agent's ``launcher.incarnation``), so nothing races this restore, and the unlock ends whatever is left.
    """
    deadline = Deadline(timeout)
    client = AgentSocketClient.for_pid(pid, socket_dir)
    client.wait_listening(deadline.remaining(0.1), gone=gone)
    actions, reply = resume(client, deadline.remaining(1.0), before_unlock=before_unlock, recorded=recorded)
    if reply.get("state") != protocol.STATE_RUNNING:
        raise RuntimeRefusedError("the process is %s after %s, not RUNNING" % (reply.get("state"), actions),
                                  state=reply.get("state"))
    return actions


# -- the device files: what a restore needs of this node before CRIU runs ------------------------------------
def is_chip_node(path):
    """A chip's node: davinci<N> (by name, wherever it lives)."""
    name = os.path.basename(path or "")
    rest = name[len(layout.NPU_CHIP_PREFIX):]
    return name.startswith(layout.NPU_CHIP_PREFIX) and bool(rest) and all(c in "0123456789" for c in rest)


def is_npu_node(path):
    """An NPU device node the plugin records: a chip's, or one every NPU process of the node has (davinci_manager,
    npu_device_cust, devmm_svm, hisi_hdc), by name wherever it lives."""
    return is_chip_node(path) or os.path.basename(path or "") in layout.NPU_NODE_WIDE


def targets_from_oci(spec):
    """{path in the container: (type, major, minor)} of the NPU nodes an OCI config gives its container."""
    return dict((d["path"], (d.get("type") or "c", int(d["major"]), int(d["minor"])))
                for d in (spec.get("linux") or {}).get("devices") or []
                if is_npu_node(d.get("path")) and d.get("major") is not None and d.get("minor") is not None)


def targets_from_docker(info):
    """The same from `docker inspect` (HostConfig.Devices, numbered by the node on the host)."""
    found = {}
    for device in (info.get("HostConfig") or {}).get("Devices") or []:
        inner = device.get("PathInContainer") or device.get("PathOnHost")
        if not is_npu_node(inner):
            continue
        try:
            st = os.stat(device.get("PathOnHost"))
        except (OSError, TypeError):
            continue
        found[inner] = ("c" if stat.S_ISCHR(st.st_mode) else "b", os.major(st.st_rdev), os.minor(st.st_rdev))
    return found


def targets_text(targets):
    """``targets`` as the NPU plugin reads them (layout.ENV_NPU_DEVICES, layout.NPU_DEVICES_FILE): the grammar's
    targets (docs/simulator.md, "The plugin's text formats"), each path escaped as in the plugin's image."""
    return ",".join("%s=%s:%d:%d" % (criu_images.npu_quote(path), kind, major, minor)
                    for path, (kind, major, minor) in sorted(targets.items()))


def chips_used(recorded, devices=None):
    """Paths of the chip nodes the checkpointed process used: those it held a descriptor on, and -- as the HAL reaches
    a chip through the manager, with an ioctl and no descriptor on the chip's node -- davinci<N> beside each manager
    it held, for each device N it had set (the device part's ``devices``)."""
    paths = set(f["path"] for f in recorded["fds"] if is_chip_node(f["path"]))
    for held in recorded["fds"]:
        if os.path.basename(held["path"]) in layout.NPU_MANAGERS:
            paths.update(os.path.join(os.path.dirname(held["path"]), "%s%d" % (layout.NPU_CHIP_PREFIX, int(n)))
                         for n in devices or [])
    return sorted(paths)


def _reaches(pid, directory, want, rdev, proc_root):
    """Whether process ``pid``, which holds a manager at ``directory``/<manager>, can bind the chip ``rdev``: a chip's
    node of that numbering is beside it in the process's own root (the driver binds only a chip a container has)."""
    where = os.path.join(proc_root, str(pid), "root") + directory
    try:
        names = [n for n in os.listdir(where) if is_chip_node(n)]
    except OSError:
        return False
    for name in names:
        try:
            st = os.stat(os.path.join(where, name))
        except OSError:
            continue
        if stat.S_IFMT(st.st_mode) == want and st.st_rdev == rdev:
            return True
    return False


def _holders(kind, rdev, proc_root="/proc"):
    """'pid N (comm)' of every process (but this one) that holds the device ``kind`` ``rdev``: a descriptor on its
    node, or a manager it can bind the chip through (the HAL's way; which chip a manager's descriptor is bound to only
    the driver knows, so any chip its process can reach counts)."""
    found = []
    want = stat.S_IFCHR if kind == "c" else stat.S_IFBLK
    for entry in os.listdir(proc_root):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fd_dir = os.path.join(proc_root, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        through = None
        for fd in fds:
            try:
                st = os.stat(os.path.join(fd_dir, fd))
                target = os.readlink(os.path.join(fd_dir, fd)) if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(
                    st.st_mode) else ""
            except OSError:
                continue
            if stat.S_IFMT(st.st_mode) == want and st.st_rdev == rdev:
                through = ""
                break
            if through is None and os.path.basename(target) in layout.NPU_MANAGERS and \
                    _reaches(entry, os.path.dirname(target), want, rdev, proc_root):
                through = " through %s" % target
        if through is not None:
            found.append("pid %s (%s)%s" % (entry, proc.comm(int(entry), proc_root) or "?", through))
    return found


def devices_unavailable(images_dir, targets=None, plugin_dirs=None, proc_root="/proc", part=None):
    """Why the NPU devices the checkpointed process held cannot be had on this node now, or None: the one check
    the restore pipeline makes of them before CRIU runs (pipeline.py's check stage).

    ``targets`` maps each device's path in the restored process to this node's (type, major, minor) -- from the
    new container's configuration; None: the nodes at those paths on this host (a bare process). The NPU plugin
    must be where CRIU loads plugins, and no other process may hold a chip the process used (chips_used, with
    ``part``: the manifest's device part; CANN refuses a restore onto a device another process holds, and so would
    the driver: aclrtSnapShotProcessRestore's constraint). The node-wide nodes (the manager, npu_device_cust,
    devmm_svm, hisi_hdc) are every NPU process's, never one process's device, and are not checked.
    """
    try:
        recorded = criu_images.read_npu_devices(images_dir)
    except ValueError as exc:
        return "npu_image_unreadable: %s" % exc
    if not recorded or not recorded["fds"] + recorded["vmas"]:
        return None
    dirs = plugin_dirs or [d for d in (os.environ.get("CRIU_LIBS_DIR"), layout.CRIU_PLUGIN_DIR) if d]
    if not any(os.path.isfile(os.path.join(d, layout.NPU_PLUGIN_FILE)) for d in dirs):
        held = ", ".join(sorted(set(f["path"] for f in recorded["fds"])))
        return ("npu_plugin_missing: the checkpointed process holds NPU device files (%s) that CRIU restores only "
                "with the NPU plugin, and this node has no %s in %s; install it with the "
                "inferops.snapshot.snapshot_prereqs role" % (held, layout.NPU_PLUGIN_FILE, " or ".join(dirs)))
    for path in chips_used(recorded, (part or {}).get("devices")):
        if targets is not None:
            if path not in targets:
                return ("device_missing: the checkpointed process held %s, and the new container is not given it "
                        "(docker run --device, or the device plugin's allocation)" % path)
            kind, major, minor = targets[path]
        else:
            try:
                st = os.stat(path)
            except OSError as exc:
                return "device_missing: the checkpointed process held %s, which this node lacks: %s" % (path, exc)
            kind, major, minor = "c" if stat.S_ISCHR(st.st_mode) else "b", os.major(st.st_rdev), os.minor(st.st_rdev)
        holders = _holders(kind, os.makedev(major, minor), proc_root)
        if holders:
            return ("device_busy: %s (%s %d:%d on this node) is held by %s; the runtime refuses to restore onto a "
                    "device another process holds: stop it, or restore onto another device"
                    % (path, kind, major, minor, ", ".join(holders[:5])))
    return None

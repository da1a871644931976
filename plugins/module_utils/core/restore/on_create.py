# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restore driver: a container restored inside its own ``runc create`` by the node's restore-on-create
runtime (core/node/runtime.py, which hands it the node's state: restore/node_state.py). PRIVATE to the
inferops.snapshot collection.

Instead of creating the container's process, ``runc restore --detach`` brings the checkpointed one
back into the new container (same bundle, same containerd stdio). Its new environment is written
through ``/proc/PID/root`` before the device state is restored; a cold start writes it into the
rootfs and lets the runtime ``exec runc create``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import shutil

from ..base import layout
from ..base.errors import SnapshotError
from ..clients import criu_cli
from ..clients.docker_cli import DockerCli, env_dict
from ..clients.runc_cli import StoppedRestore
from ..linux import fs, netns, paths, proc, syscalls
from ..store import criu_images, device, fleet, manifest, metadata, world
from ..store.container_record import parse_container_record
from . import held, reseed, verify
from .attempt import Fallback
from .driver import Driver
from .stages import CACHE, COPY, HELD, RESTORE

# What of the verdict the runtime's log line keeps.
VERIFY_SUMMARY = ("valid", "bytes", "files", "throughput_mb_s", "overlapped", "hashed_bytes", "checksums", "staged",
                  "staged_miss", "authenticated_by_decryption", "held")
REMAPPED = "remapped-images"  # the folder of the images for the pod's new address
LAZY_COPY_BECAUSE = "a lazy restore's pages stream in from the images after the restored tasks resume"
# A failure path only (see failure_cause): at most this much later a cold start, for a reason that names its cause.
LAZY_EXIT_GRACE = 1.0


def under_mount(spec, inner_path):
    """The mount destination of the OCI config that would hide ``inner_path`` in the rootfs, if any."""
    best = None
    for mount in spec.get("mounts") or []:
        dest = (mount.get("destination") or "").rstrip("/") or "/"
        if dest != "/" and (inner_path == dest or inner_path.startswith(dest + "/")):
            if best is None or len(dest) > len(best):
                best = dest
    return best


def restored_process_paths(request, recorded_env, config):
    """(metadata file, agent socket dir) as the *restored* process sees them.

    It keeps the environment it was checkpointed with, so unless an annotation says otherwise, its
    old environment (recorded in the snapshot's host/container.json) decides, not the new one.
    """
    found = []
    for key, variable in (("metadata_file", layout.ENV_METADATA_FILE), ("agent_socket_dir", layout.ENV_AGENT_SOCKET_DIR)):
        value = request[key] if key in request["annotated"] else (recorded_env.get(variable) or config[key])
        if not value.startswith("/") or ".." in value.split("/"):
            raise Fallback("bad_request: %s of the snapshotted process, %r, is not an absolute path" % (variable, value))
        found.append(value)
    return tuple(found)


class Refused(SnapshotError):
    """The create is refused rather than started cold (a strict request whose snapshot does not verify)."""


class OnCreate(Driver):
    path = "runtime"
    engine = "docker"
    stages = RESTORE
    # runc's CRIU configuration file leaves the tasks stopped until the page images' verdict (runc_cli.StoppedRestore)
    verification = manifest.OVERLAPPED
    images_from = (CACHE, HELD)  # a lazy restore: (CACHE, COPY), its pages streaming in after the tasks resume

    def __init__(self, node, spec, bundle, create, request, docker, criu_version):
        super(OnCreate, self).__init__(identity=request["identity"], criu_version=criu_version,
                                       runtime_version=request["runtime_version"])
        self.node = node                # node_state.NodeState: settings, log, runc and CRIU clients, state dir
        self.spec = spec
        self.bundle = bundle
        self.create = create
        self.request = request
        self.docker = docker            # {name, image_id} from dockerd's own record
        self.container_id = create["id"]
        self.paths = None               # (metadata file, agent socket dir) of the restored process
        self.source = request.get("source")   # a clone: the identity of the snapshot's own pod (fleet.py)
        self.entry = None               # this restore in the snapshot's record of restores (fleet.py)
        self.lazy = None                # the criu lazy-pages daemon of a lazy restore (clients/criu.LazyPages)
        if node.config.get("lazy_pages"):  # nothing could ask the leases once the tasks run: a private copy
            self.images_from, self.copy_because = (CACHE, COPY), LAZY_COPY_BECAUSE

    @property
    def rootfs(self):
        root = (self.spec.get("root") or {}).get("path") or "rootfs"
        return root if os.path.isabs(root) else os.path.join(self.bundle, root)

    @property
    def user(self):
        return (self.spec.get("process") or {}).get("user") or {}

    def locate(self, attempt):
        """Everything decided before the snapshot's contents are touched: the request, the policy, the path."""
        request, create = self.request, self.create
        if request.get("refused"):  # the node cannot tell who asks, or cannot trust its own settings (node/runtime.py)
            raise Fallback(request["refused"])
        if request["problems"]:
            raise Fallback("bad_request: %s" % "; ".join(request["problems"]))
        if create["unknown"] or create["preserve_fds"] or "--no-new-keyring" in create["flags"]:
            raise Fallback("unsupported: runc create options %s have no restore equivalent"
                           % (create["unknown"] + (["--preserve-fds"] if create["preserve_fds"] else [])
                              + [f for f in create["flags"] if f == "--no-new-keyring"]))
        if request["policy"] == "once" and self.node.restored_once(self.container_id):
            raise Fallback("policy_once: container %s was restored before; its restarts start cold (set "
                           "restore-policy=always to restore on every start)" % self.container_id[:12])
        roots = self.node.config["snapshot_roots"] or []
        last = "no snapshot root is configured on this node (snapshot_node_snapshot_roots)"
        for root in roots:
            try:
                snapshot_dir = paths.validate_snapshot_dir(attempt.requested, field="restore-from", root=root)
            except SnapshotError as exc:
                last = exc.msg
                continue
            self.bind_to_requester(os.path.relpath(snapshot_dir, os.path.normpath(root)).split("/"))
            return snapshot_dir
        raise Fallback("unsafe_path: %s; allowed roots: %s" % (last, ", ".join(roots) or "none"))

    def bind_to_requester(self, below_root):
        """The identity a restore must find signed in the snapshot: the one requested, else the one the path spells
        below its root (its last four components, <namespace>/<service>/<instance>/<pod>) -- never none. On a CRI
        node the snapshot's namespace directory must be the pod's own namespace, and so must that identity (and a
        clone's source): a pod restores only its own tenant's snapshots, whatever its annotations or env ask for."""
        depth = len(layout.IDENTITY_KEYS)
        who = self.request.get("requester")
        # With tenants the namespace is the first directory below the root (their boundary), never a deeper one.
        deeper = who is not None and len(below_root) > depth
        if deeper or (len(below_root) < depth and (self.identity is None or who is not None)):
            raise Fallback("bad_request: restore-from: %s is not <namespace>/<service>/<instance>/<pod> below its "
                           "snapshot root%s" % ("/".join(below_root), "; on a node with tenants the namespace is the "
                                                "first directory below the root" if who else
                                                "; or give the identity (%s)" % layout.ENV_RESTORE_IDENTITY))
        if self.identity is None:  # the layout's last four components
            self.identity = dict(zip(layout.IDENTITY_KEYS, below_root[-depth:]))
        if who is None:
            return
        claimed = [("the snapshot's directory", below_root[-depth]), ("the identity", self.identity["namespace"])]
        if self.source is not None:
            claimed.append(("the clone's source", self.source["namespace"]))
        for what, namespace in claimed:
            if namespace != who["namespace"]:
                raise Fallback("tenant_mismatch: %s is of namespace %s, and %s says this container is of pod %s in "
                               "namespace %s; a pod restores only snapshots of its own namespace"
                               % (what, namespace, who["by"], who["pod"], who["namespace"]))

    def image_id(self, attempt):
        if self.docker.get("by"):  # what the container runtime says it runs: a pod's annotation cannot override it
            return self.docker.get("image_id")
        return self.request["image_id"] or self.docker.get("image_id")

    def expectations(self, attempt):
        """The pod's own identity, or for a clone exactly the declared source of the same service; on a CRI node the
        image containerd runs, which must be known (and agree with the one the pod names, if it names one)."""
        refused = fleet.clone_reason(self.identity, self.source)
        if refused:
            raise Fallback(refused)
        if self.docker.get("error"):
            raise Fallback("image_unknown: cannot ask %s which image container %s runs, so the snapshot's image cannot "
                           "be checked: %s" % (self.docker["by"], self.container_id[:12], self.docker["error"]))
        asked, runs = self.request["image_id"], self.docker.get("image_id")
        if self.docker.get("by") and asked and asked != runs:
            raise Fallback("image_mismatch: the pod names image %s (restore-image-id), %s runs %s"
                           % (asked, self.docker["by"], runs))
        return verify.expectations(self.identity, self.image_id(attempt), self.criu_version, self.runtime_version,
                                   source=self.source)

    def world_now(self, recorded):
        return world.oci_facts(self.spec), self.node.runc.version()

    def check(self, attempt):
        try:
            old_env = env_dict((parse_container_record(attempt.document(layout.CONTAINER_RECORD)).get("config")
                                or {}).get("Env"))
        except (IOError, OSError, ValueError, Fallback):
            old_env = {}
        self.paths = restored_process_paths(self.request, old_env, self.node.config)
        try:  # never two processes restored from one snapshot on one device (fleet.py)
            self.entry = fleet.begin(attempt.snapshot_dir, fleet.device_keys(self.spec), attempt.timeout,
                                     identity=self.identity)
        except fleet.Busy as exc:
            raise Fallback(exc.reason)
        except (IOError, OSError) as exc:
            raise Fallback("restores_record: cannot enter this restore in %s: %s (restoring nodes need write access "
                           "to the snapshot store)" % (layout.restores_path(attempt.snapshot_dir), exc))

    def prepare(self, attempt):
        """Recreate what the process had made in its old container's writable layer and needs back.

        The new container's rootfs is the image's: the directory of the agent's listening socket
        (created at run time) is missing there, and CRIU cannot re-bind the socket without it.
        """
        inner = self.paths[1]
        if under_mount(self.spec, inner):
            return  # a volume or tmpfs of the new container provides it
        try:
            root_fd = os.open(self.rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.close(syscalls.open_dirs_below(root_fd, [p for p in inner.split("/") if p], self.user.get("uid"),
                                                  self.user.get("gid")))
            finally:
                os.close(root_fd)
        except (IOError, OSError, ValueError) as exc:
            raise Fallback("rootfs: cannot create %s in the new container's rootfs: %s" % (inner, exc))

    def host_restore(self, attempt):
        """runc restore --detach within the deadline; returns the restored pid or raises Fallback."""
        node, container_id = self.node, self.container_id
        state = fs.ensure_dir(node.path(container_id))
        work = os.path.join(state, "work")
        if os.path.lexists(work) and not criu_cli.remove_work_dir(work):
            raise Fallback("busy: %s has mounts below it from an earlier restore; unmount them" % work)
        fs.ensure_dir(work)
        pid_file = self.create["pid_file"] or os.path.join(state, "restored.pid")
        lazy = bool(node.config.get("lazy_pages"))
        images_dir = self.remapped_images(attempt, state)  # the pod's new address
        argv = node.runc.restore_argv(container_id, self.bundle, images_dir, work,
                                      pid_file, self.create["console_socket"], "--no-pivot" in self.create["flags"],
                                      lazy_pages=lazy)
        if lazy:  # listening before runc starts: CRIU hands it the tasks' memory as they are created
            try:
                self.lazy = criu_cli.LazyPages(node.criu, attempt.images_dir, work).start(
                    min(5.0, attempt.remaining()))
            except SnapshotError as exc:
                raise Fallback("lazy_pages_failed: %s" % exc.msg)
        stopped = StoppedRestore(self.bundle, os.path.join(state, "criu.conf")) if attempt.leave_stopped else None
        if stopped:
            stopped.enter(self.spec)
        targets = self.device_targets(attempt)  # this node's numbering of the NPU nodes, for CRIU's NPU plugin
        env = dict(os.environ, **{layout.ENV_NPU_DEVICES: device.targets_text(targets)}) if targets else None
        try:  # the container's stdio is ours: CRIU hands it to the restored pipes
            rc = node.runc.restore(argv, attempt.remaining(), env=env, log=lambda action, pids: node.log.event(
                "restore_stop", container=container_id, action=action, pids=pids))
            if rc is None:
                kept, _cause = self.keep_log(work)
                raise Fallback("timeout: runc restore did not finish within %.0f s and was stopped (CRIU log: %s)"
                               % (attempt.timeout, kept))
        finally:
            if stopped:
                stopped.leave()
        if rc != 0:
            kept, cause = self.keep_log(work)
            raise Fallback("criu_failed: runc restore exited %d%s (CRIU log: %s)"
                           % (rc, ": %s" % cause if cause else "", kept))
        try:
            with open(pid_file) as handle:
                pid = int(handle.read().strip())
        except (IOError, OSError, ValueError):
            raise Fallback("criu_failed: runc restore wrote no pid to %s" % pid_file)
        if not self.lazy:  # the lazy-pages daemon works (and logs) there until every page is in
            criu_cli.remove_work_dir(work)
        attempt.pid_start_time = proc.start_time(pid)
        return pid

    def device_targets(self, attempt):
        return device.targets_from_oci(self.spec)

    def new_address(self):
        """The pod's new IPv4 address, or None: a container on the host's network keeps the node's address. From the
        network namespace the configuration names (a Kubernetes pod's, made by its CNI plugin before its containers),
        else from dockerd, which allocated it before this create (its hook configures the namespace during runc's
        restore, after CRIU read the images)."""
        found = [n for n in (self.spec.get("linux") or {}).get("namespaces") or [] if n.get("type") == "network"]
        if not found:
            return None
        if found[0].get("path"):
            try:
                return next((a for a in netns.ipv4_addresses(found[0]["path"]) if not a.startswith("127.")), None)
            except netns.ProbeError as exc:
                raise Fallback("network: %s" % exc)
        for network in self.docker.get("networks") or []:
            address = DockerCli().network_address(network, self.container_id)
            if address:
                return address
        return None

    def remapped_images(self, attempt, state):
        """The images to restore: ``attempt.images_dir``, or -- when the process's inet sockets were bound to its old
        pod address and the pod has a new one -- a folder of the same images with CRIU's files.img rewritten to the
        new address (criu_images.remap_inet_addresses: upstream CRIU 4.2.1 has no option for it): in the held view
        (links to the verified inodes, watched like the rest: held.Held.images_with), else a private copy."""
        address = self.new_address()
        source = attempt.images_dir
        if not address:
            return source
        with open(os.path.join(source, criu_images.FILES_IMAGE), "rb") as handle:
            data = handle.read()
        listed = dict((item["path"], item["sha256"]) for item in attempt.manifest["files"])
        name = layout.IMAGES_DIR + "/" + criu_images.FILES_IMAGE
        if not attempt.plain and hashlib.sha256(data).hexdigest() != listed.get(name):  # only bytes verified in this read
            raise Fallback("checksum_mismatch: %s is no longer the file that was verified" % name)
        try:
            data_new, old = criu_images.remap_inet_addresses(data, address)
        except ValueError as exc:
            raise Fallback("host_images_unreadable: %s" % exc)
        if data_new is data:
            return source
        # Never symbolic links: CRIU opens some images from inside the container's namespaces, where no path of the
        # host's resolves.
        if attempt.held is not None and not attempt.plain:
            try:
                target = attempt.held.images_with(REMAPPED, criu_images.FILES_IMAGE, data_new)
            except held.HoldError as exc:
                raise Fallback(exc.reason)
        else:
            target = os.path.join(state, REMAPPED)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
            os.unlink(os.path.join(target, criu_images.FILES_IMAGE))
            fs.write_file_atomic(os.path.join(target, criu_images.FILES_IMAGE), data_new)
        attempt.details["address"] = {"from": old, "to": address}
        self.node.log.event("address", container=self.container_id, action="sockets bound to %s restored on %s"
                            % (", ".join(old), address))
        return target

    def release(self, attempt):
        """The tasks run only with a daemon still serving their pages (or done): one that died already left them holes."""
        if self.lazy and self.lazy.died():
            raise Fallback(self.lazy_failed())
        super(OnCreate, self).release(attempt)

    def failure_cause(self, attempt):
        """A stage failed (the agent closed its connection, say) while a lazy-pages daemon may have just died: its
        exit is given LAZY_EXIT_GRACE to show, so that the reason names the daemon, not the fault it caused."""
        if self.lazy and self.lazy.died(LAZY_EXIT_GRACE):
            return self.lazy_failed()
        return None

    def lazy_failed(self):
        return ("lazy_pages_failed: the criu lazy-pages daemon %s before every page of the restored process was in; "
                "its tasks are killed before they serve (locked until every page is in)" % self.lazy.failure())

    def pages_in(self, attempt):
        """With lazy pages: wait until the daemon has copied every page in. A daemon that died, failed or
        outlived the deadline leaves pages that would read as zeros: a Fallback (the undo kills the tasks)."""
        if not self.lazy or self.lazy.status == 0:
            return
        waited = attempt.watch.clock()
        complete = self.lazy.done(attempt.remaining())
        attempt.details["lazy_pages"] = {"waited": round(attempt.watch.clock() - waited, 6),
                                         "status": self.lazy.status}
        if not complete:
            raise Fallback(self.lazy_failed())
        criu_cli.remove_work_dir(self.lazy.work_dir)

    def after_host_restore(self, attempt):
        """The new environment, through /proc/PID/root (which sees the container's own mounts)."""
        try:  # the restored process holds the devices now, for as long as it runs
            fleet.running(attempt.snapshot_dir, self.entry, attempt.pid, attempt.pid_start_time)
        except (IOError, OSError) as exc:
            self.node.log.event("restores_record", container=self.container_id, action="not updated: %s" % exc)
        try:
            self.write_metadata(attempt, "/proc/%d/root" % attempt.pid, True)
        except (IOError, OSError, ValueError) as exc:
            raise Fallback("metadata_failed: cannot write %s into the restored container: %s" % (self.paths[0], exc))

    def agent_socket_dir(self, attempt):
        return self.paths[1]

    def undo(self, attempt):
        self.node.undo_restore(self.container_id)
        if self.lazy:  # after the tasks: while they live, a page it has not copied yet must not turn into zeros
            self.lazy.stop()

    def cold_start(self, attempt):
        """Write the metadata file into the rootfs (unless a mount of the config would hide it); the runtime
        then hands the call to runc create. A strict request (a container made from the snapshot's own record)
        whose snapshot may be forged is refused instead: Refused, and nothing runs."""
        self.node.drop_state(self.container_id)
        if self.entry:
            fleet.end(attempt.snapshot_dir, self.entry)
            self.entry = None
        if self.request.get("strict") and attempt.verdict is not None and not attempt.verdict["valid"] and \
                not verify.record_usable(attempt.verdict, attempt.documents):
            raise Refused("refused: %s=true and the snapshot does not verify (%s); the container was made from its "
                          "record, which nothing vouches for" % (layout.ENV_RESTORE_STRICT, attempt.reason))
        inner = self.request["metadata_file"]
        hidden = under_mount(self.spec, inner)
        if hidden:
            self.node.log.event("metadata", container=self.container_id,
                                action="not written: %s is below the mount %s" % (inner, hidden))
            return
        try:
            self.write_metadata(attempt, self.rootfs, False, inner)
        except (IOError, OSError, ValueError) as exc:
            self.node.log.event("metadata", container=self.container_id, action="not written: %s" % exc)

    def complete(self, attempt):
        """The markers that make the following ``start`` a no-op (and, with policy once, the next create cold):
        without them ``start`` would run the container a second time, so a restore that cannot write them is
        undone and starts cold."""
        try:
            self.node.mark_restored(self.container_id, self.request["policy"])
        except (IOError, OSError, ValueError) as exc:
            raise Fallback("state_failed: restored, but the runtime cannot record it in %s: %s"
                           % (self.node.path(self.container_id), exc))

    def record_fields(self, attempt):
        fields = {"container": self.container_id, "name": self.docker.get("name"), "policy": self.request["policy"]}
        if self.source is not None:
            fields.update(identity=self.identity, source=self.source)
        return fields

    def commit(self, attempt):
        """The outcome in the snapshot's status record and one line of the runtime's log."""
        super(OnCreate, self).commit(attempt)
        verdict = attempt.verdict or {}
        record = {"container": self.container_id, "name": self.docker.get("name"),
                  "snapshot": self.request["snapshot"], "policy": self.request["policy"], "outcome": attempt.outcome,
                  "reason": attempt.reason, "durations": attempt.watch.durations, "restored_pid": attempt.pid,
                  "device_actions": attempt.device_actions, "authenticated": bool(verdict.get("authenticated")),
                  "verify": dict(dict((key, verdict.get(key)) for key in VERIFY_SUMMARY),
                                 image_checked=bool(self.image_id(attempt)),
                                 identity_checked=self.identity is not None),
                  "identity": self.identity, "requester": self.request.get("requester")}
        for detail in ("record_error", "lazy_pages", "file_locks", "reseed"):
            if detail in attempt.details:
                record[detail] = attempt.details[detail]
        warnings = [verify.unauthenticated_warning(verdict, attempt.require_signature),
                    reseed.not_told(attempt.details.get("reseed"))]
        if attempt.restored and any(warnings):
            record["warning"] = "; ".join(warning for warning in warnings if warning)
        self.node.log.event("restore", **record)

    # -- this path's own steps ----------------------------------------------------------------------
    def write_metadata(self, attempt, root, restored, inner=None):
        doc = metadata.document(env_dict((self.spec.get("process") or {}).get("env")), restored,
                                attempt.snapshot_dir or self.request["snapshot"], "restore-on-create runtime",
                                attempt.reason, engine="docker", container=self.docker.get("name") or self.container_id,
                                container_id=self.container_id, identity=self.identity,
                                source=self.source if restored else None,
                                restore_nonce=attempt.restore_nonce if restored else None)
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            metadata.write_in_root(root_fd, inner or self.paths[0], doc, self.user.get("uid"), self.user.get("gid"))
        finally:
            os.close(root_fd)

    def keep_log(self, work):
        return criu_cli.keep_log(os.path.join(work, "restore.log"), "restore", self.container_id[:12],
                                 self.node.config["criu_log_dir"])

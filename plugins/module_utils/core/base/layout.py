# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one home of every name the collection's programs agree on. PRIVATE to inferops.snapshot.

What a snapshot directory holds and where its records live, the environment variables and
annotations the engine, the node's runtime and Kubernetes read, and the defaults of the paths they
share. Everything else imports these names from here (the agent's own names live in
``agent/protocol.py``, since the agent is copied into images without the rest). The JSON documents
themselves have schemas in ``schemas/``: manifest, metadata file, status record, snapshot config.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..agent import protocol

COLLECTION_VERSION = "0.4.0"          # galaxy.yml's version (a unit test keeps them equal)
# The snapshot's format: what a restore must be able to read of a snapshot directory (its layout, the manifest, the
# chunk index, signature, encryption, the container record, the device part, the plugin's image). Raised by every change
# a restore of the previous format could not read; snapshots record it (manifest format_version, absent before: 1), and a
# restore refuses another (store/manifest.format_reason) -- whichever collection release wrote or reads it.
SNAPSHOT_FORMAT = 2

# -- a snapshot directory: <root>/<namespace>/<service>/<instance>/<pod>/ -----------------------------
IDENTITY_KEYS = ("namespace", "service", "instance", "pod")
MANIFEST = "manifest.json"            # schemas/manifest.schema.json
CHECKSUMS = "checksum.sha256"         # `sha256sum -c` format, the manifest included, in canonical form
SIGNATURE = "signature.json"          # Ed25519 over checksum.sha256 (signature.py); not in the list it signs
HOST_DIR = "host"
IMAGES_DIR = "host/criu"              # the CRIU images
CONTAINER_RECORD = "host/container.json"  # what `docker inspect` said, enough to recreate the container
CHUNK_INDEX = "host/chunks.json"      # per-chunk digests of the big images, listed in checksum.sha256
CANARY = "canary.json"                # the canary request and the warmed-up engine's answer (canary.py)
DEVICE_DIR = "device"
DEVICE_PART = "device/device.json"    # the device part (schemas/manifest.schema.json#/$defs/device_part)
IMAGES_INVENTORY = "inventory.img"    # CRIU writes it last: a directory without it holds no checkpoint
# Beside the snapshot directory, in its parent (so that they survive its removal):
STAGING_SUFFIX = ".partial"           # .<pod>.partial: a generation being assembled, published by rename
STATUS_SUFFIX = ".status.json"        # .<pod>.status.json: the status record (schemas/status.schema.json)
OLD_INFIX = ".old."                   # .<pod>.old.<pid>: the previous snapshot while a new one is published
VIEW_PREFIX = ".inferops-view-"       # .inferops-view-XXXX: what one restore reads, hard links to the inodes it verified
CLAIM_SUFFIX = ".generation.json"     # .<pod>.generation.json: the generation that owns the pod now (claim.py)
RESTORES_SUFFIX = ".restores.json"    # .<pod>.restores.json: restores in progress and the processes they made (fleet.py)
LATEST_SUFFIX = ".latest.json"        # .<pod>.latest.json: the controller's signed statement of the latest generation


def snapshot_dir(root, identity):
    return os.path.join(root, *[identity[key] for key in IDENTITY_KEYS])


def identity_string(identity):
    return "/".join(str(identity.get(key) or "?") for key in IDENTITY_KEYS)


def _sibling(snapshot_dir_, suffix):
    parent, name = os.path.split(snapshot_dir_.rstrip("/"))
    return os.path.join(parent, "." + name + suffix)


def staging_dir(snapshot_dir_):
    return _sibling(snapshot_dir_, STAGING_SUFFIX)


def status_path(snapshot_dir_):
    return _sibling(snapshot_dir_, STATUS_SUFFIX)


def claim_path(snapshot_dir_):
    return _sibling(snapshot_dir_, CLAIM_SUFFIX)


def restores_path(snapshot_dir_):
    return _sibling(snapshot_dir_, RESTORES_SUFFIX)


def latest_path(snapshot_dir_):
    return _sibling(snapshot_dir_, LATEST_SUFFIX)


def old_dir(snapshot_dir_, pid):
    return _sibling(snapshot_dir_, "%s%d" % (OLD_INFIX, pid))


def sibling(name):
    """(kind, pod) of a name beside the snapshot directories -- status, staging, old, claim or restores -- or None."""
    if not name.startswith("."):
        return None
    for kind, suffix in (("status", STATUS_SUFFIX), ("staging", STAGING_SUFFIX), ("claim", CLAIM_SUFFIX),
                         ("restores", RESTORES_SUFFIX)):
        if name.endswith(suffix) and len(name) > len(suffix) + 1:
            return kind, name[1:-len(suffix)]
    pod, infix, pid = name[1:].rpartition(OLD_INFIX)
    return ("old", pod) if infix and pod and pid.isdigit() else None


def images_dir(snapshot_dir_):
    return os.path.join(snapshot_dir_, IMAGES_DIR)


def is_page_image(relpath):
    """A CRIU pages image: process memory that CRIU copies into the restored tasks and never interprets."""
    directory, name = os.path.split(relpath)
    return directory == IMAGES_DIR and name.startswith("pages-") and name.endswith(".img")


# -- the node's cache of verified snapshots (restore/cache.py): <stage_dir>/<fingerprint>/ ------------------------
STAGE_CONTENT = "snapshot"            # <entry>/snapshot/: the copy, as published (dirs 0700, files 0600)
STAGE_VERDICT = "verdict.json"        # <entry>/verdict.json: what was verified, bound to the copy's files' stat
STAGE_PARTIAL_INFIX = ".partial."     # <stage_dir>/.<fingerprint>.partial.<pid>: a copy being made and verified
STAGE_DROP_INFIX = ".drop."           # <stage_dir>/.<fingerprint>.drop.<pid>: an entry being removed
STAGE_DEFAULT_KEEP = 4                # entries kept (oldest verified first out, never one in use)
STAGE_DEFAULT_MAX_BYTES = 64 * 1024 ** 3


def stage_entry(stage_dir, fingerprint):
    return os.path.join(stage_dir, fingerprint)


def stage_content(entry_dir):
    return os.path.join(entry_dir, STAGE_CONTENT)


def stage_verdict(entry_dir):
    return os.path.join(entry_dir, STAGE_VERDICT)


def stage_partial(stage_dir, fingerprint, pid):
    return os.path.join(stage_dir, ".%s%s%d" % (fingerprint, STAGE_PARTIAL_INFIX, pid))


def stage_dropped(stage_dir, fingerprint, pid):
    return os.path.join(stage_dir, ".%s%s%d" % (fingerprint, STAGE_DROP_INFIX, pid))


# -- what the engine reads ---------------------------------------------------------------------------
ENV_NPU_SNAPSHOT_PATH = "VLLM_NPU_SNAPSHOT_PATH"   # the engine takes the device snapshot itself after warmup
ENV_METADATA_FILE = "INFEROPS_METADATA_FILE"       # where it reads its new environment after a restore
ENV_AGENT_SOCKET_DIR = protocol.SOCKET_DIR_ENV     # where its agent listens
DEFAULT_METADATA_FILE = "/run/inferops-snapshot/metadata.json"   # schemas/metadata.schema.json
DEFAULT_AGENT_SOCKET_DIR = protocol.DEFAULT_SOCKET_DIR

# -- what the restore-on-create runtime reads from a container's OCI config -----------------------
# (setting, annotation, environment variable): the annotation wins when both are set, since
# orchestrators set annotations and image authors set env.
ANNOTATION_RESTORE_FROM = "org.inferops.restore-from"
ANNOTATION_RESTORE_CHECKSUM = "org.inferops.restore-checksum"
ENV_RESTORE_FROM = "INFEROPS_RESTORE_FROM"
ANNOTATION_RESTORE_SOURCE = "org.inferops.restore-source"
ENV_RESTORE_SOURCE = "INFEROPS_RESTORE_SOURCE"
ENV_RESTORE_IDENTITY = "INFEROPS_RESTORE_IDENTITY"
ENV_RESTORE_DEVICE = "INFEROPS_RESTORE_DEVICE"
# A snapshot that does not verify is a refused create, not a cold start (snapshot_restore method=runtime sets it on
# the containers it creates from a snapshot's record: nothing built from a record that may be forged runs).
ENV_RESTORE_STRICT = "INFEROPS_RESTORE_STRICT"
RESTORE_REQUEST_KEYS = (
    ("snapshot", ANNOTATION_RESTORE_FROM, ENV_RESTORE_FROM),
    ("timeout", "org.inferops.restore-timeout", "INFEROPS_RESTORE_TIMEOUT"),
    ("policy", "org.inferops.restore-policy", "INFEROPS_RESTORE_POLICY"),
    ("identity", "org.inferops.restore-identity", ENV_RESTORE_IDENTITY),
    # a clone (fleet.py): namespace/service/instance/pod of the snapshot's own pod, another instance of the same service
    ("source", ANNOTATION_RESTORE_SOURCE, ENV_RESTORE_SOURCE),
    ("device", "org.inferops.restore-device", ENV_RESTORE_DEVICE),
    ("strict", "org.inferops.restore-strict", ENV_RESTORE_STRICT),
    ("runtime_version", "org.inferops.restore-runtime-version", "INFEROPS_RESTORE_RUNTIME_VERSION"),
    ("image_id", "org.inferops.restore-image-id", None),
    ("checksum", ANNOTATION_RESTORE_CHECKSUM, "INFEROPS_RESTORE_CHECKSUM"),  # the fingerprint it must have
    ("metadata_file", "org.inferops.metadata-file", ENV_METADATA_FILE),
    ("agent_socket_dir", "org.inferops.agent-socket-dir", ENV_AGENT_SOCKET_DIR),
)
RESTORE_POLICIES = ("once", "always")
# Every annotation of a restore request starts with it (the runtime reads only those above; containerd passes a pod's
# annotations through where its runtime entry allows "<prefix>*"), and the admission policy keeps it from the pods
# of namespaces it does not list.
RESTORE_ANNOTATION_PREFIX = "org.inferops."
# Who asks, on a CRI node: the OCI annotations the container runtime itself sets from the pod's real metadata, which
# a pod creator cannot set (docs/security.md says why, from containerd's and CRI-O's sources): (runtime, namespace,
# pod, container, container type). A node without them (dockerd) has no tenants: whoever may run docker is root.
CRI_REQUESTER_KEYS = (
    ("containerd", "io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name",
     "io.kubernetes.cri.container-name", "io.kubernetes.cri.container-type"),
    ("cri-o", "io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name",
     "io.kubernetes.cri-o.ContainerType"),
)
# Kubernetes on Docker Engine (cri-dockerd) puts no annotations in the OCI config: the kubelet's labels on the
# container, in dockerd's own record, say who asks (a pod's own labels cannot override them: the kubelet sets them
# last). A sandbox is labelled "podsandbox".
DOCKER_REQUESTER_LABELS = ("cri-dockerd", "io.kubernetes.pod.namespace", "io.kubernetes.pod.name",
                           "io.kubernetes.container.name", "io.kubernetes.docker.type")

# -- host paths and their defaults ------------------------------------------------------------------
TMPFS = "/dev/shm"                                # what must never reach a disk (plaintext, env values) lives here
DEFAULT_SNAPSHOT_ROOT = "/var/lib/inferops/snapshots"
DOCKER_ROOT = "/var/lib/docker"
DOCKER_RUNC_ROOT = "/var/run/docker/runtime-runc/moby"
RUNC_CRIU_CONFIG = "/etc/criu/runc.conf"          # runc passes it to CRIU on checkpoint and restore
RUNC_CRIU_OPTIONS = ("tcp-close",)                # lines it must hold (see clients/runc_cli.py)
CRIU_LOG_DIR = "/var/log/inferops-snapshot/criu"   # logs of failed CRIU runs (clients/criu_cli.py keep_log)
# Where containerd keeps a Docker container's task (namespace moby): dockerd's own containerd, then a system one.
# Its CRIU logs live there (criu-dump.log, work/restore.log) and go with the task (clients/docker_cli.py keeps them).
CONTAINERD_TASK_ROOTS = ("/var/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby",
                         "/run/containerd/io.containerd.runtime.v2.task/moby")
# A Kubernetes node's containerd (clients/containerd_cli.py): its socket serves containerd's API and the CRI, and a
# pod's status names a container of its CRI plugin by this prefix and the container's id.
CONTAINERD_ADDRESS = "/run/containerd/containerd.sock"
CRI_CONTAINER_ID_PREFIX = "containerd://"
# SHA-256 of the files a snapshot's world records, per file identity (digests.py): node-local, root's, 0700
DIGEST_CACHE_DIR = "/var/cache/inferops-snapshot/digests"
DEFAULT_RUNC = "/usr/bin/runc"
# The node's high-water marks: the highest generation it has restored per identity (freshness.py). Root's, 0600 in a
# 0700 directory, and on disk: it must outlive a reboot (a rollback after a reboot is still a rollback).
GENERATIONS_FILE = "/var/lib/inferops/state/generations.json"
# The statement of an identity's latest generation (freshness.py): good for this long unless the controller signs it
# again -- with each generation and by the scheduled refresh (playbooks/refresh.yml, daily). A week: a daily refresh
# may miss six runs before restores start cold, and a rollback on a node that never restored the newer generation is
# possible for at most that long after it (docs/security.md, "Freshness across nodes").
LATEST_VALIDITY = 7 * 24 * 3600
# How far a statement may be dated ahead of a node's clock before it is refused (clock_skew:): NTP keeps clocks within
# milliseconds; five minutes forgives a node that has just booted.
CLOCK_SKEW = 300
# The controller's signing key, made on first use by the roles (snapshot_signing_key), and the signer's record of the
# last generation it signed per identity (freshness.SignerLedger); in the controller user's home unless told otherwise.
CONTROLLER_KEYS_DIR = "~/.inferops/keys"
SIGNING_KEY_FILE = "signing.pem"       # Ed25519, PKCS#8, 0600
SIGNING_PUBLIC_FILE = "signing.pub"    # its public half: what the nodes trust
SIGNER_LEDGER_FILE = "generations.json"
RUNTIME_STATE_DIR = "/run/inferops-restore"
RUNTIME_LOG = "/var/log/inferops-restore-runtime.log"
RUNTIME_DEFAULTS = {                              # the node runtime's runtime.json (role snapshot_node)
    "runc": DEFAULT_RUNC,
    "criu": None,                                 # runc's --criu; None: runc finds criu on its PATH
    "state_dir": RUNTIME_STATE_DIR,
    "log_file": RUNTIME_LOG,
    "timeout": 60.0,
    "policy": "once",
    "snapshot_roots": [DEFAULT_SNAPSHOT_ROOT],
    "docker_root": DOCKER_ROOT,                   # dockerd's data root (the role takes it from docker info)
    "tenants": True,                              # a request whose requester cannot be established restores nothing
    "min_size": 1024,
    "device_restore": True,
    "metadata_file": DEFAULT_METADATA_FILE,
    "agent_socket_dir": DEFAULT_AGENT_SOCKET_DIR,
    "criu_log_dir": CRIU_LOG_DIR,
    "trusted_keys": [],                           # public keys (PEM files, or {key, identities}); only signed snapshots
    "encryption_keys": [],                        # key files an encrypted snapshot may be decrypted with
    "require_signature": None,                    # None: on when any key is configured (secure by default)
    "require_encryption": None,                   # None: on when encryption keys are configured
    "generations_file": GENERATIONS_FILE,         # the node's high-water marks (freshness.py)
    "decrypt_dir": TMPFS,                         # where its plaintext lives while CRIU reads it
    "stage_dir": None,                            # the node's cache of verified snapshots (restore/cache.py); None: off
    "lazy_pages": False,                          # memory through a criu lazy-pages daemon (restore/on_create.py)
    "containerd_socket": None,                    # a CRI node's containerd: what it records of a pod (node/runtime.py)
    "ctr": "ctr",                                 # ... asked through its client
}

# The simulated NPU (tests/simulator): its device memory lives in files below this directory, which a container
# gets as a bind mount; the real one is a device node (/dev/davinciN). fleet.py keys restores by either.
ENV_SIM_DEVICE_DIR = "ACL_SIM_DEVICE_DIR"

# -- the NPU's device files (the collection's CRIU NPU plugin, roles/snapshot_prereqs/files/npu-plugin) -------
CRIU_PLUGIN_DIR = "/usr/lib/criu"                 # where CRIU loads plugins from (its CR_PLUGIN_DEFAULT)
NPU_PLUGIN_FILE = "inferops_npu_plugin.so"
NPU_PLUGIN_IMAGE = "inferops-npu.img"             # the plugin's own image in CRIU's images dir (clients/criu_cli.py)
NPU_PLUGIN_MARKER = "[inferops-npu-plugin]"       # on every error line the plugin writes into CRIU's log
ENV_NPU_DEVICES = "INFEROPS_NPU_DEVICES"          # path=c:MAJOR:MINOR,...: this node's numbering, for the plugin
NPU_DEVICES_FILE = "inferops-npu-devices"         # the same, as a file beside the images (docker's copy of them)
# The device files the Ascend Docker Runtime gives an NPU container and the HAL opens (the plugin's names too)
NPU_CHIP_PREFIX = "davinci"                       # davinci<N>: one chip
NPU_MANAGER = "davinci_manager"                   # the HAL's way to every chip (an ioctl binds a sub-module and chip)
NPU_MANAGER_CUST = "npu_device_cust"              # the HAL's fallback when davinci_manager is not accessible
NPU_SVM = "devmm_svm"                             # shared virtual memory
NPU_HDC = "hisi_hdc"                              # host-device communication over PCIe
NPU_NODE_WIDE = (NPU_MANAGER, NPU_MANAGER_CUST, NPU_SVM, NPU_HDC)  # every NPU process's, never one process's device
NPU_MANAGERS = (NPU_MANAGER, NPU_MANAGER_CUST)     # what the HAL reaches a chip through (and an ioctl)
# The driver's user-space libraries: the Ascend Docker Runtime mounts <dir>/lib64 read-only from the host; the library
# halGetAPIVersion is a constant of (store/npu_driver.py records and compares what a process maps from its directory)
NPU_DRIVER_DIR = "/usr/local/Ascend/driver"
NPU_DRIVER_LIBRARY = "libascend_hal.so"

# -- Kubernetes: labels, annotations, the scheduling gate, the record ConfigMap ----------------------
K8S_SERVICE_LABEL = "inferops.org/service"
K8S_INSTANCE_LABEL = "inferops.org/instance"
K8S_HOSTNAME_LABEL = "kubernetes.io/hostname"
K8S_RESTORE_GATE = "inferops.org/snapshot-restore"
# The ValidatingAdmissionPolicy, and its binding of the same name, that keeps the restore runtime's RuntimeClass and
# the restore annotations and env to the namespaces an operator lists (module_utils/k8s/admission.py)
K8S_ADMISSION_POLICY = "restore-requests.snapshot.inferops.org"
K8S_PREFIX = "snapshot.inferops.org/"
K8S_ENABLED = K8S_PREFIX + "enabled"
K8S_IDENTITY = K8S_PREFIX + "identity"
K8S_NPU_PATH = K8S_PREFIX + "npu-path"
K8S_HOST_PATH = K8S_PREFIX + "host-path"
K8S_TIMEOUT = K8S_PREFIX + "timeout-seconds"
K8S_STATUS = K8S_PREFIX + "status"
K8S_REASON = K8S_PREFIX + "reason"
K8S_CHECKSUM = K8S_PREFIX + "checksum"
K8S_NODE = K8S_PREFIX + "node"
K8S_TOTAL_BYTES = K8S_PREFIX + "total-bytes"
K8S_DURATION = K8S_PREFIX + "duration-seconds"
K8S_UPDATED_AT = K8S_PREFIX + "updated-at"    # when the collection last changed the others
K8S_RESTORE = K8S_PREFIX + "restore"
K8S_RESTORE_REASON = K8S_PREFIX + "restore-reason"
K8S_METADATA = K8S_PREFIX + "metadata"          # the new pod's view of the metadata document
# (the annotations' values: schemas/k8s-annotations.schema.json; one writer, module_utils/k8s/pods.py)
K8S_RECORD_PREFIX = "inferops-snapshot-"        # ConfigMap inferops-snapshot-<service> (schemas/k8s-record.schema.json)
K8S_POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"   # a StatefulSet pod's ordinal (Kubernetes >= 1.28)

# -- the snapshot config (schemas/snapshot-config.schema.json) ---------------------------------------
CONFIG_DEFAULTS = {"timeoutSeconds": 300, "minSizeBytes": 1024, "engine": "docker"}

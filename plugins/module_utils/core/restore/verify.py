# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verdict on a snapshot before a restore, the same for every path. PRIVATE to inferops.snapshot.

``for_restore`` runs the content checks of ``manifest.verify`` (listing, sizes, checksums, manifest
schema, identity, image, CRIU and runtime versions) and adds what a restore by this engine needs:
the snapshot was taken with the same engine and holds CRIU images. ``expectations`` is the one
place where "what the restore would run with" is worked out from the modules' options.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ..base import layout
from ..base.errors import ParameterError
from ..clients.criu_cli import CriuCli
from ..store import encryption, fleet, freshness, manifest, world

image_reason = world.image_reason  # the one image check of every path

# ``<fact>_mismatch`` reasons say nothing against the bytes the snapshot holds -- it is intact and, where keys are
# configured, authentic -- only that it does not fit what would run here now (image, versions, kernel, mounts,
# files, arguments...). Its container record can still recreate the container, to start cold (``record_usable``).
# These mismatches, and every other reason, may mean tampering or another pod's snapshot: nothing of it is used.
NOT_STALE = ("checksum_mismatch", "manifest_mismatch", "identity_mismatch", "engine_mismatch")

ENGINE_HINTS = {"docker": "a Docker container: restore it with engine=docker",
                "containerd": "a container of a pod on containerd: restore it into a container (the node's runtime, or engine=docker)",
                "criu": "a bare process: restore it with engine=criu"}
# Engines whose snapshots are one kind: runc's checkpoint of an OCI container, which any container path restores (the
# world compared before it says whether the new container fits).
CONTAINER_ENGINES = {"docker", "containerd"}


def expectations(identity=None, image_id=None, criu_version="auto", runtime_version=None, criu=None, source=None):
    """What a restore here would run with. ``criu_version``: ``auto`` asks this host's CRIU, ``skip``
    checks nothing, anything else is the version to compare with.

    ``source``: a clone (fleet.py) -- the identity of the snapshot's own pod, which the manifest must then
    hold instead of ``identity``; exactly that one, and only of the same namespace and service as ``identity``
    (ParameterError otherwise)."""
    refused = fleet.clone_reason(identity, source)
    if refused:
        raise ParameterError(refused, field="source")
    identity = fleet.expected_identity(identity, source)
    if criu_version == "auto":
        criu_version = (criu or CriuCli()).version()
    elif criu_version == "skip":
        criu_version = None
    return {"identity": identity, "image_id": image_id, "criu_version": criu_version,
            "runtime_version": runtime_version}


def requirements(trusted, keys, require_signature=None, require_encryption=None):
    """(require_signature, require_encryption) as a host applies them: secure by default -- None means on as soon as any
    key is configured (trusted keys or encryption keys) for the signature, and encryption keys for encryption."""
    if require_signature is None:
        require_signature = bool(trusted) or bool(keys)
    if require_encryption is None:
        require_encryption = bool(keys)
    return bool(require_signature), bool(require_encryption)


def unauthenticated_warning(verdict, require_signature):
    """The warning of a restore that nothing authenticated (no key configured, nothing required), or None."""
    if require_signature or not verdict or verdict.get("authenticated"):
        return None
    return ("unauthenticated: this host trusts no signing key, so anyone who can write the snapshot store can have "
            "their own memory image restored here as root; configure trusted_keys (the roles install the "
            "controller's key), see docs/security.md")


def trust_reasons(recorded, authenticated, trusted, require_signature, require_encryption, now=None):
    """What this host's policy refuses in a snapshot whose manifest verified: an unsigned one where signatures are
    required, one encrypted in a format or a coverage this host does not restore, an expired one."""
    reasons = []
    if require_signature and not authenticated and not trusted:  # with trusted keys verify() refused it already
        reasons.append("unsigned: this host restores only signed snapshots (require_signature: a key is configured) "
                       "and trusts no signing key; give it the public key (trusted_keys) or set require_signature "
                       "to false")
    for why in (encryption.format_reason(recorded.get("encryption")), encryption.cover_reason(recorded, require_encryption),
                freshness.expired_reason(recorded, now)):
        if why:
            reasons.append(why)
    return reasons


def engine_reason(recorded, engine):
    """Why a verified snapshot cannot be restored by ``engine`` (None when it can, is unknown, or not asked)."""
    taken = ((recorded or {}).get("engine") or {}).get("name")
    if not taken or not engine or taken == engine or (taken in CONTAINER_ENGINES and engine in CONTAINER_ENGINES):
        return None
    return "engine_mismatch: snapshot was taken with engine %s (%s), not %s" % (
        taken, ENGINE_HINTS.get(taken, "another engine"), engine)


def for_restore(snapshot_dir, engine, expect, min_size=0, workers=None, progress=None, trusted=None, world_now=None,
                plan=manifest.FULL, require_signature=False, require_encryption=False, fresh=None):
    """{valid, reasons, authenticated, bytes, files, checksums, throughput_mb_s, reader, manifest, documents, deferred};
    never raises for a bad snapshot. The one verdict of every restore path, ``snapshot_verify`` and ``snapshot_info``.
    ``engine``: docker or criu, the engine that would restore it (None: any). ``trusted``: the public keys a
    signature must come from (signature.py). ``world_now``: (manifest) -> (process facts of what would run, or
    None for a bare process; runc version): the world the process would come back into, compared with the one
    it was taken in (world.py).

    ``plan`` (manifest.Plan): what is hashed now, deferred, taken as listed or kept, and through which descriptors
    (manifest.verify). ``documents``: the small files (manifest.DOCUMENTS) as read and hashed -- what a restore acts
    on instead of reading them again; ``deferred``: what ``manifest.verify_deferred`` must still pass.
    ``require_signature`` / ``require_encryption``: this host's policy (``requirements``); an expired snapshot is
    refused whatever the policy. ``fresh`` (freshness.Gate): last, once everything else holds -- the controller's
    statement of the latest generation where keys are trusted, and the node's mark (raised unless it is a check).
    """
    valid, reasons, details = manifest.verify(snapshot_dir, min_size, expect, workers, progress=progress,
                                              trusted=trusted, plan=plan)
    recorded = details["manifest"]
    for mismatch in (engine_reason(recorded, engine), manifest.format_reason(recorded) if recorded else None):
        if mismatch:
            reasons.append(mismatch)
    inventory = os.path.join(layout.IMAGES_DIR, layout.IMAGES_INVENTORY)
    if valid and not (inventory in plan.files.fds if plan.files is not None else
                      os.path.isfile(os.path.join(snapshot_dir, inventory))):
        reasons.append("incomplete: %s holds no CRIU images (%s)" % (layout.images_dir(snapshot_dir),
                                                                     layout.IMAGES_INVENTORY))
    if recorded is not None:
        reasons.extend(trust_reasons(recorded, details["authenticated"], trusted, require_signature, require_encryption))
    if valid and not reasons and world_now is not None:
        process, runc_version = world_now(recorded)
        reasons.extend(world.compare(recorded.get("world"), process, expect.get("criu_version"), runc_version))
    if valid and not reasons and fresh is not None:
        refused = fresh.admit(snapshot_dir, recorded, details["fingerprint"], trusted)
        if refused:
            reasons.append(refused)
    hashing = details["hashing"] or {}
    return {"valid": not reasons, "reasons": reasons, "authenticated": details["authenticated"],
            "key_id": details["key_id"], "fingerprint": details["fingerprint"],
            "bytes": details["bytes"], "files": details["files"],
            "checksums": details.get("checksums"), "deferred": details.get("deferred"),
            "throughput_mb_s": None if plan.sizes_only else hashing.get("throughput_mb_s"),
            "hashed_bytes": hashing.get("bytes", 0), "workers": hashing.get("workers"), "reader": hashing.get("reader"),
            "hashing_s": hashing.get("seconds", 0.0),
            "manifest": recorded, "documents": details["documents"]}


def reason(verdict):
    return "; ".join((verdict or {}).get("reasons") or []) or "not verified"


def stale_kind(text):
    """Whether a reason is only staleness: a ``<fact>_mismatch`` not in NOT_STALE."""
    kind = text.split(":", 1)[0]
    return kind.endswith("_mismatch") and kind not in NOT_STALE


def stale_reasons(verdict):
    """The reasons of a verdict that say the snapshot does not belong to what would run now (image, versions,
    world); not those that say it is damaged or not this pod's."""
    return [text for text in (verdict or {}).get("reasons") or [] if stale_kind(text)]


def record_usable(verdict, documents):
    """Whether a verdict still vouches for the snapshot's container record (host/container.json) when it is
    invalid: the record and the manifest were hashed in the read that returned them (``documents``), the checksum
    list is authentic (signed, where keys are configured), and every reason is only staleness (a
    ``<fact>_mismatch`` but NOT_STALE). Then the container may be recreated from it, to start cold."""
    verdict = verdict or {}
    if layout.CONTAINER_RECORD not in (documents or {}) or manifest.MANIFEST not in documents:
        return False
    return all(stale_kind(text) for text in verdict.get("reasons") or [])

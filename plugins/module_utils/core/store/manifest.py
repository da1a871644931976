# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hashing, the checksum list and the verification of published snapshots. PRIVATE to inferops.snapshot.

A published snapshot directory holds ``manifest.json`` (schemas/manifest.schema.json),
``checksum.sha256`` (``sha256sum -c`` format, one line per file, the manifest included, sorted, in
exactly the form ``format_checksums`` writes: any other byte is a reason to refuse it) and the
device and host parts. Files larger than CHUNK_BYTES also get per-chunk digests in the chunk index
``host/chunks.json`` (itself listed in ``checksum.sha256``), so verification hashes a multi-GB page
image on all cores at once. Verification reads every byte exactly once. Sealing (writing them) is
seal.py; the layout's names are layout.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import hashlib
import json
import os
import re

from ..base import layout, schema
from ..clients import criu_cli
from ..linux import fs
from . import hashing, signature, status
from .world import image_reason

MANIFEST = layout.MANIFEST
CHECKSUMS = layout.CHECKSUMS
CHUNK_INDEX = layout.CHUNK_INDEX
# Files above this size get per-chunk digests in the chunk index, so that one big file is hashed on all cores. A chunk
# is one SHA-256 stream that no second core can share: at 64 MiB, the 5-6 jobs of a 0.3 GB snapshot left one of two
# cores hashing 192 MiB against the other's 152 (about 10 % of the check); at 16 MiB the last job is short. A
# verification takes the size from the snapshot's own index, so snapshots sealed with 64 MiB chunks still verify.
CHUNK_BYTES = 16 * 1024 * 1024
_CHECKSUM_LINE = re.compile(r"^([0-9a-f]{64})  ([^\n]+)$")


class ChecksumFormatError(ValueError):
    pass


def list_files(root):
    """Relative paths of the regular files below ``root``, sorted (fs.list_plain_files: links and special files
    raise NotRegularFile, a ValueError)."""
    return fs.list_plain_files(root)


def _chunk_plan(index_data, listed):
    """{relpath: entry} of the files the (already verified) chunk index lets us check chunk by chunk.

    A file is checked by chunks only when the index agrees with checksum.sha256 about its digest and
    the chunk list covers its recorded size; any other file is hashed whole, as without an index.
    """
    try:
        index = json.loads(index_data.decode("utf-8"))
        chunk_bytes = int(index["chunk_bytes"])
        entries = index["files"]
        if chunk_bytes <= 0 or not isinstance(entries, dict):
            return {}, None
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, None
    plan = {}
    for rel, entry in entries.items():
        try:
            size, chunks = int(entry["size"]), list(entry["chunks"])
        except (ValueError, KeyError, TypeError):
            continue
        if rel in listed and entry.get("sha256") == listed[rel] and size > 0 and len(chunks) == (size + chunk_bytes - 1) // chunk_bytes:
            plan[rel] = dict(size=size, chunks=chunks)
    return plan, chunk_bytes


def format_checksums(hashes):
    return "".join("%s  %s\n" % (hashes[rel][1], rel) for rel in sorted(hashes))


def parse_checksums(text):
    """{relpath: sha256} from checksum.sha256; anything but the canonical form raises ChecksumFormatError.

    Canonical: the bytes ``format_checksums`` writes for these entries (sorted, two spaces, one LF
    per line, nothing else). A list that says the same thing in other bytes was not written by us.
    """
    entries = {}
    if not text.endswith("\n") or "\r" in text:
        raise ChecksumFormatError("not in canonical form (every line ends with one LF, no CR)")
    for number, line in enumerate(text[:-1].split("\n"), 1):
        match = _CHECKSUM_LINE.match(line)
        if not match:
            raise ChecksumFormatError("line %d is not '<sha256>  <path>'" % number)
        digest, rel = match.groups()
        if rel.startswith("/") or ".." in rel.split("/") or rel in entries:
            raise ChecksumFormatError("line %d names an absolute, parent or repeated path %r" % (number, rel))
        entries[rel] = digest
    if format_checksums(dict((rel, (None, digest)) for rel, digest in entries.items())) != text:
        raise ChecksumFormatError("not in canonical form (sorted '<sha256>  <path>' lines)")
    return entries


def manifest_files(hashes, exclude=(MANIFEST, CHECKSUMS)):
    files = [{"path": rel, "size": hashes[rel][0], "sha256": hashes[rel][1]} for rel in sorted(hashes)
             if rel not in exclude]
    return files, sum(item["size"] for item in files)


def load_manifest(directory):
    with open(os.path.join(directory, MANIFEST)) as handle:
        return json.load(handle)


# The documents a restore acts on besides the CRIU images: read once, hashed from those same bytes, and handed back
# (KEEP) so that nothing reads them again by path after the verdict.
DOCUMENTS = (MANIFEST, layout.CONTAINER_RECORD, layout.CANARY, layout.DEVICE_PART, CHUNK_INDEX)

HASH = "hash"      # read and hashed now: whole, or chunk by chunk where the verified chunk index allows
DEFER = "defer"    # its size now, its content by verify_deferred while the caller uses it in a way that runs none of it
LISTED = "listed"  # taken as listed: its size is checked against the manifest, its content is not read
KEEP = "keep"      # a document: read once, hashed from memory, its bytes handed back in details["documents"]


class Plan(collections.namedtuple("Plan", "documents page_images other files")):
    """What a verification does with each class of file, decided once, before anything is read.

    ``documents``: DOCUMENTS but the manifest (which is always KEEP), KEEP or LISTED. ``page_images``
    (layout.is_page_image: process memory, which CRIU copies into the tasks and never interprets): HASH, DEFER or
    LISTED. ``other``: every other file (the CRIU images CRIU parses, the device part...), HASH or LISTED. LISTED is
    for a caller whose next step hands the files to a component that hashes them right before it uses them (the node's
    runtime), so that no file is read twice. ``files``: the descriptors every file is read through (restore.held.Held:
    what is verified is what the restore then reads), or None: by path."""

    def action(self, rel):
        if rel == MANIFEST:
            return KEEP
        if rel in DOCUMENTS:
            return self.documents
        return self.page_images if layout.is_page_image(rel) else self.other

    @property
    def sizes_only(self):
        """Nothing but the manifest's content is checked (a verified copy's, or ``snapshot_verify hash=false``)."""
        return self.documents == LISTED

    def describe(self):
        return "documents %s, page images %s, other files %s" % (self.documents, self.page_images, self.other)


FULL = Plan(KEEP, HASH, HASH, None)                # every byte, now
SIZES_ONLY = Plan(LISTED, LISTED, LISTED, None)    # the listing, sizes, manifest, identity, versions
DOCUMENTS_ONLY = Plan(KEEP, LISTED, LISTED, None)  # what this side acts on; a component that hashes them gets the rest
OVERLAPPED = Plan(KEEP, DEFER, HASH, None)         # the page images hashed while CRIU copies them into stopped tasks


class _Refused(Exception):
    """A verification that cannot go on: the snapshot is refused for ``reasons``."""

    def __init__(self, reasons):
        super(_Refused, self).__init__(reasons)
        self.reasons = reasons


def verify(directory, min_size=0, expect=None, workers=None, progress=None, trusted=None, plan=FULL):
    """Check a published snapshot, as ``plan`` says for each file. Returns (valid, reasons, details); never raises
    for bad snapshots.

    ``expect`` may hold ``identity``, ``image_id``, ``criu_version``, ``runtime_version``: what the restore would run
    with, and ``checksum``: the fingerprint a caller knows the snapshot by (a Kubernetes annotation). A key whose
    value is None is not checked. ``trusted`` ({key id: public key}, signature.load_public_keys): when given, the
    snapshot must carry a valid signature by one of them; ``details["authenticated"]`` says whether it did.

    Three steps: list (the checksum list, read once -- its fingerprint, its parse and the signature check are of the
    same bytes -- against the files there are), hash (each file as the plan says), compare (with the list, the
    manifest, what is expected). ``details["checksums"]`` says how much content was checked;
    ``details["deferred"]`` is what ``verify_deferred`` still needs (None when nothing was deferred): until it has
    passed, the verdict covers everything but those files' bytes. ``details["documents"]`` holds the bytes of the
    documents kept ({relpath: bytes}, only those whose digest is the listed one): the manifest is parsed from its own.
    """
    details = {"path": directory, "bytes": 0, "files": 0, "hashing": None, "manifest": None, "authenticated": False,
               "key_id": None, "fingerprint": None, "documents": {}, "deferred": None}
    try:
        listed, present, reasons = _list(directory, plan, trusted, expect or {}, details)
        hashes = _hash(directory, plan, listed, present, trusted, workers, progress, details)
    except _Refused as refused:
        return False, refused.reasons, details
    reasons.extend(_compare_all(listed, present, hashes, expect or {}, min_size, details))
    return not reasons, reasons, details


def _read(directory, plan, rel, limit=hashing.DOCUMENT_LIMIT):
    """The bytes of the small file ``rel``: through the plan's held files (a file the restore did not hold is not
    verified), or by path."""
    path = os.path.join(directory, rel)
    if plan.files is None:
        return hashing.read_document(path, limit)
    if rel not in plan.files.fds:
        raise ValueError("%s appeared after the restore began" % rel)
    return hashing.read_document(path, limit, plan.files.fd(rel), plan.files.sink(rel))


def _list(directory, plan, trusted, expect, details):
    """Step 1: ({relpath: sha256} listed, the files present, the reasons so far), or _Refused: the snapshot is not
    there whole, its list is unreadable or not canonical, or not signed by a trusted key."""
    if not os.path.isdir(directory):
        raise _Refused(["missing: no snapshot at %s" % directory])
    missing = ["incomplete: %s is missing" % name for name in (MANIFEST, CHECKSUMS)
               if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise _Refused(missing)
    try:
        raw = _read(directory, plan, CHECKSUMS)
        listed = parse_checksums(raw.decode("utf-8"))
    except (ChecksumFormatError, UnicodeDecodeError, ValueError, IOError, OSError) as exc:
        raise _Refused(["checksum_unreadable: %s: %s" % (CHECKSUMS, exc)])
    details["fingerprint"] = hashlib.sha256(raw).hexdigest()
    _authenticate(directory, plan, trusted, raw, details)
    reasons = _fingerprint_reasons(directory, details["fingerprint"], expect.get("checksum"))
    try:
        # A restore's files are the ones it holds, which is what it restores from: a file held and then unlinked
        # from the folder must still be judged (a second listing would not see it).
        present = set(plan.files.fds if plan.files is not None else list_files(directory))
    except fs.NotRegularFile as exc:
        raise _Refused(["unsafe_file: %s" % exc])
    except OSError as exc:
        raise _Refused(["unreadable: the snapshot's folder could not be listed: %s" % exc])
    present -= {CHECKSUMS, layout.SIGNATURE}
    reasons.extend("file_missing: %s is listed in %s but absent" % (rel, CHECKSUMS)
                   for rel in sorted(set(listed) - present))
    reasons.extend("file_unlisted: %s is not covered by %s" % (rel, CHECKSUMS) for rel in sorted(present - set(listed)))
    return listed, present, reasons


def _authenticate(directory, plan, trusted, raw, details):
    """Who made it, before anything else is read: an untrusted snapshot is refused (_Refused) whatever it holds."""
    signed = None
    if plan.files is not None and layout.SIGNATURE in plan.files.fds:
        signed = _read(directory, plan, layout.SIGNATURE, 64 * 1024)
    details["authenticated"], refused, details["key_id"] = signature.check(directory, trusted, checksums=raw,
                                                                           document=signed)
    if refused:
        raise _Refused([refused])


def _hash(directory, plan, listed, present, trusted, workers, progress, details):
    """Step 2: {relpath: (size, sha256 or None)} of every listed file present, each as the plan says."""
    to_hash = sorted(set(listed) & present)
    size_of = plan.files.size if plan.files is not None else \
        (lambda rel: os.lstat(os.path.join(directory, rel)).st_size)
    taken = [rel for rel in to_hash if plan.action(rel) == LISTED]
    details["checksums"] = "verified" if not taken else ("sizes only" if plan.sizes_only else
                                                         "verified but %d files taken as listed" % len(taken))
    hashes = dict((rel, (size_of(rel), listed[rel])) for rel in taken)  # a size unlike the manifest's is still caught
    kept = [rel for rel in to_hash if plan.action(rel) == KEEP]
    documents = _read_documents(directory, plan, listed, kept, hashes, details)
    refused = _scope_reason(trusted, details, documents.get(MANIFEST))
    if refused:  # a trusted key outside the identities it may sign: refused before the images are read
        details["authenticated"] = False
        raise _Refused([refused])
    whole, chunked, chunks = _jobs(documents, listed, to_hash, hashes, size_of)
    whole, chunked, later = _defer(plan, whole, chunked, chunks, listed, hashes, size_of, details)
    whole_hashes, chunk_hashes, stats = _hash_jobs(directory, plan, whole, chunked, workers, progress)
    hashes.update(whole_hashes)
    for rel in chunked:
        good = [digest for _length, digest in chunk_hashes[rel]] == chunks[rel]["chunks"]
        hashes[rel] = (chunks[rel]["size"], listed[rel] if good else None)
    stats["bytes"] += sum(hashes[rel][0] for rel in kept)  # the documents, hashed apart
    stats.update(chunked_files=len(chunked), **({"deferred_files": len(later)} if later else {}))
    details.update(hashing=stats, files=len(hashes), bytes=sum(size for size, _digest in hashes.values()))
    return hashes


def _defer(plan, whole, chunked, chunks, listed, hashes, size_of, details):
    """The files the plan defers taken out of this read (their size checked against the manifest, their content left to
    verify_deferred, as ``details["deferred"]``); returns what is left to hash now, and the deferred files."""
    later = [rel for rel in whole + sorted(chunked) if plan.action(rel) == DEFER]
    if not later:
        return whole, chunked, later
    details["deferred"] = {"whole": [rel for rel in later if rel in whole],
                           "chunked": dict((rel, (chunked[rel], chunks[rel]["chunks"])) for rel in later
                                           if rel in chunked),
                           "listed": dict((rel, listed[rel]) for rel in later)}
    hashes.update((rel, (size_of(rel), listed[rel])) for rel in later)
    return ([rel for rel in whole if rel not in hashes],
            dict((rel, size) for rel, size in chunked.items() if rel not in hashes), later)


def _hash_jobs(directory, plan, whole, chunked, workers, progress):
    """hashing.hash_tree of what is left, through the plan's held files; _Refused when it cannot be read."""
    try:
        if plan.files is not None:
            missing = sorted(rel for rel in whole + list(chunked) if rel not in plan.files.fds)
            if missing:
                raise ValueError("%s appeared after the restore began" % ", ".join(missing))
        return hashing.hash_tree(directory, whole, chunked, workers=workers, progress=progress, files=plan.files)
    except (IOError, OSError, ValueError) as exc:
        raise _Refused(["unreadable: the snapshot's files could not be hashed: %s" % exc])


def _read_documents(directory, plan, listed, kept, hashes, details):
    """The documents the plan keeps, read once and hashed from those bytes; {relpath: bytes} of those as listed."""
    documents = details["documents"]
    for rel in kept:
        try:
            data = _read(directory, plan, rel)
        except (IOError, OSError, ValueError) as exc:
            raise _Refused(["unreadable: %s: %s" % (rel, exc)])
        hashes[rel] = (len(data), hashlib.sha256(data).hexdigest())
        if hashes[rel][1] == listed[rel]:
            documents[rel] = data
    return documents


def _jobs(documents, listed, to_hash, hashes, size_of):
    """(files hashed whole, {file: chunk bytes} hashed by chunks, {file: its chunk index entry}) of what is left;
    a file the chunk index records with another size is known to be wrong without a read (into ``hashes``)."""
    plan, chunk_bytes = _chunk_plan(documents[CHUNK_INDEX], listed) if CHUNK_INDEX in documents else ({}, None)
    chunked = {}
    for rel, entry in plan.items():
        if rel not in to_hash or rel in hashes:  # absent, or taken as listed: not read
            continue
        size = size_of(rel)
        if size != entry["size"]:
            hashes[rel] = (size, None)  # truncated or grown
        else:
            chunked[rel] = chunk_bytes
    whole = [rel for rel in to_hash if rel not in hashes and rel not in chunked]
    return whole, chunked, dict((rel, plan[rel]) for rel in chunked)


def _compare_all(listed, present, hashes, expect, min_size, details):
    """Step 3: the reasons the hashes, the manifest (parsed from the bytes just hashed) and what is expected give."""
    corrupted = set(rel for rel in set(listed) & present if hashes[rel][1] != listed[rel])
    reasons = ["checksum_mismatch: %s" % rel for rel in sorted(corrupted)]
    manifest = None
    if MANIFEST in details["documents"]:  # never read again
        try:
            manifest = json.loads(details["documents"][MANIFEST].decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            reasons.append("manifest_invalid: %s is not JSON: %s" % (MANIFEST, exc))
    if manifest is not None:
        problems = schema.errors("manifest", manifest)
        reasons.extend("manifest_invalid: %s" % problem for problem in problems[:5])
        if not problems:
            details["manifest"] = manifest
            reasons.extend(_compare(manifest, hashes, expect, corrupted))
    if details["bytes"] < min_size:
        reasons.append("too_small: %d bytes in total, below the minimum of %d" % (details["bytes"], min_size))
    return reasons


def verify_deferred(directory, deferred, workers=None, progress=None, files=None):
    """The content check ``verify(defer=...)`` left for later: (reasons, stats); [] when every byte is as listed."""
    chunked = dict((rel, entry[0]) for rel, entry in deferred["chunked"].items())
    whole_hashes, chunk_hashes, stats = hashing.hash_tree(directory, deferred["whole"], chunked, workers=workers,
                                                          progress=progress, files=files)
    reasons = []
    for rel in sorted(deferred["listed"]):
        if rel in chunked:
            good = [digest for _length, digest in chunk_hashes.get(rel, [])] == deferred["chunked"][rel][1]
        else:
            good = (whole_hashes.get(rel) or (None, None))[1] == deferred["listed"][rel]
        if not good:
            reasons.append("checksum_mismatch: %s" % rel)
    return reasons, stats


def format_reason(recorded):
    """Why a verified manifest is of a snapshot format this code does not read (None when it is its own)."""
    found = (recorded or {}).get("format_version", 1)
    if found == layout.SNAPSHOT_FORMAT:
        return None
    return ("format_mismatch: the snapshot is of format %d (made by inferops.snapshot %s), this collection restores "
            "format %d; take a new snapshot (a generation replaces it)"
            % (found, ((recorded.get("world") or {}).get("host") or {}).get("collection", "before 0.4.0"),
               layout.SNAPSHOT_FORMAT))


def _compare(manifest, hashes, expect, already_reported):
    reasons = []
    for item in manifest["files"]:
        got = hashes.get(item["path"])
        if got is not None and item["path"] not in already_reported and (got[0] != item["size"] or got[1] != item["sha256"]):
            reasons.append("manifest_mismatch: %s differs from the manifest's record" % item["path"])
    if expect.get("identity") is not None and manifest["identity"] != expect["identity"]:
        reasons.append("identity_mismatch: snapshot belongs to %s, not %s"
                       % (_identity_str(manifest["identity"]), _identity_str(expect["identity"])))
    wrong = image_reason((manifest.get("image") or {}).get("id"), expect.get("image_id"))
    if wrong:
        reasons.append(wrong)
    wanted_criu = criu_cli.major(expect.get("criu_version"))
    taken_criu = criu_cli.major(manifest["engine"].get("criu_version"))
    if wanted_criu is not None and taken_criu != wanted_criu:
        reasons.append("criu_mismatch: snapshot was taken with CRIU %s, this host has %s"
                       % (manifest["engine"].get("criu_version"), expect["criu_version"]))
    if expect.get("runtime_version") is not None and manifest["runtime"]["version"] != expect["runtime_version"]:
        reasons.append("runtime_mismatch: snapshot was taken with ACL runtime %s, the engine would load %s"
                       % (manifest["runtime"]["version"], expect["runtime_version"]))
    return reasons


def _scope_reason(trusted, details, data):
    """Signature_untrusted when the key that signed the snapshot (authenticated: the manifest's bytes are the signed
    ones) may not sign the identity its manifest names (the node's policy, keyscope.py)."""
    if not details["authenticated"] or data is None:
        return None
    try:
        identity = json.loads(data.decode("utf-8"))["identity"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None  # the manifest's own check says what is wrong with it
    if not isinstance(identity, dict):
        return None
    return signature.scope_reason(trusted, details["key_id"], identity)


def _fingerprint_reasons(directory, fingerprint, expected):
    """The fingerprint the generation recorded (the status record) and the one the caller knows must match."""
    reasons = []
    record = status.read(directory) or {}
    if record.get("status") == "completed" and record.get("checksum") and record["checksum"] != fingerprint:
        reasons.append("checksum_mismatch: the status record says the snapshot is %s, its %s hashes to %s"
                       % (record["checksum"], CHECKSUMS, fingerprint))
    if expected and expected != fingerprint:
        reasons.append("checksum_mismatch: the snapshot was recorded as %s, its %s hashes to %s"
                       % (expected, CHECKSUMS, fingerprint))
    return reasons


def _identity_str(identity):
    return "/".join(identity[key] for key in ("namespace", "service", "instance", "pod"))

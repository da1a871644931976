# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one restore knows as it goes (``Attempt``), built once from a host's settings. PRIVATE to the
inferops.snapshot collection.

A ``snapshot_restore`` task and a call of the node's restore-on-create runtime build their attempt the same way
(``new_attempt``), from settings of the same names -- a module's parameters, the runtime's ``runtime.json`` -- and
with the keys loaded once (``Trust.load``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import os

from ..base import layout
from ..base.clock import Deadline, Stopwatch
from ..store import encryption, fleet, freshness, hashing, signature
from . import verify

DECRYPT_DIR = layout.TMPFS   # the plaintext of an encrypted snapshot never reaches a disk


class Fallback(Exception):
    """The snapshot cannot be used: start cold, for ``reason`` (``<kind>: <detail>``)."""

    def __init__(self, reason):
        super(Fallback, self).__init__(reason)
        self.reason = reason


class Trust(collections.namedtuple("Trust", "trusted keys require_signature require_encryption")):
    """What a host trusts ({key id: public key}), may decrypt with ({key id: key}) and requires (signatures,
    encryption; verify.requirements: on as soon as a key is configured, unless turned off)."""

    @classmethod
    def load(cls, settings, load_keys=True):
        """From settings that name ``trusted_keys``, ``encryption_keys``, ``require_signature``,
        ``require_encryption``; a key that cannot be loaded is a SnapshotError naming its setting. Without
        ``load_keys``: the requirements alone, no key (a restore then refuses every snapshot that needs one)."""
        trusted, keys = settings.get("trusted_keys") or [], settings.get("encryption_keys") or []
        wanted = verify.requirements(trusted, keys, settings.get("require_signature"), settings.get("require_encryption"))
        if not load_keys:
            return cls(None, None, *wanted)
        return cls(signature.load_public_keys(trusted, "trusted_keys"), encryption.load_keys(keys, "encryption_keys"),
                   *wanted)


def new_attempt(requested, timeout, settings, trust, device_restore=True, check_mode=False, checksum=None,
                keeps_record=True):
    """The attempt of a restore of ``requested`` on this host, from its ``settings`` (``min_size``, ``workers``,
    ``stage_dir``, ``decrypt_dir``, ``generations_file``) and its ``trust``. ``keeps_record``: this run raises the
    node's high-water mark (not a hand-over: the runtime's own run does, with its settings; nor a check)."""
    generations = settings.get("generations_file")
    fresh = freshness.Gate(freshness.HighWater(generations) if generations else None,
                           record=keeps_record and not check_mode)
    return Attempt(requested, timeout, device_restore=device_restore, check_mode=check_mode,
                   min_size=settings.get("min_size") or 0, workers=settings.get("workers"), trusted=trust.trusted,
                   checksum=checksum, keys=trust.keys, decrypt_dir=settings.get("decrypt_dir"),
                   stage_dir=settings.get("stage_dir"), require_signature=trust.require_signature,
                   require_encryption=trust.require_encryption, freshness=fresh)


class Attempt:
    """What one restore knows as it goes; the stages and the driver read and fill it."""

    def __init__(self, requested, timeout, device_restore=True, check_mode=False, min_size=0, workers=None,
                 trusted=None, checksum=None, keys=None, decrypt_dir=None, stage_dir=None, require_signature=False,
                 require_encryption=False, freshness=None):
        self.requested = requested     # the snapshot asked for; snapshot_dir once it is validated
        self.snapshot_dir = None
        self.watch = Stopwatch()
        self.deadline = Deadline(timeout)
        self.timeout = timeout
        self.device_restore = device_restore
        self.check_mode = check_mode
        self.min_size = min_size
        self.workers = workers
        self.trusted = trusted         # {key id: public key}: only snapshots signed by one of them are restored
        self.checksum = checksum       # the fingerprint the caller knows the snapshot by (a pod annotation)
        self.keys = keys or {}         # {key id: key}: what an encrypted snapshot may be decrypted with
        self.require_signature = require_signature    # this host's policy (verify.requirements)
        self.require_encryption = require_encryption
        self.freshness = freshness     # freshness.Gate: the latest generation's statement and the node's mark, or None
        self.decrypt_dir = decrypt_dir or DECRYPT_DIR
        self.plain = None              # plaintext.PrivateDir: an encrypted snapshot's plaintext, while restored
        self.leave_stopped = False     # the host restore leaves the tasks stopped, for release() after the verdict
        self.stage_dir = stage_dir     # the node's cache of verified snapshots (cache.py), or None
        self.cached = None             # the cache's verified copy restored from (cache.Entry, held until the end)
        self.held = None               # the snapshot's files held for this restore (held.Held), or None
        self.plan = None               # the verification plan (manifest.Plan) this restore follows
        self.pages = None              # the page images' check while CRIU restores (page_check.PageCheck), or None
        self.verdict = None
        self.manifest = None
        self.pid = None
        self.pid_start_time = None
        self.started = False           # the host restore began: a failure from here on needs an undo
        self.device_actions = None
        self.restored = False
        self.failed = False            # neither restored nor started cold (the cold start itself failed)
        self.reason = None
        self.details = {}              # driver facts for the caller's result (container id, placement, ...)
        self.documents = {}            # {relpath: bytes} of the small files, as read and hashed by the verification
        self.restore_nonce = fleet.new_nonce()  # this restore's own: its metadata file's, and the agent's (reseed.py)

    @property
    def outcome(self):
        return "restored" if self.restored else ("failed" if self.failed else "cold")

    def document(self, relpath):
        """The bytes of a small file of the snapshot (manifest.DOCUMENTS) as verified: from the verified copy the
        restore reads (the plaintext of an encrypted snapshot, a cached copy), or as they were hashed; never read
        again from the store. Raises Fallback when the verification did not hand them over."""
        described = (self.manifest or {}).get("encryption") or {}
        if self.plain and relpath in described.get("files", ()):
            return hashing.read_document(os.path.join(self.plain.path, relpath))
        if self.cached:
            return hashing.read_document(os.path.join(self.cached.dir, relpath))
        if relpath not in self.documents:
            raise Fallback("unverified: %s was not read by the verification (not listed in %s?)"
                           % (relpath, layout.CHECKSUMS))
        data = self.documents[relpath]
        if relpath in described.get("files", ()):
            data = encryption.decrypt_bytes(self.keys, data, relpath, encryption.Binding.of(self.manifest))
        return data

    def has_document(self, relpath):
        return any(item["path"] == relpath for item in (self.manifest or {}).get("files", ()))

    def remaining(self, floor=0.1):
        return self.deadline.remaining(floor)

    @property
    def stored_dir(self):
        """Where the snapshot's files as stored are read from, once verified: its cached copy, the very files the
        verification hashed (held.Held's view: leased, or copied as they were hashed), or -- for a path that reads
        nothing of the images itself -- the snapshot."""
        if self.cached:
            return self.cached.dir
        return self.held.view if self.held else self.snapshot_dir

    @property
    def plain_dir(self):
        return self.plain.path if self.plain else None

    @property
    def content_dir(self):
        """Where the snapshot's files are read from: the snapshot (or its cached copy), or the plaintext of an
        encrypted one."""
        return self.plain_dir or self.stored_dir

    @property
    def images_dir(self):
        """The CRIU images' folder: of the plaintext, the cached copy, or -- through the descriptor the restore holds
        (held.Held.images_dir) -- of the files verified."""
        if self.held is not None and not self.plain and not self.cached:
            return self.held.images_dir
        return layout.images_dir(self.content_dir)

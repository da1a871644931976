# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The page images' content check, while CRIU copies them into tasks it leaves stopped. PRIVATE to the
inferops.snapshot collection.

A verification that defers the page images (manifest.DEFER) leaves their content to ``PageCheck``, a thread of its
own that reads them through the descriptors the restore holds -- the very inodes CRIU reads -- while CRIU restores.
Nothing restored runs before its verdict (the pipeline's ``verify_pages`` stage).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import threading

from ..store import manifest


class PageCheck:
    """manifest.verify_deferred of ``deferred``, in a thread, through ``files`` (held.Held) when the restore holds them."""

    def __init__(self, directory, deferred, workers=None, files=None):
        self.directory, self.deferred, self.workers, self.files = directory, deferred, workers, files
        self.reasons = None
        self.stats = None
        self._thread = threading.Thread(target=self._run, name="inferops-verify-pages")
        self._thread.daemon = True  # a restore that failed meanwhile does not wait for it

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        try:
            self.reasons, self.stats = manifest.verify_deferred(self.directory, self.deferred, self.workers,
                                                                files=self.files)
        except Exception as exc:  # unreadable now: not verified, so never released
            self.reasons = ["unreadable: the page images could not be hashed: %s: %s" % (type(exc).__name__, exc)]

    def result(self, timeout):
        """The reasons the page images do not match ([] when every byte does); a check still running at the
        deadline is a reason too."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return ["timeout: the page images were still being hashed when the restore's deadline came"]
        return self.reasons


def authenticated_by_decryption(attempt):
    """The encrypted files whose bytes decrypting them authenticates, when hashing them would prove no more.

    Without a signature required (``trusted``) and without a fingerprint known from outside the store
    (``checksum``, a pod annotation), checksum.sha256 is only as trustworthy as the store that holds it: whoever
    can rewrite a file can rewrite its checksum. AES-GCM under this host's key refuses every byte that a holder of
    the key did not write, a truncation and a reordering included, so for those files it is the stronger check and
    the hash is left out (their listing, sizes and the manifest's digests are still checked). With trusted keys or an
    expected fingerprint the checksums are bound to something the store cannot rewrite, and every key holder (each
    restoring node) could forge ciphertext: those snapshots are hashed in full."""
    described = (attempt.manifest or {}).get("encryption")
    if not described or attempt.trusted or attempt.checksum or described["key_id"] not in attempt.keys:
        return set()
    return set(described["files"])


def leave_to_decryption(attempt, deferred):
    """``deferred`` without the files the decryption authenticates (recorded in the verdict)."""
    if not deferred:
        return deferred
    by_decryption = authenticated_by_decryption(attempt)
    left = sorted(rel for rel in deferred["listed"] if rel in by_decryption)
    if not left:
        return deferred
    attempt.verdict["authenticated_by_decryption"] = left
    kept = dict(whole=[rel for rel in deferred["whole"] if rel not in by_decryption],
                chunked=dict((rel, item) for rel, item in deferred["chunked"].items() if rel not in by_decryption),
                listed=dict((rel, digest) for rel, digest in deferred["listed"].items() if rel not in by_decryption))
    return kept if kept["listed"] else None

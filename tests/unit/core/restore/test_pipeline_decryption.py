"""An encrypted snapshot that nothing outside the store binds: its ciphertext is authenticated by decrypting it
(AES-GCM under this host's key), not hashed as well; anything bound (trusted keys, an expected fingerprint) is
hashed in full. Either way every changed byte ends in a cold start with the reason."""

import os

from conftest import flip_byte_keeping_mtime
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import pipeline
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.attempt import Attempt
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.page_check import authenticated_by_decryption
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import encryption, hashing, manifest

from unit.core.restore.test_cache import PAGES, Fake, keys, make


class Stopping(Fake):
    """A driver whose host restore can leave the tasks stopped: the page images' hash may overlap it."""

    verification = manifest.OVERLAPPED

    def __init__(self):
        super(Stopping, self).__init__()
        self.released = False

    def release(self, attempt):
        self.released = True


def restore(snap, key, **kwargs):
    driver = Stopping()
    attempt = Attempt(snap, 30, device_restore=False, keys={encryption.key_id(key): key}, **kwargs)
    return driver, pipeline.run(driver, attempt)


def test_an_unbound_encrypted_snapshot_is_authenticated_by_its_decryption_not_hashed_again(tmp_path):
    key = os.urandom(32)
    snap = make(tmp_path, size=3 << 20, encryption_key=key)
    driver, attempt = restore(snap, key)
    assert attempt.restored and not driver.cold, attempt.reason
    verdict = attempt.verdict
    assert verdict["authenticated_by_decryption"] == [PAGES], verdict
    assert "overlapped" not in verdict and attempt.pages is None, "nothing left to hash after the restore"
    assert attempt.leave_stopped and driver.released, "the tasks still wait for the leases to be asked"
    pages = os.lstat(os.path.join(snap, PAGES)).st_size
    assert verdict["hashed_bytes"] < pages, "the ciphertext of the page images was not hashed"


def test_a_changed_byte_of_the_ciphertext_still_ends_in_a_cold_start(tmp_path):
    key = os.urandom(32)
    snap = make(tmp_path, size=3 << 20, encryption_key=key)
    for offset in (encryption.HEADER.size + 10, os.lstat(os.path.join(snap, PAGES)).st_size - 1):
        flip_byte_keeping_mtime(os.path.join(snap, PAGES), offset)
        driver, attempt = restore(snap, key)
        assert not attempt.restored and driver.cold and driver.read_from is None, attempt.reason
        assert "decrypt" in attempt.reason or "authentic" in attempt.reason, attempt.reason
        flip_byte_keeping_mtime(os.path.join(snap, PAGES), offset)  # back as it was
    driver, attempt = restore(snap, key)
    assert attempt.restored, attempt.reason


def test_a_changed_checksum_or_a_cut_ciphertext_still_ends_in_a_cold_start(tmp_path):
    key = os.urandom(32)
    snap = make(tmp_path, size=3 << 20, encryption_key=key)
    checksums = os.path.join(snap, manifest.CHECKSUMS)
    text = open(checksums).read()
    digest = [line.split()[0] for line in text.splitlines() if line.endswith(PAGES)][0]
    flipped = digest[:5] + ("0" if digest[5] != "0" else "1") + digest[6:]
    with open(checksums, "w") as handle:
        handle.write(text.replace(digest, flipped))
    driver, attempt = restore(snap, key)
    assert not attempt.restored and driver.cold, "the checksum list no longer agrees with the manifest"
    with open(checksums, "w") as handle:
        handle.write(text)
    path = os.path.join(snap, PAGES)
    size = os.lstat(path).st_size
    os.truncate(path, size - encryption.TAG_BYTES - 100)
    driver, attempt = restore(snap, key)
    assert not attempt.restored and driver.cold and driver.read_from is None, attempt.reason


def test_a_snapshot_bound_by_trusted_keys_or_an_expected_fingerprint_is_hashed_in_full(tmp_path):
    key = os.urandom(32)
    signing, trusted = keys(tmp_path)
    snap = make(tmp_path, size=3 << 20, encryption_key=key, key=signing)
    for bound in (dict(trusted=trusted), dict(checksum=hashing.fingerprint(snap))):
        driver, attempt = restore(snap, key, **bound)
        assert attempt.restored, (bound, attempt.reason)
        assert "authenticated_by_decryption" not in attempt.verdict, bound
        assert attempt.verdict["overlapped"]["files"] >= 1 and driver.released, "the page images were hashed"
        assert attempt.verdict["hashed_bytes"] >= os.lstat(os.path.join(snap, PAGES)).st_size


def test_no_key_or_no_encryption_leaves_nothing_to_the_decryption(tmp_path):
    key = os.urandom(32)
    plain = make(tmp_path, pod="plain", size=1 << 20)
    attempt = Attempt(plain, 30, keys={encryption.key_id(key): key})
    attempt.manifest = manifest.load_manifest(plain)
    assert authenticated_by_decryption(attempt) == set()
    snap = make(tmp_path, pod="enc", size=1 << 20, encryption_key=key)
    attempt = Attempt(snap, 30, keys={})
    attempt.manifest = manifest.load_manifest(snap)
    assert authenticated_by_decryption(attempt) == set()
    attempt.keys = {encryption.key_id(key): key}
    assert authenticated_by_decryption(attempt) == set(attempt.manifest["encryption"]["files"])
    assert layout.is_page_image(PAGES)

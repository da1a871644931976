"""core/restore/on_create.py's images for a pod's new address: CRIU's files.img rewritten, the other images as they
were verified -- in the held view (links to the verified inodes, handed over as a descriptor and watched like the rest)
or, for an encrypted snapshot, beside its plaintext: never the held ciphertext. Its other steps run on the real node
runtime (tests/integration/test_restore_on_create.py, test_npu_device_files.py for the address)."""

import hashlib
import os
import socket
import types

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import held
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.on_create import REMAPPED, OnCreate
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import criu_images
from conftest import criu_image
from unit.core.store.test_device import inet_entry

NEW = "10.9.9.200"


def driver():
    node = types.SimpleNamespace(config={}, log=types.SimpleNamespace(event=lambda *args, **kwargs: None))
    d = OnCreate(node, {}, "/bundle", {"id": "c0"}, {"identity": None, "runtime_version": None}, {}, "4.2.1")
    d.new_address = lambda: NEW
    return d


def images(root, core):
    """CRIU images below ``root``: files.img with a socket bound to the old pod address, and a core image."""
    folder = root / layout.IMAGES_DIR
    folder.mkdir(parents=True)
    criu_image(folder, criu_images.FILES_IMAGE, criu_images.FILES_MAGIC,
               [inet_entry(1, criu_images.AF_INET, socket.inet_aton("10.1.2.3"))])
    (folder / "core-1.img").write_bytes(core)
    return str(root)


def listed(root):
    data = (root / layout.IMAGES_DIR / criu_images.FILES_IMAGE).read_bytes()
    return {"files": [{"path": layout.IMAGES_DIR + "/" + criu_images.FILES_IMAGE,
                       "sha256": hashlib.sha256(data).hexdigest()}]}


def test_the_images_for_a_new_address_are_a_watched_folder_of_the_held_view(tmp_path):
    snap = images(tmp_path / "store" / "pod", b"core")
    h = held.Held.open(snap, str(tmp_path / "shm"))
    try:
        h.make_view()
        attempt = types.SimpleNamespace(images_dir=h.images_dir, manifest=listed(tmp_path / "store" / "pod"),
                                        plain=None, held=h, details={})
        target = driver().remapped_images(attempt, str(tmp_path / "state"))
        assert target.startswith("/proc/%d/fd/" % os.getpid()), "handed over as the descriptor the restore holds"
        assert os.stat(os.path.join(target, "core-1.img")).st_ino == \
            os.stat(os.path.join(snap, layout.IMAGES_DIR, "core-1.img")).st_ino
        remapped, old = criu_images.remap_inet_addresses(
            open(os.path.join(snap, layout.IMAGES_DIR, criu_images.FILES_IMAGE), "rb").read(), NEW)
        assert open(os.path.join(target, criu_images.FILES_IMAGE), "rb").read() == remapped and old == ["10.1.2.3"]
        assert attempt.details["address"] == {"from": ["10.1.2.3"], "to": NEW} and h.broken() == []
        os.unlink(os.path.join(h.view_path, REMAPPED, "core-1.img"))
        assert h.broken() == ["the view's folder %s (core-1.img removed)" % REMAPPED]
    finally:
        h.close()


def test_an_encrypted_snapshots_images_for_a_new_address_are_its_plaintext_never_the_held_ciphertext(tmp_path):
    snap = images(tmp_path / "store" / "pod", b"CIPHERTEXT")
    plain = images(tmp_path / "plain", b"core")
    h = held.Held.open(snap, str(tmp_path / "shm"))
    try:
        h.make_view()
        attempt = types.SimpleNamespace(images_dir=os.path.join(plain, layout.IMAGES_DIR), manifest={"files": []},
                                        plain=types.SimpleNamespace(path=plain), held=h, details={})
        target = driver().remapped_images(attempt, str(tmp_path / "state"))
        assert target == str(tmp_path / "state" / REMAPPED)
        assert open(os.path.join(target, "core-1.img"), "rb").read() == b"core"
    finally:
        h.close()

import os

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import UnsafePathError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import paths


def test_plain_path_is_normalised(tmp_path):
    assert paths.validate_snapshot_dir(str(tmp_path) + "//a/./b/") == str(tmp_path / "a" / "b")


@pytest.mark.parametrize("bad, words", [
    ("relative/dir", "relative"),
    ("/srv/../etc", "'..'"),
    ("/", "'/'"),
    ("", "non-empty"),
    ("/srv/a\x00b", "NUL"),
])
def test_rejected_paths_say_why(bad, words):
    with pytest.raises(UnsafePathError, match=words) as info:
        paths.validate_snapshot_dir(bad, field="host_snapshot_dir")
    assert info.value.msg.startswith("host_snapshot_dir:")


def test_outside_root_is_refused(tmp_path):
    with pytest.raises(UnsafePathError, match="not below the snapshot root"):
        paths.validate_snapshot_dir(str(tmp_path / "other" / "x"), root=str(tmp_path / "root"))
    assert paths.validate_snapshot_dir(str(tmp_path / "root" / "x"), root=str(tmp_path / "root"))


def test_symlink_as_the_snapshot_dir_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        paths.validate_snapshot_dir(str(tmp_path / "link"))


def pod(root):
    return os.path.join(str(root), "ns", "svc", "p0", "pod-a")


def test_a_symlink_inside_the_store_is_refused_wherever_it_points(tmp_path):
    """A link below the snapshot root was followed and the whole snapshot written elsewhere."""
    store = tmp_path / "store"
    (store / "ns").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (store / "ns" / "svc").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError, match="symbolic link inside the snapshot store"):
        paths.validate_snapshot_dir(pod(store))
    with pytest.raises(UnsafePathError, match="symbolic link inside the snapshot store"):
        paths.validate_snapshot_dir(pod(store), root=str(store))


def test_a_root_owned_link_to_the_store_is_followed_and_its_target_checked(tmp_path):
    big_disk = tmp_path / "data"
    big_disk.mkdir()
    (tmp_path / "store").symlink_to(big_disk)  # an operator's: the store lives on a big disk
    assert paths.validate_snapshot_dir(pod(tmp_path / "store"), root=str(tmp_path / "store")) == pod(tmp_path / "store")
    os.chown(big_disk, 4242, 4242)  # ... but what it points to must be as safe as the rest
    with pytest.raises(UnsafePathError, match="owned by uid 4242"):
        paths.validate_snapshot_dir(pod(tmp_path / "store"), root=str(tmp_path / "store"))


def test_a_link_in_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone can replace the link
    (tmp_path / "elsewhere").mkdir()
    (shared / "store").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        paths.validate_snapshot_dir(pod(shared / "store"), root=str(shared / "store"))
    shared.chmod(0o1777)  # sticky, like /tmp: the root-owned link cannot be replaced by others
    assert paths.validate_snapshot_dir(pod(shared / "store"), root=str(shared / "store"))
    os.lchown(shared / "store", 4242, 4242)
    with pytest.raises(UnsafePathError, match="link owned by uid 4242"):
        paths.validate_snapshot_dir(pod(shared / "store"), root=str(shared / "store"))


def test_every_component_must_belong_to_root(tmp_path):
    middle = tmp_path / "home" / "alice"
    middle.mkdir(parents=True)
    os.chown(middle, 4242, 4242)
    with pytest.raises(UnsafePathError, match="'%s' is owned by uid 4242" % middle):
        paths.validate_snapshot_dir(pod(middle / "store"))
    with pytest.raises(UnsafePathError, match="'/' cannot be a snapshot root"):
        paths.validate_snapshot_dir("/ns/svc/p0/pod", root="/")


def test_group_writable_or_foreign_owned_dir_is_refused(tmp_path):
    target = tmp_path / "snap"
    target.mkdir()
    target.chmod(0o770)
    with pytest.raises(UnsafePathError, match="chmod 0700"):
        paths.validate_snapshot_dir(str(target))
    target.chmod(0o700)
    os.chown(target, 4242, 4242)
    with pytest.raises(UnsafePathError, match="owned by uid 4242"):
        paths.validate_snapshot_dir(str(target))


def test_existing_file_is_not_a_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UnsafePathError, match="not a directory"):
        paths.validate_snapshot_dir(str(tmp_path / "f"))


def test_staging_sibling_is_hidden():
    assert layout.staging_dir("/s/ns/svc/p0/pod-a") == "/s/ns/svc/p0/.pod-a.partial"
    assert layout.staging_dir("/s/ns/svc/p0/pod-a/") == "/s/ns/svc/p0/.pod-a.partial"

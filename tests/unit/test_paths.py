import os
import stat

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core import layout, paths
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import UnsafePathError


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


def test_symlink_in_a_world_writable_directory_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (tmp_path / "elsewhere").mkdir()
    (shared / "snap").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError, match="others can write"):
        paths.validate_snapshot_dir(str(shared / "snap" / "pod"))


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


def test_write_file_atomic_modes_and_no_symlink_following(tmp_path):
    directory = paths.ensure_dir(str(tmp_path / "a" / "b"))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    target = os.path.join(directory, "f.json")
    paths.write_file_atomic(target, b"one")
    paths.write_file_atomic(target, b"two")
    assert open(target, "rb").read() == b"two"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert sorted(os.listdir(directory)) == ["f.json"], "no temporary file may be left behind"


def test_remove_tree_does_not_follow_symlinks(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(keep)
    paths.remove_tree(str(tree))
    assert not tree.exists() and (keep / "precious").exists()

"""The sweep of containerd's leaked restore copies (containerd/containerd#10166), over a /proc-shaped
tree on disk; the real `docker start --checkpoint` case is in tests/integration/test_host_snapshot.py."""

import os

from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import containerd_leak as leak


def fake_containerd(proc, pid, env=b"", comm="containerd"):
    base = proc / str(pid)
    (base / "root").mkdir(parents=True)
    (base / "comm").write_text(comm + "\n")
    (base / "environ").write_bytes(env)
    return base / "root"


def images(directory, inventory=b"inv-A", pages=1000):
    directory.mkdir(parents=True)
    (directory / "inventory.img").write_bytes(inventory)
    (directory / "pages-1.img").write_bytes(b"\0" * pages)
    (directory / "descriptors.json").write_text("[]")
    return directory


def test_temp_dir_follows_containerds_environment(tmp_path):
    proc = tmp_path / "proc"
    fake_containerd(proc, 10, b"PATH=/bin\0XDG_RUNTIME_DIR=/run/user/0\0")
    fake_containerd(proc, 11, b"TMPDIR=/var/tmp\0")
    fake_containerd(proc, 12)
    fake_containerd(proc, 13, comm="dockerd")
    assert leak.temp_dirs(str(proc)) == [str(proc / "10/root/run/user/0"), str(proc / "11/root/var/tmp"),
                                         str(proc / "12/root/tmp")]


def test_only_new_copies_of_these_images_are_removed(tmp_path):
    proc = tmp_path / "proc"
    tmp = fake_containerd(proc, 10) / "tmp"
    tmp.mkdir()
    ours = images(tmp_path / "snapshot" / "criu")
    older = images(tmp / "ctrd-checkpoint111")  # there before: another restore's, not ours to judge
    guard = leak.LeakGuard(str(ours), str(proc))
    with guard:
        copy = images(tmp / "ctrd-checkpoint222")
        (copy / "config.json").write_text("{}")  # containerd adds its own files
        other_snapshot = images(tmp / "ctrd-checkpoint333", inventory=b"inv-B")
        other_size = images(tmp / "ctrd-checkpoint444", pages=999)
        unrelated = tmp / "something-else"
        unrelated.mkdir()
    assert guard.removed == [str(copy)]
    assert not copy.exists()
    for kept in (older, other_snapshot, other_size, unrelated, ours):
        assert kept.exists(), kept


def test_removes_the_copy_when_the_start_fails(tmp_path):
    proc = tmp_path / "proc"
    tmp = fake_containerd(proc, 10) / "tmp"
    tmp.mkdir()
    ours = images(tmp_path / "criu")
    try:
        with leak.LeakGuard(str(ours), str(proc)):
            images(tmp / "ctrd-checkpoint9")
            raise RuntimeError("docker start --checkpoint failed")
    except RuntimeError:
        pass
    assert os.listdir(str(tmp)) == []


def test_a_link_is_never_followed(tmp_path):
    proc = tmp_path / "proc"
    tmp = fake_containerd(proc, 10) / "tmp"
    tmp.mkdir()
    ours = images(tmp_path / "criu")
    precious = images(tmp_path / "precious")  # same content as ours, reached through a planted link
    with leak.LeakGuard(str(ours), str(proc)) as guard:
        os.symlink(str(precious), str(tmp / "ctrd-checkpoint5"))
    assert guard.removed == [] and precious.exists()


def test_no_containerd_means_nothing_to_do(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    ours = images(tmp_path / "criu")
    with leak.LeakGuard(str(ours), str(proc)) as guard:
        pass
    assert guard.removed == []

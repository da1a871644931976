"""snapshot_node_files (plugins/module_utils/_node_files.py, its action plugin and module): a controller's directory
installed on a node in one module run -- only what differs written, only what it installed itself removed, nothing
outside dest reachable, and the files' bytes never echoed back in the result."""

import base64
import json
import os
import stat

import pytest

from conftest import run_module
from ansible_collections.inferops.snapshot.plugins.module_utils import _diff, _node_files
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError


def encoded(**files):
    return {rel.replace("__", "/"): base64.b64encode(data).decode() for rel, data in files.items()}


def test_writes_what_differs_and_a_second_run_changes_nothing(tmp_path):
    dest = tmp_path / "lib" / "pkg"
    files = encoded(a_py=b"A = 1\n", sub__b_py=b"B = 2\n")
    first = _node_files.install(str(dest), files)
    assert first == {"written": ["a_py", "sub/b_py"], "removed": [], "files": 2}
    assert (dest / "sub" / "b_py").read_bytes() == b"B = 2\n"
    assert stat.S_IMODE((dest / "a_py").stat().st_mode) == 0o644
    assert stat.S_IMODE((dest / "sub").stat().st_mode) == 0o755
    assert _node_files.install(str(dest), files) == {"written": [], "removed": [], "files": 2}

    (dest / "a_py").write_bytes(b"A = 9\n")  # same size, other bytes
    os.chmod(str(dest / "sub" / "b_py"), 0o666)
    assert _node_files.install(str(dest), files)["written"] == ["a_py", "sub/b_py"]
    assert (dest / "a_py").read_bytes() == b"A = 1\n" and stat.S_IMODE((dest / "sub" / "b_py").stat().st_mode) == 0o644


def test_removes_only_what_an_earlier_run_installed(tmp_path):
    dest = tmp_path / "pkg"
    _node_files.install(str(dest), encoded(a_py=b"a", old_py=b"old"))
    (dest / "operator_notes.txt").write_text("not ours")
    done = _node_files.install(str(dest), encoded(a_py=b"a"))
    assert done == {"written": [], "removed": ["old_py"], "files": 1}
    assert not (dest / "old_py").exists() and (dest / "operator_notes.txt").read_text() == "not ours"


def test_check_mode_writes_nothing_and_says_what_it_would_change(tmp_path):
    dest = tmp_path / "pkg"
    _node_files.install(str(dest), encoded(a_py=b"a", old_py=b"old"))
    would = _node_files.install(str(dest), encoded(a_py=b"new", c_py=b"c"), check_mode=True)
    assert would == {"written": ["a_py", "c_py"], "removed": ["old_py"], "files": 2}
    assert sorted(os.listdir(str(dest))) == [_node_files.INSTALLED, "a_py", "old_py"]
    assert (dest / "a_py").read_bytes() == b"a"
    diff = _diff.node_files({"dest": str(dest)}, would)
    assert diff["before"].splitlines() == ["a_py  (differs)", "c_py  (differs)", "old_py  (removed)"]


@pytest.mark.parametrize("rel", ["../escape.py", "/etc/passwd", "a//b.py", "./a.py", "a/../../b.py",
                                 _node_files.INSTALLED])
def test_a_path_outside_dest_is_refused_before_anything_is_written(tmp_path, rel):
    dest = tmp_path / "pkg"
    with pytest.raises(ParameterError) as raised:
        _node_files.install(str(dest), {"ok.py": base64.b64encode(b"x").decode(), rel: base64.b64encode(b"x").decode()})
    assert raised.value.result["field"] == "files" and repr(rel) in raised.value.msg
    assert not dest.exists()


@pytest.mark.parametrize("dest", ["", "relnodefiles", "/tmp/nf\x00x", "/tmp/a/../b", "{tmp}/afile", "{tmp}/afile/sub"])
@pytest.mark.parametrize("check_mode", [False, True])
def test_a_dest_that_cannot_be_a_directory_is_refused_naming_it(tmp_path, monkeypatch, dest, check_mode):
    monkeypatch.chdir(str(tmp_path))
    (tmp_path / "afile").write_text("keep")
    before = sorted(os.listdir(str(tmp_path)))
    with pytest.raises(ParameterError, match="^dest: ") as raised:
        _node_files.install(dest.format(tmp=tmp_path), encoded(a_py=b"a"), check_mode=check_mode)
    assert raised.value.result["field"] == "dest"
    assert sorted(os.listdir(str(tmp_path))) == before and (tmp_path / "afile").read_text() == "keep"


@pytest.mark.parametrize("blocker", ["file", "directory"])
@pytest.mark.parametrize("check_mode", [False, True])
def test_a_conflict_below_dest_is_refused_before_anything_is_written(tmp_path, blocker, check_mode):
    dest = tmp_path / "pkg"
    dest.mkdir()
    if blocker == "file":
        (dest / "sub").write_text("not a directory")  # sub/b_py cannot be made below it
    else:
        (dest / "c_py").mkdir()  # c_py cannot be renamed over a directory
    with pytest.raises(ParameterError, match="^dest: cannot install (sub/b_py|c_py) in ") as raised:
        _node_files.install(str(dest), encoded(a_py=b"a", sub__b_py=b"b", c_py=b"c"), check_mode=check_mode)
    assert raised.value.result["field"] == "dest"
    assert sorted(os.listdir(str(dest))) == ["c_py" if blocker == "directory" else "sub"]  # a_py not written


@pytest.mark.parametrize("entry", ["../outside.txt", "{outside}", "a/../../outside.txt", "", "./a_py", 7])
@pytest.mark.parametrize("check_mode", [False, True])
def test_an_install_list_naming_a_path_outside_dest_is_refused_and_nothing_is_removed(tmp_path, entry, check_mode):
    """The list of what an earlier run installed names what this run removes: an entry '../x' or '/etc/x' (the list
    edited, or written by something else) removed that file, wherever it was. Checked as ``files`` are."""
    dest, outside = tmp_path / "pkg", tmp_path / "outside.txt"
    _node_files.install(str(dest), encoded(a_py=b"a", old_py=b"old"))
    outside.write_text("not ours")
    listed = dest / _node_files.INSTALLED
    entry = entry.format(outside=outside) if isinstance(entry, str) else entry
    listed.write_text(json.dumps({"files": ["a_py", "old_py", entry]}))
    with pytest.raises(ParameterError) as raised:
        _node_files.install(str(dest), encoded(a_py=b"a"), check_mode=check_mode)
    assert raised.value.result["field"] == "dest" and raised.value.msg == (
        "dest: %s lists %r, which is not a relative path below dest: this module never wrote it; remove that entry "
        "(or the file) and run again" % (listed, entry))
    assert outside.read_text() == "not ours" and (dest / "old_py").exists(), "nothing removed"


def test_a_removal_never_goes_through_a_linked_directory(tmp_path):
    dest, elsewhere = tmp_path / "pkg", tmp_path / "elsewhere"
    _node_files.install(str(dest), encoded(a_py=b"a", sub__old_py=b"old"))
    elsewhere.mkdir()
    (elsewhere / "old_py").write_text("not ours")
    (dest / "sub" / "old_py").unlink()
    (dest / "sub").rmdir()
    (dest / "sub").symlink_to(elsewhere)
    with pytest.raises(ParameterError, match="^dest: cannot install sub/old_py in .*: .*/sub is a symbolic link"):
        _node_files.install(str(dest), encoded(a_py=b"a"))
    assert (elsewhere / "old_py").read_text() == "not ours"


def test_content_that_is_not_base64_is_refused(tmp_path):
    with pytest.raises(ParameterError, match="not base64"):
        _node_files.install(str(tmp_path / "pkg"), {"a.py": "not base64!"})


def test_the_tree_read_on_the_controller_leaves_out_byte_code_and_links(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "pkg" / "b.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / "link.py").symlink_to(tmp_path / "pkg" / "a.py")
    assert _node_files.read_tree(str(tmp_path / "pkg")) == {"a.py": base64.b64encode(b"A = 1\n").decode()}


def test_through_ansible_the_action_plugin_sends_the_tree_and_the_result_names_files_only(tmp_path):
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "a.py").write_text("SECRETLESS_BUT_LONG_CONTENT = 1\n")
    (source / "sub" / "b.py").write_text("B = 2\n")
    dest = tmp_path / "dest"
    args = {"src": str(source), "dest": str(dest)}
    would = run_module("snapshot_node_files", args, check=True)
    assert would["changed"] and would["written"] == ["a.py", "sub/b.py"] and not dest.exists(), would
    done = run_module("snapshot_node_files", args, extra_env={"ANSIBLE_VERBOSITY": "3"})  # results keep invocation
    assert done["changed"] and not done["failed"] and (dest / "sub" / "b.py").read_text() == "B = 2\n", done
    assert done["invocation"]["module_args"]["files"] == ["a.py", "sub/b.py"]
    assert "SECRETLESS_BUT_LONG_CONTENT" not in repr(done)
    again = run_module("snapshot_node_files", args)
    assert not again["changed"] and again["written"] == [] and again["files"] == 2, again
    refused = run_module("snapshot_node_files", dict(args, src=str(tmp_path / "missing")))
    assert refused["failed"] and refused["msg"].startswith("src: "), refused
    given = run_module("snapshot_node_files", dict(args, files={"a.py": "QQ=="}))
    assert given["failed"] and given["msg"].startswith("files: set from src"), given

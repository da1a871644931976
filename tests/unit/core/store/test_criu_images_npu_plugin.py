"""The contract between the collection's CRIU NPU plugin (C, roles/snapshot_prereqs/files/npu-plugin) and its Python
side: the names they share are layout.py's and criu_images.py's, both readers of the plugin's image follow the one
grammar of docs/simulator.md ("The plugin's text formats") on the same edge cases, the plugin reads the numbering
device.targets_text writes and refuses a malformed one loudly, and it re-creates a node under its lock or not at
all.

The plugin's side is its own source, compiled with build.sh's warnings into npu_plugin_harness.c, which stands where
CRIU does (the images directory, the log) and calls the hooks the plugin registers."""

import ast
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import criu_images, device

PLUGIN_DIR = REPO / "roles" / "snapshot_prereqs" / "files" / "npu-plugin"
PLUGIN = PLUGIN_DIR / "inferops_npu_plugin.c"
FORMAT = PLUGIN_DIR / "inferops_npu_format.h"  # its contract and the grammar, which the plugin includes
NODES = PLUGIN_DIR / "inferops_npu_nodes.h"     # its records, this node's numbering and the nodes made so
HARNESS = REPO / "tests" / "unit" / "core" / "store" / "npu_plugin_harness.c"
WARNINGS = "-std=gnu11 -O2 -g -Wall -Wextra -Werror"  # build.sh's
DOC = REPO / "docs" / "simulator.md"
GRAMMAR = "The plugin's text formats"
MARKER = layout.NPU_PLUGIN_MARKER

# The plugin's #defines that are a contract with the Python side, and the Python side's value of each.
CONTRACT = {
    "IMAGE_NAME": layout.NPU_PLUGIN_IMAGE,
    "TARGETS_FILE": layout.NPU_DEVICES_FILE,
    "TARGETS_ENV": layout.ENV_NPU_DEVICES,
    "INFEROPS_NPU_MARKER": layout.NPU_PLUGIN_MARKER,
    "CHIP_PREFIX": layout.NPU_CHIP_PREFIX,
    "MANAGER_NAME": layout.NPU_MANAGER,
    "MANAGER_CUST_NAME": layout.NPU_MANAGER_CUST,
    "SVM_NAME": layout.NPU_SVM,
    "HDC_NAME": layout.NPU_HDC,
    "IMAGE_HEADER": criu_images.NPU_IMAGE_HEADER + "\n",
    "MAX_RECORDS": criu_images.NPU_MAX_RECORDS,
    "MAX_TARGETS": criu_images.NPU_MAX_TARGETS,
    "PATH_TOKEN_MAX": criu_images.NPU_PATH_MAX,
}


def plugin_source():
    """The plugin's C source as one text: its contract header, its records and the plugin."""
    return FORMAT.read_text() + NODES.read_text() + PLUGIN.read_text()


def defines(source):
    """{name: value} of the C source's #defines of one string literal or one number."""
    return dict((name, ast.literal_eval(value)) for name, value in
                re.findall(r'^#define (\w+) +("(?:[^"\\\n]|\\.)*"|[0-9]+)(?![\w(])', source, re.M))


def contract_broken(source):
    """What the plugin's source breaks of CONTRACT: a define gone, a value that differs, a value spelled again."""
    found, broken = defines(source), []
    for name, value in sorted(CONTRACT.items()):
        if name not in found:
            broken.append("%s is not #defined (as %r)" % (name, value))
        elif found[name] != value:
            broken.append("%s is %r, the Python side's %r" % (name, found[name], value))
        elif isinstance(value, str) and source.count(json.dumps(value)) != 1:
            broken.append("%s's value %s is spelled again: use the name" % (name, json.dumps(value)))
    return broken


def test_the_plugins_contract_names_are_the_python_sides():
    assert contract_broken(plugin_source()) == [], "make the plugin's #define and layout.py / criu_images.py agree"


def test_a_changed_a_missing_and_a_respelled_name_are_found():
    source = plugin_source()
    assert contract_broken(source.replace('"inferops-npu.img"', '"inferops-npu2.img"')) == [
        "IMAGE_NAME is 'inferops-npu2.img', the Python side's 'inferops-npu.img'"]
    assert contract_broken(re.sub(r"^#define TARGETS_ENV .*$", "", source, flags=re.M)) == [
        "TARGETS_ENV is not #defined (as 'INFEROPS_NPU_DEVICES')"]
    assert contract_broken(source + '\nstatic const char *again = "davinci_manager";\n') == [
        "MANAGER_NAME's value \"davinci_manager\" is spelled again: use the name"]
    assert contract_broken(source.replace("#define MAX_RECORDS 65536", "#define MAX_RECORDS 512")) == [
        "MAX_RECORDS is 512, the Python side's 65536"]


def test_the_grammar_is_written_once_with_the_plugins_limits_and_both_sides_cite_it():
    section = DOC.read_text().split("### " + GRAMMAR + "\n", 1)[1].split("\n## ", 1)[0]
    limits = defines(plugin_source())
    for words in ("at most %(MAX_RECORDS)d records", "at most %(PATH_TOKEN_MAX)d bytes",
                  "at most %(MAX_TARGETS)d entries and %(TARGETS_MAX)d bytes"):
        assert words % limits in section, "docs/simulator.md's grammar no longer says %r" % (words % limits)
    for reader in (PLUGIN, FORMAT, NODES, criu_images.__file__, device.__file__):
        text = Path(reader).read_text()
        assert "docs/simulator.md" in text and GRAMMAR in text, "%s does not cite the grammar" % reader


# -- the plugin's side -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """npu_plugin_harness.c built over the plugin's source, against the criu-plugin.h build.sh finds -- after build.sh
    itself has built the plugin (under -Werror) into a fresh place."""
    out = tmp_path_factory.mktemp("npu-plugin")
    assert WARNINGS in (PLUGIN_DIR / "build.sh").read_text(), "build.sh's flags changed: follow them in WARNINGS"
    built = subprocess.run(["bash", str(PLUGIN_DIR / "build.sh"), str(out / layout.NPU_PLUGIN_FILE)],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, "the plugin does not build: %s%s" % (built.stdout, built.stderr)
    header = re.search(r"\(header: (.*)/criu-plugin\.h\)", built.stdout).group(1)
    binary = out / "npu_plugin_harness"
    compiled = subprocess.run(["cc"] + WARNINGS.split() + ["-isystem", header, "-I", str(PLUGIN_DIR), "-o", str(binary),
                                                           str(HARNESS)], capture_output=True, text=True, check=False)
    assert compiled.returncode == 0, compiled.stderr
    return binary


def plugin(harness, *args, **env):
    """The harness run with ``args`` and only ``env`` of the plugin's variables: (exit status, stdout, stderr)."""
    environ = dict((k, v) for k, v in os.environ.items() if k != layout.ENV_NPU_DEVICES)
    environ.update(env)
    done = subprocess.run([str(harness)] + [str(a) for a in args], capture_output=True, text=True, env=environ,
                          check=False, errors="surrogateescape")
    return done.returncode, done.stdout, done.stderr


def records(stdout):
    """The harness's records as read_npu_devices gives them, and the targets: {"fds", "vmas", "targets"}."""
    found, keys = {"fds": [], "vmas": [], "targets": []}, {"f": "fds", "v": "vmas", "t": "targets"}
    for words in (line.split(" ") for line in stdout.splitlines() if line[:2] in ("f ", "v ", "t ")):
        kind, major, minor, path = words[-4:]
        fields = dict(type=kind, major=int(major), minor=int(minor), path=os.fsdecode(bytes.fromhex(path)))
        if words[0] == "f":
            fields.update(id=int(words[1]), flags=int(words[2], 16))
        found[keys[words[0]]].append(fields)
    return found


def c_reads(harness, images):
    """What the plugin reads of the image in ``images``: read_npu_devices' shape, or None where it fails the hook."""
    code, out, err = plugin(harness, "restore", images)
    assert code in (0, 1), err
    if code:
        assert MARKER + " " in err, "the plugin failed without its marker: %s" % err
        return None
    found = records(out)
    return {"fds": found["fds"], "vmas": found["vmas"]}


def python_reads(images):
    try:
        return criu_images.read_npu_devices(str(images))
    except ValueError:
        return None


HEADER = (criu_images.NPU_IMAGE_HEADER + "\n").encode()


def image(*lines):
    return HEADER + b"".join(line + b"\n" for line in lines)


def fd(path, id_=27, flags=0o2, kind="c", major=120, minor=64):
    return {"id": id_, "flags": flags, "type": kind, "major": major, "minor": minor, "path": path}


def vma(path, kind="c", major=120, minor=64):
    return {"type": kind, "major": major, "minor": minor, "path": path}


LONGEST = "/" + "a" * (criu_images.NPU_PATH_MAX - 1)
ESCAPED_LONGEST = "/" + "%20" * ((criu_images.NPU_PATH_MAX - 1) // 3)
ACCEPTED = [
    ("escaped paths", image(b"fd 27 2 c 120 64 /dev/dav%20inci0", b"vma c 120 64 /dev/%25%C3%A9/davinci_manager"),
     {"fds": [fd("/dev/dav inci0")], "vmas": [vma(os.fsdecode(b"/dev/%\xc3\xa9/davinci_manager"))]}),
    ("largest and smallest numbers", image(b"fd 4294967295 ffffffff b 4294967295 4294967295 /", b"fd 0 0 c 0 0 /d"),
     {"fds": [fd("/", 4294967295, 0xFFFFFFFF, "b", 4294967295, 4294967295), fd("/d", 0, 0, "c", 0, 0)], "vmas": []}),
    ("longest path", image(b"vma c 120 64 " + LONGEST.encode()), {"fds": [], "vmas": [vma(LONGEST)]}),
    ("longest escaped path", image(b"vma c 120 64 " + ESCAPED_LONGEST.encode()),
     {"fds": [], "vmas": [vma(ESCAPED_LONGEST.replace("%20", " "))]}),
    ("header only", image(), {"fds": [], "vmas": []}),
    ("most records", image(*[b"vma c 1 %d /m" % i for i in range(criu_images.NPU_MAX_RECORDS)]),
     {"fds": [], "vmas": [vma("/m", "c", 1, i) for i in range(criu_images.NPU_MAX_RECORDS)]}),
]
REFUSED = [
    ("path over the limit", image(b"vma c 1 2 " + LONGEST.encode() + b"a")),
    ("escaped path over the limit", image(b"vma c 1 2 " + ESCAPED_LONGEST.encode() + b"%20")),
    ("id over 32 bits", image(b"fd 4294967296 2 c 1 2 /p")),
    ("minor over 32 bits", image(b"vma c 1 4294967296 /p")),
    ("flags over 32 bits", image(b"fd 1 100000000 c 1 2 /p")),
    ("a leading zero", image(b"fd 027 2 c 1 2 /p")),
    ("a leading zero in flags", image(b"fd 27 02 c 1 2 /p")),
    ("a sign", image(b"vma c +1 2 /p")),
    ("a minus", image(b"vma c -1 2 /p")),
    ("0x flags", image(b"fd 1 0x2 c 1 2 /p")),
    ("uppercase flags", image(b"fd 1 A c 1 2 /p")),
    ("non-ASCII digits", image("vma c \u0661 2 /p".encode())),
    ("an underscore in a number", image(b"vma c 1_0 2 /p")),
    ("trailing garbage", image(b"fd 1 2 c 1 2 /p extra")),
    ("a trailing space", image(b"vma c 1 2 /p ")),
    ("two spaces", image(b"vma c  1 2 /p")),
    ("a tab", image(b"vma\tc 1 2 /p")),
    ("bad type letter", image(b"fd 1 2 z 1 2 /p")),
    ("uppercase type letter", image(b"vma C 1 2 /p")),
    ("lowercase escape", image(b"vma c 1 2 /a%2c")),
    ("an escaped safe byte", image(b"vma c 1 2 /a%41")),
    ("an escaped slash", image(b"vma c 1 2 %2Fdev")),
    ("an escaped NUL", image(b"vma c 1 2 /a%00b")),
    ("a cut escape", image(b"vma c 1 2 /a%4")),
    ("a bare percent", image(b"vma c 1 2 /a%")),
    ("a non-hex escape", image(b"vma c 1 2 /a%G0")),
    ("a raw unsafe byte", image(b"vma c 1 2 /a=b")),
    ("raw UTF-8", image("vma c 1 2 /\u00e9".encode())),
    ("a form feed", image(b"vma c 1 2 /a\x0cb")),
    ("a NUL byte", image(b"vma c 1 2 /a\x00b")),
    ("a relative path", image(b"vma c 1 2 dev/davinci0")),
    ("no path", image(b"vma c 1 2 ")),
    ("a missing field", image(b"fd 1 2 c 1 /p")),
    ("an unknown kind", image(b"what c 1 2 /p")),
    ("an uppercase kind", image(b"FD 1 2 c 1 2 /p")),
    ("a blank line", image(b"", b"vma c 1 2 /p")),
    ("a CR LF", image(b"vma c 1 2 /p\r")),
    ("no final newline", image(b"vma c 1 2 /p")[:-1]),
    ("too many records", image(*[b"vma c 1 2 /m"] * (criu_images.NPU_MAX_RECORDS + 1))),
    ("another version", image().replace(b"v1", b"v2")),
    ("a header with a trailing space", image().replace(b"v1", b"v1 ")),
    ("a header without its newline", HEADER[:-1]),
    ("an empty file", b""),
]


@pytest.mark.parametrize("data, expected", [case[1:] for case in ACCEPTED] + [(case[1], None) for case in REFUSED],
                         ids=[case[0] for case in ACCEPTED + REFUSED])
def test_both_readers_of_the_image_read_the_same(harness, tmp_path, data, expected):
    (tmp_path / layout.NPU_PLUGIN_IMAGE).write_bytes(data)
    assert python_reads(tmp_path) == expected, "criu_images.read_npu_devices"
    assert c_reads(harness, tmp_path) == expected, "the plugin"


def test_what_the_plugin_writes_both_read_back_and_a_path_it_cannot_write_whole_is_refused(harness, tmp_path):
    odd = tmp_path / "a dir %\u00e9,=:" / "davinci0"
    odd.parent.mkdir()
    os.mknod(str(odd), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    images = tmp_path / "images"
    images.mkdir()
    code, _out, err = plugin(harness, "dump", images, odd)
    assert code == 0, err
    found = python_reads(images)
    assert found == c_reads(harness, images) and found["fds"][0]["flags"] & os.O_ACCMODE == os.O_RDWR, found
    assert found == {"fds": [fd(str(odd), 27, found["fds"][0]["flags"], "c", 1, 3)], "vmas": [vma(str(odd), "c", 1, 3)]}
    # under PATH_MAX, but over the image's limit escaped (three bytes a space): cut short it would name another file
    deep = tmp_path / "/".join([" " * 200] * 7) / "davinci0"
    deep.parent.mkdir(parents=True)
    os.mknod(str(deep), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (images / layout.NPU_PLUGIN_IMAGE).unlink()
    code, _out, err = plugin(harness, "dump", images, deep)
    assert code == 1 and "%s device %s: its path is over %d bytes escaped" % (MARKER, deep, criu_images.NPU_PATH_MAX) \
        in err, err
    assert not (images / layout.NPU_PLUGIN_IMAGE).exists()


# -- this node's numbering ---------------------------------------------------------------------------------------

def targets_read(harness, tmp_path, text=None, file_text=None):
    """The plugin's restore init given ``text`` in INFEROPS_NPU_DEVICES and/or ``file_text`` (bytes) as the file
    beside an image without NPU devices: (exit status, {path: (type, major, minor)}, stderr)."""
    images = tmp_path / "images"
    images.mkdir(parents=True, exist_ok=True)
    if file_text is not None:
        (images / layout.NPU_DEVICES_FILE).write_bytes(file_text)
    env = {} if text is None else {layout.ENV_NPU_DEVICES: text}
    code, out, err = plugin(harness, "restore", images, **env)
    return code, dict((t["path"], (t["type"], t["major"], t["minor"])) for t in records(out)["targets"]), err


ODD_TARGETS = {"/dev/davinci0": ("c", 120, 128), "/dev/davinci_manager": ("b", 7, 3),
               "/a b,c=d:%/davinci1": ("c", 0, 4294967295), os.fsdecode(b"/\xc3\xa9/davinci2"): ("c", 1, 2)}


def test_the_plugin_reads_the_numbering_device_writes(harness, tmp_path):
    text = device.targets_text(ODD_TARGETS)
    assert targets_read(harness, tmp_path, text=text)[:2] == (0, ODD_TARGETS)
    assert targets_read(harness, tmp_path, file_text=text.encode())[:2] == (0, ODD_TARGETS)
    assert targets_read(harness, tmp_path, file_text=text.encode() + b"\n")[:2] == (0, ODD_TARGETS), "a final LF"
    assert targets_read(harness, tmp_path / "x", text="")[:2] == (0, {}), "empty: no numbering"


LONG = ",".join("/dev/davinci%d=c:1:%d" % (i, i) for i in range(criu_images.NPU_MAX_TARGETS + 1))


@pytest.mark.parametrize("text, named", [
    ("/dev/davinci0", 'malformed entry "/dev/davinci0"'),
    ("/dev/davinci0=c:1", 'malformed entry "/dev/davinci0=c:1"'),
    ("/dev/davinci1=c:1:2,/dev/davinci0=x:1:2", 'malformed entry "/dev/davinci0=x:1:2"'),
    ("/dev/davinci0=c:1:2:3", 'malformed entry "/dev/davinci0=c:1:2:3"'),
    ("davinci0=c:1:2", 'malformed entry "davinci0=c:1:2"'),
    ("/dev/davinci0=c:01:2", 'malformed entry "/dev/davinci0=c:01:2"'),
    ("/dev/davinci0=c:1:4294967296", 'malformed entry "/dev/davinci0=c:1:4294967296"'),
    ("/dev/a b=c:1:2", 'malformed entry "/dev/a b=c:1:2"'),
    ("/dev/davinci0=c:1:2 ", 'malformed entry "/dev/davinci0=c:1:2 "'),
    ("/dev/davinci0=c:1:2,", 'malformed entry ""'),
    (",/dev/davinci0=c:1:2", 'malformed entry ""'),
    ("/dev/davinci0=c:1:2,,/dev/davinci1=c:1:3", 'malformed entry ""'),
    ("/dev/davinci0=c:1:2\n/dev/davinci1=c:1:3", 'malformed entry "/dev/davinci0=c:1:2\n/dev/davinci1=c:1:3"'),
    ("/dev/davinci0=c:1:2,/dev/davinci0=c:1:3", "/dev/davinci0 is given two numberings"),
    (LONG, "more than %d entries" % criu_images.NPU_MAX_TARGETS),
    ("/dev/davinci0=c:1:2," + "/" * 16400 + "=c:1:2", "over 16383 bytes"),
], ids=lambda value: value[:40] if isinstance(value, str) else None)
def test_a_malformed_numbering_fails_the_restore_naming_the_entry(harness, tmp_path, text, named):
    for source, code, _found, err in (
            (layout.ENV_NPU_DEVICES,) + targets_read(harness, tmp_path / "env", text=text),
            (layout.NPU_DEVICES_FILE,) + targets_read(harness, tmp_path / "file", file_text=text.encode())):
        assert code == 1, "the plugin took %r from %s" % (text, source)
        assert "%s %s: %s" % (MARKER, source, named) in err, err


def test_a_numbering_file_with_a_nul_or_unreadable_fails_the_restore(harness, tmp_path):
    code, _found, err = targets_read(harness, tmp_path / "a", file_text=b"/dev/davinci0=c:1:2\0,/dev/x=c:1:1")
    assert code == 1 and "%s %s: over 16383 bytes, or a NUL byte in it" % (MARKER, layout.NPU_DEVICES_FILE) in err, err
    (tmp_path / "b" / "images" / layout.NPU_DEVICES_FILE).mkdir(parents=True)
    code, _found, err = targets_read(harness, tmp_path / "b")
    assert code == 1 and "%s cannot read %s: Is a directory" % (MARKER, layout.NPU_DEVICES_FILE) in err, err


# -- the lock ----------------------------------------------------------------------------------------------------

def restore_node(harness, tmp_path, lock_taken):
    """RESTORE_EXT_FILE of a descriptor recorded on c 1:5 whose node this node numbers c 1:3 (absent, so re-created),
    in a mount namespace of its own whose /run is empty -- or holds a directory where the plugin's lock file goes."""
    node = tmp_path / "dev" / "davinci0"
    node.parent.mkdir(parents=True)
    images = tmp_path / "images"
    images.mkdir()
    quoted = criu_images.npu_quote(str(node)).encode()
    (images / layout.NPU_PLUGIN_IMAGE).write_bytes(image(b"fd 27 2 c 1 5 " + quoted))
    lock = defines(plugin_source())["RECREATE_LOCK"]
    script = "mount -t tmpfs tmpfs /run && %s exec \"$@\"" % ("mkdir %s &&" % lock if lock_taken else "")
    environ = dict(os.environ, **{layout.ENV_NPU_DEVICES: device.targets_text({str(node): ("c", 1, 3)})})
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(harness),
                           "restore", str(images), "27"], capture_output=True, text=True, env=environ, check=False)
    return done.returncode, done.stdout, done.stderr, node, lock


def test_a_node_is_re_created_under_the_lock_or_not_at_all(harness, tmp_path):
    code, out, err, node, _lock = restore_node(harness, tmp_path / "free", lock_taken=False)
    assert code == 0 and "opened c 1 3" in out, err
    assert os.major(node.stat().st_rdev) == 1 and os.minor(node.stat().st_rdev) == 3
    code, out, err, node, lock = restore_node(harness, tmp_path / "taken", lock_taken=True)
    assert code == 1 and "%s device %s: cannot take the lock %s to re-create it as c 1:3: Is a directory" \
        % (MARKER, node, lock) in err, err
    assert not os.path.lexists(str(node)), "re-created without the lock"


def test_a_node_of_this_nodes_numbering_is_made_so_when_the_process_held_no_descriptor_on_it(harness, tmp_path):
    """The HAL reaches a chip through davinci_manager and an ioctl, so a process may hold no descriptor on its chip's
    node: restoring the manager's descriptor makes every node of this node's numbering so (grus re-creates every
    mismatched node too), the chip's included."""
    nodes = tmp_path / "dev"
    nodes.mkdir()
    manager, chip = nodes / layout.NPU_MANAGER, nodes / "davinci0"
    os.mknod(str(manager), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(str(chip), stat.S_IFCHR | 0o666, os.makedev(120, 7))  # the checkpointed node's numbering
    images = tmp_path / "images"
    images.mkdir()
    (images / layout.NPU_PLUGIN_IMAGE).write_bytes(image(b"fd 27 2 c 1 3 " + criu_images.npu_quote(str(manager)).encode()))
    environ = dict(os.environ, **{layout.ENV_NPU_DEVICES: device.targets_text(
        {str(manager): ("c", 1, 3), str(chip): ("c", 120, 9)})})
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           "mount -t tmpfs tmpfs /run && exec \"$@\"", "sh", str(harness), "restore", str(images), "27"],
                          capture_output=True, text=True, env=environ, check=False)
    assert done.returncode == 0 and "opened c 1 3" in done.stdout, done.stderr
    assert os.minor(chip.stat().st_rdev) == 9 and stat.S_ISCHR(chip.stat().st_mode), "the chip's node is this node's"


# -- CRIU's inventory, the number of records, the mappings ----------------------------------------------------------

def test_the_plugin_names_itself_in_crius_inventory_once_per_dump_and_takes_itself_off_at_restore(harness, tmp_path):
    node = tmp_path / layout.NPU_SVM
    os.mknod(str(node), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    images = tmp_path / "images"
    images.mkdir()
    code, out, err = plugin(harness, "dump", images, node, 3)
    assert code == 0, err
    assert out.splitlines() == ["inventory + inferops_npu"], "named once: a restore without it then fails at once"
    assert len(python_reads(images)["vmas"]) == 3
    code, out, err = plugin(harness, "restore", images)
    assert code == 0 and "inventory - inferops_npu" in out.splitlines(), (out, err)


def test_a_dump_over_the_records_limit_fails_at_dump_and_one_at_the_limit_restores(harness, tmp_path):
    node = tmp_path / layout.NPU_MANAGER
    os.mknod(str(node), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    most, over = tmp_path / "most", tmp_path / "over"
    most.mkdir()
    over.mkdir()
    code, _out, err = plugin(harness, "dump", most, node, criu_images.NPU_MAX_RECORDS - 1)  # and its descriptor
    assert code == 0, err
    assert len(python_reads(most)["vmas"]) == criu_images.NPU_MAX_RECORDS - 1 and c_reads(harness, most) is not None
    code, _out, err = plugin(harness, "dump", over, node, criu_images.NPU_MAX_RECORDS)
    assert code == 1, "one record more than the image may hold must fail the dump, not the restore"
    assert "%s device %s: the process holds more than %d NPU descriptors and mappings" % (
        MARKER, node, criu_images.NPU_MAX_RECORDS) in err, err[-500:]


def test_every_mapping_of_an_npu_node_becomes_a_placeholder_and_any_other_is_left_to_criu(harness, tmp_path):
    npu = ["/dev/" + name for name in layout.NPU_NODE_WIDE] + ["/dev/davinci3", "/x/davinci12"]
    others = ["/dev/dri/renderD128", "/dev/zero", "/dev/davinci", "/dev/kfd"]
    code, out, err = plugin(harness, "map", tmp_path, *(npu + others))
    assert code == 0, err
    assert out.splitlines()[1:] == ["placeholder " + p for p in npu] + ["left " + p for p in others], out

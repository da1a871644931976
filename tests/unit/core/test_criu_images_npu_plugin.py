"""The contract between the collection's CRIU NPU plugin (C, roles/snapshot_prereqs/files/npu-plugin) and its Python
side: the names they share are layout.py's and criu_images.py's."""

import ast
import json
import re

from conftest import REPO

from ansible_collections.inferops.snapshot.plugins.module_utils.core import criu_images, layout

PLUGIN = REPO / "roles" / "snapshot_prereqs" / "files" / "npu-plugin" / "inferops_npu_plugin.c"

# The plugin's #defines that are a contract with the Python side, and the Python side's value of each.
CONTRACT = {
    "IMAGE_NAME": layout.NPU_PLUGIN_IMAGE,
    "TARGETS_FILE": layout.NPU_DEVICES_FILE,
    "TARGETS_ENV": layout.ENV_NPU_DEVICES,
    "INFEROPS_NPU_MARKER": layout.NPU_PLUGIN_MARKER,
    "MANAGER_NAME": layout.NPU_MANAGER,
    "IMAGE_HEADER": criu_images.NPU_IMAGE_HEADER + "\n",
}


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
    assert contract_broken(PLUGIN.read_text()) == [], "make the plugin's #define and layout.py / criu_images.py agree"


def test_a_changed_a_missing_and_a_respelled_name_are_found():
    source = PLUGIN.read_text()
    assert contract_broken(source.replace('"inferops-npu.img"', '"inferops-npu2.img"')) == [
        "IMAGE_NAME is 'inferops-npu2.img', the Python side's 'inferops-npu.img'"]
    assert contract_broken(re.sub(r"^#define TARGETS_ENV .*$", "", source, flags=re.M)) == [
        "TARGETS_ENV is not #defined (as 'INFEROPS_NPU_DEVICES')"]
    assert contract_broken(source + '\nstatic const char *again = "davinci_manager";\n') == [
        "MANAGER_NAME's value \"davinci_manager\" is spelled again: use the name"]

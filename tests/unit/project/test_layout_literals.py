"""Names are imported, not spelled: a value of core/base/layout.py (a file name of the snapshot directory, an env
variable, an annotation, a default path the programs share) appears as a literal nowhere else in plugins/, roles/
or extensions/ -- in the code of Python files and in the tasks, templates and variables of YAML and Jinja.

Prose is not code: docstrings, comments, module documentation (DOCUMENTATION, EXAMPLES, RETURN, doc fragments,
a role's meta/argument_specs.yml) and the text of task names and messages may name a value for a reader. A few
places cannot import (a role's defaults, which ansible-doc shows; what runs outside Python); each is listed in
SPELLED with the layout name it copies, and the test checks the copy is still equal to it."""

import ast
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO

from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import protocol
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout

ROOTS = ("plugins", "roles", "extensions")
HOME = REPO / "plugins" / "module_utils" / "core" / "base" / "layout.py"
GENERATED = {REPO / "plugins" / "module_utils" / "core" / "base" / "schemas.py"}  # scripts/gen_schemas.py
PROSE_KEYS = {"name", "msg", "fail_msg", "success_msg", "description", "short_description"}
DOC_ASSIGNMENTS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
# Tests spell the contract on purpose -- a second opinion that catches a changed layout -- and so do the molecule
# scenarios, which are tests users run.
TESTS = (REPO / "extensions" / "molecule",)
# (file, the layout name its value copies): places that cannot import, each kept equal to layout by this test.
# A role's defaults are its documented interface (ansible-doc shows them; tasks and templates take names through
# the inferops.snapshot.layout filter); the node runtime's entry script logs a failure to load the package it
# would take the name from.
SPELLED = {
    ("roles/k8s_snapshot/defaults/main.yml", "DEFAULT_AGENT_SOCKET_DIR"),
    ("roles/k8s_snapshot/defaults/main.yml", "K8S_INSTANCE_LABEL"),
    ("roles/k8s_snapshot/defaults/main.yml", "K8S_SERVICE_LABEL"),
    ("roles/k8s_snapshot/defaults/main.yml", "RUNC_CRIU_CONFIG"),
    ("roles/snapshot_cleanup/defaults/main.yml", "DEFAULT_AGENT_SOCKET_DIR"),
    ("roles/snapshot_cleanup/defaults/main.yml", "DEFAULT_METADATA_FILE"),
    ("roles/snapshot_generate/defaults/main.yml", "DEFAULT_AGENT_SOCKET_DIR"),
    ("roles/snapshot_generate/defaults/main.yml", "DOCKER_RUNC_ROOT"),
    ("roles/snapshot_node/defaults/main.yml", "DEFAULT_AGENT_SOCKET_DIR"),
    ("roles/snapshot_node/defaults/main.yml", "CONTAINERD_ADDRESS"),
    ("roles/snapshot_node/defaults/main.yml", "DEFAULT_METADATA_FILE"),
    ("roles/snapshot_node/defaults/main.yml", "DEFAULT_SNAPSHOT_ROOT"),
    ("roles/snapshot_node/defaults/main.yml", "RUNC_CRIU_CONFIG"),
    ("roles/snapshot_node/defaults/main.yml", "DEFAULT_RUNC"),
    ("roles/snapshot_node/defaults/main.yml", "RUNTIME_LOG"),
    ("roles/snapshot_node/defaults/main.yml", "RUNTIME_STATE_DIR"),
    ("roles/snapshot_node/defaults/main.yml", "TMPFS"),
    ("roles/snapshot_node/files/inferops_restore_runtime.py", "RUNTIME_LOG"),
    ("roles/snapshot_prereqs/defaults/main.yml", "CRIU_PLUGIN_DIR"),
    ("roles/snapshot_prereqs/defaults/main.yml", "RUNC_CRIU_CONFIG"),
    ("roles/snapshot_prereqs/defaults/main.yml", "RUNC_CRIU_OPTIONS"),
    ("roles/snapshot_restore/defaults/main.yml", "DEFAULT_AGENT_SOCKET_DIR"),
    ("roles/snapshot_restore/defaults/main.yml", "DEFAULT_METADATA_FILE"),
}


def layout_values():
    """{value: NAME} of every string layout defines, in a constant or inside one (tuples, dict values), but for
    lowercase words and identifiers (`host`, `docker`, `image_id`): option and field names, owned by the argspecs
    and schemas, and words anyone writes. The agent's own names are protocol.py's (layout imports them)."""
    found = {}

    def add(name, value):
        if isinstance(value, str):
            if not re.match(r"^[a-z][a-z0-9_]*$", value):
                found.setdefault(value, name)
        elif isinstance(value, (tuple, list)):
            for item in value:
                add(name, item)
        elif isinstance(value, dict):
            for item in value.values():
                add(name, item)

    names = [name for name in dir(layout) if name.isupper() and name != "COLLECTION_VERSION"]  # galaxy.yml's
    for name in sorted(names, key=lambda name: not isinstance(getattr(layout, name), str)):  # its own name first
        add(name, getattr(layout, name))
    return found


VALUES = layout_values()
AGENT = dict((value, name) for name, value in vars(protocol).items() if name.isupper() and isinstance(value, str))


def spelled_in(text, values=None):
    """The layout values in ``text``, each as a whole (not part of a longer name, nor of a longer value: the
    prefix of an annotation is not reported inside the annotation)."""
    spans = []
    for value, name in (VALUES if values is None else values).items():
        for match in re.finditer(re.escape(value), text):
            before = text[match.start() - 1] if match.start() else ""
            after = text[match.end()] if match.end() < len(text) else ""
            if (value[0].isalnum() and before and (before.isalnum() or before in "_-")) or \
                    (value[-1].isalnum() and after and (after.isalnum() or after in "_-")):
                continue
            if value[-1] in "-./" and after and after not in "{%$'\" \t\n":
                continue  # a prefix counts where a name is built from it, not inside another literal name
            spans.append((match.start(), match.end(), "%s (%s)" % (name, value)))
    return sorted(set(hit for start, end, hit in spans
                      if not any(s <= start and end <= e and (s, e) != (start, end) for s, e, _hit in spans)))


def python_literals(path):
    """(line, text) of every string literal of a Python file's code: docstrings and module docs left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            prose.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id in DOC_ASSIGNMENTS
                                                for target in node.targets):
            prose.update(id(inner) for inner in ast.walk(node.value))
    return [(node.lineno, node.value.replace("\\", "") if "\\" in node.value else node.value)  # r"\.partial$" too
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose]


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
_Loader.add_constructor("!vault", lambda loader, node: "")


def yaml_scalars(node, key=None):
    """Every key and value of a YAML document but the prose ones (task names, messages, descriptions)."""
    if isinstance(node, dict):
        for child_key, value in node.items():
            if child_key in PROSE_KEYS:
                continue
            yield str(child_key)
            yield from yaml_scalars(value, child_key)
    elif isinstance(node, list):
        for value in node:
            yield from yaml_scalars(value, key)
    elif isinstance(node, str):
        yield node


def code_texts(path):
    """(where, text) of the code of one file under the roots; none for prose and what is not code."""
    if path.suffix == ".py":
        if path.parent.name == "doc_fragments":
            return []
        return [("%d" % line, text) for line, text in python_literals(path)]
    if path.suffix in (".yml", ".yaml"):
        if path.name == "argument_specs.yml" or path.parent.name == "filter":  # role and filter documentation
            return []
        return [("yaml", text) for document in yaml.load_all(path.read_text(encoding="utf-8"), Loader=_Loader)
                for text in yaml_scalars(document)]
    if path.suffix == ".j2":
        return [("%d" % number, line) for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                if not line.lstrip().startswith("#")]
    return []


def scanned():
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path != HOME and path not in GENERATED \
                    and not any(path.is_relative_to(tests) for tests in TESTS):
                yield path


def test_no_layout_value_is_spelled_outside_its_home():
    found = []
    for path in scanned():
        rel = str(path.relative_to(REPO))
        allowed = set(name for file_, name in SPELLED if file_ == rel)
        agent = path.is_relative_to(REPO / "plugins" / "module_utils" / "core" / "agent")
        for where, text in code_texts(path):
            values = VALUES if not agent else dict((v, n) for v, n in VALUES.items() if v not in AGENT)
            for hit in spelled_in(text, values):
                if hit.split(" ")[0] not in allowed:
                    found.append("%s:%s %s" % (rel, where, hit))
    assert not found, "import these names from core/base/layout.py (or pass them in) instead:\n" + "\n".join(
        sorted(set(found)))


@pytest.mark.parametrize("rel, name", sorted(SPELLED))
def test_each_spelled_copy_is_still_equal_to_layout(rel, name):
    values = [text for _where, text in code_texts(REPO / rel)]
    wanted = getattr(layout, name)
    wanted = wanted if isinstance(wanted, (tuple, list)) else [wanted]
    assert all(any(spelled_in(text, {value: name}) for text in values) for value in wanted if isinstance(value, str)), \
        "%s no longer spells layout.%s = %r: follow layout, or drop it from SPELLED" % (rel, name, wanted)


def test_the_scan_finds_what_it_should(tmp_path):
    """The scan itself: a spelled annotation in a task and in code is found; in prose it is not."""
    assert spelled_in("{{ 'snapshot.inferops.org/status' }}") == ["K8S_STATUS (snapshot.inferops.org/status)"]
    assert spelled_in("%s/.%s.status.json") == ["STATUS_SUFFIX (.status.json)"]
    assert spelled_in("INFEROPS_RESTORE_FROM_X") == []  # a longer name is another name
    assert spelled_in("inferops-snapshot-{{ service }}") == ["K8S_RECORD_PREFIX (inferops-snapshot-)"]
    assert spelled_in("inferops-snapshot-tmpfiles.conf") == []  # another name that starts alike
    module = tmp_path / "m.py"
    module.write_text('"""snapshot.inferops.org/status"""\nDOCUMENTATION = "INFEROPS_RESTORE_FROM"\n'
                      'KEY = "org.inferops.restore-from"  # snapshot.inferops.org/node\n')
    assert [text for _line, text in python_literals(module)] == ["org.inferops.restore-from"]
    tasks = tmp_path / "tasks.yml"
    tasks.write_text("- name: annotate snapshot.inferops.org/status\n  x:\n    key: snapshot.inferops.org/node\n")
    texts = [text for _where, text in code_texts(tasks)]
    assert "snapshot.inferops.org/node" in texts and not any("status" in text for text in texts)
    assert Path(REPO / "plugins").is_dir()


def test_the_roles_take_the_names_through_the_layout_filter():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.inferops.snapshot.plugins.filter.snapshot import FilterModule
    take = FilterModule().filters()["layout"]
    assert take("MANIFEST") == layout.MANIFEST and take("RUNC_CRIU_OPTIONS") == list(layout.RUNC_CRIU_OPTIONS)
    for wrong in ("manifest", "NOPE", "os", 3):
        with pytest.raises(AnsibleFilterError, match="is no name of core/base/layout.py"):
            take(wrong)
    used = [path for path in scanned() if path.suffix in (".yml", ".j2") and
            "inferops.snapshot.layout" in path.read_text(encoding="utf-8")]
    assert len(used) >= 5, used  # the roles' tasks and templates that needed a name

"""core/'s folders are layers (docs/architecture.md, "The map"): the table there names every folder, in order, and every
import of a file of core/ goes to its own folder or one above it -- no folder imports a later one, so no two folders
import each other. And every file of core/ has a unit test at its place or is named below as covered elsewhere."""

import ast
import re

import pytest

from conftest import MODULE_UTILS, REPO

CORE = MODULE_UTILS / "core"
UNIT = REPO / "tests" / "unit" / "core"
DOC = REPO / "docs" / "architecture.md"

# Files of core/ whose tests live elsewhere than tests/unit/core/<folder>/test_<name>*.py: {file: the tests that
# exercise it}. Each test named must exist, and a unit test among them must import or name the file's module, so
# that the list cannot rot (integration tests reach core/ through the modules, the runtime and the agent).
COVERED_ELSEWHERE = {
    "agent/__main__.py": ["tests/integration/test_device_snapshot.py"],
    "agent/controller.py": ["tests/unit/core/agent/test_lease.py", "tests/integration/test_device_snapshot.py"],
    "agent/process.py": ["tests/unit/core/agent/test_reseed.py"],
    "agent/restored.py": ["tests/unit/core/agent/test_lease.py", "tests/unit/core/agent/test_reseed.py"],
    "agent/server.py": ["tests/unit/core/agent/test_reseed.py", "tests/integration/test_device_snapshot.py"],
    "base/errors.py": ["tests/unit/test_module.py"],
    "base/layout.py": ["tests/unit/project/test_layout_literals.py"],
    "base/progress.py": ["tests/integration/test_host_snapshot.py", "tests/integration/test_wait_serving.py"],
    "base/schemas.py": ["tests/unit/core/base/test_schema.py"],
    "base/snapshot_config.py": ["tests/unit/plugins/filter/test_snapshot.py", "tests/unit/core/base/test_schema.py"],
    "clients/commands.py": ["tests/unit/core/test_clients.py"],
    "clients/docker_cli.py": ["tests/unit/core/test_clients.py"],
    "clients/runc_cli.py": ["tests/unit/core/test_clients.py"],
    "generate/bare_process.py": ["tests/unit/core/generate/test_driver.py", "tests/integration/test_lease_criu.py"],
    "generate/checkpointer.py": ["tests/integration/test_host_snapshot.py", "tests/integration/test_lease_criu.py"],
    "generate/docker_container.py": ["tests/unit/core/generate/test_driver.py",
                                     "tests/integration/test_host_snapshot.py"],
    "generate/leftovers.py": ["tests/unit/core/generate/test_claim.py", "tests/integration/test_takeover.py"],
    "generate/task.py": ["tests/unit/plugins/action/test_host_checkpoint.py", "tests/integration/test_host_snapshot.py"],
    "linux/mounts.py": ["tests/unit/core/restore/test_pipeline_memory.py", "tests/unit/core/node/test_runtime.py"],
    "linux/netns.py": ["tests/integration/test_npu_device_files.py", "tests/integration/test_restore_on_create.py"],
    "restore/attempt.py": ["tests/unit/core/restore/test_pipeline.py"],
    "restore/checkpoint.py": ["tests/unit/core/restore/test_driver.py", "tests/integration/test_restore_docker_path.py"],
    "restore/handover.py": ["tests/unit/core/restore/test_driver.py", "tests/integration/test_restore_on_create.py"],
    "restore/health.py": ["tests/integration/test_wait_serving.py"],
    "restore/node_state.py": ["tests/integration/test_restore_on_create.py", "tests/integration/test_lazy_pages.py"],
    "restore/page_check.py": ["tests/unit/core/restore/test_pipeline_decryption.py"],
    "restore/reseed.py": ["tests/unit/core/agent/test_reseed.py"],
    "restore/stages.py": ["tests/unit/core/restore/test_pipeline.py", "tests/unit/core/restore/test_driver.py"],
    "store/container_record.py": ["tests/unit/core/test_clients.py", "tests/unit/core/linux/test_fs.py"],
    "store/digests.py": ["tests/unit/core/store/test_world.py"],
    "store/hashing.py": ["tests/unit/core/store/test_mapped.py", "tests/unit/core/store/test_manifest_chunks.py"],
    "store/keyscope.py": ["tests/unit/core/store/test_signature.py", "tests/unit/core/store/test_encryption.py"],
    "store/metadata.py": ["tests/unit/project/test_architecture.py", "tests/unit/core/restore/test_bare.py"],
}


def layers():
    """The folders of the map's table, in order."""
    section = DOC.read_text().split("## The map", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)/` \|", section, re.M)


def folders():
    return sorted(p.name for p in CORE.iterdir() if p.is_dir() and any(p.glob("*.py")))


def imports(path):
    """The folders of core/ a file imports from (its relative imports, resolved)."""
    package = path.relative_to(CORE).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[:len(package) - (node.level - 1)]) + (node.module.split(".") if node.module else [])
            if base:
                found.add(base[0])
            else:  # from core import <folder>
                found.update(alias.name for alias in node.names)
    return found


def upward_imports(order):
    """'<file> imports <folder>' for each import of a later layer."""
    rank = dict((name, index) for index, name in enumerate(order))
    found = []
    for path in sorted(CORE.rglob("*.py")):
        if "__pycache__" in path.parts or path.parent == CORE:
            continue
        own = path.relative_to(CORE).parts[0]
        for folder in sorted(imports(path)):
            if folder not in rank or rank[folder] > rank[own]:
                found.append("%s imports %s/" % (path.relative_to(CORE), folder))
    return found


def test_the_map_names_every_folder_of_core_once_and_nothing_else():
    order = layers()
    assert sorted(order) == folders() and len(set(order)) == len(order), (order, folders())
    assert order[0] == "agent", "the agent imports nothing outside its folder: it is the first layer"
    assert [p.name for p in CORE.glob("*.py")] == [], "every file of core/ lies in one of its folders"


def test_no_file_of_core_imports_a_later_layer():
    assert upward_imports(layers()) == []


def test_an_import_of_a_later_layer_is_found():
    """The check can fail: read with the layers reversed, the tree imports upward everywhere."""
    assert len(upward_imports(list(reversed(layers())))) > 20


def unit_tests_of(path):
    rel = path.relative_to(CORE)
    return [t for t in (UNIT / rel.parent).glob("test_%s*.py" % path.stem)
            if t.stem == "test_" + path.stem or t.stem.startswith("test_%s_" % path.stem)]


def test_every_file_of_core_has_a_test_at_its_place_or_is_listed_with_the_tests_that_cover_it():
    untested = [str(p.relative_to(CORE)) for p in sorted(CORE.rglob("*.py"))
                if p.name != "__init__.py" and "__pycache__" not in p.parts and not unit_tests_of(p)
                and str(p.relative_to(CORE)) not in COVERED_ELSEWHERE]
    assert untested == [], "give each a test at its place (tests/unit/core/<folder>/test_<name>.py) or name the " \
                           "tests that cover it in COVERED_ELSEWHERE"


@pytest.mark.parametrize("name", sorted(COVERED_ELSEWHERE))
def test_a_file_listed_as_covered_elsewhere_is_named_by_each_of_its_tests(name):
    module = name[:-len(".py")].split("/")[-1]
    assert (CORE / name).is_file(), "%s is gone: take it out of COVERED_ELSEWHERE" % name
    assert not unit_tests_of(CORE / name), "%s has a test at its place now: take it out of COVERED_ELSEWHERE" % name
    for test in COVERED_ELSEWHERE[name]:
        assert (REPO / test).is_file(), "%s is gone" % test
    units = [test for test in COVERED_ELSEWHERE[name] if test.startswith("tests/unit/")]
    defined = [node.name for node in ast.parse((CORE / name).read_text()).body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")]
    words = re.compile(r"\b(%s)\b" % "|".join(re.escape(word) for word in [module] + defined))
    assert not units or any(words.search((REPO / test).read_text()) for test in units), \
        "none of %s names %s or anything it defines" % (units, module)

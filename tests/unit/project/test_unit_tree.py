"""tests/unit's tree mirrors plugins/module_utils/core, as kubernetes.core's tests/unit mirrors its plugins: the test of
core/restore/pipeline.py is tests/unit/core/restore/test_pipeline.py, a test of one side of a module is
test_<module>_<topic>.py beside it (test_pipeline_memory.py), and a test of a whole subpackage is named for it
(core/test_clients.py). Checked on the names, so that a test file cannot outlive the module it tests, or drift away
from it, unnoticed."""

from conftest import MODULE_UTILS, REPO

UNIT = REPO / "tests" / "unit"


def named_module(test_file, code_dir):
    """The module (<name>.py) or subpackage (<name>/) in code_dir that test_<name>.py names -- for
    test_<module>_<topic>.py the one its leading words name -- or None."""
    words = test_file.stem[len("test_"):].split("_")
    for count in range(len(words), 0, -1):
        name = "_".join(words[:count])
        if (code_dir / (name + ".py")).is_file() or any((code_dir / name).glob("*.py")):
            return code_dir / name
    return None


def misplaced(tests_root, code_root):
    return [str(path.relative_to(tests_root)) for path in sorted(tests_root.rglob("test_*.py"))
            if named_module(path, code_root / path.parent.relative_to(tests_root)) is None]


def test_every_test_of_core_names_a_module_at_its_place():
    assert misplaced(UNIT / "core", MODULE_UTILS / "core") == []


def test_a_test_named_for_no_module_or_away_from_its_module_is_found(tmp_path):
    code, tests = tmp_path / "core", tmp_path / "tests"
    for path in ("clock.py", "clients/criu.py", "restore/pipeline.py", "restore/file_locks.py"):
        (code / path).parent.mkdir(parents=True, exist_ok=True)
        (code / path).write_text("")
    good = ["test_clock.py", "test_clients.py", "clients/test_criu_lazy_pages.py", "restore/test_pipeline.py",
            "restore/test_pipeline_memory.py", "restore/test_file_locks.py"]
    bad = ["test_pipeline.py", "test_clockwork.py", "clients/test_clients.py", "restore/test_file.py"]
    for path in good + bad:
        (tests / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / path).write_text("")
    assert misplaced(tests, code) == sorted(bad)


def test_every_folder_of_the_unit_tests_is_a_package():
    """pytest imports a test module of a package by its dotted name (unit.core.restore.test_pipeline), so the mirror
    may repeat a basename of another folder and a test imports another's helpers by that name. A folder without
    __init__.py would put its files back on their basenames."""
    folders = set(folder for path in UNIT.rglob("test_*.py") for folder in path.parents if UNIT in folder.parents)
    folders.add(UNIT)
    assert sorted(str(folder.relative_to(REPO)) for folder in folders if not (folder / "__init__.py").is_file()) == []

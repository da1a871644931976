"""Growth as a decision (scripts/size_budget.py, as checkpointctl's test/check-lib-size.sh): no file of the collection's
code over its cap, and no commit since the last release growing the code past a budget without a ``Size-Budget:``
trailer saying why. The tree is checked as it is; the rule itself on small repositories made for it."""

import re
import subprocess

import pytest

from conftest import REPO, load_file_module

SCRIPT = REPO / "scripts" / "size_budget.py"
DOC = REPO / "docs" / "architecture.md"


budget = load_file_module("size_budget", SCRIPT)


def test_the_tree_keeps_its_size_budget(capsys):
    code = budget.main(["--repo", str(REPO)])
    assert code == 0, capsys.readouterr().out


def test_the_numbers_are_the_ones_the_architecture_doc_gives():
    section = DOC.read_text().split("### Size budget", 1)[1].split("\n## ", 1)[0]
    rows = dict((label, int(value.replace(",", ""))) for label, value in
                re.findall(r"^\| ([^|]+?) \| ([0-9,]+) \|$", section, re.M))
    assert rows == {"lines of any one file": budget.FILE_CAP,
                    "lines a commit may add without a `Size-Budget:` trailer": budget.COMMIT_BUDGET}, rows


def test_what_is_counted_is_the_code_and_not_the_generated_schemas():
    assert budget.counted("plugins/module_utils/core/restore/pipeline.py")
    assert budget.counted("plugins/modules/host_checkpoint.py") and budget.counted("plugins/action/host_checkpoint.py")
    assert budget.counted("roles/snapshot_prereqs/files/npu-plugin/inferops_npu_plugin.c")
    assert budget.counted("roles/snapshot_prereqs/files/npu-plugin/inferops_npu_format.h")
    assert not budget.counted("plugins/module_utils/core/base/schemas.py")
    assert not budget.counted("tests/unit/core/restore/test_pipeline.py") and not budget.counted("docs/index.md")


class Repo:
    """A git repository to commit into: ``commit(message, {path: lines})``."""

    def __init__(self, path):
        self.path = path
        self.git("init", "-q", "-b", "main")
        self.git("config", "user.email", "dev@example.invalid")
        self.git("config", "user.name", "dev")

    def git(self, *args):
        return subprocess.run(["git", "-C", str(self.path)] + list(args), capture_output=True, text=True,
                              check=True).stdout

    def commit(self, message, files):
        for rel, lines in files.items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join("x = %d\n" % n for n in range(lines)) if isinstance(lines, int) else lines)
            self.git("add", rel)
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD").strip()

    def check(self):
        return budget.main(["--repo", str(self.path)])


@pytest.fixture
def repo(tmp_path):
    made = Repo(tmp_path)
    made.commit("before the rule: grows freely", {"plugins/modules/a.py": 400, "galaxy.yml": "version: 0.1.0\n"})
    made.commit("the rule", {budget.SELF: "# the script\n"})
    return made


def test_a_commit_over_the_budget_needs_a_trailer_saying_why(repo, capsys):
    assert repo.check() == 0, capsys.readouterr().out
    grown = repo.commit("grows the code", {"plugins/module_utils/core/b.py": budget.COMMIT_BUDGET + 1})
    assert repo.check() == 1
    out = capsys.readouterr().out
    assert "%s grows the code: +%d lines" % (grown[:12], budget.COMMIT_BUDGET + 1) in out, out
    repo.git("commit", "-q", "--amend", "-m", "grows the code\n\nSize-Budget: the new driver, which nothing else serves")
    assert repo.check() == 0, capsys.readouterr().out


def test_a_trailer_without_a_reason_or_a_mention_in_the_body_is_not_a_decision(repo, capsys):
    repo.commit("grows the code\n\nSize-Budget: ok", {"plugins/b.py": budget.COMMIT_BUDGET + 1})
    assert repo.check() == 1
    repo.git("commit", "-q", "--amend", "-m", "grows it\n\nSize-Budget: the reason\n\nand then some prose")
    assert repo.check() == 1, "a trailer is in the last paragraph"


def test_growth_is_net_and_only_of_the_code(repo, capsys):
    repo.commit("moves code and adds tests and docs", {"plugins/modules/a.py": 300, "plugins/modules/c.py": 100 + 150,
                                                       "tests/unit/test_c.py": 2000, "docs/c.md": 2000})
    assert repo.check() == 0, capsys.readouterr().out


def test_a_file_over_the_cap_is_named_whatever_its_commits_said(repo, capsys):
    repo.commit("big\n\nSize-Budget: a driver that cannot be split", {"plugins/big.py": budget.FILE_CAP + 1})
    assert repo.check() == 1
    assert "plugins/big.py: %d lines, over the cap of %d" % (budget.FILE_CAP + 1, budget.FILE_CAP) in \
        capsys.readouterr().out


def test_a_release_starts_the_count_again(repo, capsys):
    repo.commit("grows the code", {"plugins/b.py": budget.COMMIT_BUDGET + 1})
    assert repo.check() == 1
    repo.commit("release 0.2.0", {"galaxy.yml": "version: 0.2.0\n"})
    assert repo.check() == 0, capsys.readouterr().out

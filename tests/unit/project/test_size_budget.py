"""The size budget of core/ (issue 29, 4), as checkpointctl's test/check-lib-size.sh has one for its library: growth
past it is a decision -- raise the number in docs/architecture.md ("Size budget"), the one place it is written, in the
change that needs it -- never an accident. Lines as `wc -l` counts them, of every hand-written .py file under
plugins/module_utils/core (the generated schemas.py aside: schemas/ is its source)."""

import re

from conftest import REPO

CORE = REPO / "plugins" / "module_utils" / "core"
GENERATED = {CORE / "base" / "schemas.py"}  # scripts/gen_schemas.py
DOC = REPO / "docs" / "architecture.md"
ROWS = {"total": "`core/` in all", "file": "any one file of `core/`"}


def budget():
    """The two numbers, from the table under docs/architecture.md's "Size budget"."""
    section = DOC.read_text().split("### Size budget", 1)[1].split("\n## ", 1)[0]
    found = {}
    for key, label in ROWS.items():
        match = re.search(r"^\| %s[^|]*\| ([0-9,]+) \|$" % re.escape(label), section, re.M)
        assert match, "docs/architecture.md's Size budget table has no row %r" % label
        found[key] = int(match.group(1).replace(",", ""))
    return found


def sizes():
    files = sorted(p for p in CORE.rglob("*.py") if "__pycache__" not in p.parts and p not in GENERATED)
    return dict((str(p.relative_to(CORE)), len(p.read_bytes().splitlines())) for p in files)


def test_the_budget_is_written_in_the_architecture_doc():
    numbers = budget()
    assert 0 < numbers["file"] < numbers["total"]


def test_no_file_of_core_is_over_its_budget():
    limit = budget()["file"]
    over = dict((name, lines) for name, lines in sizes().items() if lines > limit)
    assert not over, ("over the budget of %d lines per file of core/ (split the file by job, or raise the budget in "
                      "docs/architecture.md, 'Size budget'): %s" % (limit, over))


def test_core_in_all_is_within_its_budget():
    limit, total = budget()["total"], sum(sizes().values())
    assert total <= limit, ("core/ has %d lines, over its budget of %d (docs/architecture.md, 'Size budget': raise it "
                            "in the change that needs it, or make room)" % (total, limit))


def test_the_count_sees_every_file_and_leaves_out_only_the_generated_one():
    """A budget that cannot fail is no budget: the count includes the files it must (the agent's, the clients'),
    and the generated schemas.py only is left out."""
    counted = sizes()
    assert {"base/layout.py", "agent/launcher.py", "clients/criu_cli.py", "restore/pipeline.py"} <= set(counted)
    assert "base/schemas.py" not in counted and sum(counted.values()) > 10000

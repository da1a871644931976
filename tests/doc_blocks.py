"""The fenced blocks of the user docs, for the doc-tests. A block a reader is told to copy (one with a language:
sh, yaml, json, dockerfile, ...) is marked on the line before it, either

    <!-- doctest: NAME -->          a test runs it: the test names NAME (tests/integration/test_doc_examples.py)
    <!-- not run: REASON -->        CI cannot run it (needs an NPU, a Kubernetes cluster, an AWX), and why

Blocks without a language are output samples. tests/unit/project/test_docs.py holds every block of DOCS to a marker."""

import re
from collections import namedtuple

from conftest import REPO

# The docs whose examples run: what an operator copies on the first day.
DOCS = ("README.md", "docs/quickstart.md", "docs/awx.md", "docs/agent.md", "docs/restore-on-create.md",
        "docs/kubernetes.md")

Block = namedtuple("Block", "doc line lang marker name text")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER = re.compile(r"^\s*<!-- (doctest|not run): (.+?) -->\s*$")


def blocks(doc):
    """Every fenced block of ``doc`` (a path relative to the repository), with its marker (None when unmarked)."""
    lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, lang = opening.group(1), opening.group(2)
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[index + 1:end])
        marker = MARKER.match(lines[index - 1]) if index else None
        found.append(Block(doc, index + 1, lang, marker.group(1) if marker else None,
                           marker.group(2) if marker else None, body + "\n"))
        index = end + 1
    return found


def block(doc, name):
    """The text of the block of ``doc`` marked ``<!-- doctest: name -->``."""
    [text] = [b.text for b in blocks(doc) if b.marker == "doctest" and b.name == name] or [None]
    assert text is not None, "%s has no block marked doctest: %s" % (doc, name)
    return text

"""The user documentation stays true to the code: the module reference is generated from the modules
and current, the generator reads the docs the way ansible-doc does, the error messages that
troubleshooting.md is keyed by exist in the code, and relative links resolve."""

import ast
import json
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from conftest import COLLECTIONS, REPO, ensure_collection_link, load_file_module

from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import stages

DOCS = REPO / "docs"
GENERATOR = REPO / "scripts" / "gen_module_docs.py"


gen = load_file_module("gen_module_docs", GENERATOR)


def module_names():
    return sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if not p.name.startswith("_"))


def test_module_reference_is_current():
    proc = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_every_module_has_a_section_in_the_reference():
    text = (DOCS / "modules.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (\S+)$", text, flags=re.M)
    assert sorted(sections) == module_names()


def _normalise(value):
    """ansible-doc turns a one-line description into a string or a list as written; compare as lists."""
    if isinstance(value, dict):
        return {key: (_as_list(item) if key == "description" else _normalise(item)) for key, item in value.items()}
    if isinstance(value, list):
        return [_normalise(item) for item in value]
    return value


def _as_list(value):
    return [_normalise(item) for item in value] if isinstance(value, list) else [value]


def test_generator_reads_each_module_as_ansible_doc_does():
    """Fragments merged, suboptions and attributes included: the same documentation ansible-doc shows."""
    ensure_collection_link()
    names = ["inferops.snapshot.%s" % name for name in module_names()]
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--json", "-t", "module"] + names,
                          capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert sorted(shown) == names, proc.stderr
    for name in module_names():
        ours = gen.read_module(str(REPO / "plugins" / "modules" / ("%s.py" % name)))
        theirs = shown["inferops.snapshot.%s" % name]
        for key in ("options", "attributes", "notes", "short_description", "version_added"):
            assert _normalise(ours["doc"].get(key)) == _normalise(theirs["doc"].get(key)), (name, key)
        assert _normalise(ours["returns"]) == _normalise(theirs["return"] or {}), name


CRYPTO_OPTIONS = {"signing_key", "trusted_keys", "encryption_key", "encryption_keys"}


def test_every_module_that_signs_verifies_or_encrypts_lists_cryptography_in_its_requirements():
    """snapshot_prereqs installs cryptography on the nodes for exactly these options; ansible-doc must say so."""
    for name in module_names():
        doc = gen.read_module(str(REPO / "plugins" / "modules" / ("%s.py" % name)))["doc"]
        options = CRYPTO_OPTIONS & set(doc.get("options") or {})
        requirements = " ".join(doc.get("requirements") or [])
        if options:
            assert "cryptography" in requirements, (name, sorted(options))
            for option in options:
                assert "O(%s)" % option in requirements, (name, option, requirements)
        for library in required_libraries(name):
            assert library in requirements, (name, library)


# Modules that need nothing on their host but Python: the agent's socket, the files they are given.
NEEDS_NOTHING = {"npu_snapshot_lock", "snapshot_node_files"}


def test_every_module_says_what_it_needs_where():
    """A module that runs a tool or imports a library names it in requirements: (the Docker CLI, CRIU, a library on the
    controller); ansible-doc shows the list, fragments merged."""
    for name in module_names():
        doc = gen.read_module(str(REPO / "plugins" / "modules" / ("%s.py" % name)))["doc"]
        requirements = " ".join(doc.get("requirements") or [])
        assert bool(requirements) != (name in NEEDS_NOTHING), (name, requirements)
        source = (REPO / "plugins" / "modules" / ("%s.py" % name)).read_text(encoding="utf-8")
        if "DockerCli(" in source:
            assert "Docker CLI" in requirements or "Docker" in requirements, (name, requirements)
        if "signature.key_pair" in source or "snapshot_signing_key" == name:
            assert "cryptography (Python library) on the controller" in requirements, (name, requirements)


def required_libraries(name):
    """What the module's _module.run() checks for on the target (its requires=, default jsonschema)."""
    tree = ast.parse((REPO / "plugins" / "modules" / ("%s.py" % name)).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "run":
            for keyword in node.keywords:
                if keyword.arg == "requires":
                    # a name of _module.LIBRARIES, or k8s client.LIBRARY: the kubernetes library
                    return [element.value if isinstance(element, ast.Constant) else "kubernetes"
                            for element in keyword.value.elts]
            return ["jsonschema"]
    raise AssertionError("%s calls no _module.run" % name)


@pytest.mark.parametrize("text, expected", [
    ("C(state=locked)", "`state=locked`"),
    ("O(restore_before_unlock=false) and RV(valid)", "`restore_before_unlock=false` and `valid`"),
    ("O(ignore:foo)", "`foo`"),
    ("M(inferops.snapshot.npu_snapshot_lock) C(state=unlocked)",
     "[`inferops.snapshot.npu_snapshot_lock`](#npu_snapshot_lock) `state=unlocked`"),
    ("M(community.docker.docker_container)", "`community.docker.docker_container`"),
    ("a <name> | b", "a &lt;name&gt; \\| b"),
    ("C(a|b) and C(.<name>.partial)", "`a\\|b` and `.<name>.partial`"),
    ("I(never) B(ever)", "*never* **ever**"),
    ("two\n  lines", "two lines"),
    ("L(moby 37344,https://github.com/moby/moby/issues/37344)", "[moby 37344](https://github.com/moby/moby/issues/37344)"),
])
def test_markup_becomes_markdown(text, expected):
    assert gen.markup(text, known={"npu_snapshot_lock"}) == expected


def test_a_module_with_broken_yaml_is_named(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text('DOCUMENTATION = """\nmodule: broken\ndescription: a: b\n"""\nEXAMPLES = ""\nRETURN = ""\n')
    with pytest.raises(gen.DocError, match="broken.py: its DOCUMENTATION or RETURN is not valid YAML"):
        gen.read_module(str(path))


def test_a_fragment_from_outside_the_collection_and_its_dependencies_is_a_clear_error():
    with pytest.raises(gen.DocError, match="resolves fragments of inferops.snapshot and of its dependencies "
                                           "kubernetes.core"):
        gen.add_fragments({"extends_documentation_fragment": ["community.docker.docker"]})
    # a dependency's fragment is merged as ansible-doc merges it: kubernetes.core's connection options
    doc = gen.add_fragments({"extends_documentation_fragment": ["kubernetes.core.k8s_auth_options"]})
    assert {"kubeconfig", "proxy", "impersonate_user"} <= set(doc["options"])


def test_a_new_module_is_picked_up(tmp_path, monkeypatch):
    modules = tmp_path / "modules"
    modules.mkdir()
    for name in ("snapshot_verify.py", "zz_cleanup.py", "snapshot_status.py"):
        (modules / name).write_text(
            'DOCUMENTATION = r"""\nmodule: %s\nshort_description: Test C(x)\ndescription: d\noptions: {}\n"""\n'
            'EXAMPLES = ""\nRETURN = ""\n' % name[:-3])
    monkeypatch.setattr(gen, "MODULES_DIR", str(modules))
    text = gen.render()
    assert re.findall(r"^## (\S+)$", text, flags=re.M) == ["snapshot_verify", "snapshot_status", "zz_cleanup"]
    assert "| [`inferops.snapshot.zz_cleanup`](#zz_cleanup) | Test `x` |" in text


# --------------------------------------------------------------------- troubleshooting keys

def code_strings():
    """Every string constant in plugins/ (adjacent literals are one constant in the AST), plus the
    ACL error descriptions the binding builds from its table ('507905 ACL_ERROR_...: ...')."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import acl
    found = [acl.describe_error(code) for code in acl.ERRORS]
    for path in (REPO / "plugins").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
    return found


def troubleshooting_keys():
    """Headings '### `message`' quote a message of the collection; '…' stands for the variable parts."""
    text = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    return re.findall(r"^### `([^`]+)`", text, flags=re.M)


def test_troubleshooting_is_keyed_by_messages_the_code_really_has():
    keys = troubleshooting_keys()
    assert len(keys) >= 20, keys
    strings = code_strings()
    missing = []
    for key in keys:
        for piece in (part.strip() for part in key.split("…")):
            if piece and not any(piece in s for s in strings):
                missing.append((key, piece))
    assert not missing, "troubleshooting.md quotes messages the code does not have: %r" % missing


# '<kind>: ' prefixes in the code that are no reason an operator reads: CRIU log lines the CRIU client quotes as
# not being the cause, the runtime log's word for a start it passes on, a value of the k8s env annotation, a
# parameter of _k8s_service.restore_template_env (a helper of the docs and tests, not a module option), an argument
# of the agent's Python API for engines (a TypeError for the integrator).
NOT_REASONS = {"rlimit", "cgroupd", "noop", "removed", "source_stem", "hook"}
REASON_KIND = re.compile(r"^([a-z][a-z0-9]*(?:_[a-z0-9]+)*): ")


def option_names():
    """Every option and suboption of every module and every role variable: a message starting with one of them
    is a parameter error that names its field, not a reason kind."""
    names = set()

    def walk(options):
        for name, spec in (options or {}).items():
            names.add(name)
            walk(spec.get("suboptions"))
    for name in module_names():
        walk(gen.read_module(str(REPO / "plugins" / "modules" / ("%s.py" % name)))["doc"].get("options"))
    for spec in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        for entry in (yaml.safe_load(spec.read_text()) or {}).get("argument_specs", {}).values():
            walk(entry.get("options"))
    return names


def reason_kinds():
    """{kind: [files]} of every '<kind>: ...' message constant in plugins/, and '<stage>_failed' for every stage of
    the restore pipeline (a typed error in a stage is reported as '<stage>_failed: <its message>')."""
    found = {}
    for path in sorted((REPO / "plugins").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and REASON_KIND.match(node.value):
                found.setdefault(REASON_KIND.match(node.value).group(1), []).append(path.name)
    pipeline = (REPO / "plugins" / "module_utils" / "core" / "restore" / "pipeline.py").read_text(encoding="utf-8")
    assert '"%s_failed: %s" % (stage' in pipeline, "the pipeline names a failed stage differently now: follow it here"
    for stage in set(value.name for value in vars(stages).values() if isinstance(value, stages.Stage)):
        found.setdefault("%s_failed" % stage, []).append("stages.py (stage)")
    return found


def test_every_reason_the_code_can_give_has_a_troubleshooting_entry():
    """A cold start or failure says '<kind>: <detail>'; troubleshooting.md has a heading for each kind (the stage
    failures, '<stage>_failed', may share one entry that names them all)."""
    text = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    headed = set(REASON_KIND.match(key).group(1) for key in troubleshooting_keys() if REASON_KIND.match(key))
    params = option_names()
    kinds = reason_kinds()
    assert {"unsigned", "decrypt_failed", "insufficient_memory", "host_restore_failed"} <= set(kinds), kinds
    missing = sorted("%s (%s)" % (kind, ", ".join(sorted(set(files))))
                     for kind, files in kinds.items() if kind not in params and kind not in NOT_REASONS
                     and kind not in headed and not (kind.endswith("_failed") and "`%s`" % kind in text))
    assert not missing, "troubleshooting.md has no entry (### `<kind>: ...`) for: %s" % ", ".join(missing)


# The roles' own reasons (YAML, not plugins/): where a role's report says why a pod starts normally or is left alone.
ROLE_REASONS = {"snapshot_restore/tasks/normal_start.yml": ("_entry_reason", "_snapshot_restore_plan_off_reason"),
                "snapshot_generate/tasks/main.yml": ("reason",)}


def role_reason_pieces():
    """The literal words of each reason those templates can give ('; already running' -> 'already running')."""
    for name, keys in ROLE_REASONS.items():
        text = (REPO / "roles" / name).read_text(encoding="utf-8")
        for key in keys:
            template = re.search(r"^\s+%s: >-\n((?:\s{6,}.*\n)+)" % re.escape(key), text, flags=re.M).group(1)
            for literal in re.findall(r"'([^']*)'", template):
                words = literal.strip("; :").strip()
                if len(words) > 4 and words not in ("true", "unknown error"):
                    yield name, words


def test_every_reason_a_role_gives_for_a_normal_start_has_a_troubleshooting_entry():
    headings = " ".join(troubleshooting_keys())
    pieces = list(role_reason_pieces())
    assert ("snapshot_restore/tasks/normal_start.yml", "already running") in pieces, pieces
    missing = [(name, words) for name, words in pieces if words not in headings and
               words not in (DOCS / "troubleshooting.md").read_text(encoding="utf-8").split("## Roles and playbooks")[-1]]
    assert not missing, "troubleshooting.md's Roles and playbooks section does not say: %s" % missing


def test_troubleshooting_ends_with_the_roles_section():
    text = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[-1] == "Roles and playbooks"


def test_no_doc_says_only_read_only_mounts_are_compared():
    """A restore compares the files of every mount, read-only or read-write (core/store/world.py): the wording of the
    rule before that ('a changed file in a read-only mount') stayed in the modules', roles' and guides' docs."""
    old_rule = re.compile(r"(?:file|files) (?:in|of) (?:a )?read-only (?:mount|ones)|read-only ones \(weights")
    places = [REPO / "README.md", REPO / "plugins" / "module_utils" / "core" / "store" / "world.py"]
    places += sorted(DOCS.glob("*.md")) + sorted((REPO / "plugins" / "modules").glob("*.py"))
    places += sorted((REPO / "roles").glob("*/meta/argument_specs.yml")) + sorted((REPO / "roles").glob("*/defaults/main.yml"))
    said = [(str(path.relative_to(REPO)), match.group(0)) for path in places
            for match in old_rule.finditer(" ".join(path.read_text(encoding="utf-8").split()))]
    assert not said, said


# --------------------------------------------------------------------- links

def slug(heading):
    """GitHub's heading anchor: lower case, punctuation dropped (except - and _), spaces to '-'."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    kept = "".join(ch for ch in heading if ch in " -" or unicodedata.category(ch)[0] in "LMN"
                   or unicodedata.category(ch) == "Pc")
    return kept.replace(" ", "-")


def anchors(path):
    seen = {}
    result = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = re.match(r"^#{1,6} (.+)$", line)
        if match and not in_code:
            base = slug(match.group(1).strip())
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else "%s-%d" % (base, count))
    return result


def doc_links():
    for path in sorted(DOCS.glob("*.md")) + [REPO / "README.md"]:
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if not re.match(r"^[a-z]+://", target):
                yield path, target


def repository_links():
    """Links to this repository's own files (galaxy.yml's repository, a branch, a path): what a page links where the
    built collection leaves the target out (docs/benchmarks.md's run folders)."""
    repository = yaml.safe_load((REPO / "galaxy.yml").read_text())["repository"].rstrip("/")
    pattern = re.compile(re.escape(repository) + r"/(?:blob|raw|tree)/main/([^)#\s]+)")
    for path in sorted(DOCS.glob("*.md")) + [REPO / "README.md"]:
        for target in pattern.findall(path.read_text(encoding="utf-8")):
            yield path, target


def test_links_into_the_repository_name_files_it_has():
    links = list(repository_links())
    assert any(path.name == "benchmarks.md" for path, _target in links), "benchmarks.md links its runs this way"
    missing = [(path.name, target) for path, target in links if not (REPO / target).exists()]
    assert not missing, missing


def test_the_docsite_leads_to_every_guide_by_its_title():
    """docs/docsite/extra-docs.yml's page (a docsite renders RST only): one link per guide of docs/, its title the
    guide's own, into the repository (galaxy.yml's); scripts/docs-lint.sh checks the page as antsibull-docs reads it."""
    index = yaml.safe_load((DOCS / "docsite" / "extra-docs.yml").read_text())
    assert [entry for section in index["sections"] for entry in section["toctree"]] == ["guides"]
    page = (DOCS / "docsite" / "rst" / "guides.rst").read_text(encoding="utf-8")
    repository = yaml.safe_load((REPO / "galaxy.yml").read_text())["repository"].rstrip("/")
    linked = dict((target, title) for title, target in re.findall(r"`([^`<]+?) <([^>]+)>`__", page))
    guides = sorted(path for path in DOCS.glob("*.md") if path.name != "index.md")
    wanted = dict(("%s/blob/main/docs/%s" % (repository, path.name), path.read_text(encoding="utf-8").splitlines()[0][2:])
                  for path in guides)
    assert linked == wanted


def test_relative_links_resolve():
    broken = []
    for path, target in doc_links():
        file_part, _sep, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append((path.name, target, "no such file"))
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append((path.name, target, "no such heading"))
    assert not broken, broken


# --------------------------------------------------------------------- docs that run

def test_every_block_a_reader_copies_is_run_by_a_test_or_says_why_not():
    """tests/doc_blocks.py: a block with a language is marked doctest (a test names it and runs it) or not run (with
    the reason); a name is run by exactly one block and named by a test (or by .ci/run, which runs `make test`)."""
    import doc_blocks
    runners = "\n".join(path.read_text(encoding="utf-8") for path in sorted((REPO / "tests").rglob("*.py"))
                        if path.name != "doc_blocks.py") + (REPO / ".ci" / "run").read_text(encoding="utf-8")
    unmarked, names, unrun = [], [], []
    for doc in doc_blocks.DOCS:
        for block in doc_blocks.blocks(doc):
            if block.lang and block.marker is None:
                unmarked.append("%s:%d" % (doc, block.line))
            if block.marker == "doctest":
                names.append(block.name)
                if not re.search(r"\b%s\b" % re.escape(block.name), runners):
                    unrun.append("%s:%d %s" % (doc, block.line, block.name))
    assert not unmarked, "blocks with neither <!-- doctest: NAME --> nor <!-- not run: REASON -->: %s" % unmarked
    assert len(names) == len(set(names)), names
    assert not unrun, "doctest blocks no test runs: %s" % unrun
    assert {"quickstart-dockerfile", "quickstart-generate", "quickstart-restore", "awx-make-ee"} <= set(names)

"""The execution environment: `ansible-builder create` writes a build context from
execution-environment.yml, and the dependencies its build would install are the collection's
controller-side ones (requirements/runtime.txt, bindep.txt, kubernetes.core's), pinned by
requirements/constraints.txt -- never the test or benchmark tools. The image build itself needs a
registry for its base image and is out of reach here; the context is what it would run."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile

import yaml
from packaging.requirements import Requirement

from conftest import BIN, REPO

TOOLS = {"pytest", "pytest-timeout", "pytest-asyncio", "kmock", "paramiko", "molecule", "matplotlib",
         "ansible-lint", "ansible-builder", "antsibull-changelog", "jinja2"}


def sh(*command, **kwargs):
    proc = subprocess.run([str(c) for c in command], capture_output=True, text=True, check=False, **kwargs)
    assert proc.returncode == 0, "%s failed (rc=%d)\n%s\n%s" % (command, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def requirement_lines(path):
    return [Requirement(line.split("#")[0].strip()) for line in open(path) if line.split("#")[0].strip()]


def pins():
    return {r.name.lower(): r.specifier for r in requirement_lines(REPO / "requirements" / "constraints.txt")}


def build_context(tmp_path):
    """The checkout's EE definition with the files it names, as `make ee` lays them out."""
    work = tmp_path / "ee"
    (work / "requirements").mkdir(parents=True)
    (work / "build" / "ee").mkdir(parents=True)
    shutil.copy(REPO / "execution-environment.yml", work)
    shutil.copy(REPO / "requirements" / "constraints.txt", work / "requirements")
    sh(BIN / "ansible-galaxy", "collection", "build", "--output-path", tmp_path / "dist", REPO)
    [tarball] = (tmp_path / "dist").glob("inferops-snapshot-*.tar.gz")
    shutil.copy(tarball, work / "build" / "ee" / "inferops-snapshot.tar.gz")
    sh(BIN / "ansible-builder", "create", "-f", "execution-environment.yml", "-c", "context",
       "--output-filename", "Containerfile", cwd=str(work))
    return work / "context", tarball


def test_ansible_builder_creates_a_context_with_the_collection_and_the_pins(tmp_path):
    context, tarball = build_context(tmp_path)
    containerfile = (context / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="ee-base:latest"' in containerfile  # the build names the real base
    assert "ENV PIP_CONSTRAINT=/etc/inferops-snapshot-ee/constraints.txt" in containerfile
    assert containerfile.index("ENV PIP_CONSTRAINT") < containerfile.index("pip install --no-cache-dir $ANSIBLE_INSTALL_REFS")
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core ansible-runner"' in containerfile
    assert "ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml" in containerfile
    assert (context / "_build" / "configs" / "constraints.txt").read_text() == \
        (REPO / "requirements" / "constraints.txt").read_text()
    # ansible-core and ansible-runner come in at the versions the tests run.
    assert str(pins()["ansible-core"]).startswith("==") and str(pins()["ansible-runner"]).startswith("==")

    galaxy = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert galaxy == {"collections": [{"name": "collections/inferops-snapshot.tar.gz", "type": "file"}]}
    shipped = context / "_build" / "collections" / "inferops-snapshot.tar.gz"
    assert shipped.read_bytes() == tarball.read_bytes()
    with tarfile.open(shipped) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert manifest["collection_info"]["dependencies"] == {"kubernetes.core": ">=3.0.0"}
    assert manifest["collection_info"]["license"] == ["GPL-3.0-or-later"]
    for needed in ("meta/execution-environment.yml", "requirements/runtime.txt", "bindep.txt"):
        assert needed in names, needed
    assert "requirements.txt" not in names, "a root requirements.txt would be read as the collection's dependencies"


def test_the_build_would_install_the_controller_dependencies_only(tmp_path):
    """The context's own introspect.py (what the build runs) over the collections the build installs."""
    context, tarball = build_context(tmp_path)
    collections = tmp_path / "collections"
    sh(BIN / "ansible-galaxy", "collection", "install", "--offline", "--no-deps", "--force", "-p", collections, tarball,
       env={k: v for k, v in os.environ.items() if k != "ANSIBLE_COLLECTIONS_PATH"})
    # kubernetes.core as Galaxy would install it (here: the copy the pinned ansible package bundles).
    bundled = os.path.join(sysconfig.get_paths()["purelib"], "ansible_collections", "kubernetes", "core")
    shutil.copytree(bundled, collections / "ansible_collections" / "kubernetes" / "core")
    pip_out, bindep_out = tmp_path / "requirements.txt", tmp_path / "bindep.txt"
    sh(sys.executable, context / "_build" / "scripts" / "introspect.py", "introspect", "--sanitize",
       "--write-pip", pip_out, "--write-bindep", bindep_out, collections)

    wanted = {r.name.lower(): r for r in requirement_lines(pip_out)}
    assert set(wanted) == {"jsonschema", "kubernetes", "requests-oauthlib", "jsonpatch"}, pip_out.read_text()
    assert not TOOLS & set(wanted)
    assert "inferops.snapshot" in pip_out.read_text()  # says which collection asked for what
    # Every pinned version satisfies what the collections ask for, so the constrained build resolves.
    for name, requirement in wanted.items():
        if name in pins():
            version = str(pins()[name]).lstrip("=")
            assert requirement.specifier.contains(version), (name, requirement, version)
    ours = sorted(line.split("#")[0].strip() for line in bindep_out.read_text().splitlines()
                  if line.endswith("# from collection inferops.snapshot"))
    assert ours == ["openssh-client [platform:dpkg]", "openssh-clients [platform:rpm]"], bindep_out.read_text()

"""A release an operator can pin: the changelog fragments lint (antsibull-changelog, the format every change's
fragment is written in), galaxy.yml's version is one that `antsibull-changelog release` released (a bump without
its changelog, or a release without its bump, fails), and the docs name that version."""

import re
import subprocess

import yaml

from conftest import REPO

# The project venv's: the release tool is not one of the ansible-core versions' (scripts/ansible-versions.sh makes
# those venvs with what the collection needs at run time, and runs this file there too).
ANTSIBULL = REPO / ".venv" / "bin" / "antsibull-changelog"


def version_key(version):
    return tuple(int(part) for part in re.findall(r"\d+", version))


def test_the_changelog_fragments_lint():
    proc = subprocess.run([str(ANTSIBULL), "lint"], cwd=str(REPO), capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_the_collection_version_is_the_newest_release_of_the_changelog():
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    releases = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["releases"]
    assert max(releases, key=version_key) == version, "galaxy.yml says %s; released: %s (antsibull-changelog release)" % (
        version, sorted(releases, key=version_key))
    assert "## v%s" % version.replace(".", "\\.") in (REPO / "CHANGELOG.md").read_text(), \
        "CHANGELOG.md lacks %s: regenerate it" % version


def test_the_docs_name_the_released_version():
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    assert "Version %s (see `CHANGELOG.md`)" % version in (REPO / "docs" / "index.md").read_text()

"""A release an operator can pin: the changelog fragments lint (antsibull-changelog, the format every change's
fragment is written in), galaxy.yml's version is one that `antsibull-changelog release` released (a bump without
its changelog, or a release without its bump, fails), the docs, the snapshots' record and every version_added agree
with it, and no breaking change waits on main under an already-released version."""

import re
import subprocess

import yaml

from conftest import REPO
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout

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


def test_no_breaking_change_waits_unreleased_under_a_released_version():
    """galaxy.yml always names a released version (above), so a breaking change on main under it would ship as that
    version to whoever installs main: a breaking fragment means a release in the same change."""
    breaking = []
    for path in sorted((REPO / "changelogs" / "fragments").glob("*.yml")):
        fragment = yaml.safe_load(path.read_text()) or {}
        if fragment.get("breaking_changes") or fragment.get("removed_features"):
            breaking.append(path.name)
    assert breaking == [], "unreleased breaking changes under %s: cut a release (antsibull-changelog release)" % \
        yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]


def test_the_versions_agree():
    """galaxy.yml's version, the one snapshots record (layout.COLLECTION_VERSION) and every version_added no later
    than it."""
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    assert layout.COLLECTION_VERSION == version
    later = []
    for path in sorted((REPO / "plugins").rglob("*.py")):
        for added in re.findall(r"^version_added: ['\"]?([0-9.]+)", path.read_text(), re.M):
            if version_key(added) > version_key(version):
                later.append("%s: %s" % (path.relative_to(REPO), added))
    assert later == [], "version_added later than %s: %s" % (version, later)

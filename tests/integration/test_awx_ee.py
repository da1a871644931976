"""The execution environment for an AWX without internet: `make ee` (scripts/ee-context.sh) puts everything the image
build installs into its context -- the collection and kubernetes.core as tarballs, the wheelhouse of every Python
package at the versions requirements/constraints.txt pins -- and `ansible-builder create` writes the Containerfile.
The build then needs no network: it is run here with `docker build --network none` on a Debian base image made from
Debian's packages (an AWX's own base would be its registry's copy of an EE base; docs/awx.md). The image has the
collections and the controller-side dependencies (requirements/runtime.txt, bindep.txt, kubernetes.core's) and
never the test or benchmark tools, and it leaves nothing of pip's offline settings or the test pins set."""

import json
import os
import subprocess
import sys
import tarfile

import yaml
from packaging.requirements import Requirement

from conftest import BIN, REPO, docker

TOOLS = {"pytest", "pytest-timeout", "pytest-asyncio", "kmock", "paramiko", "molecule", "matplotlib",
         "ansible-lint", "ansible-builder", "antsibull-changelog", "ansible"}


def sh(*command, **kwargs):
    proc = subprocess.run([str(c) for c in command], capture_output=True, text=True, check=False, **kwargs)
    assert proc.returncode == 0, "%s failed (rc=%d)\n%s\n%s" % (command, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def requirement_lines(path):
    return [Requirement(line.split("#")[0].strip()) for line in open(path) if line.split("#")[0].strip()]


def pins():
    return {r.name.lower(): r.specifier for r in requirement_lines(REPO / "requirements" / "constraints.txt")}


def build_context(tmp_path):
    """`make ee`'s context, made in tmp_path from the checkout (scripts/ee-context.sh with EE_WORK)."""
    sh(BIN / "ansible-galaxy", "collection", "build", "--output-path", tmp_path / "dist", REPO)
    [tarball] = (tmp_path / "dist").glob("inferops-snapshot-*.tar.gz")
    work = tmp_path / "ee"
    work.mkdir()
    sh("bash", REPO / "scripts" / "ee-context.sh", env=dict(os.environ, EE_WORK=str(work), EE_COLLECTION=str(tarball)))
    return work / "build" / "ee" / "context", tarball


def test_ansible_builder_creates_a_context_that_holds_everything_the_build_installs(tmp_path):
    context, tarball = build_context(tmp_path)
    containerfile = (context / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="give-your-base-image-as-build-arg-EE_BASE_IMAGE:see-docs-awx-md"' in containerfile
    assert 'ARG ANSIBLE_GALAXY_CLI_COLLECTION_OPTS="--offline"' in containerfile
    # pip: the wheelhouse only, set before the first pip install and put back as the base had it at the end
    offline = containerfile.index("find-links = /output/wheelhouse")
    assert offline < containerfile.index("/output/scripts/pip_install") < containerfile.index("$ANSIBLE_INSTALL_REFS")
    assert containerfile.index("'dumb-init==1.2.5'") < containerfile.index("RUN rm -f /etc/pip.conf")
    assert "PIP_CONSTRAINT" not in containerfile and "constraints.txt" not in containerfile, "no test pins in the image"
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core ansible-runner"' in containerfile
    assert "ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml" in containerfile
    # ansible-core and ansible-runner come in at the versions the tests run: the wheelhouse holds those, only.
    wheels = sorted(p.name for p in (context / "_build" / "wheels").glob("*.whl"))
    for name in ("ansible-core", "ansible-runner", "jsonschema", "kubernetes"):
        pinned = str(pins()[name]).lstrip("=")
        found = [w for w in wheels if w.lower().startswith(name.replace("-", "_") + "-")]
        assert [w.split("-")[1] for w in found] == [pinned], (name, found)
    assert not [w for w in wheels if w.split("-")[0].lower().replace("_", "-") in TOOLS], wheels
    for tool in ("bindep", "dumb_init", "packaging", "pyyaml"):  # what the Containerfile's own steps install
        assert any(w.lower().startswith(tool + "-") for w in wheels), tool

    galaxy = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert galaxy == {"collections": [{"name": "collections/inferops-snapshot.tar.gz", "type": "file"},
                                      {"name": "collections/kubernetes-core.tar.gz", "type": "file"}]}
    shipped = context / "_build" / "collections" / "inferops-snapshot.tar.gz"
    assert shipped.read_bytes() == tarball.read_bytes()
    with tarfile.open(shipped) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert manifest["collection_info"]["dependencies"] == {"kubernetes.core": ">=2.4.2"}
    assert manifest["collection_info"]["license"] == ["GPL-3.0-or-later"]
    for needed in ("meta/execution-environment.yml", "requirements/runtime.txt", "bindep.txt"):
        assert needed in names, needed
    assert "requirements.txt" not in names, "a root requirements.txt would be read as the collection's dependencies"
    with tarfile.open(context / "_build" / "collections" / "kubernetes-core.tar.gz") as tar:
        assert json.load(tar.extractfile("MANIFEST.json"))["collection_info"]["name"] == "core"


def test_the_build_would_install_the_controller_dependencies_only(tmp_path):
    """The context's own introspect.py (what the build runs) over the collections the build installs."""
    context, _tarball = build_context(tmp_path)
    collections = tmp_path / "collections"
    for tarball in sorted((context / "_build" / "collections").glob("*.tar.gz")):
        sh(BIN / "ansible-galaxy", "collection", "install", "--offline", "--no-deps", "--force", "-p", collections,
           tarball, env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections)))
    pip_out, bindep_out = tmp_path / "requirements.txt", tmp_path / "bindep.txt"
    sh(sys.executable, context / "_build" / "scripts" / "introspect.py", "introspect", "--sanitize",
       "--write-pip", pip_out, "--write-bindep", bindep_out, collections)

    wanted = {r.name.lower(): r for r in requirement_lines(pip_out)}
    assert set(wanted) == {"jsonschema", "kubernetes", "requests-oauthlib", "jsonpatch"}, pip_out.read_text()
    assert not TOOLS & set(wanted)
    assert "inferops.snapshot" in pip_out.read_text()  # says which collection asked for what
    # Every pinned version satisfies what the collections ask for, so the wheelhouse resolves.
    for name, requirement in wanted.items():
        if name in pins():
            version = str(pins()[name]).lstrip("=")
            assert requirement.specifier.contains(version), (name, requirement, version)
    ours = sorted(line.split("#")[0].strip() for line in bindep_out.read_text().splitlines()
                  if line.endswith("# from collection inferops.snapshot"))
    assert ours == ["openssh-client [platform:dpkg]", "openssh-clients [platform:rpm]"], bindep_out.read_text()


# The CI's base: Debian 12 from Debian's packages (scripts/build-debian-image.sh, cached), with python3-venv and
# openssh-client (bindep.txt: installed already, so the build installs no system package), and the venv the build's
# pip works in (Debian's own python3 has no ensurepip). An AWX's base is its registry's copy of an EE base.
BASE_DOCKERFILE = """FROM {image}
RUN python3 -m venv /opt/ee
ENV PATH=/opt/ee/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""
DEBIAN_BUILD_ARGS = ["--build-arg", "PYCMD=/opt/ee/bin/python3", "--build-arg", "PKGMGR=/usr/bin/apt-get",
                     "--build-arg", "PKGMGR_PRESERVE_CACHE=always"]


def ee_base(tmp_path):
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-debian-image.sh"), "bookworm", "ee"],
                         capture_output=True, text=True, timeout=1500, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "Dockerfile").write_text(BASE_DOCKERFILE.format(image=out.stdout.split()[-1]))
    docker("build", "--network", "none", "-q", "-t", "inferops/ee-base:bookworm", tmp_path / "base")
    return "inferops/ee-base:bookworm"


def test_the_image_builds_with_no_network_from_the_context_alone(docker_env, tmp_path):
    context, _tarball = build_context(tmp_path)
    base = ee_base(tmp_path)
    image = "inferops/snapshot-ee:test-%d" % os.getpid()
    try:
        build = subprocess.run(["docker", "build", "--network", "none", "-f", str(context / "Containerfile"),
                                "--build-arg", "EE_BASE_IMAGE=%s" % base] + DEBIAN_BUILD_ARGS +
                               ["-t", image, str(context)], capture_output=True, text=True, timeout=1500,
                               env=dict(os.environ, DOCKER_BUILDKIT="0"), check=False)
        assert build.returncode == 0, build.stdout[-6000:] + build.stderr[-3000:]

        def inside(script):
            return docker("run", "--rm", "--network", "none", image, "bash", "-c", script)
        collections = inside("ansible-galaxy collection list --format json")
        found = dict((name, info["version"]) for path in json.loads(collections).values() for name, info in path.items())
        assert found["inferops.snapshot"] == yaml.safe_load((REPO / "galaxy.yml").read_text())["version"], found
        assert "kubernetes.core" in found, found
        assert "snapshot_dir" in inside("ansible-doc -t module --json inferops.snapshot.snapshot_restore")
        installed = dict(line.split("==") for line in inside("pip list --format freeze").split())
        assert installed["ansible-core"] == str(pins()["ansible-core"]).lstrip("=")
        assert installed["jsonschema"] == str(pins()["jsonschema"]).lstrip("=") and "kubernetes" in installed
        assert not TOOLS & set(name.lower() for name in installed), installed
        # nothing of the offline build is left set for whoever builds on this image
        env = json.loads(docker("image", "inspect", "--format", "{{json .Config.Env}}", image))
        assert not [item for item in env if item.startswith(("PIP_CONSTRAINT", "PIP_NO_INDEX", "PIP_FIND_LINKS"))], env
        assert inside("ls /etc/pip.conf /output 2>/dev/null; echo done").split() == ["done"]
        # the AWX project's wrappers resolve against the image's collection
        wrappers = REPO / "extensions" / "awx" / "project"
        checked = docker("run", "--rm", "--network", "none", "-v", "%s:/runner/project:ro" % wrappers, image,
                         "ansible-playbook", "--syntax-check", "/runner/project/generate.yml")
        assert "playbook: /runner/project/generate.yml" in checked, checked
    finally:
        docker("rmi", "-f", image, check=False)

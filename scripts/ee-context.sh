#!/usr/bin/env bash
# The execution environment's build context for an AWX without internet (make ee; docs/awx.md). Everything the image
# build installs is in the context, so the build needs no network at all (podman/docker build --network none):
#
#   build/ee/collections/  inferops-snapshot.tar.gz (this checkout, built by make build-collection) and
#                          kubernetes-core.tar.gz (its dependency, packed from an installed copy)
#   build/ee/wheels/       the wheelhouse: every Python package the build pip-installs -- ansible-core,
#                          ansible-runner, the collections' controller requirements (ansible-builder's own
#                          introspection of the two collections) and the builder's tools (bindep, dumb-init) --
#                          at the versions requirements/constraints.txt pins, for the base image's Python
#   build/ee/context/      `ansible-builder create` of execution-environment.yml, with the above in _build/
#
# The one online step is filling the wheelhouse (pip download, from the index pip is configured with: PIP_INDEX_URL
# for a private mirror); it is cached in /var/cache/inferops/ee-wheels/<key of its inputs>, so a second run is offline.
# The image build then installs from the wheelhouse only (no index) -- the wheelhouse holds exactly the tested
# versions, so no constraints file is needed in the image, and nothing pip-related is left set in it.
#
# Environment (all optional):
#   EE_PYTHON=3.11                     the base image's Python (X.Y): the wheels are for it
#   EE_PLATFORMS="manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64"
#                                      wheel platforms the base image's glibc and machine accept (aarch64 likewise)
#   EE_KUBERNETES_CORE=DIR|TARBALL     kubernetes.core to put in: an installed copy (a directory with MANIFEST.json)
#                                      or a tarball from your automation hub; default: the copy the venv's pinned
#                                      ansible package bundles
#   INFEROPS_EE_WHEEL_CACHE=/var/cache/inferops/ee-wheels
#   EE_COLLECTION=TARBALL              the collection to put in (default: build/dist/inferops-snapshot-<version>.tar.gz)
#   EE_WORK=DIR                        where build/ee is made (default: the checkout; execution-environment.yml is
#                                      copied there when it is another directory)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/.venv/bin
work=${EE_WORK:-$root}
out=$work/build/ee
python_version=${EE_PYTHON:-3.11}
platforms=${EE_PLATFORMS:-manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64}
cache=${INFEROPS_EE_WHEEL_CACHE:-/var/cache/inferops/ee-wheels}
# What the Containerfile's own steps pip-install besides the collections' requirements (ansible-builder 3).
builder_tools="ansible-core ansible-runner bindep pyyaml packaging dumb-init==1.2.5"
say() { printf '[ee-context] %s\n' "$*" >&2; }

version=$(sed -n 's/^version: *//p' "$root/galaxy.yml")
tarball=${EE_COLLECTION:-$root/build/dist/inferops-snapshot-$version.tar.gz}
[[ -f $tarball ]] || { say "$tarball is missing: run make build-collection"; exit 1; }
rm -rf "$out/collections" "$out/wheels" "$out/context" "$out/requirements.txt"
mkdir -p "$out/collections" "$out/wheels"
cp "$tarball" "$out/collections/inferops-snapshot.tar.gz"

# kubernetes.core as a collection tarball, built again from an installed copy with the metadata its MANIFEST.json
# records (an installed copy may lack files its FILES.json lists: the ansible package leaves some out).
source=${EE_KUBERNETES_CORE:-$("$bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ansible_collections/kubernetes/core}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [[ -f $source ]]; then
    cp "$source" "$out/collections/kubernetes-core.tar.gz"
else
    "$bin/python" - "$source" "$scratch/kubernetes.core" <<'PY'
import json, os, shutil, sys
import yaml
source, dest = sys.argv[1], sys.argv[2]
with open(os.path.join(source, "MANIFEST.json")) as handle:
    info = json.load(handle)["collection_info"]
shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "MANIFEST.json", "FILES.json"))
with open(os.path.join(dest, "galaxy.yml"), "w") as handle:
    yaml.safe_dump(dict((key, value) for key, value in info.items() if value not in (None, [], {}, "")), handle)
PY
    "$bin/ansible-galaxy" collection build --output-path "$scratch/dist" "$scratch/kubernetes.core" >/dev/null
    mv "$scratch"/dist/kubernetes-core-*.tar.gz "$out/collections/kubernetes-core.tar.gz"
fi

# The Python requirements of the two collections, as the image build's introspection will find them.
ANSIBLE_COLLECTIONS_PATH=$scratch/installed "$bin/ansible-galaxy" collection install --offline --no-deps -p "$scratch/installed" \
    "$out"/collections/*.tar.gz >/dev/null
introspect=$("$bin/python" -c 'import ansible_builder, os; print(os.path.dirname(ansible_builder.__file__))')/_target_scripts/introspect.py
"$bin/python" "$introspect" introspect --sanitize --write-pip "$out/requirements.txt" "$scratch/installed" >/dev/null

# The wheelhouse, cached by everything that decides its content.
platform_args=()
for platform in $platforms; do platform_args+=(--platform "$platform"); done
key=$( { cat "$root/requirements/constraints.txt" "$out/requirements.txt"; echo "$python_version $platforms $builder_tools"; } |
    sha256sum | cut -c1-16)
wheels=$cache/$key
if [[ ! -f $wheels/.complete ]]; then
    mkdir -p "$cache"
    exec 9>"$cache/.$key.lock"
    flock 9
    if [[ ! -f $wheels/.complete ]]; then
        say "filling the wheelhouse $wheels (Python $python_version; $platforms)"
        rm -rf "$wheels.partial"
        # shellcheck disable=SC2086  # builder_tools is a list of requirements
        "$bin/pip" download --quiet --dest "$wheels.partial" --only-binary=:all: --implementation cp \
            --python-version "$python_version" "${platform_args[@]}" -c "$root/requirements/constraints.txt" \
            -r "$out/requirements.txt" $builder_tools
        touch "$wheels.partial/.complete"
        rm -rf "$wheels" && mv "$wheels.partial" "$wheels"
    fi
fi
cp "$wheels"/*.whl "$out/wheels/"
say "$(find "$out/wheels" -name '*.whl' | wc -l) wheels, $(find "$out/collections" -name '*.tar.gz' -printf '%f ')"

[[ $work -ef $root ]] || cp "$root/execution-environment.yml" "$work/"
cd "$work"
"$bin/ansible-builder" create -f execution-environment.yml -c "$out/context" --output-filename Containerfile >/dev/null
echo "$out/context"

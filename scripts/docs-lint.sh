#!/usr/bin/env bash
# The collection's documentation as a docsite (docs.ansible.com, `antsibull-docs collection`) renders it:
# `antsibull-docs lint-collection-docs --plugin-docs --check-extra-docs-refs` on this checkout -- every module's,
# plugin's and role's documentation against the docsite's schema, its markup (O(...), M(...), ...) and what that
# references, the RST it becomes (rstcheck), and docs/docsite/ (extra-docs.yml, links.yml and the pages they name).
# make docs-lint; make test runs it beside pytest (make checks).
#
# antsibull-docs lives in a venv of its own, build/antsibull-docs, at the version requirements/constraints.txt pins
# (requirements/docs.txt): its Sphinx wants another docutils than the project venv's tools. Made once, reused while
# its inputs are unchanged.
#
# kubernetes.core, which the k8s modules' documentation extends (kubernetes.core.k8s_auth_options), is found the way
# ansible-galaxy finds it: a copy of the project venv's (the ansible package's) in a folder outside any Git checkout
# -- antsibull-docs copies a collection inside one by its Git file list, and the venv's files are ignored there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
venv=$here/build/antsibull-docs
stamp=$(cat "$here/requirements/constraints.txt" "$here/requirements/docs.txt" | sha256sum | cut -d' ' -f1)-$(
    $python -c 'import sys; print(sys.version.split()[0])')
mkdir -p "$here/build"
(
    flock 9
    if [[ ! -x $venv/bin/antsibull-docs || "$(cat "$venv/.inferops-stamp" 2>/dev/null)" != "$stamp" ]]; then
        echo "[docs-lint] making $venv" >&2
        rm -rf "$venv"
        "$python" -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -c "$here/requirements/constraints.txt" \
            -r "$here/requirements/docs.txt" >&2
        echo "$stamp" >"$venv/.inferops-stamp"
    fi
) 9>"$here/build/.antsibull-docs.lock"

k8s_core=$("$here/.venv/bin/python" -c 'import ansible_collections.kubernetes.core as c; print(list(c.__path__)[0])') ||
    { echo "kubernetes.core is not in $here/.venv (the ansible package brings it): make venv" >&2; exit 1; }
deps=$(mktemp -d /tmp/inferops-docs-lint-XXXXXX)
trap 'rm -rf "$deps"' EXIT
mkdir -p "$deps/ansible_collections/kubernetes"
cp -r "$k8s_core" "$deps/ansible_collections/kubernetes/core"
mkdir -p "$here/build/collections/ansible_collections/inferops"
ln -sfn "$here" "$here/build/collections/ansible_collections/inferops/snapshot"

cd "$here/build/collections/ansible_collections/inferops/snapshot"
# ansible-doc and ansible-galaxy of the project venv (the ansible-core CI tests), this checkout and kubernetes.core only
PATH="$here/.venv/bin:$PATH" ANSIBLE_COLLECTIONS_PATH="$here/build/collections:$deps" ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=False \
    "$venv/bin/antsibull-docs" lint-collection-docs --plugin-docs --check-extra-docs-refs .
echo "[docs-lint] antsibull-docs $("$venv/bin/antsibull-docs" --version): the collection's docs pass"

#!/usr/bin/env bash
# The older ansible-core minors that meta/runtime.yml's requires_ansible claims, each in its own venv:
# build/ansible-core-<version>, from the "older-ansible-core:" lines of requirements/constraints.txt
# (the one place that pins them). A venv is made once and reused while its inputs are unchanged.
# kubernetes.core goes beside each: the copy the project venv's ansible package bundles, or, where the line says
# "kubernetes.core-from ansible==X", the copy the ansible package X bundles (taken from its wheel; nothing else of
# it is installed). The lowest kubernetes.core of the venvs must be galaxy.yml's floor: the floor is tested.
#
#   bash scripts/ansible-versions.sh venvs    make (or reuse) the venvs; prints their directories
#   bash scripts/ansible-versions.sh test     and run ansible-test sanity and the unit tests in each
#
# tests/integration/test_ansible_versions.py runs the generate, verify and restore playbooks with each
# venv's ansible-playbook against the real workload.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
constraints=$here/requirements/constraints.txt
mapfile -t versions < <(sed -n 's/^# older-ansible-core: *\([0-9][0-9.]*\)\( .*\)\{0,1\}$/\1/p' "$constraints")
((${#versions[@]})) || { echo "no older-ansible-core lines in $constraints" >&2; exit 1; }

ansible_for() {  # $1: ansible-core version; the ansible package whose kubernetes.core its venv gets ("" for the project's)
    awk -v version="$1" '$1 == "#" && $2 == "older-ansible-core:" && $3 == version && $4 == "kubernetes.core-from" { print $5 }' \
        "$constraints"
}

venv_for() {   # $1: ansible-core version; makes build/ansible-core-$1 unless it is up to date
    # make test runs this beside pytest, whose ansible-core test asks for the same venvs: one maker each
    mkdir -p "$here/build"
    (flock 9 && venv_make "$1") 9>"$here/build/.ansible-core-$1.lock"
}

venv_make() {
    local version=$1 dir stamp
    dir=$here/build/ansible-core-$version
    stamp=$(cat "$constraints" "$here/requirements/runtime.txt" "$here/requirements/target.txt" "$here/scripts/ansible-versions.sh" |
        sha256sum | cut -d' ' -f1)-$($python -c 'import sys; print(sys.version.split()[0])')
    if [[ -x $dir/bin/ansible-playbook && "$(cat "$dir/.inferops-stamp" 2>/dev/null)" == "$stamp" ]]; then
        echo "$dir"
        return 0
    fi
    echo "[ansible-versions] making $dir" >&2
    rm -rf "$dir"
    "$python" -m venv "$dir"
    # The project's pins, except its own ansible-core; pytest and cel-python for the unit tests (the admission
    # policy's CEL is evaluated there).
    grep -v '^ansible-core==' "$constraints" >"$dir/constraints.txt"
    "$dir/bin/pip" install --quiet --disable-pip-version-check -c "$dir/constraints.txt" "ansible-core==$version" \
        -r "$here/requirements/runtime.txt" -r "$here/requirements/target.txt" pytest pytest-timeout cel-python >&2
    # kubernetes.core, which the k8s modules import (galaxy.yml's dependency): an ansible-core venv comes without
    # the collections the ansible package bundles, so the project venv's copy goes beside it, as ansible-galaxy
    # would install it (Galaxy is not reachable).
    local k8s_core site ansible
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$site/ansible_collections/kubernetes"
    ansible=$(ansible_for "$version")
    if [[ -n $ansible ]]; then
        # the ansible package's wheel holds the collections as files: kubernetes.core is taken out of it
        "$dir/bin/pip" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d "$dir/.ansible-wheel" \
            "$ansible" >&2
        "$dir/bin/python" - "$dir"/.ansible-wheel/ansible-*.whl "$site" <<'PY'
import sys
import zipfile
prefix = "ansible_collections/kubernetes/core/"
with zipfile.ZipFile(sys.argv[1]) as wheel:
    members = [name for name in wheel.namelist() if name.startswith(prefix)]
    assert members, "%s holds no kubernetes.core" % sys.argv[1]
    wheel.extractall(sys.argv[2], members)
PY
        rm -rf "$dir/.ansible-wheel"
    else
        k8s_core=$("$here/.venv/bin/python" -c 'import ansible_collections.kubernetes.core as c; print(list(c.__path__)[0])') ||
            { echo "kubernetes.core is not in $here/.venv (the ansible package brings it): make venv" >&2; return 1; }
        cp -r "$k8s_core" "$site/ansible_collections/kubernetes/core"
    fi
    echo "$stamp" >"$dir/.inferops-stamp"
    echo "$dir"
}

k8s_core_version() {  # $1: a venv; the version of the kubernetes.core beside its ansible-core
    "$1/bin/python" -c 'import json, os, ansible_collections.kubernetes.core as c
print(json.load(open(os.path.join(list(c.__path__)[0], "MANIFEST.json")))["collection_info"]["version"])'
}

floor_is_tested() {  # the venvs' lowest kubernetes.core is galaxy.yml's floor
    local floor lowest
    floor=$(sed -n 's/^ *kubernetes.core: *">=\([0-9.]*\)" *$/\1/p' "$here/galaxy.yml")
    lowest=$(for version in "${versions[@]}"; do k8s_core_version "$here/build/ansible-core-$version"; done | sort -V | head -n 1)
    if [[ -z $floor || $floor != "$lowest" ]]; then
        echo "[ansible-versions] galaxy.yml's kubernetes.core floor is '${floor}', the lowest tested here $lowest: test the" \
            "floor (a kubernetes.core-from line in $constraints) or raise it" >&2
        return 1
    fi
    echo "[ansible-versions] kubernetes.core $floor, galaxy.yml's floor, is tested (beside ansible-core $(
        for version in "${versions[@]}"; do [[ $(k8s_core_version "$here/build/ansible-core-$version") == "$floor" ]] && echo "$version"; done |
        paste -sd ' '))"
}

case ${1:-test} in
    venvs)
        for version in "${versions[@]}"; do venv_for "$version"; done
        floor_is_tested >&2
        ;;
    test)
        # The unit tests mostly wait (timeouts under test): all versions at once, beside the sanity runs.
        # Sanity on the controller's Python, without pylint and pep8: the target Pythons and the style
        # checks do not depend on the ansible-core version; scripts/sanity.sh runs them with the project's.
        dirs=() units=() temps=()
        for version in "${versions[@]}"; do dirs+=("$(venv_for "$version")"); done
        floor_is_tested
        trap 'rm -rf "${temps[@]}"' EXIT
        for i in "${!versions[@]}"; do
            # its own basetemp: pytest removes all but the newest three sessions' tmp dirs of a shared one,
            # which would pull the tmp dirs away from under a pytest running beside (make test). A short
            # one: the agents' unix sockets live under it, and a socket path has at most 107 bytes.
            temps+=("$(mktemp -d /tmp/inferops-units-XXXXXX)")
            # The unit tests of what runs on ansible-core (modules, plugins, the k8s side, the project's pins), not
            # those of core/: it is standard library only (tests/unit/project/test_architecture.py), so its tests --
            # three quarters of the suite -- would run the same code on the same Python again, beside make test.
            (cd "$here" && "${dirs[$i]}/bin/python" -m pytest tests/unit --ignore=tests/unit/core -q -p no:cacheprovider \
                --basetemp "${temps[$i]}" \
                >"${dirs[$i]}/unit.log" 2>&1) &
            units+=($!)
        done
        failed=()
        for i in "${!versions[@]}"; do
            echo "[ansible-versions] ansible-core ${versions[$i]}: sanity"
            ANSIBLE_TEST_VENV=${dirs[$i]} SANITY_CONTROLLER_ONLY=1 \
                bash "$here/scripts/sanity.sh" --skip-test pylint --skip-test pep8 ||
                failed+=("${versions[$i]} sanity")
        done
        for i in "${!versions[@]}"; do
            if wait "${units[$i]}"; then
                echo "[ansible-versions] ansible-core ${versions[$i]}: unit tests: $(tail -n 1 "${dirs[$i]}/unit.log")"
            else
                cat "${dirs[$i]}/unit.log"
                failed+=("${versions[$i]} unit tests")
            fi
        done
        if ((${#failed[@]})); then
            echo "[ansible-versions] FAILED: ${failed[*]}" >&2
            exit 1
        fi
        ;;
    *)
        echo "usage: $0 venvs|test" >&2
        exit 2
        ;;
esac

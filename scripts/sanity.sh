#!/usr/bin/env bash
# Run `ansible-test sanity` on this checkout: every test on the controller's Python (the venv's),
# then the tests that run on the targets' Python (compile, import) on every other Python the
# collection claims -- ansible-test's supported versions that tests/config.yml's python_requires
# allows -- that this machine has (pythonX.Y on PATH, or under ~/.pyenv/versions). It says which
# claimed versions it could not find.
#
#   bash scripts/sanity.sh [ansible-test sanity options...]
#   ANSIBLE_TEST_VENV=build/ansible-core-2.16.19 bash scripts/sanity.sh    (another ansible-core)
#   SANITY_CONTROLLER_ONLY=1 bash scripts/sanity.sh                          (the controller's Python only)
#
# ansible-test needs the collection to sit at .../ansible_collections/inferops/snapshot, so the
# tracked and new (not ignored) files are copied there first; build outputs and the venv stay out.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${ANSIBLE_TEST_VENV:-$here/.venv}
[[ $venv == /* ]] || venv=$here/$venv
bin="$venv/bin"
label=$(basename "$venv")
label=${label#.}
dest="$here/build/sanity-$label/ansible_collections/inferops/snapshot"
rm -rf "$here/build/sanity-$label"
mkdir -p "$dest"
cd "$here"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$dest"
# The collections it depends on (galaxy.yml: kubernetes.core) beside it, as ansible-galaxy installs them: the k8s
# modules import kubernetes.core's module_utils and document its doc fragment. From the venv's ansible package (the
# project's venv when ANSIBLE_TEST_VENV's ansible-core comes without the bundled collections).
for python in "$bin/python" "$here/.venv/bin/python"; do
    k8s_core=$("$python" -c 'import ansible_collections.kubernetes.core as c; print(list(c.__path__)[0])' 2>/dev/null) \
        && break
done
[[ -n ${k8s_core:-} ]] || { echo "kubernetes.core is not installed (the ansible package brings it): make venv" >&2; exit 1; }
mkdir -p "$dest/../../kubernetes"
cp -r "$k8s_core" "$dest/../../kubernetes/core"
cd "$dest"
git init -q . && git add -A  # ansible-test only looks at files git knows about
export PATH="$bin:$PATH"
# ansible-test skips its shellcheck test, silently, when the binary is missing.
command -v shellcheck >/dev/null || { echo "shellcheck is not installed: run scripts/env/setup.sh (its apt step)" >&2; exit 1; }
# ansible-test downloads get-pip.py from a host these machines cannot reach; give it a local one.
# (Older ansible-tests name a pip version per Python range: the stand-in serves them all.)
ansible_test=$("$bin/python" -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')
mkdir -p ~/.ansible/test/cache
mapfile -t pip_versions < <(grep -oP "pip='\K[0-9.]+" "$ansible_test/_internal/python_requirements.py" | sort -u)
for pip_version in "${pip_versions[@]}"; do
    cp "$here/scripts/ansible_test_get_pip.py" ~/.ansible/test/cache/"get_pip_${pip_version//./_}.py"
done

controller=$("$bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# The claimed target Pythons: what this ansible-test supports, within tests/config.yml's python_requires.
read -r -a claimed < <("$bin/python" - "$here/tests/config.yml" <<'PY'
import sys
import yaml
from ansible_test._internal.constants import SUPPORTED_PYTHON_VERSIONS
from packaging.specifiers import SpecifierSet
wanted = SpecifierSet(yaml.safe_load(open(sys.argv[1]))["modules"]["python_requires"])
print(" ".join(v for v in SUPPORTED_PYTHON_VERSIONS if v in wanted))
PY
)
found=() missing=()
for version in "${claimed[@]}"; do
    [[ $version == "$controller" || ${SANITY_CONTROLLER_ONLY:-0} == 1 ]] && continue
    # (a pyenv shim is on PATH for every version, but only runs the ones pyenv is set to)
    if "python$version" -c '' 2>/dev/null; then
        found+=("$version")
        continue
    fi
    pyenv_bin=$(compgen -G "$HOME/.pyenv/versions/$version.*/bin/python$version" | sort -V | tail -n 1 || true)
    if [[ -n $pyenv_bin ]]; then
        PATH="$(dirname "$pyenv_bin"):$PATH"
        found+=("$version")
    else
        missing+=("$version")
    fi
done

failed=()
echo "[sanity] $label: every test on the controller's Python $controller"
"$bin/ansible-test" sanity --python "$controller" --color no "$@" || failed+=("$controller")
for version in "${found[@]}"; do
    echo "[sanity] $label: target tests (compile, import) on Python $version"
    "$bin/ansible-test" sanity --python "$version" --test compile --test import --color no "$@" || failed+=("$version")
done
if ((${#failed[@]})); then
    echo "[sanity] $label: FAILED on Python ${failed[*]} (claimed: ${claimed[*]})" >&2
else
    echo "[sanity] $label: passed on Python $controller${found[*]:+ ${found[*]}} (claimed: ${claimed[*]})"
fi
if ((${#missing[@]})); then
    echo "[sanity] $label: claimed but not on this machine, not tested: ${missing[*]}"
fi
if [[ ${SANITY_CONTROLLER_ONLY:-0} == 1 ]]; then
    echo "[sanity] $label: the other claimed Pythons were not asked for (SANITY_CONTROLLER_ONLY=1)"
fi
((${#failed[@]} == 0))

#!/usr/bin/env bash
# Run `ansible-test sanity` on this checkout. ansible-test needs the collection to sit at
# .../ansible_collections/inferops/snapshot, so the tracked and new (not ignored) files are copied
# there first; build outputs and the venv stay out.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin="$here/.venv/bin"
dest="$here/build/sanity/ansible_collections/inferops/snapshot"
rm -rf "$here/build/sanity"
mkdir -p "$dest"
cd "$here"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$dest"
cd "$dest"
git init -q . && git add -A  # ansible-test only looks at files git knows about
export PATH="$bin:$PATH"
# ansible-test skips its shellcheck test, silently, when the binary is missing.
command -v shellcheck >/dev/null || { echo "shellcheck is not installed: run scripts/env/setup.sh (its apt step)" >&2; exit 1; }
# ansible-test downloads get-pip.py from a host these machines cannot reach; give it a local one.
pip_version=$(grep -oP "pip='\K[0-9.]+" "$("$bin/python" -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py")
mkdir -p ~/.ansible/test/cache
cp "$here/scripts/ansible_test_get_pip.py" ~/.ansible/test/cache/"get_pip_${pip_version//./_}.py"
exec "$bin/ansible-test" sanity --python 3.11 --color no "$@"

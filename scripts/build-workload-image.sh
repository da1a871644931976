#!/usr/bin/env bash
# Build the sample workload image (inferops/workload:latest) offline from inferops/base:bookworm
# (made by scripts/env/setup.sh). The agent is the collection's own folder plugins/module_utils/core/agent,
# copied whole as the package inferops_agent; the simulator is built on the host, whose Debian suite matches
# the base image's.
# Rebuilds only when an input changed (the inputs' hash is an image label).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tag=${1:-inferops/workload:latest}
bash "$root/tests/simulator/build.sh" "$root/build/simulator" >/dev/null
ctx="$root/build/workload-image"
# make test builds it while pytest's fixture and molecule may ask for it too: one builder at a time
mkdir -p "$root/build"
exec 9>"$root/build/.workload-image.lock"
flock 9
rm -rf "$ctx" && mkdir -p "$ctx"
cp -r "$root/plugins/module_utils/core/agent" "$ctx/inferops_agent"
find "$ctx/inferops_agent" -name __pycache__ -prune -exec rm -rf {} +
cp "$root/tests/workload/workload.py" "$root/tests/workload/Dockerfile" "$root/build/simulator/libascendcl.so" "$ctx/"
digest=$(cd "$ctx" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
current=$(docker image inspect --format '{{ index .Config.Labels "org.inferops.inputs" }}' "$tag" 2>/dev/null || true)
if [[ $current == "$digest" ]]; then
    echo "workload image $tag is up to date ($digest)"
    exit 0
fi
docker image inspect inferops/base:bookworm >/dev/null 2>&1 \
    || { echo "inferops/base:bookworm is missing: run scripts/env/setup.sh first" >&2; exit 1; }
DOCKER_BUILDKIT=0 docker build --quiet --label "org.inferops.inputs=$digest" -t "$tag" "$ctx" >/dev/null
echo "built workload image $tag ($digest)"

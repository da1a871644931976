#!/usr/bin/env bash
# Build the engine image inferops/llama:<llama-cpp-python version>: llama.cpp's OpenAI-compatible
# server under the collection's agent (tests/engines/llama/Dockerfile), FROM the workload image.
#
#   bash scripts/build-llama-image.sh [TAG]     # last line of stdout: the image tag
#
# Offline once cached. What it needs, each cached outside the checkout and fetched only when missing:
#   - the llama-cpp-python wheel: scripts/build-llama-wheel.sh (built once per key, ~5.5 min)
#   - the other wheels pinned in requirements/engines.txt, binary only, from the package index pip is
#     configured with: <cache>/engine-deps-<cpXY>-<arch>-<hash of the pins>/
#   - Debian's libgomp1 (the base image has no OpenMP runtime): `apt-get download` from the host's
#     own apt sources into <cache>/../debs/ (the host must be Debian bookworm like the image)
# The python packages are installed for the image by the host's python (the same Debian python
# 3.11, checked) with `pip install --no-index --target`, because the image has no pip.
# Rebuilds only when an input changed: the hash of the inputs (workload image id, Dockerfile, pins,
# every wheel and the .deb) is the image label org.inferops.inputs, as in build-workload-image.sh.
# The image replaced by a rebuild is removed when no container uses it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/requirements/engines.txt"
cache=${INFEROPS_WHEEL_CACHE:-/var/cache/inferops/wheels}
debs=${INFEROPS_DEB_CACHE:-$(dirname "$cache")/debs}
python=${INFEROPS_BUILD_PYTHON:-/usr/bin/python3}
workload=${INFEROPS_WORKLOAD_IMAGE:-inferops/workload:latest}  # the base, (re)built by build-workload-image.sh
say() { printf '[build-llama-image] %s\n' "$*" >&2; }

version=$(sed -n 's/^llama-cpp-python\(\[[a-z,]*\]\)\{0,1\}==\([0-9][0-9A-Za-z.]*\).*/\2/p' "$req")
[[ -n $version ]] || { say "no llama-cpp-python==VERSION pin in $req"; exit 1; }
tag=${1:-inferops/llama:$version}

mkdir -p "$cache" "$debs"
exec 8>"$cache/.llama-image.lock"
flock 8  # one build at a time on this machine (another session may be building the same image)

# 1. the base: the workload image with the agent package and the ACL simulator library
bash "$root/scripts/build-workload-image.sh" "$workload" >&2
base_id=$(docker image inspect --format '{{.Id}}' "$workload")
probe='import sys, sysconfig, inferops_agent.launcher; print("cp%d%d" % sys.version_info[:2]); print(sysconfig.get_path("purelib"))'
if ! image_py=$(docker run --rm --network none --entrypoint python3 "$workload" -c "$probe" 2>&1); then
    say "the workload image $workload has no python package inferops_agent (an image from before the agent" \
        "moved to plugins/module_utils/core/agent?): $image_py"
    exit 1
fi
image_pytag=$(sed -n 1p <<<"$image_py")
site=$(sed -n 2p <<<"$image_py")  # Debian: /usr/local/lib/python3.X/dist-packages, on sys.path
host_pytag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
[[ $image_pytag == "$host_pytag" ]] || { say "the image has python $image_pytag, $python is $host_pytag"; exit 1; }

# 2. the llama-cpp-python wheel (cached by key)
wheel=$(bash "$root/scripts/build-llama-wheel.sh" | tail -n 1)
[[ -f $wheel ]] || { say "build-llama-wheel.sh gave no wheel"; exit 1; }

# 3. the other pinned wheels (binary only), once per set of pins
pins=$(grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' -e '^llama-cpp-python' "$req" | sed 's/[[:space:]]*#.*//')
deps="$cache/engine-deps-$host_pytag-$(uname -m)-$(printf '%s\n' "$pins" | sha256sum | cut -c1-12)"
if [[ ! -f $deps/.complete ]]; then
    say "fetching $(wc -l <<<"$pins") pinned wheels into $deps"
    mkdir -p "$deps"
    # shellcheck disable=SC2086
    timeout 900 "$python" -m pip download --quiet --progress-bar off --no-deps --only-binary :all: \
        --no-cache-dir -d "$deps" $pins 2>&1 | sed "/^WARNING: Location '.*' is ignored/d" >&2
    touch "$deps/.complete"
else
    say "pinned wheels cached in $deps"
fi

# 4. libgomp1 from Debian, the same suite as the image
# shellcheck disable=SC1091
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
image_suite=$(docker run --rm --network none --entrypoint sh "$workload" -c '. /etc/os-release && echo $VERSION_CODENAME')
[[ $suite == "$image_suite" ]] || { say "host is Debian '$suite', the image '$image_suite': fetch libgomp1 for $image_suite"; exit 1; }
deb=$(find "$debs" -maxdepth 1 -name "libgomp1_*_$(dpkg --print-architecture).deb" | sort -V | tail -n 1)
if [[ -z $deb ]]; then
    say "apt-get download libgomp1 (from the host's apt sources) into $debs"
    (cd "$debs" && timeout 300 apt-get download -q -o APT::Sandbox::User=root libgomp1 >&2) \
        || { say "apt-get download libgomp1 failed (run apt-get update?)"; exit 1; }
    deb=$(find "$debs" -maxdepth 1 -name "libgomp1_*_$(dpkg --print-architecture).deb" | sort -V | tail -n 1)
else
    say "libgomp1 cached: $deb"
fi

# 5. inputs hash -> up to date?
digest=$({
    echo "$base_id"
    sha256sum "$root/tests/engines/llama/Dockerfile" "$req" "$0" "$wheel" "$deb" | cut -d' ' -f1
    find "$deps" -maxdepth 1 -name '*.whl' -print0 | sort -z | xargs -0 sha256sum | cut -d' ' -f1
} | sha256sum | cut -c1-16)
old_id=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
current=$(docker image inspect --format '{{ index .Config.Labels "org.inferops.inputs" }}' "$tag" 2>/dev/null || true)
if [[ $current == "$digest" ]]; then
    say "engine image $tag is up to date ($digest)"
    echo "$tag"
    exit 0
fi

# 6. the context: site/ installed for the image's python, the .deb, the Dockerfile
started=$(date +%s)
ctx="$root/build/llama-image"
rm -rf "$ctx" && mkdir -p "$ctx"
cp "$root/tests/engines/llama/Dockerfile" "$ctx/"
cp "$deb" "$ctx/libgomp1.deb"
# Only the cached wheels count (no index, no pip configuration: the host's find-links are not inputs).
# --no-compile: the image keeps PYTHONDONTWRITEBYTECODE and the context stays reproducible.
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$req" | sed 's/[[:space:]]*#.*//' >"$ctx/requirements.txt"
env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    PIP_ROOT_USER_ACTION=ignore \
    "$python" -m pip install --quiet --no-index --no-compile --no-warn-script-location \
    --find-links "$deps" --find-links "$(dirname "$wheel")" --target "$ctx/site" -r "$ctx/requirements.txt" >&2
rm -f "$ctx/requirements.txt"
# the data files of llama-cpp-python's wheel (headers, a second copy of its libraries: llama_cpp/lib is
# the one it loads) and console scripts with the host's shebang: not needed in the image
rm -rf "$ctx/site/bin" "$ctx/site/include" "$ctx/site/lib"
if ! out=$(DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE=$workload" --build-arg "SITE=$site" \
    --label "org.inferops.inputs=$digest" --label "org.inferops.engine=llama-cpp-python==$version" \
    -t "$tag" "$ctx" 2>&1); then
    say "docker build failed: $out"
    exit 1
fi
rm -rf "$ctx"  # 130 MB of installed packages: the image has them now

# 7. the image must start its server's code: OpenMP runtime present, the wheel runs here (glibc, CPU)
check='import llama_cpp, llama_cpp.server.app, inferops_agent.launcher
llama_cpp.llama_backend_init()
print(llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())'
if ! out=$(docker run --rm --network none --entrypoint python3 "$tag" -c "$check" 2>&1); then
    say "the built image cannot load llama_cpp: $out"
    exit 1
fi
new_id=$(docker image inspect --format '{{.Id}}' "$tag")
if [[ -n $old_id && $old_id != "$new_id" ]]; then
    docker image rm "$old_id" >/dev/null 2>&1 || true  # still used by a container: left alone
fi
say "built engine image $tag ($digest) in $(( $(date +%s) - started ))s: llama_cpp $(head -c 300 <<<"$out" | tr '\n' ' ')"
echo "$tag"

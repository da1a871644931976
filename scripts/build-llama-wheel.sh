#!/usr/bin/env bash
# Build llama-cpp-python's wheel (it compiles llama.cpp with cmake) once and cache it outside the
# checkout, for the engine image inferops/llama (scripts/build-llama-image.sh).
#
#   bash scripts/build-llama-wheel.sh      # last line of stdout: the wheel's path
#
# The wheel is keyed by package version (requirements/engines.txt), python tag, machine, glibc and a
# hash of the cmake flags: <cache>/llama-cpp-python-<ver>-<cpXY>-<arch>-glibc<ver>-<flags>/. A second
# run with the same key finds it and does nothing (a second CI run on the same machine pays nothing);
# a fresh machine builds it once (about 5.5 min on 2 cores at nice 19). Concurrent runs wait for each
# other (flock) instead of building twice; a build is published with one rename, so a killed build
# never leaves a half wheel behind.
#
# It is built with the host's Debian python (/usr/bin/python3): on Debian 12 that is the same
# python 3.11 and glibc 2.36 as the image's base inferops/base:bookworm, and llama-cpp-python is a
# ctypes package (a py3-none wheel whose shared libraries need only glibc, libstdc++ and libgomp).
# Build flags: -DGGML_NATIVE=OFF compiles ggml for a fixed x86-64 level (AVX2, FMA, F16C, BMI2:
# x86-64-v3) instead of -march=native, so a cached wheel also runs on another CPU of this kind (not
# AVX-512 just because the build machine has it); OpenMP stays on (the default, as in real engines;
# the image gets Debian's libgomp1); -DLLAVA_BUILD=OFF skips the multimodal library the server does
# not load for a text model.
#
# Environment (all optional):
#   INFEROPS_WHEEL_CACHE=/var/cache/inferops/wheels   where the keyed wheel directories live
#   INFEROPS_LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_OPENMP=ON -DLLAVA_BUILD=OFF"
#   INFEROPS_LLAMA_BUILD_TIMEOUT=2400                 seconds before the build is killed
#   INFEROPS_BUILD_PYTHON=/usr/bin/python3            the python that builds (must match the image's)
# Network: pip fetches the sdist and the build backend (scikit-build-core) from the package index
# pip is configured with; apt-get installs cmake, g++, binutils and python3-pip when missing (root).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/requirements/engines.txt"
cache=${INFEROPS_WHEEL_CACHE:-/var/cache/inferops/wheels}
cmake_args=${INFEROPS_LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_OPENMP=ON -DLLAVA_BUILD=OFF}
limit=${INFEROPS_LLAMA_BUILD_TIMEOUT:-2400}
python=${INFEROPS_BUILD_PYTHON:-/usr/bin/python3}

say() { printf '[build-llama-wheel] %s\n' "$*" >&2; }
version=$(sed -n 's/^llama-cpp-python\(\[[a-z,]*\]\)\{0,1\}==\([0-9][0-9A-Za-z.]*\).*/\2/p' "$req")
[[ -n $version ]] || { say "no llama-cpp-python==VERSION pin in $req"; exit 1; }
pytag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
glibc=$("$python" -c 'import platform; print(platform.libc_ver()[1])')
arch=$(uname -m)
flags=$(printf '%s' "$cmake_args" | sha256sum | cut -c1-8)
key="llama-cpp-python-$version-$pytag-$arch-glibc$glibc-$flags"
dir="$cache/$key"

found() {
    local wheel
    wheel=$(find "$dir" -maxdepth 1 -name 'llama_cpp_python-*.whl' 2>/dev/null | head -1)
    [[ -n $wheel && -f $dir/build-info.json ]] || return 1
    say "cached: $wheel"
    echo "$wheel"
}
found && exit 0

mkdir -p "$cache"
exec 9>"$cache/.$key.lock"
if ! flock -n 9; then
    say "another build of $key is running; waiting for it"
    flock 9
fi
found && exit 0

# The build tools, from Debian (a fresh machine set up by scripts/env/setup.sh has gcc but not these).
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v objdump >/dev/null || missing+=(binutils)
"$python" -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || { say "missing build tools: ${missing[*]} (apt-get install them as root)"; exit 1; }
    say "installing the build tools: apt-get install ${missing[*]}"
    timeout 600 apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

partial="$cache/.$key.partial.$$"
rm -rf "$partial" && mkdir -p "$partial"
trap 'rm -rf "$partial"' EXIT
say "building llama-cpp-python $version ($pytag, $arch, glibc $glibc) with CMAKE_ARGS='$cmake_args'"
say "nice 19, $(nproc) jobs, limit ${limit}s; log: $partial/build.log (kept as $cache/$key.failed.log on failure)"
started=$(date +%s)
# pip wheel -v (not install: Debian's externally-managed python is left alone; -v: cmake's output goes to
# the log). --no-cache-dir: the keyed cache here is the cache; pip's http cache would only keep a second
# copy of the 75 MB sdist.
if ! CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    nice -n 19 timeout --kill-after=30 "$limit" \
    "$python" -m pip wheel -v --no-deps --no-cache-dir --progress-bar off -w "$partial" "llama-cpp-python==$version" \
    >"$partial/build.log" 2>&1; then
    cp "$partial/build.log" "$cache/$key.failed.log"
    say "build failed or timed out after $(( $(date +%s) - started ))s; last lines:"
    tail -n 25 "$partial/build.log" >&2
    exit 1
fi
seconds=$(( $(date +%s) - started ))
wheel=$(find "$partial" -maxdepth 1 -name 'llama_cpp_python-*.whl' | head -1)
[[ -n $wheel ]] || { say "pip reported success but wrote no wheel"; tail -n 25 "$partial/build.log" >&2; exit 1; }

# What the wheel's libraries need from the system: the newest glibc symbol version, and no AVX-512
# instruction (zmm registers) in ggml's CPU backend, i.e. it really was built for the fixed level.
check="$partial/check" && mkdir -p "$check" && (cd "$check" && "$python" -m zipfile -e "$wheel" .)
libs=$(find "$check" -name '*.so*' -type f)
[[ -n $libs ]] || { say "the wheel has no shared libraries"; exit 1; }
# shellcheck disable=SC2086
needs_glibc=$(objdump -T $libs | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
cpu_lib=$(find "$check" -name 'libggml-cpu.so*' -type f | head -1)
avx512=$(objdump -d --no-show-raw-insn "$cpu_lib" | grep -c '%zmm' || true)
# shellcheck disable=SC2086
needed=$(objdump -p $libs | awk '/NEEDED/ {print $2}' | sort -u | tr '\n' ' ')
rm -rf "$check"
if [[ $avx512 != 0 ]]; then
    say "libggml-cpu uses AVX-512 ($avx512 instructions): the flags did not give a portable build"
    exit 1
fi
"$python" - "$partial/build-info.json" <<EOF
import json, sys
info = {"package": "llama-cpp-python", "version": "$version", "python": "$pytag", "arch": "$arch",
        "glibc": "$glibc", "cmake_args": "$cmake_args", "build_seconds": $seconds,
        "wheel": "$(basename "$wheel")", "needs_glibc": "$needs_glibc", "needed_libraries": "$needed".split(),
        "avx512_instructions": $avx512, "built_at": "$(date -u +%FT%TZ)", "builder": "$python"}
json.dump(info, open(sys.argv[1], "w"), indent=1, sort_keys=True)
EOF
rm -rf "$dir"
mv "$partial" "$dir"
trap - EXIT
say "built in ${seconds}s, needs $needs_glibc and: $needed"
wheel="$dir/$(basename "$wheel")"
say "cached: $wheel"
echo "$wheel"

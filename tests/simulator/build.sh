#!/usr/bin/env bash
# Builds the ACL snapshot simulator: OUTDIR/libascendcl.so (default OUTDIR: build/simulator under the
# repository root), the current runtime (both shapes of the snapshot API), and OUTDIR/legacy-api/libascendcl.so,
# an older runtime whose snapshot calls take no arguments (docs/simulator.md). Skips a build when its library is
# newer than the sources. Honours $CC.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-"$root/build/simulator"}
src="$here/src/acl_sim.c"
hdr="$here/include/acl/acl_snapshot_sim.h"
cc=${CC:-cc}
tmp=""
trap 'rm -f "$tmp"' EXIT INT TERM

build() {   # $1: the library to write; the rest: extra compiler flags
    local lib=$1
    shift
    if [ -f "$lib" ] && [ "$lib" -nt "$src" ] && [ "$lib" -nt "$hdr" ] && [ "$lib" -nt "$0" ]; then
        echo "simulator up to date: $lib"
        return 0
    fi
    mkdir -p "$(dirname "$lib")"
    tmp="$lib.tmp.$$"
    "$cc" -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -pthread -fvisibility=hidden "$@" \
        -I"$here/include" -Wl,-soname,libascendcl.so -o "$tmp" "$src"
    mv -f "$tmp" "$lib"
    echo "built simulator: $lib"
}

build "$out/libascendcl.so"
build "$out/legacy-api/libascendcl.so" -DACL_SIM_LEGACY_SNAPSHOT_API

#!/usr/bin/env bash
# Builds the ACL snapshot simulator: OUTDIR/libascendcl.so (default OUTDIR: build/simulator under the
# repository root), the current runtime (both shapes of the snapshot API), and OUTDIR/legacy-api/libascendcl.so,
# an older runtime whose snapshot calls take no arguments (docs/simulator.md), and the simulated driver's
# libascend_hal.so: OUTDIR/driver (halGetAPIVersion 500) and OUTDIR/driver-upgrade (501, another size). Skips a build
# when its library is newer than the sources. Honours $CC.
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
    if [ -f "$lib" ] && [ "$lib" -nt "$src" ] && [ "$lib" -nt "$hdr" ] && [ "$lib" -nt "$here/src/acl_sim_hal.h" ] && [ "$lib" -nt "$0" ]; then
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

driver() {  # $1: the library to write; $2: its API version; $3: the bytes of the rest of its code
    local lib=$1 hal="$here/src/hal_lib.c"
    if [ -f "$lib" ] && [ "$lib" -nt "$hal" ] && [ "$lib" -nt "$0" ]; then
        echo "simulated driver up to date: $lib"
        return 0
    fi
    mkdir -p "$(dirname "$lib")"
    tmp="$lib.tmp.$$"
    "$cc" -std=gnu11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden -DACL_SIM_HAL_API_VERSION="$2" \
        -DACL_SIM_HAL_BYTES="$3" -Wl,-soname,libascend_hal.so -o "$tmp" "$hal"
    mv -f "$tmp" "$lib"
    echo "built simulated driver: $lib"
}

driver "$out/driver/libascend_hal.so" 500 4096
driver "$out/driver-upgrade/libascend_hal.so" 501 65536

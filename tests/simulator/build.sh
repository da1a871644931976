#!/usr/bin/env bash
# Builds the ACL snapshot simulator: OUTDIR/libascendcl.so (default OUTDIR: build/simulator under
# the repository root). Skips the build when the library is newer than its sources. Honours $CC.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-"$root/build/simulator"}
src="$here/src/acl_sim.c"
hdr="$here/include/acl/acl_snapshot_sim.h"
lib="$out/libascendcl.so"
cc=${CC:-cc}

if [ -f "$lib" ] && [ "$lib" -nt "$src" ] && [ "$lib" -nt "$hdr" ] && [ "$lib" -nt "$0" ]; then
    echo "simulator up to date: $lib"
    exit 0
fi
mkdir -p "$out"
tmp="$lib.tmp.$$"
trap 'rm -f "$tmp"' EXIT INT TERM
"$cc" -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -pthread -fvisibility=hidden \
    -I"$here/include" -Wl,-soname,libascendcl.so -o "$tmp" "$src"
mv -f "$tmp" "$lib"
echo "built simulator: $lib"

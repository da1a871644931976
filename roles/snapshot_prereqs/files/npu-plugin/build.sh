#!/usr/bin/env bash
# Builds the collection's CRIU NPU plugin: OUT (default: build/criu-plugin/inferops_npu_plugin.so under the
# repository root) from inferops_npu_plugin.c (and the headers it includes) beside this script, against CRIU's plugin
# header criu-plugin.h.
# The header is looked up in $CRIU_PLUGIN_INCLUDE, then the private CRIU prefix's include/criu (the Debian package
# libcriu-dev unpacked there by criu-from-debian.sh), then /usr/include/criu (libcriu-dev / criu-devel installed).
# Skips the build when OUT is newer than the source and the header. Honours $CC. Needs only libc at run time:
# CRIU loads it with dlopen and provides the rest (criu_get_image_dir, print_on_level).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-"$(cd "$here/../../../.." && pwd)/build/criu-plugin/inferops_npu_plugin.so"}
src="$here/inferops_npu_plugin.c"
cc=${CC:-cc}
include=""
for dir in ${CRIU_PLUGIN_INCLUDE:-} "${CRIU_PREFIX:-/opt/inferops/criu}/usr/include/criu" /usr/include/criu; do
    if [ -f "$dir/criu-plugin.h" ]; then include=$dir; break; fi
done
if [ -z "$include" ]; then
    echo "criu-plugin.h not found (set CRIU_PLUGIN_INCLUDE, or install libcriu-dev; scripts/env/setup.sh and the" \
         "snapshot_prereqs role unpack it with CRIU)" >&2
    exit 1
fi
fresh=1
for input in "$src" "$here"/*.h "$include/criu-plugin.h" "$0"; do
    if [ ! -f "$out" ] || [ ! "$out" -nt "$input" ]; then fresh=0; fi
done
if [ $fresh = 1 ]; then
    echo "plugin up to date: $out"
    exit 0
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT INT TERM
"$cc" -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -fvisibility=default -isystem "$include" -o "$tmp" "$src"
mv -f "$tmp" "$out"
echo "built plugin: $out (header: $include/criu-plugin.h)"

#!/usr/bin/env bash
# CRIU's plugin header for building the NPU plugin against the CRIU that criu-from-debian.sh unpacked: the Debian
# package libcriu-dev of that very version (it ships /usr/include/criu/criu-plugin.h), from the same suite, through
# the same private apt state, unpacked into the prefix's usr/include/criu. Nothing enters the host's dpkg database.
#   fetch-header.sh            (root; settings from the environment, as for criu-from-debian.sh)
#   CRIU_PREFIX=/opt/inferops/criu  CRIU_STATE=/var/cache/inferops-criu
# Prints the include directory. Does nothing when the header of that version is there already.
set -Eeuo pipefail
PREFIX=${CRIU_PREFIX:-/opt/inferops/criu}
STATE=${CRIU_STATE:-/var/cache/inferops-criu}
say() { printf '[fetch-header] %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[[ -r $PREFIX/INFEROPS-SOURCE ]] || die "$PREFIX/INFEROPS-SOURCE is missing: run criu-from-debian.sh first"
read -r _ ver _ _ suite _ <"$PREFIX/INFEROPS-SOURCE"   # "criu <version> from Debian <suite> (<date>)"
include=$PREFIX/usr/include/criu
if [[ -f $include/criu-plugin.h && "$(cat "$include/INFEROPS-VERSION" 2>/dev/null)" == "$ver" ]]; then
    echo "$include"
    exit 0
fi
DIR=$STATE/apt-$suite
if [[ ! -r $DIR/sources.list ]]; then  # a prefix unpacked with another state directory: the same private apt state
    KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
    uri=${CRIU_MIRROR:-}
    [[ -n $uri ]] || uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
        2>/dev/null | grep -v '^[[:space:]]*#' | grep -oE '(https?|file)://[^[:space:]]+/debian/?([[:space:]]|$)' |
        head -n 1 | tr -d '[:space:]') || true
    [[ -n $uri && -r $KEYRING ]] || die "no Debian archive in the host's apt sources (set CRIU_MIRROR) or no $KEYRING"
    mkdir -p "$DIR"/{lists/partial,cache/archives/partial,sources.list.d,preferences.d}
    printf 'deb [signed-by=%s] %s %s main\n' "$KEYRING" "${uri%/}" "$suite" >"$DIR/sources.list"
    : >"$DIR/status"
fi
ARCH=$(dpkg --print-architecture)
APT=(-o "Dir::Etc::SourceList=$DIR/sources.list" -o "Dir::Etc::SourceParts=$DIR/sources.list.d"
    -o "Dir::Etc::Preferences=$DIR/preferences" -o "Dir::Etc::PreferencesParts=$DIR/preferences.d"
    -o "Dir::State::Lists=$DIR/lists" -o "Dir::State::status=$DIR/status" -o "Dir::Cache=$DIR/cache"
    -o "APT::Architectures::=$ARCH" -o "APT::Get::List-Cleanup=0")
if ! apt-cache "${APT[@]}" show "libcriu-dev=$ver" >/dev/null 2>&1; then
    apt-get "${APT[@]}" -q update >/dev/null 2>&1 || die "cannot read the package lists of '$suite'"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get "${APT[@]}" -q download "libcriu-dev=$ver" >/dev/null 2>&1) ||
    die "cannot download libcriu-dev $ver from '$suite' (the header must match criu $ver)"
dpkg -x "$work"/libcriu-dev_*.deb "$work/x"
[[ -f $work/x/usr/include/criu/criu-plugin.h ]] || die "libcriu-dev $ver has no usr/include/criu/criu-plugin.h"
mkdir -p "$include"
cp "$work/x/usr/include/criu/"*.h "$include/"
cp "$work"/x/usr/share/doc/libcriu-dev/copyright "$include/COPYRIGHT" 2>/dev/null || true
printf '%s\n' "$ver" >"$include/INFEROPS-VERSION"
say "criu-plugin.h of criu $ver (libcriu-dev from Debian $suite) in $include"
echo "$include"

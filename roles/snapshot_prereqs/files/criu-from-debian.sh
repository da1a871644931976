#!/usr/bin/env bash
# CRIU >= 4.2 on a Debian-family host whose own suite has an older one (Debian 12 has 3.17, which
# fails `criu check` on current kernels; 4.1 cannot dump TCP sockets on kernels >= 6.16): criu 4.2.x
# from a newer Debian suite, unpacked with dpkg -x together with its whole library closure -- its own
# libc included -- into a private prefix, and run through that prefix's dynamic loader by a `criu`
# wrapper. Nothing is installed into the host's dpkg database and the host's apt state is untouched.
#
#   criu-from-debian.sh            (root; the settings below come from the environment)
#
# The inferops.snapshot.snapshot_prereqs role runs it on nodes; scripts/env/setup.sh on the test
# machine. Settings (environment, all optional):
#   CRIU_PREFIX=/opt/inferops/criu       where the packages are unpacked
#   CRIU_WRAPPER=/usr/local/bin/criu     the wrapper written (it must come first on the PATH that
#                                        dockerd, containerd and runc see)
#   CRIU_SUITES="forky sid"              Debian suites tried, in order
#   CRIU_MIN=4.2                         oldest acceptable version
#   CRIU_MIRROR=URI                      Debian mirror; default: the Debian archive in the host's apt
#                                        sources (never written into the script)
#   CRIU_STATE=/var/cache/inferops-criu  private apt lists and downloads (kept: a rerun is quick)
#   CRIU_REFRESH=1                       fetch the newest criu of the suites even when the prefix is
#                                        complete (its update path: a newer criu, or a security update of
#                                        its libraries); the prefix is replaced only when that is another
#                                        version
# Last line of stdout on success: "criu <version> from Debian <suite> in <prefix> behind <wrapper>",
# followed by " (unchanged)" when the prefix was already there and nothing was fetched.
set -Eeuo pipefail
umask 022

PREFIX=${CRIU_PREFIX:-/opt/inferops/criu}
WRAPPER=${CRIU_WRAPPER:-/usr/local/bin/criu}
SUITES=${CRIU_SUITES:-forky sid}
MIN=${CRIU_MIN:-4.2}
STATE=${CRIU_STATE:-/var/cache/inferops-criu}
REFRESH=${CRIU_REFRESH:-}
CHANGED=1
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

say() { printf '[criu-from-debian] %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

version_ok() {   # $1: a version string; true when >= $MIN
    [[ $1 =~ ^([0-9]+:)?([0-9]+)\.([0-9]+) ]] || return 1
    local maj=${BASH_REMATCH[2]} min=${BASH_REMATCH[3]} want_maj=${MIN%%.*} want_min=${MIN#*.}
    ((maj > want_maj || (maj == want_maj && min >= want_min)))
}

ARCH=$(dpkg --print-architecture)
case $ARCH in
    amd64) TRIPLET=x86_64-linux-gnu LOADER=ld-linux-x86-64.so.2 ;;
    arm64) TRIPLET=aarch64-linux-gnu LOADER=ld-linux-aarch64.so.1 ;;
    *) die "architecture $ARCH is not supported (amd64 and arm64 are)" ;;
esac
[[ -r $KEYRING ]] || die "$KEYRING is missing: install the package debian-archive-keyring"

# The Debian archive the host already uses: a deb822 or one-line source whose URI ends in /debian.
mirror() {
    if [[ -n ${CRIU_MIRROR:-} ]]; then
        printf '%s\n' "${CRIU_MIRROR%/}"
        return 0
    fi
    local uri
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
        grep -v '^[[:space:]]*#' | grep -oE '(https?|file)://[^[:space:]]+/debian/?([[:space:]]|$)' |
        head -n 1 | tr -d '[:space:]') || true
    [[ -n $uri ]] || return 1
    printf '%s\n' "${uri%/}"
}

APT=()
private_apt() {   # $1: suite; sets APT and DIR: own sources, lists, cache and an empty dpkg status
    local suite=$1 uri
    uri=$(mirror) || die "no Debian archive in the host's apt sources; set CRIU_MIRROR (snapshot_prereqs_debian_mirror)"
    DIR=$STATE/apt-$suite
    mkdir -p "$DIR"/{lists/partial,cache/archives/partial,sources.list.d,preferences.d,debs}
    printf 'deb [signed-by=%s] %s %s main\n' "$KEYRING" "$uri" "$suite" >"$DIR/sources.list"
    : >"$DIR/status"   # nothing counts as installed: the closure includes criu's own libc
    APT=(-o "Dir::Etc::SourceList=$DIR/sources.list" -o "Dir::Etc::SourceParts=$DIR/sources.list.d"
        -o "Dir::Etc::Preferences=$DIR/preferences" -o "Dir::Etc::PreferencesParts=$DIR/preferences.d"
        -o "Dir::State::Lists=$DIR/lists" -o "Dir::State::status=$DIR/status" -o "Dir::Cache=$DIR/cache"
        -o "APT::Architectures::=$ARCH" -o "APT::Get::List-Cleanup=0")
}

fetch() {   # unpacks criu from the first suite that has a new enough one into $PREFIX
    local suite out ver pkgs stage deb
    for suite in $SUITES; do
        private_apt "$suite"
        if ! out=$(apt-get "${APT[@]}" -q --error-on=any update 2>&1); then
            say "cannot read the package lists of '$suite': $(printf '%s\n' "$out" | grep -E '^(E|W):' | head -n 2 | tr '\n' ' ')"
            continue
        fi
        ver=$(apt-cache "${APT[@]}" show --no-all-versions criu 2>/dev/null | awk '/^Version:/ { print $2; exit }')
        if ! version_ok "${ver:-0}"; then
            say "'$suite' has criu '${ver:-none}', need >= $MIN"
            continue
        fi
        if [[ -n $REFRESH && -x $PREFIX/usr/sbin/criu ]] && grep -q "^criu $ver from " "$PREFIX/INFEROPS-SOURCE" 2>/dev/null; then
            say "$PREFIX already holds criu $ver, the newest of '$suite'"
            CHANGED=0
            return 0
        fi
        mapfile -t pkgs < <(apt-cache "${APT[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
            --no-breaks --no-replaces --no-enhances criu 2>/dev/null | awk '/^[a-z0-9]/ { print $1 }' | sort -u)
        ((${#pkgs[@]} > 0)) || { say "cannot resolve criu's dependencies in '$suite'"; continue; }
        say "downloading criu $ver and the ${#pkgs[@]} packages of its closure from '$suite'"
        rm -f "$DIR"/debs/*.deb
        if ! out=$(cd "$DIR/debs" && apt-get "${APT[@]}" -q download "${pkgs[@]}" 2>&1); then
            say "download from '$suite' failed: $(printf '%s' "$out" | tail -n 3 | tr '\n' ' ')"
            continue
        fi
        stage="$PREFIX.new.$$"
        rm -rf "$stage"
        mkdir -p "$stage"
        for deb in "$DIR"/debs/*.deb; do
            dpkg -x "$deb" "$stage" || die "dpkg -x failed on $deb"
        done
        [[ -x $stage/usr/sbin/criu ]] || die "the criu package of '$suite' has no usr/sbin/criu"
        printf '%s\n' "${pkgs[@]}" >"$stage/INFEROPS-PACKAGES"
        # written last: a prefix with this file is complete
        printf 'criu %s from Debian %s (%s)\n' "$ver" "$suite" "$(date -u +%FT%TZ)" >"$stage/INFEROPS-SOURCE"
        mkdir -p "$(dirname "$PREFIX")"
        rm -rf "$PREFIX.old.$$"
        [[ -e $PREFIX ]] && mv "$PREFIX" "$PREFIX.old.$$"
        mv "$stage" "$PREFIX"
        rm -rf "$PREFIX.old.$$"
        return 0
    done
    die "no criu >= $MIN in the Debian suites $SUITES (CRIU_SUITES / snapshot_prereqs_criu_debian_suites), or the mirror does not serve them"
}

write_wrapper() {
    local ld="" candidate libpath="" d tmp
    for candidate in "$PREFIX/usr/lib/$TRIPLET/$LOADER" "$PREFIX/lib/$TRIPLET/$LOADER" \
        "$PREFIX/usr/lib64/$LOADER" "$PREFIX/lib64/$LOADER" "$PREFIX/usr/lib/$LOADER" "$PREFIX/lib/$LOADER"; do
        if [[ -e $candidate ]]; then ld=$(readlink -f "$candidate"); break; fi
    done
    [[ -n $ld ]] || die "no $LOADER in $PREFIX (libc6 missing from the closure?)"
    for d in "usr/lib/$TRIPLET" "lib/$TRIPLET" usr/lib lib; do
        [[ -d $PREFIX/$d ]] && libpath+="${libpath:+:}$PREFIX/$d"
    done
    mkdir -p "$(dirname "$WRAPPER")"
    tmp=$(mktemp "$WRAPPER.XXXXXX")
    cat >"$tmp" <<EOF
#!/bin/sh
# criu wrapper written by inferops.snapshot (criu-from-debian.sh): $(cut -d' ' -f1-5 "$PREFIX/INFEROPS-SOURCE"),
# unpacked with its own libc into $PREFIX. It runs through that prefix's dynamic loader so the host's
# libraries are not mixed in (--library-path, not LD_LIBRARY_PATH: programs criu runs use the host's).
exec $ld --library-path $libpath $PREFIX/usr/sbin/criu "\$@"
EOF
    chmod 0755 "$tmp"
    mv "$tmp" "$WRAPPER"
}

# A complete prefix from an earlier run only needs its wrapper (unless asked to look for a newer criu).
if [[ -e $PREFIX/INFEROPS-SOURCE && -x $PREFIX/usr/sbin/criu && -z $REFRESH ]]; then
    before=$(cat "$WRAPPER" 2>/dev/null || true)
    write_wrapper
    [[ $before == "$(cat "$WRAPPER")" ]] && CHANGED=0
    got=$("$WRAPPER" --version 2>/dev/null | awk '/^Version:/ { print $2; exit }') || true
    version_ok "${got:-0}" || { say "$PREFIX is unusable (criu '${got:-?}'), fetching it again"; CHANGED=1; fetch; write_wrapper; }
else
    fetch
    write_wrapper
fi
got=$("$WRAPPER" --version 2>&1 | awk '/^Version:/ { print $2; exit }') || true
version_ok "${got:-0}" || die "$WRAPPER does not report criu >= $MIN: $("$WRAPPER" --version 2>&1 | head -n 3 | tr '\n' ' ')"
echo "$(cut -d' ' -f1-5 "$PREFIX/INFEROPS-SOURCE") in $PREFIX behind $WRAPPER$( ((CHANGED)) || echo ' (unchanged)')"

#!/usr/bin/env bash
# A Debian image (inferops/debian:<suite>) built offline from Debian's packages: debootstrap
# --variant=minbase of <suite> from the Debian mirror in the host's apt sources (scripts/env/setup.sh's
# debian_mirror and build_rootfs_tar: the same recipe as the base image, never a host name in the
# repository), then `docker import`. tests/integration/test_prereqs_debian.py runs the snapshot_prereqs
# role in containers of these images (Debian 12 and 13).
#
#   bash scripts/build-debian-image.sh trixie      # last line of stdout: the image's name
#   bash scripts/build-debian-image.sh bookworm ee # inferops/debian:bookworm-ee: with python3-venv and
#                                                  # openssh-client too (test_awx_ee.py's base for the EE build)
#
# The rootfs tarball is cached outside the checkout, in /var/cache/inferops/rootfs/<suite>.tar (with the
# recipe beside it): a fresh machine pays the debootstrap once (about 1-2 min), later runs and a wiped
# docker only the import (seconds). Concurrent runs wait for each other (flock). Root.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
suite=${1:?usage: build-debian-image.sh <debian suite, e.g. trixie> [ee]}
flavour=${2:-}
case $flavour in
    "") more="" ;;
    ee) more=python3-venv,openssh-client ;;   # a venv for the EE build's pip; bindep.txt's ssh client
    *) echo "unknown flavour '$flavour' (known: ee)" >&2; exit 2 ;;
esac
[[ $suite =~ ^[a-z]+$ ]] || { echo "not a Debian suite name: $suite" >&2; exit 2; }
cache=${INFEROPS_ROOTFS_CACHE:-/var/cache/inferops/rootfs}
name=$suite${flavour:+-$flavour}
image=inferops/debian:$name

# shellcheck source=scripts/env/setup.sh
source "$root/scripts/env/setup.sh"   # its functions only; nothing runs
# shellcheck disable=SC2034  # read by setup.sh's functions (log, debian_mirror, build_rootfs_tar)
{ CURRENT_STEP=debian-$name; BASE_SUITE=$suite; BUILD_DIR=$cache; BASE_INCLUDE=$BASE_INCLUDE${more:+,$more}; }
recipe="debootstrap --variant=minbase --include=$BASE_INCLUDE $suite; slimmed; v1"
recipe_id=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)   # an image label: no spaces

mkdir -p "$cache"
exec 9>"$cache/.$name.lock"
flock 9
tar=$cache/$name.tar
if [[ "$(docker image inspect --format '{{ index .Config.Labels "org.inferops.recipe" }}' "$image" 2>/dev/null)" == \
    "$recipe_id" ]]; then
    log "$image present"
    echo "$image"
    exit 0
fi
if [[ -f $tar && "$(cat "$tar.recipe" 2>/dev/null)" == "$recipe" ]]; then
    log "reusing cached rootfs $tar"
else
    rm -f "$tar" "$tar.recipe"
    t=$(now)
    build_rootfs_tar "$tar"
    printf '%s\n' "$recipe" >"$tar.recipe"
    log "debootstrap of $suite took $(elapsed "$t")s"
fi
docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
    --change "LABEL org.inferops.recipe=$recipe_id" --message "inferops: $recipe" "$tar" "$image" >/dev/null
log "imported $image"
echo "$image"

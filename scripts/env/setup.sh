#!/usr/bin/env bash
# inferops.snapshot — prepare a Debian 12 (bookworm, amd64) host for the project's tests and demo.
#
# Run as root:  bash scripts/env/setup.sh
# Idempotent: a second run only checks, takes seconds and changes nothing.
#
# Steps (see docs/dev/environment.md for the why):
#   1. apt      Debian packages the tests need (docker.io, containerd, runc, debootstrap, gcc, ...)
#   2. dockerd  /etc/docker/daemon.json (experimental, no bridge, no iptables, storage driver) and a
#               running, experimental dockerd
#   3. criu     CRIU >= 4.2 on PATH: criu 4.2.x from Debian forky/sid unpacked into a private prefix
#               (/opt/inferops/criu) behind the wrapper /usr/local/bin/criu
#   3b. plugin  the collection's CRIU NPU plugin, built against that CRIU's criu-plugin.h (libcriu-dev of
#               the same version) and installed where CRIU loads plugins (/usr/lib/criu)
#   3c. npu     the simulated NPU driver's device nodes, as an NPU node has them: /dev/davinci0..7 and
#               /dev/davinci_manager (a loop device; the loop driver loaded and a free loop device bound
#               where a fresh machine has none yet), by tests/simulator/aclsim_ctl.py install --node
#   4. image    the offline base image inferops/base:bookworm (debootstrap | docker import)
#   5. cri      the Kubernetes CRI nodes' packages (containerd with its CRI plugin, containernetworking-plugins) and
#               their pause image, by scripts/env/cri-node.sh install; the nodes themselves are started by the
#               tests that use them (tests/conftest.py cri_nodes: cri-node.sh start, then import of the workload image)
#
# Environment knobs (all optional):
#   INFEROPS_ENV_RESTART_DOCKER=1  allow restarting a running dockerd that is not configured right
#   INFEROPS_DEBIAN_MIRROR=URI     Debian mirror to use instead of the one in the host's apt sources
#   INFEROPS_CRIU_SUITES="forky sid"  Debian suites tried, in order, for criu 4.2.x
#   INFEROPS_CRIU_PREFIX=/opt/inferops/criu
#   INFEROPS_BASE_IMAGE=inferops/base:bookworm
#   INFEROPS_ENV_STEPS="apt dockerd criu plugin npu image cri"  run only these steps
set -Eeuo pipefail
umask 022

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD_DIR=${INFEROPS_BUILD_DIR:-$REPO_ROOT/build/env}
CRIU_PREFIX=${INFEROPS_CRIU_PREFIX:-/opt/inferops/criu}
CRIU_WRAPPER=/usr/local/bin/criu
CRIU_SUITES=${INFEROPS_CRIU_SUITES:-forky sid}
CRIU_MIN_MAJOR=4
CRIU_MIN_MINOR=2
BASE_IMAGE=${INFEROPS_BASE_IMAGE:-inferops/base:bookworm}
BASE_SUITE=bookworm
DAEMON_JSON=/etc/docker/daemon.json
DOCKERD_LOG=/var/log/inferops-dockerd.log
DOCKERD_WAIT_S=60
DAEMON_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
STEPS=${INFEROPS_ENV_STEPS:-apt dockerd criu plugin npu image cri}
CRIU_PLUGIN_DIR=/usr/lib/criu   # CRIU's built-in plugin directory (criu/include/plugin.h CR_PLUGIN_DEFAULT)
NPU_PLUGIN=$REPO_ROOT/roles/snapshot_prereqs/files/npu-plugin
export DEBIAN_FRONTEND=noninteractive
# keep the caller's PATH order, only add what a root shell on Debian should have
for _d in /usr/local/bin /usr/local/sbin; do [[ ":$PATH:" == *":$_d:"* ]] || PATH="$_d:$PATH"; done
for _d in /usr/sbin /sbin /usr/bin /bin; do [[ ":$PATH:" == *":$_d:"* ]] || PATH="$PATH:$_d"; done
export PATH

T0=$(date +%s.%N)
CURRENT_STEP=init
INSTALLED_DOCKER_NOW=0   # set when step 1 installed docker.io in this very run

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[setup %s] %s\n' "$CURRENT_STEP" "$*"; }
die() {
    printf '[setup %s] ERROR: %s\n' "$CURRENT_STEP" "$1" >&2
    shift || true
    local line
    for line in "$@"; do printf '    %s\n' "$line" >&2; done
    exit 1
}
on_err() {
    local rc=$? line=$1 cmd=$2
    printf '[setup %s] ERROR: unexpected failure (rc=%s) at setup.sh:%s: %s\n' \
        "$CURRENT_STEP" "$rc" "$line" "$cmd" >&2
    exit "$rc"
}
trap 'on_err "$LINENO" "$BASH_COMMAND"' ERR

python() {
    if [[ -x /usr/bin/python3 ]]; then /usr/bin/python3 "$@"; else python3 "$@"; fi
}

pkg_installed() {
    [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == installed ]]
}

# The Debian mirror URI the host already uses (never hard-coded in the repository).
debian_mirror() {
    if [[ -n "${INFEROPS_DEBIAN_MIRROR:-}" ]]; then
        printf '%s\n' "${INFEROPS_DEBIAN_MIRROR%/}"
        return 0
    fi
    python - "$BASE_SUITE" <<'PY'
import glob, re, sys
codename = sys.argv[1]
entries = []  # (uri, suites)
def add(types, uris, suites, enabled=True):
    if not enabled or "deb" not in types:
        return
    for u in uris:
        entries.append((u.rstrip("/"), suites))
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    text = open(path, encoding="utf-8", errors="replace").read()
    for stanza in re.split(r"\n\s*\n", text):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:
                fields[key] += " " + line.strip()
                continue
            if ":" in line:
                key, val = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = val.strip()
        if "uris" in fields:
            add(fields.get("types", "").split(), fields["uris"].split(),
                fields.get("suites", "").split(),
                fields.get("enabled", "yes").lower() not in ("no", "false", "0"))
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        continue
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^]]*\]", " ", line)
        parts = line.split()
        if len(parts) >= 3:
            add([parts[0]], [parts[1]], [parts[2]])
for uri, suites in entries:          # the stanza serving the host's own release
    if codename in suites:
        print(uri); sys.exit(0)
for uri, suites in entries:          # anything that looks like a main Debian archive
    if uri.endswith("/debian") and not any(s.endswith("-security") for s in suites):
        print(uri); sys.exit(0)
sys.exit(1)
PY
}

require_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts dockerd)" \
        "run: sudo bash scripts/env/setup.sh"
    [[ -r /etc/debian_version ]] || die "this script supports Debian 12 (bookworm) hosts only"
    local arch
    arch=$(dpkg --print-architecture)
    [[ $arch == amd64 ]] || die "architecture '$arch' is not supported (the CRIU prefix is amd64 only)"
}

docker_ok() { timeout 20 docker info >/dev/null 2>&1; }

# --------------------------------------------------------------------------------------------
# step 1: apt packages
# --------------------------------------------------------------------------------------------
APT_PACKAGES=(
    docker.io containerd runc tini iptables       # engine (dockerd manages containerd/runc)
    debootstrap tar                               # offline base image
    gcc make libc6-dev                            # simulator library
    python3 python3-venv                          # json merge here, project venv
    iproute2 curl procps ca-certificates          # tests and diagnostics
    openssh-server                                # sshd of the multi-host tests' own namespaced hosts
    python3-jsonschema                            # what the snapshot_node role installs on nodes (its tests)
    python3-cryptography                          # the node runtime's signatures and decryption (its tests)
    shellcheck                                    # ansible-test sanity's shellcheck test (scripts/sanity.sh)
    sudo                                          # become from a normal user (test_become.py)
    git                                           # ansible-test sanity works on a git tree
)

step_apt() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        pkg_installed "$p" || missing+=("$p")
    done
    # systemd-tmpfiles applies the boot-time plaintext sweep the snapshot_node role installs (its test runs it):
    # from systemd where it is installed, else the standalone package (it conflicts with systemd)
    command -v systemd-tmpfiles >/dev/null || missing+=(systemd-standalone-tmpfiles)
    if ((${#missing[@]} == 0)); then
        log "all ${#APT_PACKAGES[@]} packages present"
        return 0
    fi
    log "installing: ${missing[*]}"
    local out
    if ! out=$(apt-get update -q 2>&1); then
        die "apt-get update failed, cannot install: ${missing[*]}" \
            "check the host's apt sources (/etc/apt/sources.list.d/) and that the Debian mirror is reachable" \
            "$(printf '%s\n' "$out" | tail -n 5)"
    fi
    if ! out=$(apt-get install -y -q --no-install-recommends "${missing[@]}" 2>&1); then
        die "apt-get install failed for: ${missing[*]}" \
            "run 'apt-get install ${missing[*]}' by hand to see why" \
            "$(printf '%s\n' "$out" | tail -n 8)"
    fi
    for p in "${missing[@]}"; do
        pkg_installed "$p" || die "package '$p' is still not installed after apt-get install"
    done
    [[ " ${missing[*]} " == *" docker.io "* ]] && INSTALLED_DOCKER_NOW=1
    return 0
}

# --------------------------------------------------------------------------------------------
# step 2: dockerd
# --------------------------------------------------------------------------------------------
dockerd_pids() { pgrep -x dockerd || true; }

# overlay2 needs a working overlay mount on the filesystem that holds /var/lib/docker.
overlay_works() {
    local root=/var/lib/docker probe rc=1
    mkdir -p "$root"
    probe=$(mktemp -d "$root/.inferops-overlay-probe.XXXXXX")
    mkdir -p "$probe"/{lower,upper,work,merged}
    if mount -t overlay overlay \
        -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
        umount "$probe/merged" && rc=0
    fi
    rm -rf "$probe"
    return $rc
}

choose_storage_driver() {
    # 1. whatever the running daemon uses (never orphan a user's images)
    if docker_ok; then docker info --format '{{.Driver}}'; return; fi
    # 2. whatever already holds images under /var/lib/docker
    local d
    for d in overlay2 vfs; do
        if [[ -d /var/lib/docker/image/$d ]]; then echo "$d"; return; fi
    done
    # 3. overlay2 if the kernel and filesystem allow it, vfs otherwise
    if overlay_works; then echo overlay2; else echo vfs; fi
}

# Merge our keys into daemon.json, keep every other key the user had. Prints changed|unchanged.
write_daemon_json() {
    local driver=$1
    mkdir -p "$(dirname "$DAEMON_JSON")"
    python - "$DAEMON_JSON" "$driver" <<'PY'
import json, os, sys, tempfile
path, driver = sys.argv[1], sys.argv[2]
try:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    cur = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    cur = {}
except ValueError as e:
    sys.stderr.write(f"{path} is not valid JSON: {e}\n")
    sys.exit(2)
if not isinstance(cur, dict):
    sys.stderr.write(f"{path} does not hold a JSON object\n")
    sys.exit(2)
new = dict(cur)
new["experimental"] = True       # docker checkpoint needs it
new["bridge"] = "none"           # no bridge networking on these hosts: --network host|none
new["iptables"] = False
new.setdefault("storage-driver", driver)
if new == cur:
    print("unchanged")
    sys.exit(0)
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".daemon.json.")
with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump(new, f, indent=2, sort_keys=True)
    f.write("\n")
os.chmod(tmp, 0o644)
os.replace(tmp, path)
print("changed")
PY
}

start_dockerd() {
    if [[ -d /run/systemd/system ]] && systemctl cat docker.service >/dev/null 2>&1; then
        log "starting docker.service (systemd)"
        systemctl start docker.service || true
    else
        log "starting dockerd in the background (log: $DOCKERD_LOG)"
        # PATH must reach /usr/local/bin: containerd -> shim -> runc -> 'criu' is looked up on it.
        env -i PATH="$DAEMON_PATH" HOME=/root LANG=C.UTF-8 \
            setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
        disown || true
    fi
    local t=$SECONDS
    while ((SECONDS - t < DOCKERD_WAIT_S)); do
        docker_ok && return 0
        sleep 0.5
    done
    die "dockerd did not answer 'docker info' within ${DOCKERD_WAIT_S}s" \
        "last lines of $DOCKERD_LOG (or: journalctl -u docker):" \
        "$(tail -n 15 "$DOCKERD_LOG" 2>/dev/null || true)"
}

stop_dockerd() {
    if [[ -d /run/systemd/system ]] && systemctl is-active --quiet docker.service 2>/dev/null; then
        systemctl stop docker.service docker.socket 2>/dev/null || true
    fi
    local pid
    for pid in $(dockerd_pids); do kill -TERM "$pid" 2>/dev/null || true; done
    local t=$SECONDS
    while [[ -n "$(dockerd_pids)" ]] && ((SECONDS - t < 30)); do sleep 0.5; done
    [[ -z "$(dockerd_pids)" ]] || die "dockerd (pid $(dockerd_pids | xargs)) did not stop within 30s"
}

step_dockerd() {
    command -v dockerd >/dev/null || die "dockerd not found" "install the Debian package docker.io"
    local running=0 driver change
    docker_ok && running=1
    driver=$(choose_storage_driver)
    change=$(write_daemon_json "$driver") || die "cannot update $DAEMON_JSON" \
        "fix or remove the file, then rerun"
    [[ $change == changed ]] && log "wrote $DAEMON_JSON (storage-driver default: $driver)"

    if ((running)); then
        local exp
        exp=$(docker info --format '{{.ExperimentalBuild}}' 2>/dev/null || echo unknown)
        if [[ $exp == true && $change == unchanged ]]; then
            log "dockerd running, experimental, $(docker info --format '{{.Driver}}') storage"
            return 0
        fi
        if [[ $exp == true ]]; then
            # bridge/iptables changes only take effect on restart; experimental (what we need) is on.
            log "dockerd running and experimental; $DAEMON_JSON changed (applies at next dockerd restart)"
            return 0
        fi
        if [[ ${INFEROPS_ENV_RESTART_DOCKER:-0} != 1 && $INSTALLED_DOCKER_NOW != 1 ]]; then
            die "dockerd is running but not in experimental mode (docker checkpoint needs it)" \
                "$DAEMON_JSON now has \"experimental\": true; restart dockerd yourself," \
                "or rerun with INFEROPS_ENV_RESTART_DOCKER=1 to let this script restart it"
        fi
        log "restarting dockerd to enable experimental mode"
        stop_dockerd
    fi
    start_dockerd
    [[ $(docker info --format '{{.ExperimentalBuild}}') == true ]] || die \
        "dockerd started but is not experimental" "check $DAEMON_JSON and the dockerd command line"
    log "dockerd up, experimental, $(docker info --format '{{.Driver}}') storage"
}

# --------------------------------------------------------------------------------------------
# step 3: CRIU >= 4.2
# --------------------------------------------------------------------------------------------
criu_version_ok() {   # $1: criu command; true when it reports >= 4.2
    local v
    v=$("$1" --version 2>/dev/null | awk '/^Version:/ { print $2; exit }') || return 1
    [[ $v =~ ^([0-9]+)\.([0-9]+) ]] || return 1
    local maj=${BASH_REMATCH[1]} min=${BASH_REMATCH[2]}
    ((maj > CRIU_MIN_MAJOR || (maj == CRIU_MIN_MAJOR && min >= CRIU_MIN_MINOR)))
}

criu_check_out() { criu check 2>&1; }

# runc (run by containerd's shim) looks 'criu' up on PATH; the daemons must see the wrapper's dir.
check_daemon_path() {
    local want pid p comm bad=""
    want=$(dirname "$(command -v criu)")
    for pid in $(pgrep -x dockerd || true) $(pgrep -x containerd || true); do
        # a daemon that exited since pgrep (a test's CRI node restarting) has nothing to check: under set -e the
        # failed read would end the whole setup
        p=$( { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | sed -n 's/^PATH=//p') || continue
        [[ -e /proc/$pid ]] || continue
        comm=$(cat "/proc/$pid/comm" 2>/dev/null || echo "?")
        if [[ ":$p:" != *":$want:"* ]]; then
            bad="$comm (pid $pid) runs with PATH='$p', which lacks $want"
            break
        fi
    done
    [[ -z $bad ]] && return 0
    # Our own kind of daemon (no systemd, containerd a child of dockerd) can be restarted with the
    # right PATH when the user allows it; anything else is the user's to fix.
    if [[ ${INFEROPS_ENV_RESTART_DOCKER:-0} == 1 && ! -d /run/systemd/system ]] && [[ $comm == dockerd ||
        $(ps -o comm= -p "$(ps -o ppid= -p "$pid" | tr -d ' ')" 2>/dev/null) == dockerd ]]; then
        log "$bad: restarting dockerd with PATH=$DAEMON_PATH"
        stop_dockerd
        start_dockerd
        check_daemon_path_once
        return 0
    fi
    die "$bad:" \
        "runc started by it cannot find criu ('docker checkpoint' fails with: CRIU version check failed:" \
        "exec: \"criu\": executable file not found in \$PATH)." \
        "Restart it with $want on PATH, or rerun with INFEROPS_ENV_RESTART_DOCKER=1 (restarts a dockerd" \
        "that this script can manage; a systemd unit needs Environment=PATH=... in a drop-in)"
}
check_daemon_path_once() {
    local pid p want
    want=$(dirname "$(command -v criu)")
    for pid in $(pgrep -x dockerd || true) $(pgrep -x containerd || true); do
        p=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^PATH=//p')
        [[ ":$p:" == *":$want:"* ]] || die "$(cat "/proc/$pid/comm") (pid $pid) still lacks $want on PATH after restart"
    done
}

# criu 4.2.x from a newer Debian suite into a private prefix, behind the wrapper: the script the
# snapshot_prereqs role runs on nodes (one implementation for both).
CRIU_FROM_DEBIAN=$REPO_ROOT/roles/snapshot_prereqs/files/criu-from-debian.sh
install_criu_prefix() {
    local mirror
    mirror=$(debian_mirror) || die "cannot find a Debian mirror URI in the host's apt sources" \
        "looked in /etc/apt/sources.list.d/*.sources and /etc/apt/sources.list;" \
        "set INFEROPS_DEBIAN_MIRROR=<uri> to name one"
    CRIU_PREFIX=$CRIU_PREFIX CRIU_WRAPPER=$CRIU_WRAPPER CRIU_SUITES=$CRIU_SUITES CRIU_MIRROR=$mirror \
        CRIU_MIN=$CRIU_MIN_MAJOR.$CRIU_MIN_MINOR CRIU_STATE=$BUILD_DIR bash "$CRIU_FROM_DEBIAN" >/dev/null ||
        die "could not install criu >= $CRIU_MIN_MAJOR.$CRIU_MIN_MINOR into $CRIU_PREFIX (see the lines above)" \
            "the host's Debian mirror must serve one of: $CRIU_SUITES (set INFEROPS_CRIU_SUITES / INFEROPS_DEBIAN_MIRROR)," \
            "or install criu >= $CRIU_MIN_MAJOR.$CRIU_MIN_MINOR on PATH yourself"
}

# runc hands CRIU the options in /etc/criu/runc.conf, for checkpoints and restores alike (also
# those `docker start --checkpoint` makes). tcp-close leaves requests in flight to the running
# process during a leave-running snapshot and closes their copies in a restored one; without it
# a snapshot taken under traffic cannot be restored through Docker. skip-in-flight lets the dump
# ignore connections not yet accepted (a health probe arriving while the engine is frozen).
# Other lines are kept.
RUNC_CRIU_CONF=${RUNC_CRIU_CONF:-/etc/criu/runc.conf}
ensure_runc_criu_conf() {
    local option
    mkdir -p "$(dirname "$RUNC_CRIU_CONF")"
    for option in tcp-close skip-in-flight; do
        if ! grep -qx "$option" "$RUNC_CRIU_CONF" 2>/dev/null; then
            printf '%s\n' "$option" >>"$RUNC_CRIU_CONF"
            log "added $option to $RUNC_CRIU_CONF"
        fi
    done
}

step_criu() {
    local out
    ensure_runc_criu_conf
    if command -v criu >/dev/null && criu_version_ok criu && out=$(criu_check_out); then
        check_daemon_path
        log "$(command -v criu): $(criu --version | awk '/^Version:/ { print "criu " $2 }'), criu check: ok"
        return 0
    fi
    install_criu_prefix
    local found
    found=$(command -v criu || true)
    [[ $found == "$CRIU_WRAPPER" ]] || die "'criu' on PATH is '$found', not $CRIU_WRAPPER" \
        "put $(dirname "$CRIU_WRAPPER") before $(dirname "${found:-/usr/sbin/criu}") on PATH or remove the old criu"
    criu_version_ok criu || die "$CRIU_WRAPPER does not report criu >= $CRIU_MIN_MAJOR.$CRIU_MIN_MINOR" \
        "$(criu --version 2>&1 | head -n 3)"
    out=$(criu_check_out) || die "'criu check' failed with criu $(criu --version | awk '/^Version:/ {print $2}'):" \
        "$(printf '%s\n' "$out" | tail -n 15)"
    check_daemon_path
    log "$(cut -d' ' -f1-5 "$CRIU_PREFIX/INFEROPS-SOURCE") in $CRIU_PREFIX behind $CRIU_WRAPPER; criu check: ok"
}

# --------------------------------------------------------------------------------------------
# step 3b: the CRIU NPU plugin
# --------------------------------------------------------------------------------------------
# The header comes with the CRIU of the private prefix (libcriu-dev of its version); a CRIU found on the
# PATH instead needs /usr/include/criu/criu-plugin.h (libcriu-dev) installed.
step_plugin() {
    local include="" built=$REPO_ROOT/build/criu-plugin/inferops_npu_plugin.so target
    target=$CRIU_PLUGIN_DIR/inferops_npu_plugin.so
    if [[ -e $CRIU_PREFIX/INFEROPS-SOURCE ]]; then
        include=$(CRIU_PREFIX=$CRIU_PREFIX CRIU_STATE=$BUILD_DIR bash "$NPU_PLUGIN/fetch-header.sh") ||
            die "cannot get criu-plugin.h for the CRIU in $CRIU_PREFIX (see the lines above)"
    fi
    CRIU_PLUGIN_INCLUDE=$include CRIU_PREFIX=$CRIU_PREFIX bash "$NPU_PLUGIN/build.sh" "$built" >/dev/null ||
        die "cannot build the CRIU NPU plugin (see the lines above)"
    if cmp -s "$built" "$target"; then
        log "$target up to date"
        return 0
    fi
    mkdir -p "$CRIU_PLUGIN_DIR"
    install -m 0644 "$built" "$target.new.$$"
    mv -f "$target.new.$$" "$target"
    log "installed $target"
}

# --------------------------------------------------------------------------------------------
# step 3c: the simulated NPU's device nodes
# --------------------------------------------------------------------------------------------
# A real NPU process holds /dev/davinci<N> and a mapping of /dev/davinci_manager, and so does the simulator
# (docs/simulator.md): the node gets them as a driver's installation makes them. Every container of the tests
# and the demo gets nodes of its own simulated NPU (aclsim_ctl.py docker-args); these are the node's, for the
# simulator's defaults. Idempotent; the loop binding and the nodes do not survive a reboot, a rerun makes them.
step_npu() {
    local out
    out=$(python "$REPO_ROOT/tests/simulator/aclsim_ctl.py" install --node 8 2>&1) ||
        die "cannot install the simulated NPU's device nodes" "$out"
    log "device nodes: $(cd /dev && echo davinci*)"
}

# --------------------------------------------------------------------------------------------
# step 4: base image
# --------------------------------------------------------------------------------------------
ROOTFS_TMP=""
cleanup_rootfs() {
    [[ -n $ROOTFS_TMP && -d $ROOTFS_TMP ]] || return 0
    local m
    # debootstrap mounts proc/sys inside the target; never rm -rf through a live mount
    awk -v p="$ROOTFS_TMP/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf --one-file-system "$ROOTFS_TMP"
    ROOTFS_TMP=""
}

BASE_INCLUDE=python3,curl
BASE_RECIPE="debootstrap --variant=minbase --include=$BASE_INCLUDE $BASE_SUITE; slimmed; v1"

build_rootfs_tar() {   # $1: tar file to write (the rootfs of $BASE_SUITE)
    command -v debootstrap >/dev/null || die "debootstrap not found" "install the Debian package debootstrap"
    local mirror cache out tar=$1
    mirror=$(debian_mirror) || die "cannot find a Debian mirror URI in the host's apt sources" \
        "set INFEROPS_DEBIAN_MIRROR=<uri>"
    cache=$BUILD_DIR/debootstrap-cache
    mkdir -p "$cache"
    ROOTFS_TMP=$(mktemp -d /var/tmp/inferops-rootfs.XXXXXX)
    trap cleanup_rootfs EXIT
    log "debootstrap --variant=minbase --include=$BASE_INCLUDE $BASE_SUITE from the host's mirror"
    if ! out=$(debootstrap --variant=minbase --include="$BASE_INCLUDE" --cache-dir="$cache" \
        "$BASE_SUITE" "$ROOTFS_TMP/root" "$mirror" 2>&1); then
        die "debootstrap of $BASE_SUITE from $mirror failed" \
            "$(printf '%s\n' "$out" | tail -n 8)" \
            "full log: $ROOTFS_TMP/root/debootstrap/debootstrap.log (kept until this script exits)"
    fi
    local r=$ROOTFS_TMP/root
    # keep it small: no package caches, lists, docs, manuals or translations
    rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* \
        "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/* \
        "$r"/var/log/*.log "$r"/tmp/* "$r"/var/tmp/*
    tar --numeric-owner -C "$r" -cf "$tar.tmp" . || die "cannot write $tar.tmp"
    mv "$tar.tmp" "$tar"
    cleanup_rootfs
}

step_image() {
    docker_ok || die "docker is not answering; run the dockerd step first"
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        log "$BASE_IMAGE present ($(docker image inspect --format '{{.Size}}' "$BASE_IMAGE" |
            awk '{ printf "%.0f MB", $1 / 1e6 }'))"
        return 0
    fi
    # The rootfs tarball is cached under build/ (git-ignored): re-importing after 'docker rmi' or a
    # wiped /var/lib/docker takes seconds instead of a minute of debootstrap.
    local tar=$BUILD_DIR/rootfs-$BASE_SUITE.tar out
    mkdir -p "$BUILD_DIR"
    if [[ -f $tar && -f $tar.recipe && "$(cat "$tar.recipe")" == "$BASE_RECIPE" ]]; then
        log "reusing cached rootfs $tar"
    else
        rm -f "$tar" "$tar.recipe"
        build_rootfs_tar "$tar"
        printf '%s\n' "$BASE_RECIPE" >"$tar.recipe"
    fi
    log "docker import as $BASE_IMAGE"
    if ! out=$(docker import \
        --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
        --change "LABEL org.inferops.base.suite=$BASE_SUITE" \
        --message "inferops base: $BASE_RECIPE" \
        "$tar" "$BASE_IMAGE" 2>&1); then
        die "docker import of the $BASE_SUITE rootfs failed" "$(printf '%s\n' "$out" | tail -n 5)" \
            "remove $tar to rebuild it from scratch"
    fi
    docker run --rm --network none "$BASE_IMAGE" python3 -c 'import json, http.server, ctypes' ||
        die "$BASE_IMAGE was imported but python3 does not work in it" "remove $tar and rerun"
    log "$BASE_IMAGE built ($(docker image inspect --format '{{.Size}}' "$BASE_IMAGE" |
        awk '{ printf "%.0f MB", $1 / 1e6 }'))"
}

# --------------------------------------------------------------------------------------------
# step 5: the CRI nodes' packages
# --------------------------------------------------------------------------------------------
# Two containerd instances of their own (node-a, node-b) beside dockerd's, with CNI: docs/kubernetes.md
# ("Kubernetes nodes in the tests"). Installing is idempotent and takes well under a second once done.
step_cri() {
    local out
    out=$(bash "$REPO_ROOT/scripts/env/cri-node.sh" install 2>&1) ||
        die "cannot prepare the CRI test nodes (scripts/env/cri-node.sh install):" "$out"
    log "${out//\[cri-node\] /}"
}

# --------------------------------------------------------------------------------------------
run_step() {
    local name=$1 t
    [[ " $STEPS " == *" $name "* ]] || return 0
    CURRENT_STEP=$name
    t=$(now)
    "step_$name"
    printf '[setup %s] done in %ss\n' "$name" "$(elapsed "$t")"
}

main() {
    CURRENT_STEP=init
    require_root
    run_step apt
    run_step dockerd
    run_step criu
    run_step plugin
    run_step npu
    run_step image
    run_step cri
    CURRENT_STEP=all
    printf '[setup] environment ready in %ss\n' "$(elapsed "$T0")"
}

# sourcing the file (for tests) defines the functions without running anything
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then main "$@"; fi

#!/usr/bin/env bash
# inferops.snapshot -- the Kubernetes CRI nodes of the tests: containerd 1.6 with its CRI plugin, as
# clusters run it, twice on this one machine (node-a, node-b), each its own daemon with its own config, root,
# state, socket, runc root, CNI network and bridge, never touching dockerd's own containerd
# (/var/run/docker/containerd). docs/kubernetes.md ("Kubernetes nodes in the tests") says what they are for.
#
#   bash scripts/env/cri-node.sh install               Debian's containerd + containernetworking-plugins (setup.sh)
#   bash scripts/env/cri-node.sh start [NODE...]       start (or find running) nodes; idempotent
#   bash scripts/env/cri-node.sh import IMAGE [NODE...]  docker save IMAGE | ctr -n k8s.io images import, when changed
#   bash scripts/env/cri-node.sh restart [NODE...]     the daemon only (running pods stay, as on a real node)
#   bash scripts/env/cri-node.sh down [NODE...]        the daemon and everything its pods left: processes, mounts,
#                                                      netns, veths, bridge, IPAM (images and config stay)
#   bash scripts/env/cri-node.sh status [NODE...]      one JSON object per node: running, pid, socket, paths
#
# NODE is node-a or node-b (default: both); node-c .. node-z are for a test that breaks a node of its own.
# Layout of node-X (X = a .. z; N = 1 .. 26):
#   /etc/inferops-cri/node-X/config.toml        containerd config (version 2), imports conf.d/*.toml
#   /etc/inferops-cri/node-X/conf.d/            drop-ins (the snapshot_node role's runtime handler goes here)
#   /etc/inferops-cri/node-X/net.d/             its CNI network (bridge + host-local + portmap; loopback by the CRI)
#   /etc/inferops-cri/node-X/certs.d/           registry hosts: every registry is 127.0.0.1:9 (refused): no pull
#                                               ever leaves the machine
#   /run/inferops-cri/node-X/containerd.sock    its CRI and containerd API
#   /run/inferops-cri/node-X/containerd         its state (bundles: io.containerd.runtime.v2.task/k8s.io/<id>/,
#                                               netns: io.containerd.grpc.v1.cri/netns/)
#   /run/inferops-cri/node-X/runc/k8s.io        runc's root for its k8s.io namespace
#   /var/lib/inferops-cri/node-X/containerd     its root (content, snapshots, metadata)
#   /var/lib/inferops-cri/node-X/kubelet        the kubelet stand-in's root (pods/<uid>/volumes ...)
#   /var/log/inferops-cri/node-X/               containerd.log, pods/ (container logs)
#   bridge inferops-cri-X, 10.247.N.1/24; pods get 10.247.N.10-.250 (no default route: they reach only their
#   bridge); 10.247.0.0/16 is an unreachable route on this machine, so nothing for these addresses ever leaves
#   it when a bridge is gone.
#   /var/lib/inferops-cri/snapshots             the snapshot store both nodes share
# Pod cgroups (cgroupfs): /inferops-cri/node-X/... (the kubelet stand-in's cgroup_parent).
set -Eeuo pipefail
umask 022

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ETC_BASE=${INFEROPS_CRI_ETC:-/etc/inferops-cri}
RUN_BASE=${INFEROPS_CRI_RUN:-/run/inferops-cri}
LIB_BASE=${INFEROPS_CRI_LIB:-/var/lib/inferops-cri}
LOG_BASE=${INFEROPS_CRI_LOG:-/var/log/inferops-cri}
SHARED_STORE=$LIB_BASE/snapshots
ALL_NODES=(node-a node-b)
SUPERNET=10.247.0.0/16
CNI_BIN=/usr/lib/cni
CNI_PLUGINS=(bridge host-local loopback portmap)
RUNC=/usr/sbin/runc
PAUSE_IMAGE=docker.io/inferops-cri/pause:local
PAUSE_SOURCE=$REPO_ROOT/scripts/env/cri-pause.c
NO_REGISTRY=http://127.0.0.1:9   # the discard port: nothing listens, every pull is refused at once
CGROUP_BASE=inferops-cri
START_WAIT_S=60
DAEMON_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive
for _d in /usr/local/bin /usr/local/sbin /usr/sbin /sbin; do [[ ":$PATH:" == *":$_d:"* ]] || PATH="$PATH:$_d"; done
export PATH

log() { printf '[cri-node] %s\n' "$*" >&2; }
die() {
    printf '[cri-node] ERROR: %s\n' "$1" >&2
    shift || true
    local line
    for line in "$@"; do printf '    %s\n' "$line" >&2; done
    exit 1
}
trap 'die "unexpected failure (rc=$?) at cri-node.sh:$LINENO: $BASH_COMMAND"' ERR

[[ $(id -u) -eq 0 ]] || die "must run as root (it runs containerd, mounts, network namespaces)"

# ---------------------------------------------------------------------------------------------- node layout
node_vars() {   # $1: node name -> the variables of that node
    NODE=$1
    # node-a and node-b are the tests' two nodes; node-c .. node-z are for tests that must break a node of their
    # own (kill its daemon, tear it down) without touching the pods of other tests on node-a and node-b
    [[ $NODE =~ ^node-([a-z])$ ]] || die "unknown node '$NODE'" "the test nodes are node-a .. node-z"
    N=$(($(printf '%d' "'${BASH_REMATCH[1]}") - 96))
    ETC=$ETC_BASE/$NODE
    RUN=$RUN_BASE/$NODE
    LIB=$LIB_BASE/$NODE
    LOGDIR=$LOG_BASE/$NODE
    CONFIG=$ETC/config.toml
    SOCK=$RUN/containerd.sock
    STATE=$RUN/containerd
    ROOT=$LIB/containerd
    RUNC_ROOT=$RUN/runc
    PIDFILE=$RUN/containerd.pid
    DAEMON_LOG=$LOGDIR/containerd.log
    BRIDGE=inferops-cri-${NODE#node-}
    SUBNET=10.247.$N.0/24
    GATEWAY=10.247.$N.1
    NETWORK=inferops-cri-$NODE
    IPAM_DIR=$LIB/cni/networks
}

ctr_node() { ctr --address "$SOCK" --namespace k8s.io "$@"; }

daemon_pid() {   # the pid of this node's containerd, when it runs
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null || true)
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -F -- "--config $CONFIG" >/dev/null || return 1
    printf '%s\n' "$pid"
}

answers() { timeout 10 ctr --address "$SOCK" version >/dev/null 2>&1; }

cri_ready() {   # the CRI plugin loaded (a containerd without it answers too)
    timeout 10 ctr --address "$SOCK" plugins ls 2>/dev/null |
        awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" && $NF == "ok" { found = 1 } END { exit !found }'
}

# ---------------------------------------------------------------------------------------------- install
cmd_install() {
    local missing=() p
    for p in containerd containernetworking-plugins runc iptables iproute2 gcc libc6-dev; do
        [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" == installed ]] || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "installing: ${missing[*]}"
        local out
        out=$(apt-get update -q 2>&1) || die "apt-get update failed" "check the host's apt sources" "$(tail -n 5 <<<"$out")"
        out=$(apt-get install -y -q --no-install-recommends "${missing[@]}" 2>&1) ||
            die "apt-get install ${missing[*]} failed" "$(tail -n 8 <<<"$out")"
    fi
    local version
    version=$(containerd --version | awk '{ print $3 }')
    [[ $version =~ ^v?1\.[6-9] ]] || die "containerd $version: the test nodes need 1.6 or 1.7 (config version 2)"
    for p in "${CNI_PLUGINS[@]}"; do
        [[ -x $CNI_BIN/$p ]] || die "$CNI_BIN/$p missing" "install the Debian package containernetworking-plugins"
    done
    command -v containerd-shim-runc-v2 >/dev/null || die "containerd-shim-runc-v2 missing (Debian's containerd has it)"
    [[ -x $RUNC ]] || die "$RUNC missing" "install the Debian package runc"
    pause_tarball >/dev/null
    log "containerd $version, runc $($RUNC --version | awk 'NR == 1 { print $3 }'), CNI plugins in $CNI_BIN, pause image built"
}

# The sandbox image: a static pause program in a one-layer image, as a docker-archive tarball for
# `ctr images import` (rebuilt only when its source changes). Prints the tarball's path.
pause_tarball() {
    local dir=$LIB_BASE/images tag digest
    mkdir -p "$dir"
    digest=$(sha256sum "$PAUSE_SOURCE" | cut -c1-16)
    tag=$dir/pause-$digest.tar
    if [[ ! -s $tag ]]; then
        local work
        work=$(mktemp -d "$dir/.pause.XXXXXX")
        gcc -Os -static -s -o "$work/pause" "$PAUSE_SOURCE" || { rm -rf "$work"; die "cannot compile $PAUSE_SOURCE"; }
        python3 - "$work" "$PAUSE_IMAGE" <<'PY' || { rm -rf "$work"; die "cannot write the pause image"; }
import hashlib, io, json, os, sys, tarfile
work, name = sys.argv[1], sys.argv[2]
def tar_bytes(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, data, mode in members:
            info = tarfile.TarInfo(arcname)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, 0, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
layer = tar_bytes([("pause", open(os.path.join(work, "pause"), "rb").read(), 0o755)])
layer_id = hashlib.sha256(layer).hexdigest()
config = json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_id]},
    "history": [{"created_by": "scripts/env/cri-pause.c, gcc -static"}],
}, sort_keys=True).encode()
config_id = hashlib.sha256(config).hexdigest()
short = name.split("/", 1)[1] if name.startswith("docker.io/") else name
manifest = json.dumps([{"Config": config_id + ".json", "RepoTags": [short],
                        "Layers": [layer_id + "/layer.tar"]}]).encode()
archive = tar_bytes([(config_id + ".json", config, 0o644), (layer_id + "/layer.tar", layer, 0o644),
                     ("manifest.json", manifest, 0o644)])
open(os.path.join(work, "image.tar"), "wb").write(archive)
PY
        mv "$work/image.tar" "$tag"
        rm -rf "$work"
        find "$dir" -maxdepth 1 -name 'pause-*.tar' ! -name "${tag##*/}" -delete
    fi
    printf '%s\n' "$tag"
}

# ---------------------------------------------------------------------------------------------- config
write_if_changed() {   # $1: path, stdin: content; prints "changed" when it wrote
    local path=$1 tmp
    mkdir -p "$(dirname "$path")"
    tmp=$(mktemp "$path.XXXXXX")
    cat >"$tmp"
    chmod 0644 "$tmp"
    if cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$path"
        echo changed
    fi
}

overlay_works() {   # overlayfs on the filesystem that holds the node's root
    local probe rc=1
    mkdir -p "$LIB"
    probe=$(mktemp -d "$LIB/.overlay-probe.XXXXXX")
    mkdir -p "$probe"/{lower,upper,work,merged}
    if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
        "$probe/merged" 2>/dev/null; then
        umount "$probe/merged" && rc=0
    fi
    rm -rf "$probe"
    return $rc
}

snapshotter() {   # kept once chosen: images unpacked for one snapshotter are not there for another
    local chosen=$LIB/snapshotter
    if [[ ! -s $chosen ]]; then
        mkdir -p "$LIB"
        if overlay_works; then echo overlayfs >"$chosen"; else echo native >"$chosen"; fi
    fi
    cat "$chosen"
}

write_config() {   # prints "changed" when the daemon's config (or a file it reads at start) changed
    local snap changed=""
    snap=$(snapshotter)
    mkdir -p "$ETC/conf.d" "$RUN" "$LIB" "$LOGDIR/pods" "$LIB/kubelet" "$IPAM_DIR" "$SHARED_STORE"
    chmod 0700 "$LIB_BASE" "$SHARED_STORE"
    changed+=$(write_if_changed "$CONFIG" <<EOF
# containerd of the CRI test node $NODE (scripts/env/cri-node.sh writes it; drop-ins go to conf.d/).
version = 2
root = "$ROOT"
state = "$STATE"
oom_score = 0
# Drop-ins, e.g. a runtime handler: containerd 1.6 merges each imported file into this one.
imports = ["$ETC/conf.d/*.toml"]
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  level = "info"

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$LIB/opt"

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    disable_apparmor = true
    netns_mounts_under_state_dir = true
    # Not below containerd's own score: this machine's root lacks CAP_SYS_RESOURCE, and runc cannot lower
    # a process's oom_score_adj (the sandbox's -998) without it ("failed to update /proc/self/oom_score_adj")
    restrict_oom_score_adj = true
    max_container_log_line_size = 16384

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$CNI_BIN"
      conf_dir = "$ETC/net.d"
      max_conf_num = 1

    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "$snap"
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "$RUNC"
          # runc's root is this + "/<namespace>": $RUNC_ROOT/k8s.io
          Root = "$RUNC_ROOT"
          SystemdCgroup = false

    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "$ETC/certs.d"
EOF
)
    local host
    for host in docker.io _default; do
        changed+=$(write_if_changed "$ETC/certs.d/$host/hosts.toml" <<EOF
# No registry is reachable from the test machine: every pull goes to the discard port of this machine and is
# refused at once (the daemon's HTTP(S)_PROXY says the same for any other host).
server = "$NO_REGISTRY"

# (containerd 1.6 rejects a hosts.toml without a host table: "invalid \`host\` tree")
[host."$NO_REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF
)
    done
    changed+=$(write_if_changed "$ETC/net.d/10-$NETWORK.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$IPAM_DIR",
        "ranges": [[{"subnet": "$SUBNET", "rangeStart": "10.247.$N.10", "rangeEnd": "10.247.$N.250",
                     "gateway": "$GATEWAY"}]]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
)
    [[ -n $changed ]] && echo changed
    return 0
}

# The node's bridge exists before the first pod (the CNI bridge plugin would make it, but without the host's
# address: isGateway is off so that pods get no default route) and carries the node's address.
ensure_network() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$GATEWAY/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    ip route show type unreachable | grep "^unreachable $SUPERNET" >/dev/null || ip route add unreachable "$SUPERNET"
}

# ---------------------------------------------------------------------------------------------- start / stop
start_daemon() {
    mkdir -p "$RUN" "$LOGDIR"
    rm -f "$SOCK" "$SOCK.ttrpc"
    # the log's length before this daemon writes to it (its redirection is opened in the background: a first start
    # found no log yet); the lines after it are this start's
    local since
    touch "$DAEMON_LOG"
    since=$(wc -l <"$DAEMON_LOG")
    # HTTP(S)_PROXY: a pull the registry hosts above do not cover goes nowhere either.
    env -i PATH="$DAEMON_PATH" HOME=/root LANG=C.UTF-8 \
        HTTP_PROXY="$NO_REGISTRY" HTTPS_PROXY="$NO_REGISTRY" NO_PROXY="" \
        setsid containerd --config "$CONFIG" >>"$DAEMON_LOG" 2>&1 </dev/null 9>&- &
    local pid=$!
    echo "$pid" >"$PIDFILE"
    local t=$SECONDS failed
    while ((SECONDS - t < START_WAIT_S)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            die "containerd of $NODE exited at start" "last lines of $DAEMON_LOG:" "$(tail -n 15 "$DAEMON_LOG")"
        fi
        failed=$(tail -n "+$((since + 1))" "$DAEMON_LOG" | grep -F 'failed to load plugin io.containerd.grpc.v1.cri' || true)
        if [[ -n $failed ]]; then
            stop_daemon
            die "containerd of $NODE started without its CRI plugin (see $CONFIG and conf.d/):" "$failed"
        fi
        if answers && cri_ready; then return 0; fi
        sleep 0.2
    done
    stop_daemon
    die "containerd of $NODE did not answer with its CRI plugin within ${START_WAIT_S}s" "$(tail -n 15 "$DAEMON_LOG")"
}

stop_daemon() {
    local pid t
    pid=$(daemon_pid) || return 0
    kill -TERM "$pid" 2>/dev/null || true
    t=$SECONDS
    while kill -0 "$pid" 2>/dev/null && ((SECONDS - t < 20)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    rm -f "$PIDFILE"
}

ensure_pause_image() {
    if ! ctr_node images check "name==$PAUSE_IMAGE" 2>/dev/null | grep "complete" >/dev/null; then
        local tarball
        tarball=$(pause_tarball)
        ctr_node images import --snapshotter "$(snapshotter)" "$tarball" >/dev/null ||
            die "cannot import the pause image into $NODE"
        log "$NODE: imported $PAUSE_IMAGE"
    fi
}

start_node() {
    node_vars "$1"
    local changed pid
    changed=$(write_config)
    ensure_network
    if pid=$(daemon_pid); then
        if [[ -n $changed ]]; then
            log "$NODE: config changed, restarting containerd (pid $pid; its pods keep running)"
            stop_daemon
        elif answers && cri_ready; then
            ensure_pause_image
            log "$NODE: running (pid $pid, $SOCK)"
            return 0
        else
            log "$NODE: containerd (pid $pid) does not answer: cleaning it up"
            down_node "$NODE"
            node_vars "$1"
            write_config >/dev/null
            ensure_network
        fi
    fi
    start_daemon
    ensure_pause_image
    log "$NODE: started (pid $(daemon_pid), $SOCK)"
}

# Everything of a node that runs or is mounted goes, even when its containerd was killed: its containers'
# processes (its cgroups, and any process whose root is one of its bundles), the shims that serve it, mounts
# below its root and state, network namespaces, the veths on its bridge and the bridge, IPAM leases, portmap
# rules. Its images, content and config stay.
down_node() {
    node_vars "$1"
    if daemon_pid >/dev/null && answers; then
        local task
        for task in $(ctr_node tasks ls -q 2>/dev/null || true); do
            ctr_node tasks kill --all --signal SIGKILL "$task" >/dev/null 2>&1 || true
        done
    fi
    stop_daemon
    local pid
    for _ in $(seq 50); do   # SIGKILL takes effect when the task next runs: a loaded machine needs a moment
        for pid in $(node_pids); do kill -KILL "$pid" 2>/dev/null || true; done
        [[ -z $(node_pids) ]] && break
        sleep 0.2
    done
    [[ -z $(node_pids) ]] || die "processes of $NODE survive SIGKILL: $(node_pids | xargs)"
    unmount_below "$STATE" "$ROOT" "$RUN"
    remove_cgroups
    local veth
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        for veth in $(ip -o link show master "$BRIDGE" | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
            ip link del "$veth" 2>/dev/null || true
        done
        ip link del "$BRIDGE"
    fi
    remove_portmap_rules
    rm -rf --one-file-system "$STATE" "$RUNC_ROOT" "$IPAM_DIR" "$SOCK" "$SOCK.ttrpc"
    rm -f /var/lib/cni/results/"$NETWORK"-* 2>/dev/null || true
    local other any=0
    for other in /sys/class/net/inferops-cri-?; do
        [[ -e $other ]] && any=1
    done
    ((any)) || ip route del unreachable "$SUPERNET" 2>/dev/null || true
    log "$NODE: down"
}

node_pids() {   # processes of this node: shims serving its socket, its containers (cgroup and root); one pass each
    {
        pgrep -f -- "containerd-shim.* -address $SOCK( |\$)" || true
        grep -lE ":/$CGROUP_BASE/$NODE(/|\$)" /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3 || true
        find /proc/[0-9]*/root -maxdepth 0 -lname "$STATE/*" 2>/dev/null | cut -d/ -f3 || true
    } | { grep -vx -e "$$" -e "$BASHPID" || true; } | sort -un | while read -r pid; do
        # a zombie is dead already (its parent, a killed shim, is gone too): nothing of it is left to kill
        [[ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" == Z ]] || echo "$pid"
    done
}

unmount_below() {   # every mount below the given directories, deepest first
    local dir mnt
    for dir in "$@"; do
        awk -v p="$dir/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r | uniq |
            while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
    done
}

remove_cgroups() {   # the node's pod cgroups, in every hierarchy, deepest first
    local top
    for top in /sys/fs/cgroup/*/"$CGROUP_BASE"/"$NODE" /sys/fs/cgroup/"$CGROUP_BASE"/"$NODE"; do
        [[ -d $top ]] || continue
        find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    for top in /sys/fs/cgroup/*/"$CGROUP_BASE" /sys/fs/cgroup/"$CGROUP_BASE"; do
        if [[ -d $top ]]; then rmdir "$top" 2>/dev/null || true; fi
    done
    return 0
}

remove_portmap_rules() {   # the portmap plugin's DNAT rules of this node's network (hostPort pods)
    command -v iptables-save >/dev/null || return 0
    local rule chain rules
    rules=$(iptables-save -t nat 2>/dev/null | grep -F -- "\"$NETWORK\"" | grep '^-A ' || true)
    [[ -n $rules ]] || return 0
    while read -r rule; do
        chain=$(awk '{ for (i = 1; i < NF; i++) if ($i == "-j") print $(i + 1) }' <<<"$rule")
        eval "iptables -t nat ${rule/-A /-D }" 2>/dev/null || true
        if [[ $chain == CNI-DN-* ]]; then
            iptables -t nat -F "$chain" 2>/dev/null || true
            iptables -t nat -X "$chain" 2>/dev/null || true
        fi
    done <<<"$rules"
    return 0
}

# ---------------------------------------------------------------------------------------------- images
# docker save IMAGE once into a tarball named by its image id, imported into each node that lacks that id.
cmd_import() {
    local image=$1 id tarball dir=$LIB_BASE/images
    shift
    id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null) ||
        die "docker has no image $image" "build it first (scripts/build-workload-image.sh)"
    mkdir -p "$dir"
    tarball=$dir/$(tr '/:' '__' <<<"$image")-${id#sha256:}.tar
    local node marker
    for node in "$@"; do
        node_vars "$node"
        marker=$LIB/images/$(tr '/:' '__' <<<"$image")
        if [[ "$(cat "$marker" 2>/dev/null)" == "$id" ]] && ctr_node images ls -q | grep -xF "$(normalized "$image")" >/dev/null; then
            continue
        fi
        answers || die "$node is not running: start it first"
        if [[ ! -s $tarball ]]; then
            find "$dir" -maxdepth 1 -name "$(tr '/:' '__' <<<"$image")-*.tar" -delete
            docker save "$image" -o "$tarball.tmp" && mv "$tarball.tmp" "$tarball"
        fi
        ctr_node images import --snapshotter "$(snapshotter)" "$tarball" >/dev/null ||
            die "ctr images import of $image into $node failed"
        mkdir -p "$(dirname "$marker")"
        echo "$id" >"$marker"
        log "$node: imported $image ($id)"
    done
}

normalized() {   # the name containerd's CRI gives an image reference
    local ref=$1 first=${1%%/*}
    [[ $ref == */* ]] || ref=library/$ref
    if [[ $ref != */* || ( $first != *.* && $first != *:* && $first != localhost ) ]]; then ref=docker.io/$ref; fi
    [[ ${ref##*/} == *:* || $ref == *@* ]] || ref=$ref:latest
    printf '%s\n' "$ref"
}

# ---------------------------------------------------------------------------------------------- status
cmd_status() {
    local node pid first=1
    printf '{'
    for node in "$@"; do
        node_vars "$node"
        pid=$(daemon_pid || true)
        local running=false
        [[ -n $pid ]] && answers && cri_ready && running=true
        ((first)) || printf ','
        first=0
        printf '"%s": {"running": %s, "pid": %s, "socket": "%s", "config": "%s", "conf_d": "%s", "root": "%s", ' \
            "$NODE" "$running" "${pid:-null}" "$SOCK" "$CONFIG" "$ETC/conf.d" "$ROOT"
        printf '"state": "%s", "runc_root": "%s", "bridge": "%s", "subnet": "%s", "gateway": "%s", ' \
            "$STATE" "$RUNC_ROOT/k8s.io" "$BRIDGE" "$SUBNET" "$GATEWAY"
        printf '"network": "%s", "kubelet_root": "%s", "log_dir": "%s", "cgroup_parent": "/%s/%s", ' \
            "$NETWORK" "$LIB/kubelet" "$LOGDIR/pods" "$CGROUP_BASE" "$NODE"
        printf '"snapshotter": "%s", "sandbox_image": "%s", "snapshot_store": "%s", "daemon_log": "%s"}' \
            "$(cat "$LIB/snapshotter" 2>/dev/null || echo unknown)" "$PAUSE_IMAGE" "$SHARED_STORE" "$DAEMON_LOG"
    done
    printf '}\n'
}

# ---------------------------------------------------------------------------------------------- main
with_lock() {   # one change of the nodes at a time (two pytest workers start them at once)
    mkdir -p "$RUN_BASE"
    exec 9>"$RUN_BASE/.lock"
    flock 9
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
        install) cmd_install ;;
        start | restart | down)
            (($#)) || set -- "${ALL_NODES[@]}"
            with_lock
            local node
            for node in "$@"; do
                case $cmd in
                    start) start_node "$node" ;;
                    restart) node_vars "$node"; write_config >/dev/null; stop_daemon; start_node "$node" ;;
                    down) down_node "$node" ;;
                esac
            done
            ;;
        import)
            (($#)) || die "usage: cri-node.sh import IMAGE [NODE...]"
            local image=$1
            shift
            (($#)) || set -- "${ALL_NODES[@]}"
            with_lock
            cmd_import "$image" "$@"
            ;;
        status)
            (($#)) || set -- "${ALL_NODES[@]}"
            cmd_status "$@"
            ;;
        *) die "usage: cri-node.sh install|start|restart|down|import|status [NODE...]" ;;
    esac
}

main "$@"

#!/usr/bin/env bash
# inferops.snapshot — end-to-end smoke test of the host environment (dev tool, not a test-suite
# member). Needs what scripts/env/setup.sh provides; run as root:  bash scripts/env/smoke.sh
#
# A container from inferops/base:bookworm (host network) serves HTTP from one python3 process that
# keeps an in-memory counter (plus SMOKE_MEM_MB of ballast, so there is memory to dump):
#   (a) docker checkpoint create --leave-running, then restore into a NEW container
#       (checkpoint copied into its checkpoints/ dir, docker start --checkpoint); the counter must be
#       the value it had at checkpoint time, not the later one.
#   (b) the fast path: runc --root <moby runc root> checkpoint --leave-running --image-path DIR <id>,
#       timed; the images are then restored into another new container (docker start --checkpoint)
#       to prove they are usable.
#   (c) restore on create, only when the snapshot_node role's runtime is registered (`make demo`
#       registers it; docs/restore-on-create.md) and the collection's tooling is built (`make venv
#       collection`): a snapshot of (b)'s container with the collection's host_checkpoint module,
#       below the runtime's first snapshot root, then
#       docker run --runtime inferops-restore -e INFEROPS_RESTORE_FROM=<snapshot>; the runtime must
#       record the container as restored in the snapshot's status record.
# Containers and the snapshot it made are removed on exit, failure included. Prints timings.
#
# Knobs: SMOKE_MEM_MB (default 64), SMOKE_KEEP=1 (keep the work dir), SMOKE_RUNTIME (default
# inferops-restore), SMOKE_RUNC_ROOT (default /var/run/docker/runtime-runc/moby).
set -Eeuo pipefail

IMAGE=${INFEROPS_BASE_IMAGE:-inferops/base:bookworm}
MEM_MB=${SMOKE_MEM_MB:-64}
RUNC_ROOT=${SMOKE_RUNC_ROOT:-/var/run/docker/runtime-runc/moby}
RUNTIME=${SMOKE_RUNTIME:-inferops-restore}
for _d in /usr/local/bin /usr/local/sbin; do [[ ":$PATH:" == *":$_d:"* ]] || PATH="$_d:$PATH"; done
for _d in /usr/sbin /sbin; do [[ ":$PATH:" == *":$_d:"* ]] || PATH="$PATH:$_d"; done
export PATH

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PREFIX=inferops-smoke-$$
CONTAINERS=()
WORK=$(mktemp -d /var/tmp/inferops-smoke.XXXXXX)
SNAP_TOP=""   # (c)'s snapshot tree below the runtime's root (a directory of its own), removed on exit
declare -A TIMES=()

msg() { printf '[smoke] %s\n' "$*"; }
fail() {
    printf '[smoke] FAIL: %s\n' "$*" >&2
    exit 1
}
cleanup() {
    local rc=$? c
    for c in "${CONTAINERS[@]}"; do
        if ((rc != 0)) && docker inspect "$c" >/dev/null 2>&1; then
            printf '[smoke] --- docker logs %s (last lines) ---\n' "$c" >&2
            docker logs --tail 5 "$c" 2>&1 | sed 's/^/    /' >&2 || true
        fi
        docker rm -f "$c" >/dev/null 2>&1 || true
    done
    if [[ -n $SNAP_TOP && -d $SNAP_TOP ]]; then
        rm -rf --one-file-system "$SNAP_TOP"
    fi
    if [[ ${SMOKE_KEEP:-0} == 1 || $rc -ne 0 ]]; then
        printf '[smoke] work dir kept: %s\n' "$WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'printf "[smoke] FAIL: line %s: %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

ms_now() { date +%s%N; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# --- preconditions -------------------------------------------------------------------------
docker info >/dev/null 2>&1 || fail "docker does not answer: run scripts/env/setup.sh"
[[ $(docker info --format '{{.ExperimentalBuild}}') == true ]] || fail "dockerd is not experimental"
docker image inspect "$IMAGE" >/dev/null 2>&1 || fail "image $IMAGE missing: run scripts/env/setup.sh"
command -v criu >/dev/null || fail "criu not on PATH: run scripts/env/setup.sh"
DOCKER_ROOT=$(docker info --format '{{.DockerRootDir}}')
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

SERVER='
import http.server, os, signal, sys
port, mem = int(sys.argv[1]), int(sys.argv[2])
ballast = bytearray(os.urandom(1 << 20)) * mem      # touched, non-zero memory for CRIU to dump
state = {"n": 0}
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/inc":
            state["n"] += 1
            print("inc", state["n"], flush=True)
        body = ("%d\n" % state["n"]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer.allow_reuse_address = True
srv = http.server.HTTPServer(("127.0.0.1", port), H)
print("serving on", port, "pid", os.getpid(), "ballast MB", mem, flush=True)
srv.serve_forever()
'

server_args() { ARGS=(python3 -c "$SERVER" "$PORT" "$MEM_MB"); }
http() { curl -sf --max-time 2 "http://127.0.0.1:$PORT/$1"; }
wait_http() {   # wait until /get answers; echo the answer
    local t=$SECONDS out
    while ((SECONDS - t < 20)); do
        if out=$(curl -sf --max-time 1 "http://127.0.0.1:$PORT/get" 2>/dev/null); then
            echo "$out"
            return 0
        fi
        sleep 0.01
    done
    return 1
}
expect() {   # expect <what> <got> <want>
    [[ $2 == "$3" ]] || fail "$1: got '$2', expected '$3'"
}
new_container() {   # new_container <suffix> [docker create options...]; sets CID (full id)
    local name=$PREFIX-$1
    shift
    CONTAINERS+=("$name")   # registered before creation: cleanup removes it whatever happens
    server_args
    CID=$(docker create --name "$name" --network host "$@" "$IMAGE" "${ARGS[@]}")
}
start_from_checkpoint() {   # start_from_checkpoint <container> <checkpoint name>; retries once
    local out
    if out=$(docker start --checkpoint "$2" "$1" 2>&1); then return 0; fi
    if [[ $out == *"already exists"* ]]; then
        msg "docker start --checkpoint hit the containerd content-store race ($out); retrying once"
        out=$(docker start --checkpoint "$2" "$1" 2>&1) && return 0
    fi
    fail "docker start --checkpoint $2 $1: $out"
}
copy_checkpoint() {   # copy_checkpoint <src dir> <container id> <name>
    local dest=$DOCKER_ROOT/containers/$2/checkpoints
    mkdir -p "$dest"
    cp -a "$1" "$dest/$3"
}

msg "criu $(criu --version | awk '/^Version:/ {print $2}'), docker $(docker version --format '{{.Server.Version}}'), $(docker info --format '{{.Driver}}') storage, kernel $(uname -r), ballast ${MEM_MB} MB, port $PORT"

# --- start the original --------------------------------------------------------------------
new_container orig
id1=$CID
t=$(ms_now)
docker start "$id1" >/dev/null
wait_http >/dev/null || fail "the server in $PREFIX-orig did not answer within 20 s"
TIMES["cold start to first answer"]=$(ms_since "$t")
for _ in 1 2 3; do http inc >/dev/null; done
expect "counter before checkpoint" "$(http get)" 3

# --- (a) docker checkpoint -> new container ------------------------------------------------
msg "(a) docker checkpoint create --leave-running"
t=$(ms_now)
docker checkpoint create --leave-running "$id1" cp-a >/dev/null
TIMES["(a) docker checkpoint create"]=$(ms_since "$t")
CP_A=$DOCKER_ROOT/containers/$id1/checkpoints/cp-a
[[ -f $CP_A/inventory.img ]] || fail "no CRIU images in $CP_A"
SIZE_A=$(du -sm "$CP_A" | cut -f1)
expect "original still serving after checkpoint (inc)" "$(http inc)" 4
cp -a "$CP_A" "$WORK/cp-a"       # 'docker rm' of the original deletes its checkpoints/ too
CP_A=$WORK/cp-a
docker rm -f "$id1" >/dev/null   # frees the port: the restored process binds the same one

new_container a-restored
id2=$CID
copy_checkpoint "$CP_A" "$id2" cp-a
msg "(a) docker start --checkpoint cp-a into new container $PREFIX-a-restored"
t=$(ms_now)
start_from_checkpoint "$id2" cp-a
TIMES["(a) docker start --checkpoint returned"]=$(ms_since "$t")
got=$(wait_http) || fail "restored container did not answer"
TIMES["(a) restore to first answer"]=$(ms_since "$t")
expect "(a) counter restored from checkpoint" "$got" 3
expect "(a) restored process keeps counting" "$(http inc)" 4
sleep 0.2
docker logs "$id2" 2>&1 | grep -qx 'inc 4' || fail "(a) restored process output did not reach docker logs"
msg "(a) ok: counter 3 restored (original had moved on to 4), docker logs wired"

# --- (b) runc fast path ----------------------------------------------------------------------
CP_B=$WORK/fast
msg "(b) runc --root $RUNC_ROOT checkpoint --leave-running --image-path $CP_B <id>"
t=$(ms_now)
runc --root "$RUNC_ROOT" checkpoint --leave-running --image-path "$CP_B" "$id2" ||
    fail "(b) runc checkpoint failed; CRIU log: $CP_B/dump.log"
TIMES["(b) runc checkpoint (fast path)"]=$(ms_since "$t")
SIZE_B=$(du -sm "$CP_B" | cut -f1)
expect "(b) container still serving after runc checkpoint (inc)" "$(http inc)" 5
[[ $(docker inspect -f '{{.State.Status}}' "$id2") == running ]] || fail "(b) docker no longer sees the container running"
docker rm -f "$id2" >/dev/null

new_container b-restored
id3=$CID
copy_checkpoint "$CP_B" "$id3" cp-b
t=$(ms_now)
start_from_checkpoint "$id3" cp-b
got=$(wait_http) || fail "(b) container restored from the runc images did not answer"
TIMES["(b) docker start --checkpoint (runc images) to first answer"]=$(ms_since "$t")
expect "(b) counter restored from the runc images" "$got" 4
msg "(b) ok: runc images restore through docker (counter 4)"

# --- (c) restore on create with the collection's runtime (optional) -------------------------------
# Which runtime is registered under $RUNTIME, and is it the snapshot_node role's (its shim names the
# restore path's directory, which holds runtime.json)?
roc_skip=""
RT_PATH=$(docker info --format '{{json .Runtimes}}' |
    python3 -c 'import json, sys; print((json.load(sys.stdin).get(sys.argv[1]) or {}).get("path", ""))' "$RUNTIME")
RT_LIB=""
[[ -n $RT_PATH && -f $RT_PATH ]] && RT_LIB=$(sed -n "s/^LIB=//p" "$RT_PATH" | tr -d "'\"")
if [[ -z $RT_PATH ]]; then
    roc_skip="runtime '$RUNTIME' is not registered with dockerd (make demo registers it)"
elif [[ -z $RT_LIB || ! -f $RT_LIB/runtime.json ]]; then
    roc_skip="runtime '$RUNTIME' ($RT_PATH) is not the snapshot_node role's runtime; apply the role (make demo does)"
elif [[ ! -x $REPO/.venv/bin/ansible || ! -e $REPO/build/collections/ansible_collections/inferops/snapshot ]]; then
    roc_skip="the collection's tooling is missing (make venv collection)"
else
    ROOT=$(python3 -c 'import json, sys; print((json.load(open(sys.argv[1])).get("snapshot_roots") or [""])[0])' \
        "$RT_LIB/runtime.json")
    [[ $ROOT == /* ]] || roc_skip="runtime '$RUNTIME' has no snapshot root ($RT_LIB/runtime.json)"
fi
if [[ -z $roc_skip ]]; then
    POD=$PREFIX-c
    SNAP_TOP=$ROOT/$PREFIX           # a namespace of its own: nothing else lives below it
    SNAP=$SNAP_TOP/smoke/p0/$POD
    IMAGE_ID=$(docker inspect --format '{{.Image}}' "$id3")
    msg "(c) host_checkpoint of $PREFIX-b-restored -> $SNAP (the collection's module, no device part)"
    expect "(c) counter before the snapshot" "$(http get)" 4
    args=$(python3 -c 'import json, sys; print(json.dumps({"container": sys.argv[1], "snapshot_dir": sys.argv[2],
        "identity": {"namespace": sys.argv[3], "service": "smoke", "instance": "p0", "pod": sys.argv[4]},
        "require_device_part": False}))' "$id3" "$SNAP" "$PREFIX" "$POD")
    t=$(ms_now)
    out=$(ANSIBLE_COLLECTIONS_PATH=$REPO/build/collections ANSIBLE_LOCALHOST_WARNING=False ANSIBLE_NOCOLOR=1 \
        "$REPO/.venv/bin/ansible" localhost -i localhost, -c local -e "ansible_python_interpreter=$REPO/.venv/bin/python" \
        -m inferops.snapshot.host_checkpoint -a "$args" 2>&1) || fail "(c) host_checkpoint failed: ${out: -3000}"
    TIMES["(c) host_checkpoint (ansible module call)"]=$(ms_since "$t")
    [[ -f $SNAP/manifest.json ]] || fail "(c) no snapshot published at $SNAP: ${out: -3000}"
    expect "(c) container still serving after the snapshot (inc)" "$(http inc)" 5
    docker rm -f "$id3" >/dev/null

    CONTAINERS+=("$PREFIX-c-roc")
    server_args
    t=$(ms_now)
    roc_id=$(docker run -d --name "$PREFIX-c-roc" --network host --runtime "$RUNTIME" \
        -e INFEROPS_RESTORE_FROM="$SNAP" "$IMAGE_ID" "${ARGS[@]}")
    TIMES["(c) docker run --runtime $RUNTIME returned"]=$(ms_since "$t")
    got=$(wait_http) || fail "(c) restore-on-create container did not answer"
    TIMES["(c) restore on create to first answer"]=$(ms_since "$t")
    outcome=$(python3 -c 'import json, sys
r = (json.load(open(sys.argv[1])).get("last_restore") or {})
print(": ".join(x for x in (r.get("outcome") if r.get("container") == sys.argv[2] else "no record of this container",
                            r.get("reason")) if x))' \
        "$(dirname "$SNAP")/.$POD.status.json" "$roc_id" 2>&1) || outcome="no status record: $outcome"
    [[ $outcome == restored ]] || fail "(c) the runtime did not restore the container: $outcome (log: /var/log/inferops-restore-runtime.log)"
    expect "(c) counter restored on create" "$got" 4
    expect "(c) restored process keeps counting" "$(http inc)" 5
    sleep 0.2
    docker logs "$PREFIX-c-roc" 2>&1 | grep -qx 'inc 5' || fail "(c) output did not reach docker logs"
    t=$(ms_now)
    docker stop -t 5 "$PREFIX-c-roc" >/dev/null
    TIMES["(c) docker stop"]=$(ms_since "$t")
    expect "(c) exit code after docker stop" "$(docker inspect -f '{{.State.ExitCode}}' "$PREFIX-c-roc")" 0
    msg "(c) ok: docker run --runtime $RUNTIME restored the process (counter 4), status record says restored, logs and stop work"
else
    docker rm -f "$id3" >/dev/null
    msg "(c) skipped: $roc_skip"
fi

# --- summary ---------------------------------------------------------------------------------
msg "checkpoint sizes: docker ${SIZE_A} MB, runc ${SIZE_B} MB"
for k in "cold start to first answer" "(a) docker checkpoint create" \
    "(a) docker start --checkpoint returned" "(a) restore to first answer" \
    "(b) runc checkpoint (fast path)" "(b) docker start --checkpoint (runc images) to first answer" \
    "(c) host_checkpoint (ansible module call)" "(c) docker run --runtime $RUNTIME returned" \
    "(c) restore on create to first answer" "(c) docker stop"; do
    [[ -n ${TIMES[$k]:-} ]] && printf '[smoke]   %-62s %6s ms\n' "$k" "${TIMES[$k]}"
done
msg "PASS"

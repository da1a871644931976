#!/usr/bin/env bash
# PROTOTYPE: install scripts/env/prototype/inferops-restore-runc as /usr/local/bin/inferops-restore-runc
# and register it in /etc/docker/daemon.json as the Docker runtime "inferops-restore" (other keys
# are kept); dockerd reloads "runtimes" on SIGHUP, no restart needed.
#   bash scripts/env/prototype/install.sh            # install + register
#   bash scripts/env/prototype/install.sh --remove   # unregister + remove
set -euo pipefail
NAME=${INFEROPS_RESTORE_RUNTIME:-inferops-restore}
DEST=/usr/local/bin/inferops-restore-runc
DAEMON_JSON=/etc/docker/daemon.json
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
remove=0; [[ ${1:-} == --remove ]] && remove=1

if ((remove)); then rm -f "$DEST"; else install -m 0755 "$here/inferops-restore-runc" "$DEST"; fi
change=$(/usr/bin/python3 - "$DAEMON_JSON" "$NAME" "$DEST" "$remove" <<'PY'
import json, os, sys, tempfile
path, name, dest, remove = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
try:
    cur = json.load(open(path))
except FileNotFoundError:
    cur = {}
new = json.loads(json.dumps(cur))
rts = new.setdefault("runtimes", {})
if remove:
    rts.pop(name, None)
    if not rts:
        new.pop("runtimes")
else:
    rts[name] = {"path": dest}
if new == cur:
    print("unchanged"); sys.exit(0)
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".daemon.json.")
with os.fdopen(fd, "w") as f:
    json.dump(new, f, indent=2, sort_keys=True); f.write("\n")
os.chmod(tmp, 0o644); os.replace(tmp, path)
print("changed")
PY
)
if [[ $change == changed ]]; then
    pid=$(pgrep -x dockerd | head -n1 || true)
    if [[ -n $pid ]]; then
        kill -HUP "$pid"
        for _ in $(seq 50); do
            has=$(docker info --format '{{json .Runtimes}}' | grep -c "\"$NAME\"" || true)
            { ((remove)) && ((has == 0)); } || { ((!remove)) && ((has > 0)); } && break
            sleep 0.1
        done
    fi
fi
echo "runtimes: $(docker info --format '{{json .Runtimes}}' 2>/dev/null || echo '(dockerd not running)')"

"""Sample inference workload for the tests and the demo (stands in for a vLLM-Ascend engine).

It uses the ACL API (the simulator on these machines) the way an engine does: on start it warms up
-- loads "weights" into device memory, builds a host-side cache, "compiles" for the rest of the
warmup time -- then answers every prompt deterministically from device memory plus the cache. An
answer is right only if both the device memory and the host memory are what warmup made, so a
correct device + host restore is the only way to get the same answers back without a warmup.

Run it under the inferops agent so the modules can reach its snapshot state:
    python3 -m inferops_agent -- workload.py
Configuration is by environment (see CONFIG below). It honours VLLM_NPU_SNAPSHOT_PATH: when set,
the engine takes the device snapshot itself after warmup (lock + backup) and only then reports
ready, as the seed design's engine does. Its own HTTP control endpoint (POST /snapshot/<op>) is off
unless WORKLOAD_CONTROL_HTTP=1: on the host's network anyone on the node could reach it.

Randomness after a restore (docs/engines.md): every copy restored from one snapshot starts with the same state of
every generator in it. The agent re-seeds Python's global ``random`` itself; generators the engine owns it cannot
reach, so the engine registers a RESTORE_POST hook and re-seeds them from the restore's nonce -- ``sampler`` here,
standing in for a native sampler such as llama.cpp's. ``forgotten`` is one nobody re-seeds: every copy repeats
it. GET /v1/random shows all three and the nonce the hook got.
"""

import hashlib
import json
import os
import random
import signal
import sys
import threading
import time
import ctypes
import fcntl
import mmap
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

# The agent package the launcher runs from: the collection's binding, so the same library instance.
from inferops_agent import acl as _acl  # noqa: E402
from inferops_agent import launcher as _agent  # noqa: E402
from inferops_agent import protocol as _protocol  # noqa: E402

CONFIG = {
    "host": os.environ.get("WORKLOAD_HOST", "127.0.0.1"),
    "port": int(os.environ.get("WORKLOAD_PORT", "8000")),
    "warmup_seconds": float(os.environ.get("WORKLOAD_WARMUP_SECONDS", "5")),
    "device_bytes": int(float(os.environ.get("WORKLOAD_DEVICE_MB", "64")) * 1024 * 1024),
    "host_bytes": int(float(os.environ.get("WORKLOAD_HOST_MB", "16")) * 1024 * 1024),
    "device_id": int(os.environ.get("WORKLOAD_DEVICE_ID", "0")),
    "seed": os.environ.get("WORKLOAD_SEED", "inferops"),
    "stuck_background_thread": os.environ.get("WORKLOAD_STUCK_BACKGROUND_THREAD") == "1",
    "npu_snapshot_path": os.environ.get("VLLM_NPU_SNAPSHOT_PATH"),
    "metadata_file": os.environ.get("INFEROPS_METADATA_FILE", "/run/inferops-snapshot/metadata.json"),
    "library": os.environ.get(_agent.LIBRARY_ENV),
    # a directory for a cache the way SQLite in WAL mode keeps one (llama.cpp's disk cache): a database file and
    # its index, each with a POSIX read lock held, the index also mapped into memory
    "lock_dir": os.environ.get("WORKLOAD_LOCK_DIR"),
    # The engine's own HTTP control endpoint (POST /snapshot/<op>): off unless asked for. It carries no credentials,
    # and with --network host (the docs and the demo run engines that way) 127.0.0.1 is the node's: every process
    # of the node, of any user, and every host-networked pod could lock, back up or unlock the engine. The agent's
    # unix socket, which checks who asks (SO_PEERCRED), is the way in; turn this on only in a network of its own.
    "control_http": os.environ.get("WORKLOAD_CONTROL_HTTP") == "1",
    # a test's way to hold a restore between the restore path's first words to the agent and its device restore:
    # the first RESTORE_POST hook after a restore touches this file and takes this long
    "slow_restore_hook": os.environ.get("WORKLOAD_SLOW_RESTORE_HOOK"),
    "slow_restore_hook_seconds": float(os.environ.get("WORKLOAD_SLOW_RESTORE_HOOK_SECONDS", "0")),
}
CHUNK = 4 * 1024 * 1024
# Ready for traffic; after an engine-triggered device snapshot requests wait until the resume.
READY_PHASES = ("serving", "device_snapshot_taken")
WINDOW = 4096


def log(message):
    sys.stdout.write("[workload %d %.3f] %s\n" % (os.getpid(), time.time(), message))
    sys.stdout.flush()


class Engine:
    def __init__(self, config):
        self.config = config
        controller = _agent.current_controller()
        if controller is None:  # started without the agent: no remote control, but still serves
            controller = _agent.Controller.load(config["library"])
        if controller.runtime is None:
            raise SystemExit("workload: ACL runtime unavailable: %s" % controller.runtime_error)
        self.controller = controller
        self.acl = controller.runtime
        self.phase = "starting"
        self.started_at = time.time()
        self.ready_at = None
        self.error = None
        self.weights_ptr = None
        self.cache = None
        self.answers_served = 0
        self._thread_ctx = threading.local()
        self.locked = []  # (descriptor, mapping) kept open: closing either would drop the process's locks on it
        # The engine's own generators: a sampler it re-seeds after every restore, and one it forgot.
        self.sampler = random.Random(config["seed"])
        self.forgotten = random.Random(config["seed"])
        self.restore_nonce = None
        register = getattr(controller, "register_hook", None)  # an agent older than hooks has none
        if register is not None:
            register(_agent.RESTORE_POST, self.on_restore)

    def on_restore(self, nonce):
        """RESTORE_POST: this process was restored from a snapshot; ``nonce`` is this restore's own (the metadata
        file's restore_nonce). Short, and no device call: the engine is still locked."""
        self.restore_nonce = nonce
        self.sampler.seed(int(nonce, 16))
        log("restored: sampler re-seeded from the restore's nonce")
        if self.config["slow_restore_hook"] and not os.path.exists(self.config["slow_restore_hook"]):
            with open(self.config["slow_restore_hook"], "w") as handle:
                handle.write(nonce)
            time.sleep(self.config["slow_restore_hook_seconds"])

    def _bind_thread(self):
        """ACL contexts are per thread: every serving thread sets the device once."""
        if not getattr(self._thread_ctx, "bound", False):
            self.acl.set_device(self.config["device_id"])
            self._thread_ctx.bound = True

    # -- warmup ---------------------------------------------------------------------------------
    def warmup(self):
        began = time.monotonic()
        cfg = self.config
        self.phase = "loading_weights"
        self.acl.init()
        self.acl.set_device(cfg["device_id"])
        self._start_background_thread()
        self.weights_ptr = self.acl.malloc(cfg["device_bytes"])
        rng = random.Random(cfg["seed"])
        for offset in range(0, cfg["device_bytes"], CHUNK):
            size = min(CHUNK, cfg["device_bytes"] - offset)
            self.acl.memcpy_to_device(self.weights_ptr + offset, rng.randbytes(size))
        log("weights loaded: %d bytes on device %d" % (cfg["device_bytes"], cfg["device_id"]))
        self.phase = "building_cache"
        digest = hashlib.sha256(cfg["seed"].encode()).digest()
        blocks = []
        for _block in range(max(1, cfg["host_bytes"] // 32)):
            digest = hashlib.sha256(digest).digest()
            blocks.append(digest)
        self.cache = b"".join(blocks)
        self.controller.report(device_memory_bytes=cfg["device_bytes"], host_cache_bytes=len(self.cache),
                               model="inferops-sample")
        if cfg["lock_dir"]:
            self._lock_cache(cfg["lock_dir"])
        self.phase = "compiling"
        remaining = cfg["warmup_seconds"] - (time.monotonic() - began)
        while remaining > 0:
            log("warming up: %.1f s left" % remaining)
            time.sleep(min(1.0, remaining))
            remaining = cfg["warmup_seconds"] - (time.monotonic() - began)
        log("warmup done in %.2f s" % (time.monotonic() - began))
        if cfg["npu_snapshot_path"]:
            self._device_snapshot(cfg["npu_snapshot_path"])
        else:
            self.phase = "serving"
        self.ready_at = time.time()

    def _lock_cache(self, directory):
        """SQLite's shared locks: on the database (byte 1073741824 + 2, its SHARED range) and on its -shm index,
        which is also mapped (a lock CRIU drops when it closes the descriptor it maps the file through)."""
        for name, mapped in (("cache.db", False), ("cache.db-shm", True)):
            fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, 32768)
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 510, 1073741826 if not mapped else 120)
            self.locked.append((fd, mmap.mmap(fd, 32768) if mapped else None))
        log("holding read locks on %s/cache.db and cache.db-shm (mapped)" % directory)

    def _device_snapshot(self, path):
        """Engine-triggered device snapshot: lock + backup, record it, then report ready."""
        self.phase = "device_snapshot"
        for op in (_protocol.OP_LOCK, _protocol.OP_BACKUP):
            reply = self.controller.handle({"op": op, "timeout": 60})
            if not reply["ok"]:
                self.phase = "device_snapshot_failed"
                self.error = reply["error"]["message"]
                log("device snapshot failed: %s" % self.error)
                if self.controller.state != _protocol.STATE_RUNNING:
                    self.controller.handle({"op": _protocol.OP_UNLOCK, "timeout": 60})
                return
        os.makedirs(path, mode=0o700, exist_ok=True)
        record = {k: reply.get(k) for k in ("pid", "state", "devices", "runtime_version", "duration_s")}
        record["created_at"] = time.time()
        with open(os.path.join(path, "device-snapshot.json"), "w") as handle:
            json.dump(record, handle)
        log("device snapshot taken (state %s); waiting for the host snapshot and a resume" % reply["state"])
        self.phase = "device_snapshot_taken"

    def _start_background_thread(self):
        lib = getattr(self.acl, "lib", None)
        register = getattr(lib, "aclsimBackgroundThreadRegister", None)
        if register is None:
            return  # a real runtime manages its own background threads
        wait = lib.aclsimBackgroundThreadWaitIfLocked
        register.argtypes = wait.argtypes = [ctypes.c_char_p]
        name = b"workload-stream-poller"

        def poll():
            register(name)
            while True:
                if self.config["stuck_background_thread"]:
                    time.sleep(3600)  # never reaches a safe point: lock must time out
                wait(name)
                time.sleep(0.02)

        threading.Thread(target=poll, name="stream-poller", daemon=True).start()

    # -- serving --------------------------------------------------------------------------------
    def answer(self, prompt):
        self._bind_thread()
        h = hashlib.sha256(prompt.encode("utf-8")).digest()
        dev_offset = int.from_bytes(h[:8], "big") % (self.config["device_bytes"] - WINDOW)
        cache_offset = int.from_bytes(h[8:16], "big") % (len(self.cache) - WINDOW)
        device_window = self.acl.memcpy_from_device(self.weights_ptr + dev_offset, WINDOW)
        self.answers_served += 1
        return hashlib.sha256(h + device_window + self.cache[cache_offset:cache_offset + WINDOW]).hexdigest()

    def current_phase(self):
        if self.phase == "device_snapshot_taken" and self.controller.state == _protocol.STATE_RUNNING:
            self.phase = "serving"  # resumed after the host snapshot
        return self.phase

    def draws(self, count):
        """``count`` numbers from each generator: Python's global one, the engine's sampler, the forgotten one."""
        return {"global": [random.random() for _n in range(count)],
                "sampler": [self.sampler.random() for _n in range(count)],
                "forgotten": [self.forgotten.random() for _n in range(count)],
                "restore_nonce": self.restore_nonce, "pid": os.getpid()}

    def info(self):
        metadata = None
        try:
            with open(self.config["metadata_file"]) as handle:
                metadata = json.load(handle)
        except (OSError, ValueError):
            pass
        return {"pid": os.getpid(), "phase": self.current_phase(), "started_at": self.started_at, "ready_at": self.ready_at,
                "warmup_seconds": self.config["warmup_seconds"], "answers_served": self.answers_served,
                "snapshot_state": self.controller.state, "error": self.error, "metadata": metadata}


def make_handler(engine):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _send(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urlparse(self.path)
            if url.path == "/health":
                phase = engine.current_phase()
                ready = phase in READY_PHASES
                return self._send(200 if ready else 503, {"ready": ready, "phase": phase, "error": engine.error})
            if url.path == "/v1/info":
                return self._send(200, engine.info())
            if url.path == "/v1/random":
                return self._send(200, engine.draws(min(int(parse_qs(url.query).get("n", ["4"])[0]), 64)))
            if url.path == "/v1/generate":
                if engine.current_phase() not in READY_PHASES:
                    return self._send(503, {"error": "not ready: %s" % engine.phase})
                prompt = parse_qs(url.query).get("prompt", [""])[0]
                return self._send(200, {"prompt": prompt, "answer": engine.answer(prompt)})
            return self._send(404, {"error": "no such path"})

        def do_POST(self):
            # The engine's own HTTP control endpoint: /snapshot/<op>, same protocol as the agent.
            url = urlparse(self.path)
            op = url.path.rsplit("/", 1)[-1]
            if not url.path.startswith("/snapshot/"):
                return self._send(404, {"error": "no such path"})
            if not CONFIG["control_http"]:
                return self._send(403, _protocol.error_reply(op, _protocol.KIND_FORBIDDEN, (
                    "this engine's HTTP control endpoint is off (WORKLOAD_CONTROL_HTTP=1 turns it on, in a network "
                    "of its own only); use the agent's unix socket")))
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = _protocol.decode(self.rfile.read(min(length, _protocol.MAX_MESSAGE_BYTES + 1)) or b"{}")
            except _protocol.ProtocolError as exc:
                return self._send(400, _protocol.error_reply(op, _protocol.KIND_BAD_REQUEST, str(exc)))
            body["op"] = op
            reply = engine.controller.handle(body)
            return self._send(200 if reply["ok"] else 409, reply)

    return Handler


def main():
    engine = Engine(CONFIG)
    server = ThreadingHTTPServer((CONFIG["host"], CONFIG["port"]), make_handler(engine))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log("listening on %s:%d" % (CONFIG["host"], CONFIG["port"]))
    try:
        engine.warmup()
    except _acl.AclError as exc:
        engine.phase = "failed"
        engine.error = str(exc)
        log("warmup failed: %s" % exc)
    log("phase %s" % engine.phase)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

"""Llama.cpp's OpenAI-compatible server (PyPI llama-cpp-python) in a container under the agent: a
real third-party engine for the integration tests. Reusable pieces:

- ``build_engine_image()`` / fixture ``llama_image`` (session): the engine image, built by
  scripts/build-llama-image.sh, which builds llama-cpp-python's wheel only when its cache is cold
  (scripts/build-llama-wheel.sh, /var/cache/inferops/wheels) and reuses the image when no input changed.
- ``write_model()`` / fixture ``llama_model``: a tiny random-weight llama GGUF written by
  tests/engines/llama/make_model.py, run in the engine image (which has gguf and numpy), into a host
  directory that containers mount read-only at /models (real engines mmap weights from shared storage).
- ``LlamaEngine`` / fixture ``llama_engines``: one engine container (`--network host`, the model
  directory read-only, any engine arguments, env, extra mounts, a runtime), its readiness
  (``/v1/models``: the server has no /health), greedy completions and the RNG continuity probe.
- ``take_snapshot()``: the host snapshot of an engine container with the collection's
  ``host_checkpoint`` (method runc, host-only: no device part).
- fixture ``llama_node`` (module): the restore-on-create runtime installed by the snapshot_node role
  under this run's own name (_runtime_helpers), so a plain ``docker run --runtime`` restores;
  ``restore_env()`` is the environment such a container gets.

Every container is named ``inferops-llama-<random>`` and removed at the end of its test; the
engine image is kept (it is the cache). The engine does not use the (simulated) NPU: the
device restore is off (``INFEROPS_RESTORE_DEVICE=false``), the collection's host-only mode.
"""

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

from _runtime_helpers import installed_runtime
import conftest
from conftest import REPO, docker, free_port, run_module

ENGINE_DIR = REPO / "tests" / "engines" / "llama"
BUILD_IMAGE = REPO / "scripts" / "build-llama-image.sh"
NAME_PREFIX = "inferops-llama-"
MODELS = "/models"  # where the model directory is mounted in the container, read-only
MODEL = "tiny.gguf"
SERVICE = "llama"


def unique_name(kind="e"):
    return "%s%s-%s" % (NAME_PREFIX, kind, uuid.uuid4().hex[:6])


def identity(pod):
    return {"namespace": "default", "service": SERVICE, "instance": "p0", "pod": pod}


# -- the image ---------------------------------------------------------------------------------

class LlamaImage:
    def __init__(self, tag, image_id, seconds, wheel_built, image_built, output):
        self.tag, self.id, self.seconds = tag, image_id, seconds
        self.wheel_built, self.image_built, self.output = wheel_built, image_built, output

    def __repr__(self):
        return "LlamaImage(%s %s, %.1f s, wheel built %s, image built %s)" % (
            self.tag, self.id[:19], self.seconds, self.wheel_built, self.image_built)


def build_engine_image(timeout=3600):
    """Run scripts/build-llama-image.sh (idempotent, cached); the image and what it had to do."""
    started = time.monotonic()
    proc = subprocess.run(["bash", str(BUILD_IMAGE)], capture_output=True, text=True, timeout=timeout, check=False)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise AssertionError("scripts/build-llama-image.sh failed (rc=%d) after %.0f s:\n%s\n%s"
                             % (proc.returncode, seconds, proc.stdout[-3000:], proc.stderr[-6000:]))
    tag = proc.stdout.strip().splitlines()[-1]
    image_id = docker("image", "inspect", "--format", "{{.Id}}", tag)
    return LlamaImage(tag, image_id, seconds, "[build-llama-wheel] built in" in proc.stderr,
                      "built engine image" in proc.stderr, proc.stderr)


@pytest.fixture(scope="session")
def llama_image(docker_env):
    """The engine image (built or reused); its build time is printed, as CI pays it once per machine."""
    image = build_engine_image()
    print("\nllama engine image: %r" % image)
    return image


# -- the model ---------------------------------------------------------------------------------

def write_model(image, directory, name=MODEL, seed=42, n_layer=None, n_ff=None, in_place=False):
    """Write the tiny GGUF into the host directory ``directory`` (see make_model.py); its host path."""
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    args = ["run", "--rm", "--network", "none", "--entrypoint", "python3",
            "-v", "%s:/src:ro" % ENGINE_DIR, "-v", "%s:/out" % directory, image.id,
            "/src/make_model.py", "/out/%s" % name, "--seed", str(seed)]
    if n_layer is not None:
        args += ["--n-layer", str(n_layer)]
    if n_ff is not None:
        args += ["--n-ff", str(n_ff)]
    if in_place:
        args.append("--in-place")
    docker(*args)
    return os.path.join(directory, name)


@pytest.fixture
def llama_model(llama_image, tmp_path):
    """A model directory (host path) holding tiny.gguf (seed 42); mounted read-only at /models."""
    directory = tmp_path / "models"
    write_model(llama_image, directory)
    return directory


# -- the engine --------------------------------------------------------------------------------

def http_json(url, body=None, timeout=60):
    """(status, decoded JSON) of a GET, or of a POST of ``body`` as JSON; HTTP errors are returned."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class LlamaEngine:
    """One container of the engine image: ``python3 -m inferops_agent -- -m llama_cpp.server`` (the
    image's entrypoint) with the arguments of ``server_args()``.

    The defaults make answers deterministic: one fixed model, ``--seed 42``, two threads (so the
    OpenMP pool is in use), greedy completions (temperature 0).
    """

    def __init__(self, image, model_dir, port=None, name=None, model=MODEL, args=(), seed=42, n_ctx=512,
                 env=None, mounts=(), runtime=None, docker_args=(), model_rw=False):
        self.image = image.id if isinstance(image, LlamaImage) else image
        self.model_dir, self.model = str(model_dir), model
        self.port = port or free_port()
        self.name = name or unique_name()
        self.seed, self.n_ctx = seed, n_ctx
        self.extra_args = list(args)
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.mounts = list(mounts)  # extra "-v" values
        self.runtime = runtime
        self.docker_args = list(docker_args)  # more `docker run` options, e.g. ["-w", "/cache"]
        self.model_rw = model_rw  # the model directory mounted read-write (weights on a writable volume)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def config(self, **changes):
        """This engine's settings as keyword arguments for another one (a new name unless given):
        ``llama_engines(**original.config(runtime=node.name, env=restore_env(snap)))`` recreates it."""
        settings = dict(image=self.image, model_dir=self.model_dir, port=self.port, name=None, model=self.model,
                        args=list(self.extra_args), seed=self.seed, n_ctx=self.n_ctx, env=dict(self.env),
                        mounts=list(self.mounts), runtime=self.runtime, docker_args=list(self.docker_args),
                        model_rw=self.model_rw)
        settings.update(changes)
        return settings

    def server_args(self):
        return ["--model", "%s/%s" % (MODELS, self.model), "--host", "127.0.0.1", "--port", str(self.port),
                "--n_ctx", str(self.n_ctx), "--seed", str(self.seed), "--n_threads", "2",
                "--n_threads_batch", "2"] + self.extra_args

    def create_args(self):
        args = ["--name", self.name, "--network", "host",
                "-v", "%s:%s%s" % (self.model_dir, MODELS, "" if self.model_rw else ":ro")]
        if self.runtime:
            args = ["--runtime", self.runtime] + args
        for mount in self.mounts:
            args += ["-v", mount]
        for key, value in sorted(self.env.items()):
            args += ["-e", "%s=%s" % (key, value)]
        return args + self.docker_args + [self.image] + self.server_args()

    def run(self):
        docker("run", "-d", *self.create_args())
        return self

    def wait_ready(self, timeout=120):
        """Seconds until ``/v1/models`` answers (llama.cpp's server has no /health)."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            try:
                status, body = http_json(self.url + "/v1/models", timeout=2)
                if status == 200 and body.get("data"):
                    return time.monotonic() - started
            except OSError:
                pass
            if self.state() not in ("running", "created", "restarting"):
                break
            time.sleep(0.1)
        raise AssertionError("engine %s not ready after %.0f s (state %s); logs:\n%s"
                             % (self.name, time.monotonic() - started, self.state(), self.logs()[-6000:]))

    def complete(self, prompt, max_tokens=16, temperature=0.0, **fields):
        body = dict(fields, prompt=prompt, max_tokens=max_tokens, temperature=temperature)
        status, reply = http_json(self.url + "/v1/completions", body)
        assert status == 200, "completion failed on %s: %s %r" % (self.name, status, reply)
        return reply["choices"][0]["text"]

    def completions(self, prompts):
        """Greedy answers, one per prompt (no seed in the request: each one advances the seed chain, see probe)."""
        return [self.complete(p) for p in prompts]

    def probe(self):
        """One completion of the RNG continuity probe; see test_llama_engine.py for why it proves continuity.

        Sampled at temperature 1 without a seed in the request: llama-cpp-python then seeds the sampler
        of this request with the next value of a chain that lives in the process (``Llama._seed``,
        advanced on every completion that brings no seed: ``set_seed(Random(_seed).randint(0, 2**32))``),
        which starts at the server's ``--seed``. So the answer depends on how many completions this
        process has served: the n-th answer of every fresh process is the same, the n-th and the m-th differ.
        """
        return self.complete("continuity probe", max_tokens=24, temperature=1.0)

    def probes(self, count):
        return [self.probe() for _index in range(count)]

    def inspect(self, template):
        return docker("inspect", "--format", template, self.name)

    def state(self):
        return docker("inspect", "--format", "{{.State.Status}}", self.name, check=False) or "gone"

    @property
    def id(self):
        return self.inspect("{{.Id}}")

    def environ(self):
        """The environment of the engine process (pid 1 of the container), as the kernel has it."""
        out = docker("exec", self.name, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def logs(self):
        proc = subprocess.run(["docker", "logs", self.name], capture_output=True, text=True, check=False)
        return proc.stdout + proc.stderr

    def remove(self):
        docker("rm", "-f", self.name, check=False)


@pytest.fixture
def llama_engines():
    """Factory: ``llama_engines(image, model_dir, **kwargs)`` -> LlamaEngine; all removed at the end."""
    made = []

    def make(*args, **kwargs):
        engine = LlamaEngine(*args, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.remove()


# -- snapshot and restore ----------------------------------------------------------------------

def snapshot_dir(root, pod):
    return str(root / "default" / SERVICE / "p0" / pod)


def take_snapshot(engine, directory, pod=None, **options):
    """Host_checkpoint of the running engine container: method runc, no device part (CPU engine).
    The engine keeps running (leave_running). Returns the module's result; fails the test if it failed."""
    args = {"container": engine.name, "snapshot_dir": str(directory), "identity": identity(pod or engine.name),
            "method": "runc", "require_device_part": False, "timeout": 120}
    args.update(options)
    result = run_module("host_checkpoint", args)
    assert result.get("failed") is False and result["changed"] and result["status"] == "completed", \
        (result.get("msg"), result.get("criu_log_tail"))
    return result


def restore_env(snapshot, **extra):
    """What a container recreated under the restore-on-create runtime sets: the snapshot, device restore off."""
    env = {"INFEROPS_RESTORE_FROM": str(snapshot), "INFEROPS_RESTORE_DEVICE": "false"}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def llama_node(docker_env, tmp_path_factory):
    """The restore-on-create runtime, installed for this module under a name of its own and removed after."""
    with installed_runtime(tmp_path_factory.mktemp("llama-node")) as node:
        yield node


class Generated:
    """One generation of the main cycle: a warmed-up engine served ``prompts`` and the probe, was
    snapshotted, and was removed. ``cold``: the probe answers a fresh process gives first; ``after``:
    the ones the checkpointed state gives next (asked of the original right after the checkpoint)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def generate(node, engines, image, model_dir, prompts, probes=2, **engine):
    """Start an engine (``engines(image, model_dir, **engine)``), record, snapshot below the node's root, remove."""
    pod = unique_name("p")
    original = engines(image, model_dir, name=pod, **engine).run()
    original.wait_ready()
    cold = original.probes(probes)
    expected = original.completions(prompts)
    snap = snapshot_dir(node.roots, pod)
    checkpoint = take_snapshot(original, snap, pod)
    after = original.probes(probes)
    assert not set(after) & set(cold), "the probe does not tell the stream positions apart: %r %r" % (cold, after)
    original.remove()
    return Generated(pod=pod, snap=snap, original=original, cold=cold, after=after, expected=expected,
                     prompts=list(prompts), checkpoint=checkpoint)


def recreate(node, engines, generated, **changes):
    """The container recreated under the node's runtime with the snapshot's env (and ``changes`` to the
    original's settings); returns (engine, the runtime's record of its create)."""
    env = restore_env(generated.snap)
    env.update(changes.pop("env", {}))
    engine = engines(**generated.original.config(runtime=node.name, env=env, **changes)).run()
    engine.wait_ready()
    return engine, node.log_records(engine.id)[-1]


def cold_reference(engines, generated, **changes):
    """What a cold start of the changed world answers first: (probe, completions), from a plain runc
    container with the original's settings and ``changes``, removed again."""
    engine = engines(**generated.original.config(**changes)).run()
    engine.wait_ready()
    answers = (engine.probe(), engine.completions(generated.prompts))
    engine.remove()
    return answers


def assert_cold_start(engine, record, generated, reference, reason_start, *words):
    """The runtime started ``engine`` cold, for a reason starting with ``reason_start`` and naming ``words``,
    and it really is a fresh process of the new world: its first probe and its answers are ``reference``'s
    (from cold_reference), not the snapshot's."""
    assert record["outcome"] == "cold", "restored, not cold: %r" % record
    assert record["reason"].startswith(reason_start), record["reason"]
    for word in words:
        assert word in record["reason"], (word, record["reason"])
    probe, answers = reference
    first = engine.probe()
    assert first == probe and first not in generated.after, "not a fresh process of the new world"
    assert engine.completions(generated.prompts) == answers, "not the new world's answers"
    return record["reason"]


def posix_locks(engine):
    """The POSIX (fcntl) locks the engine process holds (conftest.posix_locks of its pid)."""
    return conftest.posix_locks(engine.inspect("{{.State.Pid}}"))


def process_start_ticks(engine):
    """Field 22 of /proc/1/stat in the container: the engine's start time in clock ticks after boot."""
    stat = docker("exec", engine.name, "cat", "/proc/1/stat")
    return int(re.sub(r"^.*\) ", "", stat).split()[19])

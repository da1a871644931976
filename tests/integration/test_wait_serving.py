"""inferops.snapshot.wait_serving through ansible-playbook (module + action plugin): one task with a
wall-clock deadline, a few progress lines on long waits instead of a retry line per probe, elapsed
time and the last probe in the result, an early end when the container's process exits."""

import http.server
import json
import os
import socket
import threading
import time
import uuid

import pytest

from conftest import docker, free_port
from _roles_helpers import local_inventory, run_playbook

BASE_IMAGE = "inferops/base:bookworm"


def wait_task(tmp_path, **args):
    """A playbook with one wait_serving task whose result is dumped next to it."""
    out = tmp_path / ("result-%s.json" % uuid.uuid4().hex[:6])
    playbook = tmp_path / ("wait-%s.yml" % uuid.uuid4().hex[:6])
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - inferops.snapshot.wait_serving: %s\n      register: waited\n      ignore_errors: true\n"
        "    - ansible.builtin.copy:\n        content: '{{ waited | to_json }}'\n        dest: %s\n        mode: '0600'\n"
        % (json.dumps(args), out))
    started = time.monotonic()
    run = run_playbook(tmp_path / "runs", playbook, local_inventory())
    took = time.monotonic() - started
    assert run.rc == 0, run
    return json.loads(out.read_text()), run, took


def progress_lines(run):
    return [line for line in run.stdout.splitlines() if "wait_serving:" in line and "not ready after" in line]


def one_run(tmp_path):
    """(elapsed, took) of a wait that ends at its first probe: what one module run and one playbook cost on this
    machine now. The deadline is the controller's; a wait may overrun it by the start of the module run that
    passes it, which a loaded 2-core machine stretches to seconds -- so the bounds below are measured, not guessed."""
    Warming.warmup, Warming.ready_at = 0.0, None  # 200 from the first probe
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Warming)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result, _run, took = wait_task(tmp_path, url="http://127.0.0.1:%d/health" % server.server_port, timeout=60)
    finally:
        server.shutdown()
    assert result["status"] == 200 and result["attempts"] == 1, result
    return result["elapsed"], took


def test_a_dead_url_fails_on_time_with_a_few_progress_lines_and_the_last_probe(tmp_path):
    url = "http://127.0.0.1:%d/health" % free_port()
    result, run, took = wait_task(tmp_path, url=url, timeout=6, interval=0.2, progress_interval=2)
    module, playbook = one_run(tmp_path)
    assert result["failed"] and result["timed_out"], result
    assert result["msg"] == "%s: not ready within 6 s (%d probes, last: %s)" % (url, result["attempts"], result["last"])
    assert "refused" in result["last"] and result["status"] is None
    assert 6 <= result["elapsed"] < 6 + 2 * module + 1 and took < playbook + 6 + 2 * module + 2, \
        (result, took, module, playbook)
    assert result["attempts"] > 10
    assert 1 <= len(progress_lines(run)) <= 3, run.stdout
    assert "RETRYING" not in run.stdout


def test_a_probe_that_hangs_does_not_stretch_the_deadline(tmp_path):
    """The server accepts connections and never answers (the issue's 3 s timeout that ran 81 s)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        url = "http://127.0.0.1:%d/health" % server.getsockname()[1]
        result, run, took = wait_task(tmp_path, url=url, timeout=3, interval=0.1, probe_timeout=30)
    module, _playbook = one_run(tmp_path)
    assert result["failed"] and result["timed_out"], result
    assert 3 <= result["elapsed"] < min(3 + 2 * module + 1, 30), (result, module)  # never the probe's 30 s
    assert "timed out" in result["last"], result


class Warming(http.server.BaseHTTPRequestHandler):
    """Answers 503 for ``warmup`` seconds counted from the first probe (not from the test's start: on a loaded
    machine the module may take seconds to start), then 200."""
    warmup = 0.0
    ready_at = None

    def do_GET(self):
        now = time.monotonic()
        if Warming.ready_at is None:
            Warming.ready_at = now + self.warmup
        self.send_response(200 if now >= Warming.ready_at else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_waits_through_a_warmup_until_the_url_answers_200(tmp_path):
    Warming.warmup, Warming.ready_at = 3.5, None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Warming)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result, run, took = wait_task(tmp_path, url="http://127.0.0.1:%d/health" % server.server_port, timeout=60,
                                      interval=0.3, progress_interval=2)
    finally:
        server.shutdown()
    assert not result.get("failed") and result["status"] == 200 and result["last"] == "HTTP 200", result
    assert result["elapsed"] >= 3.5 and result["attempts"] >= 3, result
    assert 1 <= len(progress_lines(run)) <= 3 and "last: HTTP 503" in progress_lines(run)[0], run.stdout


@pytest.fixture
def sleeper(docker_env):
    name = "waitsv-%s" % uuid.uuid4().hex[:8]
    docker("run", "-d", "--name", name, "--network", "none", BASE_IMAGE, "sleep", "300")
    yield name
    docker("rm", "-f", name, check=False)


def kill_once_waited_on(container):
    """Kill the container a while after the module started: killed before the module looks, the container is
    not running and the module says so (a different, also right answer); on a loaded machine its start-up takes
    seconds, so a fixed delay from the test's start races it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            b"AnsiballZ_wait_serving" in cmdline for cmdline in process_command_lines()):
        time.sleep(0.05)
    time.sleep(3)
    docker("kill", container)


def process_command_lines():
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(os.path.join(entry.path, "cmdline"), "rb") as f:
                    yield f.read()
            except OSError:
                continue


def test_a_file_inside_the_container_and_an_early_end_when_the_container_exits(tmp_path, sleeper):
    def touch_later():
        time.sleep(2)
        docker("exec", sleeper, "touch", "/tmp/warmed-up")
    threading.Thread(target=touch_later, daemon=True).start()
    result, run, took = wait_task(tmp_path, path="/tmp/warmed-up", container=sleeper, timeout=60, interval=0.2)
    # The file is absent until the touch, so "present" means the module waited for it. Its elapsed time is not
    # asserted: its clock starts after its own start-up, which on a loaded machine can outlast the 2 s.
    assert not result.get("failed") and result["last"] == "present", result

    threading.Thread(target=kill_once_waited_on, args=(sleeper,), daemon=True).start()
    result, run, took = wait_task(tmp_path, path="/tmp/never", container=sleeper, timeout=120, interval=0.2)
    assert result["failed"] and result["timed_out"] is False, result
    assert result["msg"].startswith("container %s exited, so /tmp/never in container %s will never be ready"
                                    % (sleeper, sleeper)), result
    assert result["elapsed"] < 20, result


@pytest.mark.parametrize("args, words", [
    ({"path": "relative/ready"}, "path: must be absolute"),
    ({"url": "http://127.0.0.1:1/", "path": "/x"}, "mutually exclusive: url|path"),
    ({"url": "http://127.0.0.1:1/", "timeout": 0}, "timeout: must be a positive number of seconds"),
    ({"path": "/x", "container": "no-such-container-%s" % uuid.uuid4().hex[:6]}, "container: no container named"),
    # at once, not after the timeout ran out, and not an "unexpected error"
    ({"url": "127.0.0.1:1", "timeout": 20}, "url: '127.0.0.1:1' is not an http(s) URL, e.g. http://127.0.0.1:8000/"),
    ({"url": "http://127.0.0.1:abc/", "timeout": 20}, "url: 'http://127.0.0.1:abc/' is not a URL that can be asked"),
    ({"url": "http://[::1", "timeout": 20}, "url: 'http://[::1' is not a URL that can be asked (Invalid IPv6 URL)"),
    ({"path": "/tmp/nonexist\u0000x", "timeout": 20}, "path: the path contains a NUL byte"),
])
def test_bad_input_names_the_field(tmp_path, args, words):
    result, run, took = wait_task(tmp_path, **args)
    assert result["failed"] and words in result["msg"], result


def test_a_password_in_the_url_is_not_in_the_message(tmp_path):
    url = "http://admin:s3cretpw@127.0.0.1:%d/health" % free_port()
    result, run, took = wait_task(tmp_path, url=url, timeout=2, interval=0.2, progress_interval=1)
    assert result["failed"] and result["timed_out"], result
    assert result["msg"].startswith("http://127.0.0.1:") and "s3cretpw" not in result["msg"], result["msg"]
    assert "s3cretpw" not in result["last"] and "s3cretpw" not in "\n".join(progress_lines(run)), result

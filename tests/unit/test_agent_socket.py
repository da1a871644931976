"""An agent that cannot listen leaves the engine serving and says why it cannot be snapshotted."""
import time

from conftest import http_get


def _wait_until(check, workload, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not check():
        assert workload.proc.poll() is None, "the engine exited; log:\n%s" % workload.log()
        assert time.monotonic() < deadline, "%s never happened; log:\n%s" % (what, workload.log())
        time.sleep(0.05)


def _serves(workload):
    try:
        return http_get(workload.url + "/health", timeout=2)[0] == 200
    except OSError:
        return False


def test_a_socket_path_over_the_unix_limit_names_the_variable_and_the_engine_serves(workload_factory, tmp_path):
    long_dir = tmp_path / ("d" * 60) / ("e" * 60)
    w = workload_factory(INFEROPS_AGENT_SOCKET_DIR=str(long_dir), WORKLOAD_WARMUP_SECONDS="0.1").start()
    _wait_until(lambda: "cannot be snapshotted" in w.log(), w, "the agent's message")
    assert "over the 107 a unix socket allows" in w.log() and "$INFEROPS_AGENT_SOCKET_DIR" in w.log()
    _wait_until(lambda: _serves(w), w, "serving")
    assert not long_dir.exists(), "nothing is made for a socket that cannot be bound"


def test_a_socket_directory_that_cannot_be_made_names_the_variable_and_the_engine_serves(workload_factory, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    w = workload_factory(INFEROPS_AGENT_SOCKET_DIR=str(blocker / "agent"), WORKLOAD_WARMUP_SECONDS="0.1").start()
    _wait_until(lambda: "cannot be snapshotted" in w.log(), w, "the agent's message")
    assert "$INFEROPS_AGENT_SOCKET_DIR" in w.log()
    _wait_until(lambda: _serves(w), w, "serving")
    assert blocker.is_file()

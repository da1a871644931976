"""What /proc says about a process that listens on a unix socket, and when a process started, on real processes."""

import socket
import subprocess
import sys
import time

from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import proc


def test_the_listener_of_a_unix_socket_is_found_by_its_path_and_nothing_else(tmp_path):
    path = tmp_path / "d.sock"
    assert proc.unix_listeners(str(path)) == []
    listening = socket.socket(socket.AF_UNIX)
    connected = socket.socket(socket.AF_UNIX)
    bound_only = socket.socket(socket.AF_UNIX)
    try:
        listening.bind(str(path))
        listening.listen()
        bound_only.bind(str(tmp_path / "quiet.sock"))  # bound, not listening: no daemon serves it
        connected.connect(str(path))
        assert proc.unix_listeners(str(path)) == [proc.os.getpid()]
        assert proc.unix_listeners(str(tmp_path / "." / "d.sock")) == [proc.os.getpid()]
        assert proc.unix_listeners(str(tmp_path / "quiet.sock")) == []
    finally:
        for s in (listening, connected, bound_only):
            s.close()
    assert proc.unix_listeners(str(path)) == []


def test_a_process_started_now_started_now():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = proc.started_at(child.pid)
        assert before - 0.05 <= started <= time.time() + 0.05, (before, started)
    finally:
        child.kill()
        child.wait()
    assert proc.started_at(child.pid) is None

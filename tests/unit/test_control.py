import shutil
import socket
import tempfile
import threading

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import control
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import EndpointError, ParameterError
from ansible_collections.inferops.snapshot.plugins.modules.npu_snapshot_lock import plan


def fake_proc(tmp_path, pid, nspid_line):
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "status").write_text("Name:\tpython3\n%sPPid:\t1\n" % nspid_line)
    return str(tmp_path)


def test_socket_for_containerised_pid_uses_its_namespace_pid(tmp_path):
    proc = fake_proc(tmp_path, 4242, "NSpid:\t4242\t1\n")
    assert control.agent_socket_for_pid(4242, "/run/inferops-snapshot", proc) == \
        "%s/4242/root/run/inferops-snapshot/agent.1.sock" % proc


def test_socket_for_host_pid(tmp_path):
    proc = fake_proc(tmp_path, 77, "NSpid:\t77\n")
    assert control.agent_socket_for_pid(77, "/tmp/agents", proc) == "%s/77/root/tmp/agents/agent.77.sock" % proc


def test_missing_process(tmp_path):
    with pytest.raises(EndpointError, match="process 5 does not exist"):
        control.agent_socket_for_pid(5, proc=str(tmp_path))
    with pytest.raises(ParameterError, match="pid: expected a positive"):
        control.agent_socket_for_pid(0)


@pytest.mark.parametrize("endpoint, cls, where", [
    ("unix:///run/a.sock", control.AgentSocketClient, "unix:///run/a.sock"),
    ("/run/a.sock", control.AgentSocketClient, "unix:///run/a.sock"),
    ("http://127.0.0.1:8000/", control.HttpEndpointClient, "http://127.0.0.1:8000"),
])
def test_endpoint_forms(endpoint, cls, where):
    client = control.client_for_endpoint(endpoint)
    assert isinstance(client, cls) and client.where == where


@pytest.mark.parametrize("endpoint, paths, words", [
    ("tcp://x:1", None, "neither"),
    ("unix://relative.sock", None, "must be absolute"),
    ("http://x", {"suspend": "/s"}, "unknown operation 'suspend'"),
    ("http://x", {"lock": "nolead"}, "endpoint_paths.lock"),
])
def test_bad_endpoints_name_the_field(endpoint, paths, words):
    with pytest.raises(ParameterError, match=words):
        control.client_for_endpoint(endpoint, paths)


@pytest.mark.parametrize("current, wanted, restore, ops", [
    ("RUNNING", "locked", True, ["lock"]),
    ("LOCKED", "locked", True, []),
    ("BACKED_UP", "locked", True, []),
    ("RUNNING", "unlocked", True, []),
    ("LOCKED", "unlocked", True, ["unlock"]),
    ("BACKED_UP", "unlocked", True, ["restore", "unlock"]),
    ("BACKED_UP", "unlocked", False, ["unlock"]),
])
def test_lock_module_plan(current, wanted, restore, ops):
    assert plan(current, wanted, restore) == ops


def test_a_socket_path_longer_than_sun_path_is_reached_through_its_directory():
    directory = tempfile.mkdtemp(prefix="ios-", dir="/tmp")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(directory + "/agent.1.sock")
        server.listen(1)

        def answer():
            conn, _address = server.accept()
            conn.recv(65536)
            conn.sendall(b'{"v": 1, "ok": true, "state": "RUNNING"}\n')
            conn.close()
        threading.Thread(target=answer, daemon=True).start()
        # the same socket, named through /proc/self/root as many times as it takes to pass sun_path's 108 bytes
        long_path = "/proc/self/root" * 8 + directory + "/agent.1.sock"
        with pytest.raises(OSError, match="too long"):
            socket.socket(socket.AF_UNIX).connect(long_path)
        assert control.AgentSocketClient(long_path).request("state", 5)["state"] == "RUNNING"
    finally:
        server.close()
        shutil.rmtree(directory)

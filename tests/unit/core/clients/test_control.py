import functools
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import free_port

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import EndpointError, ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import control
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import syscalls
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import metadata
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
        control.agent_socket_for_pid(5, proc_root=str(tmp_path))
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


@pytest.mark.parametrize("endpoint, words", [
    ("http://127.0.0.1:abc", "endpoint: 'http://127.0.0.1:abc' is not a URL that can be asked (Port could not be cast"),
    ("http://[::1", "endpoint: 'http://[::1' is not a URL that can be asked (Invalid IPv6 URL)"),
    ("http://127.0.0.1:8000/\n", "endpoint: the URL contains whitespace or a control character"),
    ("ftp://admin:s3cretpw@x/", "endpoint: 'ftp://x/' is neither unix:///path/to/agent.sock"),
])
def test_an_endpoint_url_that_cannot_be_asked_is_refused_naming_endpoint_without_its_password(endpoint, words):
    with pytest.raises(ParameterError) as error:
        control.client_for_endpoint(endpoint)
    assert error.value.msg.startswith(words) and "s3cretpw" not in error.value.msg, error.value.msg


def test_a_password_in_the_endpoint_url_is_in_no_message_nor_result():
    """Npu_snapshot_lock's endpoint: http://admin:s3cretpw@... -- the message and the result's endpoint said it."""
    port = free_port()
    client = control.client_for_endpoint("http://admin:s3cretpw@127.0.0.1:%d/" % port)
    assert client.where == "http://127.0.0.1:%d" % port
    with pytest.raises(EndpointError) as error:
        client.request("state", timeout=1)
    assert error.value.msg.startswith("cannot reach the engine's control endpoint http://127.0.0.1:%d/snapshot/state ("
                                      % port), error.value.msg
    assert "s3cretpw" not in error.value.msg and "admin" not in error.value.msg
    assert error.value.result["endpoint"] == "http://127.0.0.1:%d/snapshot/state" % port


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


# -- the host never follows a link planted inside a process's root ------------------------------------

@pytest.fixture
def jailed():
    """A process whose root (/proc/<pid>/root) is a directory of this test, as a container's is; a real socket
    listening inside it and another one outside it, where a planted link would lead. Below a short directory of its
    own: the sockets are bound by path, and pytest-xdist's tmp_path would pass sun_path's 108 bytes."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="jail-", dir="/tmp"))
    root, outside = base / "root", base / "outside"
    (root / "run" / "inferops-snapshot").mkdir(parents=True)
    outside.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; os.chroot(sys.argv[1]); print('in', "
                              "flush=True); time.sleep(600)", str(root)], stdout=subprocess.PIPE, text=True)
    servers = []
    try:
        assert child.stdout.readline().strip() == "in"

        def listen(path):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(path))
            server.listen(4)
            server.settimeout(0.5)
            servers.append(server)
            answered = []

            def answer():
                while True:
                    try:
                        conn, _address = server.accept()
                    except OSError:
                        return
                    conn.recv(65536)
                    answered.append(str(path))
                    conn.sendall(b'{"v": 1, "ok": true, "state": "RUNNING"}\n')
                    conn.close()
            threading.Thread(target=answer, daemon=True).start()
            return answered
        yield dict(pid=child.pid, root=root, outside=outside, listen=listen)
    finally:
        child.kill()
        child.wait()
        for server in servers:
            server.close()
        shutil.rmtree(str(base), ignore_errors=True)


def _in_root(jail, inner):
    return "/proc/%d/root%s" % (jail["pid"], inner)


@pytest.mark.parametrize("use_openat2", [True, False], ids=["openat2", "fd walk"])
def test_the_agent_socket_in_a_process_root_is_reached_there(jailed, monkeypatch, use_openat2):
    monkeypatch.setattr(syscalls, "open_path_in_root", functools.partial(syscalls.open_path_in_root,
                                                                         use_openat2=use_openat2))
    answered = jailed["listen"](jailed["root"] / "run" / "inferops-snapshot" / "agent.1.sock")
    client = control.AgentSocketClient(_in_root(jailed, "/run/inferops-snapshot/agent.1.sock"))
    assert client.listening() and client.request("state", 5)["state"] == "RUNNING" and answered


@pytest.mark.parametrize("use_openat2", [True, False], ids=["openat2", "fd walk"])
@pytest.mark.parametrize("planted", ["directory", "socket", "component"])
def test_a_link_planted_in_a_process_root_is_refused_not_followed(jailed, monkeypatch, use_openat2, planted):
    """A compromised engine links its socket dir (or the socket, or a directory above it) to a socket outside its
    root, absolute or relative: a naive path through /proc/<pid>/root would reach the host's socket."""
    monkeypatch.setattr(syscalls, "open_path_in_root", functools.partial(syscalls.open_path_in_root,
                                                                         use_openat2=use_openat2))
    root, outside = jailed["root"], jailed["outside"]
    answered = jailed["listen"](outside / "agent.1.sock")
    sockets = root / "run" / "inferops-snapshot"
    if planted == "directory":
        sockets.rmdir()
        sockets.symlink_to(outside)  # absolute: the host would resolve it against its own root
    elif planted == "socket":
        (sockets / "agent.1.sock").symlink_to(os.path.relpath(outside / "agent.1.sock", sockets))
    else:
        shutil.rmtree(str(root / "run"))
        (outside / "inferops-snapshot").mkdir()
        os.rename(str(outside / "agent.1.sock"), str(outside / "inferops-snapshot" / "agent.1.sock"))
        (root / "run").symlink_to("../outside")
    naive = _in_root(jailed, "/run/inferops-snapshot/agent.1.sock")
    assert os.path.exists(naive), "the planted link does lead outside the root"
    client = control.AgentSocketClient(naive)
    with pytest.raises(EndpointError, match="refusing the agent socket .*symbolic link inside the process's root"):
        client.listening()
    with pytest.raises(EndpointError, match="refusing the agent socket .*symbolic link inside the process's root"):
        client.request("lock", 5)
    with pytest.raises(EndpointError, match="refusing"):
        client.wait_listening(5)  # refused at once, not waited for
    time.sleep(0.6)  # a connection would have been accepted by now
    assert answered == [], "the host connected through the planted link"


def test_a_parent_component_is_refused_in_a_process_root(jailed):
    with pytest.raises(EndpointError, match="refusing"):
        control.AgentSocketClient(_in_root(jailed, "/run/../../outside/agent.1.sock")).request("state", 5)


def test_the_metadata_file_is_read_in_a_process_root_without_following_a_planted_link(jailed):
    """The other host-side reads into a container's root follow no link either (metadata.read_in_process)."""
    root, outside = jailed["root"], jailed["outside"]
    (outside / "metadata.json").write_text('{"restored": true, "planted": "outside"}')
    (root / "run" / "inferops-snapshot" / "metadata.json").write_text('{"restored": true}')
    assert metadata.read_in_process(jailed["pid"], "/run/inferops-snapshot/metadata.json") == {"restored": True}
    shutil.rmtree(str(root / "run" / "inferops-snapshot"))
    (root / "run" / "inferops-snapshot").symlink_to(outside)
    assert os.path.exists(_in_root(jailed, "/run/inferops-snapshot/metadata.json")), "the link leads outside"
    assert metadata.read_in_process(jailed["pid"], "/run/inferops-snapshot/metadata.json") is None
    (root / "run" / "inferops-snapshot").unlink()
    (root / "run" / "inferops-snapshot").mkdir()
    (root / "run" / "inferops-snapshot" / "metadata.json").symlink_to(outside / "metadata.json")
    assert metadata.read_in_process(jailed["pid"], "/run/inferops-snapshot/metadata.json") is None


# -- the host believes only the engine's own socket -----------------------------------------------------------------

IMPOSTOR = r"""
import os, socket, sys
path = sys.argv[1]
os.setgid(65534)
os.setuid(65534)                      # another uid in the engine's container
os.unlink(path)                       # the socket directory is an emptyDir: 0777, no sticky bit
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
os.chmod(path, 0o666)
server.listen(1)
print("listening", flush=True)
server.settimeout(float(sys.argv[2]))
try:
    conn, _address = server.accept()
except socket.timeout:
    print("no one came", flush=True)
else:
    heard = conn.recv(65536)
    print("heard %d bytes" % len(heard), flush=True)
    try:
        conn.sendall(b'{"v": 1, "ok": true, "op": "lock", "state": "LOCKED"}\n')
    except OSError:
        pass
"""


def test_a_socket_another_uid_put_in_the_engines_place_is_refused_before_anything_is_sent():
    """The engine (this process, root) serves its agent socket in a directory anyone in its container may write: the
    host reached whatever listened at the path and believed its replies -- a lock that never happened, a reseed that
    never ran. Its listener must be the engine (SO_PEERCRED) and the socket file the engine's (or root's)."""
    directory = tempfile.mkdtemp(prefix="pod-", dir="/tmp")
    os.chmod(directory, 0o777)
    path = os.path.join(directory, "agent.%d.sock" % os.getpid())
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor = None
    try:
        engine.bind(path)
        engine.listen(4)

        def answer():
            conn, _address = engine.accept()
            conn.recv(65536)
            conn.sendall(b'{"v": 1, "ok": true, "op": "state", "state": "RUNNING"}\n')
            conn.close()
        threading.Thread(target=answer, daemon=True).start()
        client = control.AgentSocketClient.for_pid(os.getpid(), directory)
        assert client.engine == os.getpid() and client.request("state", 5)["state"] == "RUNNING", "its own: believed"
        impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR, path, "1.5"], stdout=subprocess.PIPE, text=True)
        assert impostor.stdout.readline().strip() == "listening"
        with pytest.raises(EndpointError) as refused:
            client.request("lock", 5)
        assert refused.value.msg.startswith(
            "refusing the agent socket %s: it is not the engine's own (its listener is pid %d, not the engine's pid %d; "
            "its listener runs as uid 65534, not the engine's uid 0; the socket file is uid 65534's, not the engine's "
            "uid 0)" % (client.path, impostor.pid, os.getpid())), refused.value.msg
        assert impostor.stdout.readline().strip() == "heard 0 bytes", "nothing was sent to it"
    finally:
        if impostor is not None:
            impostor.kill()
            impostor.wait()
        engine.close()
        shutil.rmtree(directory)

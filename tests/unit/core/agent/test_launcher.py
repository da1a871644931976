"""An agent that cannot listen leaves the engine serving and says why it cannot be snapshotted; an agent serves
only root and the engine's own user (the peer's credentials, on a real socket from another uid)."""
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import agent_command, ensure_agent_package, http_get

from ansible_collections.inferops.snapshot.plugins.module_utils.core.agent import launcher


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


# -- who may talk to the agent: root and the engine's own user, checked by the peer's credentials ----

ENGINE_UID, OTHER_UID = 4243, 4242  # an engine image's user, and anyone else on the node
ENGINE = r'''
import sys, time
from inferops_agent import launcher
marker = sys.argv[1]
def hook(nonce):
    with open(marker, "a") as handle:
        handle.write(nonce + "\n")
launcher.current_controller().register_hook(launcher.RESTORE_POST, hook)
print("hooked", flush=True)
time.sleep(600)
'''
ASK = r'''
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(sys.argv[2].encode() + b"\n")
print(sock.makefile().readline().strip())
'''


# Other users cannot run this test's interpreter (it may live below root's home): the system's python3, with the
# agent copied where every user can read it, as an engine image has it. Standard library only.
SYSTEM_PYTHON = "/usr/bin/python3"


def ask(path, request, uid=None):
    """The agent's reply to ``request``, asked over a real connection by a process of ``uid`` (None: this one's)."""
    extra = dict(user=uid, group=uid) if uid is not None else {}
    out = subprocess.run([SYSTEM_PYTHON, "-c", ASK, path, json.dumps(request)], capture_output=True, text=True,
                         timeout=30, check=True, **extra)
    return json.loads(out.stdout)


@pytest.fixture
def engine_as_a_user():
    """The launcher and a trivial engine running as ENGINE_UID, its socket (deliberately) reachable by everyone."""
    base = tempfile.mkdtemp(prefix="inferops-peer-", dir="/tmp")
    os.chmod(base, 0o755)
    shutil.copytree(str(ensure_agent_package() / "inferops_agent"), os.path.join(base, "inferops_agent"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    os.chown(base, ENGINE_UID, ENGINE_UID)
    script, marker = os.path.join(base, "engine.py"), os.path.join(base, "hook-calls")
    with open(script, "w") as handle:
        handle.write(ENGINE)
    os.chmod(script, 0o644)  # whatever the umask: the engine runs as another user
    env = dict(os.environ, PYTHONPATH=base, INFEROPS_AGENT_SOCKET_DIR=os.path.join(base, "agent"),
               INFEROPS_ACL_LIBRARY=os.path.join(base, "none.so"))
    engine = subprocess.Popen(agent_command(script, SYSTEM_PYTHON) + [marker], env=env, user=ENGINE_UID,
                              group=ENGINE_UID, cwd=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert engine.stdout.readline().strip() == "hooked", engine.stderr.read()
        path = os.path.join(base, "agent", "agent.%d.sock" % engine.pid)
        assert os.stat(path).st_uid == ENGINE_UID and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        os.chmod(os.path.join(base, "agent"), 0o755)  # a mode someone got wrong: the credentials still decide
        os.chmod(path, 0o666)
        yield dict(path=path, marker=marker, engine=engine)
    finally:
        engine.kill()
        engine.wait()
        shutil.rmtree(base)


def test_only_root_and_the_engines_own_user_may_talk_to_the_agent(engine_as_a_user):
    e = engine_as_a_user
    refused = ask(e["path"], {"op": "resumed", "nonce": "a" * 32}, uid=OTHER_UID)
    assert refused["ok"] is False and refused["error"]["kind"] == "forbidden", refused
    assert refused["error"]["message"].startswith("uid %d (pid " % OTHER_UID), refused
    assert "only root and the engine's own uid %d may" % ENGINE_UID in refused["error"]["message"]
    assert "state" not in refused, "nothing about the engine is told to a stranger"
    assert not os.path.exists(e["marker"]), "the refused request was acted on"
    mine = ask(e["path"], {"op": "resumed", "nonce": "b" * 32}, uid=ENGINE_UID)
    assert mine["ok"] and mine["resumed"]["hooks"] == 1, mine
    by_root = ask(e["path"], {"op": "resumed", "nonce": "c" * 32})
    assert by_root["ok"], by_root
    with open(e["marker"]) as handle:
        assert handle.read().split() == ["b" * 32, "c" * 32]
    e["engine"].kill()
    assert "refused a request: uid %d" % OTHER_UID in e["engine"].communicate()[1]


@pytest.mark.parametrize("uid, own, refused", [(0, 1000, False), (1000, 1000, False), (1001, 1000, True),
                                               (0, 0, False), (65534, 0, True)])
def test_the_peer_rule(uid, own, refused):
    assert (launcher.peer_refusal(7, uid, own) is not None) is refused

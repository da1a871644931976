"""The runtime handler of containerd's CRI plugin, with containerd and ctr stubbed at the process boundary (a fake
runner whose `config dump` merges the files one plugin at a time, as containerd 1.6 does) and a real process named
containerd listening on the socket: how the files containerd reads are found, TOML written back as tomllib reads it,
the drop-in that carries the CRI section plus the handler, idempotence and whether the daemon runs with it, and every
refusal before anything is written."""

import os
import subprocess
import sys
import time
import tomllib

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import wait_for
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import CommandError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import commands
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.containerd_cli import ContainerdCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import proc
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import cri_handler as ch

CRI = ch.CRI
RUNC = {"runtime_type": ch.RUNC_V2,
        "options": {"BinaryName": "/usr/sbin/runc", "Root": "/run/node/runc", "SystemdCgroup": False}}
MAIN = """version = 2
root = "/var/lib/node"
imports = ["%(conf_d)s/*.toml"]

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "pause:local"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "/run/node/runc"
        SystemdCgroup = false

[plugins."io.containerd.internal.v1.opt"]
  path = "/opt/node"
"""


# -- reading what containerd reads -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, config", [
    (["containerd"], ch.DEFAULT_CONFIG), (["/usr/bin/containerd", "--config", "/etc/x.toml"], "/etc/x.toml"),
    (["containerd", "-c", "/a.toml"], "/a.toml"), (["containerd", "--config=/b.toml", "--log-level", "info"], "/b.toml"),
    (["containerd", "--log-level", "debug"], ch.DEFAULT_CONFIG)])
def test_the_configuration_a_daemon_reads_is_its_config_argument_or_containerds_default(argv, config):
    assert ch.config_argument(argv) == config


def test_files_are_read_in_containerds_order_breadth_first_a_globs_matches_sorted_dot_files_too(tmp_path):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (tmp_path / "main.toml").write_text('version = 2\nimports = ["%s/*.toml", "extra.toml"]\n' % conf_d)
    (conf_d / "20-b.toml").write_text('version = 2\nimports = ["%s"]\n' % (tmp_path / "nested.toml"))
    (conf_d / ".10-hidden.toml").write_text("version = 2\n")
    (conf_d / "notes.txt").write_text("not toml")
    (tmp_path / "extra.toml").write_text("version = 2\n")
    (tmp_path / "nested.toml").write_text("version = 2\n")
    order = [path for path, _table in ch.load_order(str(tmp_path / "main.toml"))]
    assert order == [str(tmp_path / "main.toml"), str(conf_d / ".10-hidden.toml"), str(conf_d / "20-b.toml"),
                     str(tmp_path / "extra.toml"), str(tmp_path / "nested.toml")]
    with_dropin = ch.load_order(str(tmp_path / "main.toml"), {str(conf_d / "90-handler.toml"): "version = 2\n"})
    assert [p for p, _t in with_dropin][3] == str(conf_d / "90-handler.toml")
    without = ch.load_order(str(tmp_path / "main.toml"), {str(conf_d / "20-b.toml"): None})
    assert str(conf_d / "20-b.toml") not in [p for p, _t in without] and str(tmp_path / "nested.toml") not in \
        [p for p, _t in without]


@pytest.mark.parametrize("text, refusal", [
    ("[plugins.cri]\n", "is a version 1 configuration"),
    ("version = 2\nimports = [\"/etc/*/conf.d/*.toml\"]\n", "a wildcard in a directory"),
    ("version = 2\n[plugins\n", "is no TOML containerd could read"),
])
def test_what_the_role_cannot_read_as_containerd_does_is_refused(tmp_path, text, refusal):
    (tmp_path / "main.toml").write_text(text)
    with pytest.raises(ch.HandlerRefused) as refused:
        ch.load_order(str(tmp_path / "main.toml"))
    assert refusal in refused.value.msg


def test_the_section_in_force_is_the_last_files_whole(tmp_path):
    order = [("/a", {"plugins": {CRI: {"x": 1}, "other": {}}}), ("/b", {"plugins": {"other": {}}}),
             ("/c", {"plugins": {CRI: {"x": 3}}})]
    assert ch.section_of(order) == ("/c", {"x": 3})
    assert ch.section_of(order, skip="/c") == ("/a", {"x": 1})
    assert ch.section_of(order[1:2]) == (None, None)


def test_toml_is_written_as_tomllib_reads_it_back():
    table = {"version": 2, "plugins": {CRI: {
        "enable_selinux": False, "max_conf": 1, "ratio": 0.5, "big": float("inf"),
        "names": ["org.inferops.*", "ünï \"quoted\" \\ \t\x01\x7f"], "empty": {},
        "containerd": {"runtimes": {"inferops-restore": dict(RUNC, pod_annotations=["org.inferops.*"])}},
        "mirrors": [{"endpoint": ["http://127.0.0.1:9"], "weight": 1}]}}}
    text = ch.toml_text(table)
    assert tomllib.loads(text) == table
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.inferops-restore.options]' in text
    with pytest.raises(ch.HandlerRefused) as refused:
        ch.toml_text({"when": {"at": object()}})
    assert "when.at: a object value is beyond what the role writes" in refused.value.msg


# -- the handler, against a process named containerd and a stubbed containerd binary ----------------------------------

class FakeContainerd(commands.Runner):
    """`containerd --config X config dump`: the files merged one plugin at a time with containerd's defaults (a runc
    handler where a section names no runtimes), `imports` listing what was read; `ctr plugins ls`: the CRI plugin's
    status ``cri`` (None: not listed)."""

    def __init__(self, cri="ok", dump_error=None):
        super(FakeContainerd, self).__init__()
        self.cri, self.dump_error, self.calls = cri, dump_error, []

    def run(self, argv, timeout=None, data=None, check=True, what=None, secrets=(), env=None):
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        if argv[-2:] == ["config", "dump"]:
            if self.dump_error:
                raise CommandError("%s failed (rc=1): %s" % (what, self.dump_error), cmd=argv, rc=1)
            order = ch.load_order(argv[2])
            merged = {"version": 2, "imports": sorted(p for p, _t in order), "plugins": {}}
            for _path, table in order:
                merged["plugins"].update(table.get("plugins") or {})
            section = merged["plugins"].setdefault(CRI, {})
            section.setdefault("sandbox_image", "registry.k8s.io/pause:3.6")
            containerd = section.setdefault("containerd", {})
            containerd.setdefault("default_runtime_name", "runc")
            containerd.setdefault("runtimes", {"runc": {"runtime_type": ch.RUNC_V2}})
            return 0, ch.toml_text(merged), ""
        if argv[-2:] == ["plugins", "ls"]:
            line = "io.containerd.grpc.v1    cri    linux/amd64    %s\n" % self.cri if self.cri else ""
            return 0, "TYPE    ID    PLATFORMS    STATUS\nio.containerd.grpc.v1    version    -    ok\n" + line, ""
        raise AssertionError("unexpected command %r" % (argv,))


@pytest.fixture
def node(tmp_path):
    """A node's configuration (main.toml importing conf.d/*.toml) and a process named containerd that reads it,
    listening on the node's socket; ``restart()`` replaces that process."""
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    main = tmp_path / "main.toml"
    main.write_text(MAIN % {"conf_d": conf_d})
    socket = tmp_path / "containerd.sock"
    named = tmp_path / "bin" / "containerd"   # a Python whose command line says containerd
    named.parent.mkdir()
    named.symlink_to(os.path.realpath(sys.executable))
    daemons = []

    def start(config=main):
        if daemons:
            daemons[-1].kill()
            daemons[-1].wait()
            os.unlink(socket)
        script = ("import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.bind(%r)\ns.listen()\ntime.sleep(600)\n"
                  % str(socket))
        daemon = subprocess.Popen([str(named), "-", "--config", str(config)], stdin=subprocess.PIPE)
        daemon.stdin.write(script.encode())
        daemon.stdin.close()
        daemons.append(daemon)
        wait_for(lambda: (proc.unix_listeners(str(socket)) == [daemon.pid], proc.unix_listeners(str(socket))), 20,
                 what="the daemon listening")
        return daemon

    start()
    yield {"main": str(main), "conf_d": conf_d, "socket": str(socket), "restart": start, "tmp": tmp_path}
    for daemon in daemons:
        daemon.kill()
        daemon.wait()


def handler(node, fake=None, **kwargs):
    args = dict(name="inferops-restore", binary="/usr/local/bin/inferops-restore-runtime", config=node["main"],
                socket=node["socket"], dropin=str(node["conf_d"] / "50-inferops-restore.toml"),
                state_dir=str(node["tmp"] / "state"), annotations=["org.inferops.*"])
    args.update(kwargs)
    cli = ContainerdCli(node["socket"], containerd="containerd", ctr="ctr", runner=fake or FakeContainerd())
    return ch.RuntimeHandler(cli=cli, **args)


def test_the_dropin_carries_the_nodes_cri_section_plus_a_copy_of_its_default_runtime(node):
    h = handler(node)
    plan = h.present()
    assert plan["changed"] and plan["before"] is None and not plan["in_force"] and plan["source"] == node["main"]
    written = tomllib.loads(plan["after"])
    section = written["plugins"][CRI]
    assert set(written["plugins"]) == {CRI}, "only the CRI section: the others stay the main file's"
    assert section["sandbox_image"] == "pause:local" and section["containerd"]["runtimes"]["runc"] == RUNC
    assert section["containerd"]["runtimes"]["inferops-restore"] == {
        "runtime_type": ch.RUNC_V2, "pod_annotations": ["org.inferops.*"], "container_annotations": ["org.inferops.*"],
        "options": dict(RUNC["options"], BinaryName="/usr/local/bin/inferops-restore-runtime")}
    assert plan["after"].startswith(ch.MARK) and plan["daemon"]["config"] == node["main"]
    h.apply(plan["after"])
    assert (node["conf_d"] / "50-inferops-restore.toml").read_text() == plan["after"]

    again = handler(node).present()
    assert not again["changed"] and again["after"] == plan["after"], "a second run changes nothing"
    assert not again["in_force"], "the daemon started before the drop-in was written"
    time.sleep(0.05)  # the daemon's start time is in clock ticks
    node["restart"]()
    assert handler(node).present()["in_force"]


def test_the_handler_takes_the_options_given_and_the_runc_root(node):
    plan = handler(node, runc_root="/run/other/runc", annotations=["org.inferops.restore-from"]).present()
    entry = tomllib.loads(plan["after"])["plugins"][CRI]["containerd"]["runtimes"]["inferops-restore"]
    assert entry["options"]["Root"] == "/run/other/runc" and entry["pod_annotations"] == ["org.inferops.restore-from"]


def test_a_change_to_the_main_files_section_reaches_the_dropin_on_the_next_run(node):
    """The drop-in's section is the one of the file that defines it without the drop-in: it never shadows a change."""
    h = handler(node)
    h.apply(h.present()["after"])
    main = open(node["main"]).read().replace('sandbox_image = "pause:local"', 'sandbox_image = "pause:2"')
    with open(node["main"], "w") as f:
        f.write(main)
    plan = handler(node).present()
    assert plan["changed"] and tomllib.loads(plan["after"])["plugins"][CRI]["sandbox_image"] == "pause:2"


def test_without_a_section_anywhere_containerds_defaults_are_carried(node):
    with open(node["main"], "w") as f:
        f.write('version = 2\nimports = ["%s/*.toml"]\n' % node["conf_d"])
    plan = handler(node).present()
    runtimes = tomllib.loads(plan["after"])["plugins"][CRI]["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", "inferops-restore"} and plan["source"] is None, \
        "the defaults' runc handler would be lost with a runtimes table of the handler alone"


@pytest.mark.parametrize("change, refusal", [
    ("other_config", "snapshot_node_containerd_config: the containerd on {socket} (pid {pid}) reads {other}, not {main}"),
    ("no_daemon", "snapshot_node_containerd_socket: no process listens on {tmp}/none.sock"),
    ("no_cri", "the containerd on {socket} runs without its CRI plugin (not loaded)"),
    ("cri_error", "the containerd on {socket} runs without its CRI plugin (status error)"),
    ("dump_fails", "containerd cannot read its configuration, so the role cannot tell which one is in force: "),
    ("not_imported", "snapshot_node_containerd_dropin: {main} does not import {tmp}/elsewhere/x.toml"),
    ("later_section", "{conf_d}/90-late.toml replace the CRI section after {conf_d}/50-inferops-restore.toml"),
    ("taken_name", "snapshot_node_runtime_name: {main} already has a runtime handler runc"),
    ("foreign_dropin", "snapshot_node_containerd_dropin: {conf_d}/50-inferops-restore.toml exists and was not "
                       "written by the role"),
    ("not_runc", "the default runtime runc of {main} is io.containerd.kata.v2, not io.containerd.runc.v2"),
])
def test_it_refuses_before_writing_what_it_cannot_tell_or_would_break(node, change, refusal):
    kwargs, fake = {}, FakeContainerd()
    if change == "other_config":
        other = node["tmp"] / "other.toml"
        other.write_text(open(node["main"]).read())
        node["restart"](other)
        refusal = refusal.replace("{other}", str(other))
    elif change == "no_daemon":
        kwargs["socket"] = str(node["tmp"] / "none.sock")
    elif change in ("no_cri", "cri_error"):
        fake = FakeContainerd(cri=None if change == "no_cri" else "error")
    elif change == "dump_fails":
        fake = FakeContainerd(dump_error="failed to load TOML: (4, 1): unexpected token")
    elif change == "not_imported":
        kwargs["dropin"] = str(node["tmp"] / "elsewhere" / "x.toml")
    elif change == "later_section":
        (node["conf_d"] / "90-late.toml").write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n')
    elif change == "taken_name":
        kwargs["name"] = "runc"
    elif change == "foreign_dropin":
        (node["conf_d"] / "50-inferops-restore.toml").write_text('version = 2\n')
    elif change == "not_runc":
        with open(node["main"], "w") as f:
            f.write((MAIN % {"conf_d": node["conf_d"]}).replace("io.containerd.runc.v2", "io.containerd.kata.v2"))
    before = sorted(os.listdir(node["conf_d"]))
    with pytest.raises(ch.HandlerRefused) as refused:
        handler(node, fake, **kwargs).present()
    daemon = proc.unix_listeners(node["socket"])
    assert refusal.format(socket=node["socket"], pid=daemon[0] if daemon else 0, main=node["main"], tmp=node["tmp"],
                          conf_d=node["conf_d"]) in refused.value.msg, refused.value.msg
    assert sorted(os.listdir(node["conf_d"])) == before


def test_a_file_containerd_reads_that_the_roles_reading_misses_is_refused(node):
    """containerd's own list of what it read (its dump's imports) is the check on the role's reading of the imports."""
    class Another(FakeContainerd):
        def run(self, argv, *args, **kwargs):
            rc, out, err = super(Another, self).run(argv, *args, **kwargs)
            return rc, out.replace("imports = [", 'imports = ["/etc/containerd/surprise.toml", ', 1), err
    with pytest.raises(ch.HandlerRefused) as refused:
        handler(node, Another()).present()
    assert "containerd reads /etc/containerd/surprise.toml besides %s, the role's reading of its imports found " \
           "nothing" % node["main"] in refused.value.msg


def test_absent_removes_only_its_own_dropin_and_refuses_while_tasks_run_with_the_binary(node):
    h = handler(node)
    h.apply(h.present()["after"])
    bundle = node["tmp"] / "state" / ch.TASKS / "k8s.io" / ("ab" * 32)
    bundle.mkdir(parents=True)
    (bundle / "options.json").write_text('{"binary_name": "/usr/local/bin/inferops-restore-runtime"}')
    (bundle / "config.json").write_text('{"annotations": {"io.kubernetes.cri.sandbox-namespace": "team-a", '
                                        '"io.kubernetes.cri.sandbox-name": "engine-0"}}')
    other = node["tmp"] / "state" / ch.TASKS / "k8s.io" / ("cd" * 32)
    other.mkdir()
    (other / "options.json").write_text('{"binary_name": "/usr/sbin/runc"}')
    with pytest.raises(ch.HandlerRefused) as refused:
        handler(node).absent()
    assert "pods still run with the runtime handler inferops-restore: team-a/engine-0 (abababababab)" in \
        refused.value.msg
    assert (node["conf_d"] / "50-inferops-restore.toml").exists()
    plan = handler(node).absent(force=True)
    assert plan["changed"] and plan["users"] == ["team-a/engine-0 (abababababab)"] and plan["after"] is None
    handler(node).apply(None)
    assert not (node["conf_d"] / "50-inferops-restore.toml").exists()
    again = handler(node).absent(force=True)
    assert not again["changed"] and not again["in_force"], "the daemon still runs with the handler it loaded"
    time.sleep(0.05)
    node["restart"]()
    assert handler(node).absent(force=True)["in_force"]

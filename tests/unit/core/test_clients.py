"""The clients of Docker, runc and CRIU, with the process boundary (the Runner) stubbed, and the Runner
itself on real processes."""

import json
import os
import sys

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import (CommandError, ParameterError,
                                                                                         SnapshotTimeout)
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import commands as runner, criu_cli as criu
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.criu_cli import CriuCli, parse_version
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.docker_cli import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.runc_cli import RuncCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import container_record as container


class FakeRunner(runner.Runner):
    """Stands in for the process boundary only: canned (rc, out, err) per argv prefix; the real error handling."""

    def __init__(self, answers):
        super(FakeRunner, self).__init__()
        self.answers = answers
        self.calls = []

    def run(self, argv, timeout=None, data=None, check=True, what=None, secrets=(), env=None):
        argv = [str(arg) for arg in argv]
        self.calls.append(argv)
        for prefix, (rc, out, err) in self.answers:
            if argv[:len(prefix)] == list(prefix):
                if check and rc != 0:
                    raise CommandError("%s failed (rc=%d): %s" % (what, rc, runner.mask(err, secrets)),
                                       cmd=runner.mask(argv, secrets), rc=rc, stderr=runner.mask(err, secrets))
                return rc, out, err
        raise AssertionError("unexpected command %r" % (argv,))


@pytest.fixture(autouse=True)
def nothing_remembered(monkeypatch):
    """What a test's `docker create` remembered (runner.remember) is masked for the rest of its process: not here."""
    monkeypatch.setattr(runner, "_REMEMBERED", set())


def docker(answers):
    cli = DockerCli("/usr/bin/docker", FakeRunner(answers))
    cli.executable = "/usr/bin/docker"
    return cli


def criu_cli(answers, installed=True):
    cli = CriuCli("criu", FakeRunner(answers))
    cli.executable = "/usr/bin/criu" if installed else None
    return cli


@pytest.mark.parametrize("text, version", [
    ("Version: 4.2.1\n", (4, 2, 1)), ("Version: 3.17\nGitID: x", (3, 17)), ("criu: not found", None), ("", None)])
def test_parse_version(text, version):
    assert parse_version(text) == version


def test_criu_missing_old_and_failing_check_are_clear():
    with pytest.raises(ParameterError, match="not found on PATH; install CRIU >= 4.2"):
        criu_cli([], installed=False).dump(1, "/x", True, 5)
    with pytest.raises(ParameterError, match="version 3.17.1 is too old"):
        criu_cli([(["/usr/bin/criu", "--version"], (0, "Version: 3.17.1\n", ""))]).require()
    broken = criu_cli([(["/usr/bin/criu", "--version"], (0, "Version: 4.2.1\n", "")),
                       (["/usr/bin/criu", "check"], (1, "", "Error (criu/cr-check.c:1234): seccomp is missing\n"))])
    with pytest.raises(CommandError, match="criu check failed.*seccomp is missing") as info:
        broken.require()
    assert info.value.result["criu_version"] == "4.2.1"
    good = criu_cli([(["/usr/bin/criu", "--version"], (0, "Version: 4.2.1\n", "")),
                     (["/usr/bin/criu", "check"], (0, "Looks good.\n", ""))])
    assert good.require() == "4.2.1"


def test_docker_daemon_facts_and_errors():
    assert docker([(["/usr/bin/docker", "version"], (0, "20.10.24 false\n", ""))]).server_info() == ("20.10.24", False)
    with pytest.raises(CommandError, match="is dockerd running"):
        docker([(["/usr/bin/docker", "version"], (1, "", "Cannot connect to the Docker daemon"))]).server_info()


def test_docker_checkpoint_support_reads_data_root_and_experimental_flag():
    cli = docker([(["/usr/bin/docker", "info"], (0, "/data/docker|false\n", ""))])
    assert cli.checkpoint_support() == ("/data/docker", False)
    assert cli.runner.calls == [["/usr/bin/docker", "info", "--format", "{{.DockerRootDir}}|{{.ExperimentalBuild}}"]]
    assert docker([(["/usr/bin/docker", "info"], (0, "/var/lib/docker|true\n", ""))]).checkpoint_support() == \
        ("/var/lib/docker", True)
    with pytest.raises(CommandError, match="is dockerd running"):
        docker([(["/usr/bin/docker", "info"], (1, "", "Cannot connect to the Docker daemon"))]).checkpoint_support()


def test_container_not_running_or_missing():
    stopped = docker([(["/usr/bin/docker", "container", "inspect"],
                       (0, '[{"State": {"Running": false, "Pid": 0, "Status": "exited"}}]', ""))])
    with pytest.raises(ParameterError, match="'c1' is not running \\(status exited\\); start it first"):
        stopped.running_pid("c1")
    missing = docker([(["/usr/bin/docker", "container", "inspect"], (1, "", "Error: No such container: c2"))])
    with pytest.raises(ParameterError, match="no container named 'c2'"):
        missing.running_pid("c2")


def test_a_docker_cli_that_is_not_there_is_refused_naming_docker_cli(tmp_path):
    missing = str(tmp_path / "nonexistent" / "docker")
    with pytest.raises(ParameterError, match=r"^docker_cli: '%s' is no executable on this host" % missing) as raised:
        DockerCli(missing).image_id("busybox")  # the real Runner: the binary cannot be started
    assert raised.value.result["field"] == "docker_cli"
    with pytest.raises(ParameterError, match=r"^docker_cli: 'no-such-docker-cli' is no executable"):
        DockerCli("no-such-docker-cli").running_pid("engine")


def test_docker_create_never_shows_the_environment_values_it_was_given():
    """A failed `docker create` used to put the whole command line, secrets included, into msg and cmd."""
    failing = docker([(["/usr/bin/docker", "create"], (125, "", "Error: invalid reference format: SECRET_TOKEN=s3cr3t"))])
    record = {"name": "w", "id": "abc", "image_id": "sha256:" + "a" * 64,
              "config": {"Env": ["PATH=/bin"]}, "host_config": {}}
    env = {"SECRET_TOKEN": "s3cr3t", "POD_IP": "10.1.2.3"}
    with pytest.raises(CommandError) as info:
        failing.create(container.create_args(record, "w2", env), env=env)
    shown = repr(info.value.msg) + repr(info.value.result)
    assert "s3cr3t" not in shown and "10.1.2.3" not in shown and runner.MASK in shown
    assert {"s3cr3t", "10.1.2.3", "/bin"} <= runner.remembered()  # for every field of the task's result (_module)


def test_docker_create_takes_the_environment_from_a_private_file_never_from_its_command_line():
    seen = {}

    class Reading(FakeRunner):
        def run(self, argv, timeout=None, data=None, check=True, what=None, secrets=(), env=None):
            path = argv[argv.index("--env-file") + 1]
            seen.update(argv=argv, path=path, content=open(path).read(), mode=os.stat(path).st_mode & 0o777,
                        dir_mode=os.stat(os.path.dirname(path)).st_mode & 0o777, env=env)
            return 0, "c0ffee\n", ""

    cli = DockerCli("/usr/bin/docker", Reading([]))
    record = {"name": "w", "id": "abc", "image_id": "sha256:" + "a" * 64,
              "config": {"Env": ["TOKEN=s3cr3t-recorded", "MULTI=line one\nline two"]}, "host_config": {}}
    assert cli.create(container.create_args(record, "w2", {"POD_IP": "10.1.2.3"}), env={"POD_IP": "10.1.2.3"}) == "c0ffee"
    assert not any("s3cr3t" in word or "10.1.2.3" in word or "line one" in word for word in seen["argv"]), seen["argv"]
    assert seen["content"] == "MULTI\nPOD_IP=10.1.2.3\nTOKEN=s3cr3t-recorded\n" and seen["mode"] == 0o600
    assert seen["dir_mode"] == 0o700 and not os.path.exists(os.path.dirname(seen["path"])), "removed right after"
    assert seen["env"]["MULTI"] == "line one\nline two", "a line break reaches docker through its environment"


def test_runner_masks_secrets_and_stops_at_its_deadline(tmp_path):
    real = runner.Runner()
    with pytest.raises(CommandError) as info:
        real.run([sys.executable, "-c", "import sys; print('x=hunter2', file=sys.stderr); sys.exit(3)"],
                 secrets=["hunter2"], what="probe")
    assert info.value.result["rc"] == 3 and "hunter2" not in repr(info.value.result) + info.value.msg
    with pytest.raises(SnapshotTimeout, match="sleeper did not finish within 1 s") as info:
        real.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1, what="sleeper")
    assert info.value.result["cmd"][0] == sys.executable
    assert real.run([sys.executable, "-c", "print('ok')"]) == (0, "ok\n", "")


def test_runc_argv_carries_the_callers_global_options_and_criu():
    cli = RuncCli("/usr/bin/runc", ["--root", "/run/moby", "--log", "/l"], criu="/opt/criu")
    assert cli.root == "/run/moby"
    assert cli.argv("kill", "c", "KILL") == ["/usr/bin/runc", "--root", "/run/moby", "--log", "/l", "--criu", "/opt/criu",
                                             "kill", "c", "KILL"]
    argv = cli.restore_argv("c", "/b", "/snap/host/criu", "/w", "/b/pid", console_socket="/s", no_pivot=True)
    assert argv[argv.index("restore"):] == ["restore", "--detach", "--image-path", "/snap/host/criu", "--work-path", "/w",
                                            "--bundle", "/b", "--pid-file", "/b/pid", "--file-locks",
                                            "--console-socket", "/s", "--no-pivot", "c"]
    argv = RuncCli("/usr/bin/runc", ["--criu", "/own"], criu="/opt/criu").argv("x")
    assert argv == ["/usr/bin/runc", "--criu", "/own", "x"]


def test_a_failed_checkpoint_keeps_criu_log_and_names_its_first_error(tmp_path):
    log_dir = tmp_path / "logs"

    class Failing(FakeRunner):
        def run(self, argv, **kwargs):
            if "checkpoint" not in argv:
                return 0, '{"status": "running"}', ""  # runc state after the failure: nothing to thaw
            work = argv[argv.index("--work-path") + 1]
            with open(work + "/dump.log", "w") as handle:
                handle.write("(00.01) Error (criu/util.c:1): rlimit: Can't setup RLIMIT_NOFILE\n"
                             "(00.02) Error (criu/files-reg.c:9): Can't dump file lock of /cache/db\n"
                             "(00.03) Error (criu/cr-dump.c:2): Dumping FAILED.\n")
            raise CommandError("runc checkpoint of container c failed (rc=1): criu failed: type NOTIFY errno 0",
                               cmd=argv, rc=1, stderr="criu failed: type NOTIFY errno 0")

    cli = RuncCli("/usr/bin/runc", ["--root", "/r"], runner=Failing([]))
    with pytest.raises(CommandError) as info:
        cli.checkpoint("c" * 64, str(tmp_path / "images"), True, 5, log_dir=str(log_dir))
    assert "Can't dump file lock of /cache/db" in info.value.msg and info.value.result["criu_log"] in info.value.msg
    kept = info.value.result["criu_log"]
    assert kept.startswith(str(log_dir)) and oct(os.stat(kept).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("left", ["paused", "running"])
def test_a_checkpoint_stopped_at_its_deadline_thaws_the_container_its_dump_left_frozen(tmp_path, left):
    """runc and CRIU killed at the deadline may leave the container's cgroup frozen: the engine would stay frozen
    with the run alive (no takeover ever thaws it), so the failed checkpoint thaws it, and says so."""
    class Stopped(FakeRunner):
        def run(self, argv, **kwargs):
            if "checkpoint" in argv:
                self.calls.append(list(argv))
                raise SnapshotTimeout("runc checkpoint of container c did not finish within 5 s")
            return super(Stopped, self).run(argv, **kwargs)

    fake = Stopped([(("/usr/bin/runc", "--root", "/r", "state"), (0, '{"status": "%s"}' % left, "")),
                    (("/usr/bin/runc", "--root", "/r", "resume"), (0, "", ""))])
    cli = RuncCli("/usr/bin/runc", ["--root", "/r"], runner=fake)
    with pytest.raises(SnapshotTimeout) as info:
        cli.checkpoint("c" * 64, str(tmp_path / "images"), True, 5, log_dir=str(tmp_path / "logs"))
    resumed = [call for call in fake.calls if "resume" in call]
    if left == "paused":
        assert resumed == [["/usr/bin/runc", "--root", "/r", "resume", "c" * 64]]
        assert info.value.msg.endswith("was thawed") and info.value.result["thawed"] == "c" * 12
    else:
        assert resumed == [] and "thawed" not in info.value.result


def test_create_args_rebuild_the_recorded_container():
    record = {"name": "w", "id": "abc", "image_id": "sha256:" + "a" * 64,
              "config": {"Image": "w:1", "Cmd": ["python3", "app.py"], "Entrypoint": None,
                         "Env": ["A=1", "B=x=y"], "WorkingDir": "/app", "User": "", "Labels": {"l": "v"}},
              "host_config": {"NetworkMode": "host", "Binds": ["/d:/d"], "ShmSize": 67108864, "Runtime": "runc",
                              "IpcMode": "private", "PidMode": "", "Privileged": False, "CapAdd": None,
                              "Devices": [], "SecurityOpt": None, "Tmpfs": None}}
    args = container.create_args(record, "w2", {"B": "new", "C": "3"})
    assert args[:2] == ["--name", "w2"]
    assert args.env == {"A": "1", "B": "new", "C": "3"} and "--env" not in args and not any("=new" in a for a in args)
    assert args[args.index("--volume") + 1] == "/d:/d" and args[args.index("--network") + 1] == "host"
    assert "--runtime" not in args and "--ipc" not in args
    assert args[-4:] == ["--", "sha256:" + "a" * 64, "python3", "app.py"]


def test_work_dir_with_a_mount_below_is_never_removed(tmp_path):
    work = tmp_path / "work"
    (work / "cgyard" / "cpu").mkdir(parents=True)
    info = tmp_path / "mountinfo"
    info.write_text("36 35 98:0 / %s/cgyard/cpu rw - cgroup cgroup rw,cpu\n" % work)
    assert criu.mounts_below(str(work), str(info)) == ["%s/cgyard/cpu" % work]
    info.write_text("36 35 98:0 / /elsewhere rw - ext4 /dev/x rw\n")
    assert criu.mounts_below(str(work), str(info)) == []
    assert criu.remove_work_dir(str(work)) is True and not work.exists()


@pytest.mark.parametrize("configured", [None, "custom", ""])
def test_a_stopped_restore_adds_leave_stopped_for_one_restore_only(tmp_path, monkeypatch, configured):
    """runc 1.1 has no leave-stopped: it goes through the bundle's CRIU config annotation, with the host's own
    options kept, and afterwards the bundle is as it was and the file leads to the host's configuration."""
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
    from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.runc_cli import StoppedRestore
    host_conf = tmp_path / "runc.conf"
    host_conf.write_text("tcp-close\nskip-in-flight\n")
    monkeypatch.setattr(layout, "RUNC_CRIU_CONFIG", str(host_conf))
    custom = tmp_path / "custom.conf"
    custom.write_text("tcp-established\n")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = {"ociVersion": "1.0.2", "process": {"args": ["x"]}}
    if configured is not None:
        spec["annotations"] = {"org.criu.config": str(custom) if configured else ""}
    original = json.dumps(spec, indent=1).encode()
    (bundle / "config.json").write_bytes(original)
    conf = tmp_path / "state" / "criu.conf"
    conf.parent.mkdir()
    stopped = StoppedRestore(str(bundle), str(conf))
    stopped.enter(spec)
    during = json.loads((bundle / "config.json").read_text())
    assert during["annotations"]["org.criu.config"] == str(conf) and during["process"] == spec["process"]
    expected = {None: ["tcp-close", "skip-in-flight"], "custom": ["tcp-established"], "": []}[configured]
    assert conf.read_text().split() == expected + ["leave-stopped"]
    assert oct(conf.stat().st_mode & 0o777) == "0o600"
    stopped.leave()
    assert (bundle / "config.json").read_bytes() == original
    if configured == "":
        assert not os.path.lexists(str(conf))  # CRIU ignores a file it cannot open: no options, as configured
    else:
        assert os.readlink(str(conf)) == str(custom if configured else host_conf)


def test_values_too_short_or_plain_to_be_secrets_are_not_masked_everywhere():
    """Masked, "1" would turn every 1 of a message into ******** (and Ansible every number holding it)."""
    assert [runner.may_be_secret(v) for v in ("1", "on", "abc", "True", "no", "", None)] == [False] * 7
    assert [runner.may_be_secret(v) for v in ("8080", "s3cr3t", "10.1.2.3", "truely")] == [True] * 4
    text = runner.mask("docker create -e WORKERS=1 -e TOKEN=s3cr3t failed after 1.5 s", ["1", "s3cr3t"])
    assert text == "docker create -e WORKERS=1 -e TOKEN=******** failed after 1.5 s"

"""The Docker and CRIU client classes, with the process boundary (run_command) stubbed."""

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils import _host as host
from ansible_collections.inferops.snapshot.plugins.module_utils._criu import CriuCli, parse_version
from ansible_collections.inferops.snapshot.plugins.module_utils._docker import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils._errors import (
    CommandError,
    ParameterError,
    SnapshotTimeout,
)


class FakeModule:
    """Stands in for AnsibleModule at the process boundary only: canned (rc, out, err) per argv prefix."""

    def __init__(self, answers, binaries=("docker", "criu")):
        self.answers = answers
        self.binaries = binaries
        self.calls = []

    def get_bin_path(self, name, required=False):
        return "/usr/bin/%s" % name if name in self.binaries else None

    def run_command(self, argv, **kwargs):
        self.calls.append(list(argv))
        for prefix, answer in self.answers:
            if list(argv[:len(prefix)]) == list(prefix):
                return answer
        raise AssertionError("unexpected command %r" % (argv,))


@pytest.mark.parametrize("text, version", [
    ("Version: 4.2.1\n", (4, 2, 1)), ("Version: 3.17\nGitID: x", (3, 17)), ("criu: not found", None), ("", None)])
def test_parse_version(text, version):
    assert parse_version(text) == version


def test_criu_missing_old_and_failing_check_are_clear():
    with pytest.raises(ParameterError, match="not found on PATH; install CRIU >= 4.2"):
        CriuCli(FakeModule([], binaries=())).run(["check"])
    old = FakeModule([(["/usr/bin/criu", "--version"], (0, "Version: 3.17.1\n", ""))])
    with pytest.raises(ParameterError, match="version 3.17.1 is too old"):
        CriuCli(old).require()
    broken = FakeModule([(["/usr/bin/criu", "--version"], (0, "Version: 4.2.1\n", "")),
                         (["/usr/bin/criu", "check"], (1, "", "Error (criu/cr-check.c:1234): seccomp is missing\n"))])
    with pytest.raises(CommandError, match="criu check failed.*seccomp is missing") as info:
        CriuCli(broken).require()
    assert info.value.result["criu_version"] == "4.2.1"
    good = FakeModule([(["/usr/bin/criu", "--version"], (0, "Version: 4.2.1\n", "")),
                       (["/usr/bin/criu", "check"], (0, "Looks good.\n", ""))])
    assert CriuCli(good).require() == "4.2.1"


def test_docker_daemon_facts_and_errors():
    module = FakeModule([(["/usr/bin/docker", "version"], (0, "20.10.24 false\n", ""))])
    assert DockerCli(module).server_info() == ("20.10.24", False)
    down = FakeModule([(["/usr/bin/docker", "version"], (1, "", "Cannot connect to the Docker daemon"))])
    with pytest.raises(CommandError, match="is dockerd running"):
        DockerCli(down).server_info()


def test_docker_checkpoint_support_reads_data_root_and_experimental_flag():
    module = FakeModule([(["/usr/bin/docker", "info"], (0, "/data/docker|false\n", ""))])
    assert DockerCli(module).checkpoint_support() == ("/data/docker", False)
    assert module.calls == [["/usr/bin/docker", "info", "--format", "{{.DockerRootDir}}|{{.ExperimentalBuild}}"]]
    module = FakeModule([(["/usr/bin/docker", "info"], (0, "/var/lib/docker|true\n", ""))])
    assert DockerCli(module).checkpoint_support() == ("/var/lib/docker", True)
    down = FakeModule([(["/usr/bin/docker", "info"], (1, "", "Cannot connect to the Docker daemon"))])
    with pytest.raises(CommandError, match="is dockerd running"):
        DockerCli(down).checkpoint_support()


def test_container_not_running_or_missing():
    stopped = FakeModule([(["/usr/bin/docker", "container", "inspect"],
                           (0, '[{"State": {"Running": false, "Pid": 0, "Status": "exited"}}]', ""))])
    with pytest.raises(ParameterError, match="'c1' is not running \\(status exited\\); start it first"):
        DockerCli(stopped).running_pid("c1")
    missing = FakeModule([(["/usr/bin/docker", "container", "inspect"], (1, "", "Error: No such container: c2"))])
    with pytest.raises(ParameterError, match="no container named 'c2'"):
        DockerCli(missing).running_pid("c2")


def test_timed_commands_report_timeouts_with_the_command():
    module = FakeModule([(["timeout"], (124, "", ""))])
    with pytest.raises(SnapshotTimeout, match="runc checkpoint did not finish within 5 s") as info:
        host.run_timed(module, ["runc", "checkpoint", "x"], 4.2, "runc checkpoint")
    assert module.calls[0][:3] == ["timeout", "--kill-after=10", "5"]
    assert info.value.result["cmd"] == ["runc", "checkpoint", "x"]


def test_create_args_rebuild_the_recorded_container():
    record = {"name": "w", "id": "abc", "image_id": "sha256:" + "a" * 64,
              "config": {"Image": "w:1", "Cmd": ["python3", "app.py"], "Entrypoint": None,
                         "Env": ["A=1", "B=x=y"], "WorkingDir": "/app", "User": "", "Labels": {"l": "v"}},
              "host_config": {"NetworkMode": "host", "Binds": ["/d:/d"], "ShmSize": 67108864, "Runtime": "runc",
                              "IpcMode": "private", "PidMode": "", "Privileged": False, "CapAdd": None,
                              "Devices": [], "SecurityOpt": None, "Tmpfs": None}}
    args = host.create_args(record, "w2", {"B": "new", "C": "3"})
    assert args[:3] == ["create", "--name", "w2"]
    assert ["--env", "A=1"] == args[3:5] and "B=new" in args and "C=3" in args and "B=x=y" not in args
    assert args[args.index("--volume") + 1] == "/d:/d" and args[args.index("--network") + 1] == "host"
    assert "--runtime" not in args and "--ipc" not in args
    assert args[-4:] == ["--", "sha256:" + "a" * 64, "python3", "app.py"]


def test_work_dir_with_a_mount_below_is_never_removed(tmp_path):
    from ansible_collections.inferops.snapshot.plugins.module_utils import _criu as criu
    work = tmp_path / "work"
    (work / "cgyard" / "cpu").mkdir(parents=True)
    info = tmp_path / "mountinfo"
    info.write_text("36 35 98:0 / %s/cgyard/cpu rw - cgroup cgroup rw,cpu\n" % work)
    assert criu.mounts_below(str(work), str(info)) == ["%s/cgyard/cpu" % work]
    info.write_text("36 35 98:0 / /elsewhere rw - ext4 /dev/x rw\n")
    assert criu.mounts_below(str(work), str(info)) == []
    assert criu.remove_work_dir(str(work)) is True and not work.exists()

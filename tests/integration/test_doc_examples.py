"""Docs that run: the blocks of the user docs marked <!-- doctest: NAME --> (tests/doc_blocks.py), written out and
run as a reader would, on the real dockerd + CRIU with the simulated NPU -- so a wrong Dockerfile, an undefined
variable or a stale command fails the build. The quickstart's second part is one story: install the collection from
the tarball into a fresh home, put the agent into an engine image with the quickstart's Dockerfile lines, run the
engine, snapshot it with the quickstart's generate playbook and bring it back with its restore playbook (both with
--diff), from the installed collection. Blocks CI cannot run say why in their marker."""

import json
import os
import shutil
import subprocess
import sys

import yaml

from conftest import BIN, COLLECTIONS, REPO, docker, free_port, node_wide, reset_device
from doc_blocks import block

QUICKSTART = "docs/quickstart.md"
AGENT = "docs/agent.md"
AWX = "docs/awx.md"


def reader_env(home):
    """A shell of someone who installed the collection: a fresh home, the venv's tools on PATH, no collections path
    of this checkout (the installed copy under ~/.ansible/collections is what runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(HOME=str(home), PATH="%s:%s" % (BIN, os.environ["PATH"]), ANSIBLE_NOCOLOR="1",
               ANSIBLE_HOST_KEY_CHECKING="False")
    return env


# What make test's own make passes down (make -C prints "Entering/Leaving directory" under a MAKELEVEL): the
# docs' commands run as an operator types them, in a shell of their own.
MAKE_VARIABLES = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR")


def bash(script, cwd, env, timeout=900):
    env = {name: value for name, value in env.items() if name not in MAKE_VARIABLES}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=str(cwd), env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, "%s\n--- stdout\n%s\n--- stderr\n%s" % (script, proc.stdout[-5000:], proc.stderr[-3000:])
    return proc.stdout


def logs(container):
    proc = subprocess.run(["docker", "logs", container], capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr  # the agent writes to stderr


def engine_image(context, tag, dockerfile_lines, engine_path, simulator_library):
    """An engine image: the base image, the sample workload as the engine, the simulator as libascendcl.so, then
    the lines the doc says to add."""
    shutil.copy(str(REPO / "tests" / "workload" / "workload.py"), str(context / "engine.py"))
    shutil.copy(str(simulator_library), str(context / "libascendcl.so"))
    (context / "Dockerfile").write_text(
        "FROM inferops/base:bookworm\n"
        "COPY engine.py %s\n"
        "COPY libascendcl.so /opt/inferops/lib/libascendcl.so\n"
        "ENV INFEROPS_ACL_LIBRARY=/opt/inferops/lib/libascendcl.so PYTHONUNBUFFERED=1\n" % engine_path
        + dockerfile_lines)
    build = subprocess.run(["docker", "build", "--network", "none", "-q", "-t", tag, str(context)], capture_output=True,
                           text=True, env=dict(os.environ, DOCKER_BUILDKIT="0"), timeout=600, check=False)
    assert build.returncode == 0, "the doc's Dockerfile lines do not build:\n%s%s" % (dockerfile_lines, build.stderr)
    return tag


def test_quickstart_install_agent_image_generate_and_restore(docker_env, simulator_library, device_dir, containers,
                                                             tmp_path):
    home, context = tmp_path / "home", tmp_path / "engine"
    home.mkdir()
    context.mkdir()
    env = reader_env(home)
    # Install the collection (make build-collection, ansible-galaxy collection install, ansible-doc)
    shown = bash(block(QUICKSTART, "quickstart-install"), REPO, env)
    assert "inferops.snapshot.snapshot_restore" in shown and "snapshot_dir" in shown, shown[-2000:]
    assert (home / ".ansible/collections/ansible_collections/inferops/snapshot/plugins/modules").is_dir()
    # Run the engine under the agent: the agent package into the build context, the Dockerfile lines
    bash(block(QUICKSTART, "quickstart-agent-context"), context, env)
    assert sorted(p.name for p in (context / "inferops_agent").glob("*.py")) == sorted(
        p.name for p in (REPO / "plugins" / "module_utils" / "core" / "agent").glob("*.py"))
    image = engine_image(context, "inferops/doctest-engine:%d" % os.getpid(),
                         block(QUICKSTART, "quickstart-dockerfile"), "/opt/engine/serve.py", simulator_library)
    pod, port = "doctest-vllm-%d" % os.getpid(), free_port()
    try:
        engine = containers(pod, image, device_dir, port).run()
        engine.wait_ready()
        assert "inferops-agent[1]: listening on" in logs(pod), logs(pod)
        before = [engine.generate(p) for p in ("hello", "snapshot")]

        # Generate, then restore: the quickstart's playbooks against this host, from the installed collection.
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(yaml.safe_dump({"npu_hosts": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
        snapshot_dir = tmp_path / "snapshots" / "default" / "qwen" / "p0" / pod
        settings = ["-e", "pod=%s" % pod, "-e", "port=%d" % port, "-e", "snapshot_dir=%s" % snapshot_dir]
        for name in ("quickstart-generate", "quickstart-restore"):
            (tmp_path / ("%s.yml" % name)).write_text(block(QUICKSTART, name))
        generated = bash(" ".join(["ansible-playbook", "--diff", "-i", str(inventory), "quickstart-generate.yml"]
                                  + settings), tmp_path, env)
        assert "%s: completed, " % snapshot_dir in generated, generated[-3000:]
        assert "%s/  (published: " % snapshot_dir in generated, "host_checkpoint's --diff: %s" % generated[-3000:]

        docker("rm", "-f", pod)  # the pod is gone, with its device memory
        reset_device(device_dir)
        restored = bash(" ".join(["ansible-playbook", "--diff", "-i", str(inventory), "quickstart-restore.yml"]
                                 + settings), tmp_path, env)
        assert '"msg": "restored from the snapshot"' in restored, restored[-3000:]
        assert "+container %s: restored from %s" % (pod, snapshot_dir) in restored, restored[-3000:]
        assert "-container %s: absent" % pod in restored and "created from the snapshot's record" in restored
        assert [engine.generate(p) for p in ("hello", "snapshot")] == before
        assert engine.info()["metadata"]["env"]["POD_IP"] == "10.0.0.12"  # new_pod_ip, defined in the play
    finally:
        docker("rm", "-f", pod, check=False)
        docker("rmi", "-f", image, check=False)


def test_agent_md_image_and_launcher(docker_env, simulator_library, device_dir, containers, tmp_path):
    """agent.md's Dockerfile lines with the folder copied as it says, and its launcher command as a container's."""
    context = tmp_path / "engine"
    context.mkdir()
    shutil.copytree(str(REPO / "plugins" / "module_utils" / "core" / "agent"), str(context / "inferops_agent"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    image = engine_image(context, "inferops/doctest-agent:%d" % os.getpid(), block(AGENT, "agent-dockerfile"),
                         "/opt/inferops/workload/workload.py", simulator_library)
    try:
        engine = containers("doctest-agent-%d" % os.getpid(), image, device_dir, free_port()).run()
        engine.wait_ready()
        assert "inferops-agent[1]: listening on" in logs(engine.name), logs(engine.name)
        engine.remove()
        # The launcher form: the engine at /opt/engine/serve.py, started as the doc's command line
        (context / "Dockerfile").write_text((context / "Dockerfile").read_text() + "COPY engine.py /opt/engine/serve.py\n")
        docker("build", "--network", "none", "-q", "-t", image, context)
        [command] = block(AGENT, "agent-launcher").strip().splitlines()
        launched = containers("doctest-launcher-%d" % os.getpid(), image, device_dir, free_port())
        docker("run", "-d", *(launched.create_args() + ["bash", "-c", "exec " + command]))
        launched.wait_ready()
        assert "inferops-agent[1]: listening on" in logs(launched.name), logs(launched.name)
    finally:
        docker("rmi", "-f", image, check=False)


def test_the_demo_by_hand_beside_another(docker_env):
    """quickstart.md's `ansible-playbook playbooks/demo.yml` with another name, port and root, as written."""
    script = block(QUICKSTART, "quickstart-demo-by-hand")
    try:
        with node_wide():  # the demo installs its runtime with the snapshot_node role
            out = bash(script, REPO, dict(os.environ, ANSIBLE_NOCOLOR="1"), timeout=900)
        assert "all 4 answers identical to the warmed-up engine's after both restores" in out, out[-3000:]
        assert "left running: my-demo on port 18181" in out, out[-3000:]
    finally:
        docker("rm", "-f", "my-demo", check=False)
        shutil.rmtree("/var/tmp/my-demo", ignore_errors=True)


def test_awx_md_steps_that_run_without_an_awx(tmp_path):
    """make ee (the execution environment's offline context), the inventory's group variables (the roles' own
    validation accepts them), the wrapper playbook (the project's file), the restore job's extra variables."""
    out = bash(block(AWX, "awx-make-ee"), REPO, dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])))
    context = REPO / "build" / "ee" / "context"
    assert out.strip().splitlines()[-1] == str(context) and (context / "Containerfile").is_file()
    assert sorted(p.name for p in (context / "_build" / "collections").iterdir()) == [
        "inferops-snapshot.tar.gz", "kubernetes-core.tar.gz"]

    group_vars = yaml.safe_load(block(AWX, "awx-inventory-vars"))
    wrapper = block(AWX, "awx-wrapper")
    assert yaml.safe_load(wrapper) == yaml.safe_load((REPO / "extensions/awx/project/generate.yml").read_text())
    restore_vars = json.loads(block(AWX, "awx-restore-vars"))
    # The roles take these: their plan (the one the generation prints) and the restore's argument spec.
    play = [{"hosts": "npu-02", "gather_facts": False, "vars": group_vars, "tasks": [
        {"ansible.builtin.include_role": {"name": "inferops.snapshot.snapshot_generate", "tasks_from": "plan"}},
        {"ansible.builtin.assert": {"that": ["snapshot_generate_plan.pods | map(attribute='name') | list"
                                             " == ['qwen-p0-1']"]}},
        {"ansible.builtin.validate_argument_spec": {
            "argument_spec": yaml.safe_load((REPO / "roles/snapshot_restore/meta/argument_specs.yml").read_text())[
                "argument_specs"]["main"]["options"],
            "provided_arguments": dict(group_vars, **{k: v for k, v in restore_vars.items() if k != "snapshot_hosts"})}}]}]
    assert restore_vars["snapshot_hosts"] == "npu-02"  # the playbook's host pattern: a host of that inventory
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"npu-02": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    bash("ansible-playbook -i inventory.yml play.yml", tmp_path,
         dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1",
              PATH="%s:%s" % (BIN, os.environ["PATH"])))

"""The README's main job, run as its first command says: `make demo` (the blocks readme-try-it and the
quickstart's readme-make-demo; the environment is set up already, so make's env step only checks it):
generate -> break -> snapshot_restore -> break -> restore on create, on the real dockerd and CRIU.
The molecule `default` scenario only syntax-checks it; this keeps the README's first command true. (Its second,
`make test`, is what CI runs: .ci/run.)"""

import os
import re
import subprocess

from conftest import COLLECTIONS, REPO, docker, node_wide

DEMO_CONTAINER = "inferops-demo-0"


def test_make_demo_playbook_restores_twice_with_identical_answers(docker_env):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1")
    try:
        with node_wide():  # the demo installs its runtime with the snapshot_node role
            run = subprocess.run(["make", "--no-print-directory", "demo"], cwd=str(REPO), env=env,
                                 capture_output=True, text=True, timeout=900, check=False)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-6000:]
        assert re.search(r"failed=0\b", out), out[-3000:]
        # The Result lines: both restores happened and were faster than the cold start they replace.
        cold = float(re.search(r"cold start \(warmup\) to first answers: ([0-9.]+) s", out).group(1))
        restore = float(re.search(r"snapshot_restore \([^)]*\) to first answers: ([0-9.]+) s", out).group(1))
        on_create = float(re.search(r"restore on create \([^)]*\) to first answers: ([0-9.]+) s", out).group(1))
        assert restore < cold and on_create < cold, (cold, restore, on_create)
        assert "answers identical to the warmed-up engine's after both restores" in out, out[-3000:]
        # Secure by default: the roles signed it on the controller and both restores required the key.
        assert re.search(r"generation [0-9]+ signed on the controller by key [0-9a-f]{16} \(", out), out[-3000:]
    finally:
        docker("rm", "-f", DEMO_CONTAINER, check=False)

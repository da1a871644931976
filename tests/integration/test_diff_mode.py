"""--diff for real: an AWX check-and-diff job of the cleanup shows what it would remove, path by path, and the real
run removes exactly that (the restore's and the checkpoint's diffs are run by test_doc_examples.py, on the
quickstart's playbooks)."""

import json
import os
import re
import subprocess
import sys

from conftest import BIN, COLLECTIONS
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import status


def cleanup(root, *flags):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_NOCOLOR="1")
    args = json.dumps({"root": str(root), "check_images": False, "remove": ["failed"]})
    proc = subprocess.run([str(BIN / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                           "-e", "ansible_python_interpreter=%s" % sys.executable,
                           "-m", "inferops.snapshot.snapshot_cleanup", "-a", args] + list(flags),
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_check_and_diff_shows_each_path_cleanup_would_remove(docker_env, tmp_path):
    root = tmp_path / "snapshots"
    pod = root / "default" / "qwen" / "p0" / "qwen-p0-0"
    pod.mkdir(parents=True, mode=0o700)
    (pod / "leftover").write_text("x")
    identity = {"namespace": "default", "service": "qwen", "instance": "p0", "pod": "qwen-p0-0"}
    status.update(str(pod), "failed", reason="host snapshot of pod qwen-p0-0 failed: boom", identity=identity)
    os.chmod(str(root), 0o700)

    dry = cleanup(root, "--check", "--diff")
    removed = re.findall(r"^-(\S+)  \(failed (\w+): generation failed: host snapshot", dry, flags=re.M)
    assert (str(pod), "snapshot") in removed and any(kind == "status" for _path, kind in removed), dry
    assert pod.exists(), "check mode removed nothing"

    real = cleanup(root, "--diff")
    assert re.findall(r"^-(\S+)  \(failed", real, flags=re.M) == [path for path, _kind in removed], real
    assert not pod.exists()
    again = cleanup(root, "--diff")
    assert not re.search(r"^-/", again, flags=re.M) and '"changed": false' in again, again

"""The collection builds with ansible-galaxy, installs, and its modules run from the installed copy."""

import json
import os
import subprocess
import sys
import tarfile

from conftest import BIN, REPO


def test_build_install_and_use_the_installed_collection(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist), str(REPO)],
                   check=True, capture_output=True, text=True)
    tarballs = list(dist.glob("inferops-snapshot-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    with tarfile.open(tarballs[0]) as tar:
        names = tar.getnames()
    for required in ("plugins/modules/host_checkpoint.py", "plugins/module_utils/core/agent/launcher.py", "meta/runtime.yml",
                     "schemas/manifest.schema.json", "MANIFEST.json", "COPYING"):
        assert required in names, required
    for excluded in (".venv", "build", ".ci"):
        assert not any(n == excluded or n.startswith(excluded + "/") for n in names), excluded

    installed = tmp_path / "collections"
    # Not through the checkout's link (make exports ANSIBLE_COLLECTIONS_PATH): a clean install.
    clean = {k: v for k, v in os.environ.items() if k != "ANSIBLE_COLLECTIONS_PATH"}
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "--force", "-p", str(installed),
                    str(tarballs[0])], check=True, capture_output=True, text=True, env=clean)
    assert (installed / "ansible_collections" / "inferops" / "snapshot" / "plugins" / "modules").is_dir()
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(installed), ANSIBLE_NOCOLOR="1")
    doc = subprocess.run([str(BIN / "ansible-doc"), "-t", "module", "--json", "inferops.snapshot.snapshot_restore"],
                         env=env, check=True, capture_output=True, text=True)
    assert "snapshot_dir" in json.loads(doc.stdout)["inferops.snapshot.snapshot_restore"]["doc"]["options"]
    run = subprocess.run([str(BIN / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                          "-e", "ansible_python_interpreter=%s" % sys.executable,
                          "-m", "inferops.snapshot.npu_snapshot_lock",
                          "-a", json.dumps({"endpoint": str(tmp_path / "none.sock"), "state": "locked"})],
                         env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 2 and "cannot reach the snapshot agent" in run.stdout, run.stdout + run.stderr

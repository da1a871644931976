"""benchmarks/chunk_size.py: the check's rate by chunk size beside the SHA-256 floor (how CHUNK_BYTES was chosen)."""

import json
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "benchmarks" / "chunk_size.py"
MIB = 1024 * 1024


def test_it_hashes_the_snapshot_by_each_chunk_size_and_reports_the_floor_beside_it(tmp_path):
    (tmp_path / "host" / "criu").mkdir(parents=True)
    (tmp_path / "host" / "criu" / "pages-1.img").write_bytes(os.urandom(3 * MIB + 5))
    (tmp_path / "manifest.json").write_text("{}")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--sizes-mib", "1", "2", "--rounds", "2",
                           "--tries", "1", "--floor-mib", "4"], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    summary = json.loads(lines[-1])
    assert summary["snapshot_bytes"] == 3 * MIB + 7 and summary["files"] == 2 and summary["rounds"] == 2
    assert sorted(summary["sizes"]) == ["1", "2"]
    for size in summary["sizes"].values():
        assert size["median_check_mb_s"] > 0 and 0 < size["min"] <= size["median_ratio"] <= size["max"]
    # a process with one thread hashes mappings, as snapshot_verify does
    assert sum("chunks of   1 MiB" in line and "(mapped)" in line for line in lines) == 2

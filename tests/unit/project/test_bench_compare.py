"""Benchmarks/compare.py, the before/after check of a refactor: a stage slower than its run-to-run noise
is "slower" (and fails with --fail-on-slower), a difference within it is "same", a row of one run only is listed,
an error sample counts for nothing, and the two committed runs compare without Docker or root."""

import importlib.util
import json
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "benchmarks" / "compare.py"
SPEC = importlib.util.spec_from_file_location("bench_compare", str(SCRIPT))
compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare)

BEFORE = REPO / "docs" / "benchmarks" / "2026-12-04-hashed-as-written" / "bench.json"
AFTER = REPO / "docs" / "benchmarks" / "2026-12-05-secure-default" / "bench.json"


def run_of(runs):
    """A bench.json: runs is a list of (variant, seconds, stages or None), one sample each, section "checkpoint"."""
    samples = [{"section": "limits", "variant": "sha256_one_core", "size_mb": None, "rep": 0, "seconds": 0.2,
                "mb_s": 1500.0, "load1": 0.5}]
    for rep, (variant, seconds, stages) in enumerate(runs):
        sample = {"section": "checkpoint", "variant": variant, "size_mb": 2048, "rep": rep, "seconds": seconds, "load1": 1.0}
        if stages is not None:
            sample["stages"] = stages
        if seconds is None:
            sample["error"] = "it broke"
        samples.append(sample)
    return {"started_at": "2026-12-06T00:00:00Z", "args": {"argv": ["--focus"]}, "machine": {"git_commit": "abc1234"},
            "samples": samples}


def write(tmp_path, name, result):
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return str(path)


def cells(text, what):
    """The cells of the table row whose first cell is what."""
    found = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| %s |" % what)]
    assert len(found) == 1, (what, text)
    return [cell.strip() for cell in found[0]]


def test_a_stage_twice_as_slow_beyond_a_tight_spread_is_slower_and_fails(tmp_path, capsys):
    before = write(tmp_path, "before.json", run_of([("host_checkpoint_runc", 5.0 + i * 0.01, {"seal": 2.0 + i * 0.01})
                                                    for i in range(3)]))
    after = write(tmp_path, "after.json", run_of([("host_checkpoint_runc", 5.0 + i * 0.01, {"seal": 4.0 + i * 0.01})
                                                  for i in range(3)]))
    assert compare.main([before, after]) == 0
    out = capsys.readouterr().out
    seal = cells(out, "checkpoint / host_checkpoint_runc.stages.seal")
    assert seal[1:] == ["2 GiB", "2.01 (n=3, 2.00–2.02)", "4.01 (n=3, 4.00–4.02)", "2.00×", "10 %", "**slower**"]
    assert cells(out, "checkpoint / host_checkpoint_runc")[-1] == "same"
    assert cells(out, "limits / sha256_one_core (MB/s)")[-1] == "machine"
    assert compare.main([before, after, "--fail-on-slower"]) == 1
    capsys.readouterr()
    assert compare.main([after, before, "--fail-on-slower"]) == 0
    assert cells(capsys.readouterr().out, "checkpoint / host_checkpoint_runc.stages.seal")[-1] == "faster"


def test_a_difference_within_the_spread_or_below_the_absolute_floor_is_the_same(tmp_path, capsys):
    before = write(tmp_path, "before.json", run_of([("v", s, {"seal": s / 2, "tiny": 0.01}) for s in (4.0, 5.0, 6.0)]))
    after = write(tmp_path, "after.json", run_of([("v", 6.5, {"seal": 3.25, "tiny": 0.03})]))
    assert compare.main([before, after, "--fail-on-slower"]) == 0
    out = capsys.readouterr().out
    total = cells(out, "checkpoint / v")
    assert total[3:] == ["6.50 (n=1)", "1.30×", "40 %", "same"]  # spread (6 - 4) / 5 of the before side
    assert cells(out, "checkpoint / v.stages.tiny")[-2:] == ["10 %", "same"]  # 3x, but 0.02 s <= --min-seconds
    assert compare.main([before, after, "--min-noise", "0", "--min-seconds", "0.01", "--fail-on-slower"]) == 1


def test_a_row_of_one_run_only_is_listed_apart_unless_only_common(tmp_path, capsys):
    before = write(tmp_path, "before.json", run_of([("v", 5.0, {"seal": 2.0, "checkpoint": 3.0})]))
    after = write(tmp_path, "after.json", run_of([("v", 5.0, {"seal": 2.0, "checkpoint_dump": 3.0}), ("new", 1.0, None)]))
    assert compare.main([before, after]) == 0
    out = capsys.readouterr().out
    common, one_side = out.split("## Rows of one run only")
    assert "v.stages.checkpoint " not in common and "v.stages.checkpoint_dump" not in common
    assert cells(one_side, "checkpoint / v.stages.checkpoint")[2:] == ["only before", "3.00 (n=1)"]
    assert cells(one_side, "checkpoint / v.stages.checkpoint_dump")[2] == "only after"
    assert cells(one_side, "checkpoint / new")[2] == "only after"
    assert compare.main([before, after, "--only-common"]) == 0
    assert "only after" not in capsys.readouterr().out


def test_an_error_sample_counts_for_nothing(tmp_path, capsys):
    before = write(tmp_path, "before.json", run_of([("v", 5.0, {"seal": 2.0}), ("broken", 1.0, None)]))
    after = write(tmp_path, "after.json", run_of([("v", 5.0, {"seal": 2.0}), ("v", None, {"seal": 99.0}),
                                                  ("broken", None, None)]))
    assert compare.main([before, after, "--fail-on-slower"]) == 0
    out = capsys.readouterr().out
    assert cells(out, "checkpoint / v.stages.seal")[3] == "2.00 (n=1)"
    assert cells(out, "checkpoint / broken")[2:] == ["only before", "1.00 (n=1)"]


def test_the_two_committed_runs_compare_without_docker_or_root():
    proc = subprocess.run([sys.executable, str(SCRIPT), str(BEFORE), str(AFTER)], cwd=str(REPO), capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "| what | size | before | after | after ÷ before | noise | verdict |" in out
    assert "4bcd7f1" in out and "cea803d (dirty)" in out and "`--focus --sizes 2 --runs 3" in out
    assert cells(out, "checkpoint / host_checkpoint_runc.stages.seal")[2].endswith("(n=3, 2.39–4.07)")
    assert cells(out, "limits / sha256_one_core (MB/s)")[-1] == "machine"
    assert cells(out, "host_restore / snapshot_restore_runtime_encrypted")[2] == "only before"  # after: seconds null

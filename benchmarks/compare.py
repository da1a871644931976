# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Two benchmarks/run.py results (bench.json) side by side, stage by stage, against their run-to-run noise.

    .venv/bin/python benchmarks/compare.py BEFORE/bench.json AFTER/bench.json   # markdown on stdout
        [--min-noise 0.10] [--min-seconds 0.05] [--fail-on-slower] [--only-common]

The check of a refactor: the benchmark before and after it shows no stage slower than its noise.
A row is a section / variant at one size: the samples' seconds, and each stage of every dict of name -> number in
them at any depth, named <variant>.<dict key>.<stage> (stages, runtime.durations, lock_window, task_walls, ...),
less the entries that are no seconds (bytes, counts, rates, kB). A sample without seconds (an error) counts for
nothing. Each side: the median of its runs, n and min-max. Noise of a row: the larger relative spread
(max - min) / median of the two sides (a side of one run spreads 0), at least --min-noise. Verdict: "slower" when
after > before x (1 + noise) and after - before > --min-seconds, "faster" the mirror of it, else "same". The
"limits" section (MB/s, higher is better) measures the machine, not the code: its rows say "machine".
Rows of one run only (a stage added, dropped or renamed) are listed in a second table (not with --only-common).
Exit status 0; 1 with --fail-on-slower when a row is slower. Stdlib only: no Docker, no root, no collection.
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import re
import sys

NOT_SECONDS = re.compile(r"(bytes|files|chunks|workers|gbps|mb_s)$|(^|_)kb(_|$)")
MACHINE = "limits"


def number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def stage_dicts(value, path=()):
    """(key path, dict) of every dict of name -> number inside value, at any depth."""
    for key, sub in value.items():
        if isinstance(sub, dict):
            present = [v for v in sub.values() if v is not None]
            if present and all(number(v) for v in present):
                yield path + (key,), sub
            else:
                yield from stage_dicts(sub, path + (key,))


def rows(result):
    """{(section, what, size_mb): [values]}, in the order of the samples."""
    out = {}
    for s in result.get("samples") or []:
        if not number(s.get("seconds")) or s.get("error"):
            continue
        section, variant, size = s.get("section"), s.get("variant"), s.get("size_mb")
        if section == MACHINE:
            if number(s.get("mb_s")):
                out.setdefault((section, variant + " (MB/s)", size), []).append(s["mb_s"])
            continue
        out.setdefault((section, variant, size), []).append(s["seconds"])
        for path, stages in stage_dicts(s):
            for stage, value in stages.items():
                if number(value) and not any(NOT_SECONDS.search(part) for part in path + (stage,)):
                    out.setdefault((section, ".".join((variant,) + path + (stage,)), size), []).append(value)
    return out


def spread(values):
    """(max - min) / median; 0 for one value."""
    mid, low, high = median(values), min(values), max(values)
    if high == low:
        return 0.0
    return (high - low) / abs(mid) if mid else float("inf")


def verdict(section, before, after, noise, min_seconds):
    if section == MACHINE:
        return "machine"
    if after > before * (1 + noise) and after - before > min_seconds:
        return "slower"
    if before > after * (1 + noise) and before - after > min_seconds:
        return "faster"
    return "same"


def fmt(value):
    if abs(value) >= 100:
        return "%.0f" % value
    return "%.2f" % value if abs(value) >= 0.1 or not value else ("%.3f" % value if abs(value) >= 0.001 else "%.1g" % value)


def side(values):
    if len(values) == 1:
        return "%s (n=1)" % fmt(values[0])
    return "%s (n=%d, %s–%s)" % (fmt(median(values)), len(values), fmt(min(values)), fmt(max(values)))


def gb(size_mb):
    return "–" if size_mb is None else "%g GiB" % (size_mb / 1024.0)


def table(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def describe(result, path):
    m, load = result.get("machine") or {}, [s["load1"] for s in result.get("samples") or [] if number(s.get("load1"))]
    commit = m.get("git_commit")
    return [path, result.get("started_at") or "–", "`%s`" % " ".join((result.get("args") or {}).get("argv") or []),
            "%s%s" % (commit, " (dirty)" if m.get("git_dirty") else "") if commit else "–",
            "%s / %s" % (fmt(median(load)) if load else "–", fmt(max(load)) if load else "–")]


def compare(before, after, names, min_noise=0.10, min_seconds=0.05, only_common=False):
    """(markdown, number of slower rows)."""
    old, new = rows(before), rows(after)
    out = ["# Benchmark comparison\n\n"]
    header = zip(["bench.json", "started", "`benchmarks/run.py` arguments", "commit", "1-min load during samples: median / max"],
                 describe(before, names[0]), describe(after, names[1]))
    out.append(table(["", "before", "after"], header))
    out.append("\nMedians of each run's samples (n, min–max). Noise: the larger (max − min) / median of the two sides "
               "(one run: 0), at least %d %%; slower / faster: beyond the noise and by more than %s s. Section %s: the "
               "machine's MB/s (higher is better), not a verdict on the code.\n\n"
               % (round(min_noise * 100), fmt(min_seconds), MACHINE))
    body, slower = [], 0
    for key in [k for k in old if k in new]:
        b, a = old[key], new[key]
        noise = max(spread(b), spread(a), min_noise)
        word = verdict(key[0], median(b), median(a), noise, min_seconds)
        slower += word == "slower"
        body.append(["%s / %s" % key[:2], gb(key[2]), side(b), side(a),
                     "%.2f×" % (median(a) / median(b)) if median(b) else "–",
                     "∞" if noise == float("inf") else "%d %%" % round(noise * 100), "**slower**" if word == "slower" else word])
    out.append(table(["what", "size", "before", "after", "after ÷ before", "noise", "verdict"], body))
    counts = dict((w, sum(1 for r in body if r[-1].strip("*") == w)) for w in ("slower", "faster", "same", "machine"))
    out.append("\n%d rows: %s.\n" % (len(body), ", ".join("%d %s" % (n, w) for w, n in counts.items())))
    one_side = [["%s / %s" % k[:2], gb(k[2]), which, side(values)]
                for which, mine, other in (("only before", old, new), ("only after", new, old))
                for k, values in mine.items() if k not in other]
    if one_side and not only_common:
        out.append("\n## Rows of one run only (added, dropped or renamed)\n\n")
        out.append(table(["what", "size", "in", "median"], one_side))
    return "".join(out), slower


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("before", help="bench.json of the run before the change")
    parser.add_argument("after", help="bench.json of the run after it")
    parser.add_argument("--min-noise", type=float, default=0.10, help="least relative noise of a row (default 0.10)")
    parser.add_argument("--min-seconds", type=float, default=0.05, help="a smaller difference is never slower (default 0.05)")
    parser.add_argument("--fail-on-slower", action="store_true", help="exit 1 when a row is slower")
    parser.add_argument("--only-common", action="store_true", help="leave out the rows of one run only")
    args = parser.parse_args(argv)
    results = []
    for path in (args.before, args.after):
        with open(path, encoding="utf-8") as f:
            results.append(json.load(f))
    text, slower = compare(results[0], results[1], (args.before, args.after), args.min_noise, args.min_seconds,
                           args.only_common)
    sys.stdout.write(text)
    return 1 if slower and args.fail_on_slower else 0


if __name__ == "__main__":
    sys.exit(main())

# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the restore-on-create runtime costs a container that does not ask for a restore.

1. End to end: N x `docker run --rm IMAGE true` with runc and with the runtime, interleaved (so
   that drift of the shared machine hits both alike); median, mean and p90 of each, and the
   median of the pairwise differences.
2. Per call: the runtime's shim itself, rendered with a runc that does nothing (/bin/true), for
   the calls containerd makes (`create` reads config.json, `start`, `delete`, `state`), against
   calling /bin/true directly: the shim's own cost, without Docker's noise.

    python3 scripts/bench_runtime_overhead.py --runtime inferops-restore -n 40

The runtime must be registered (role inferops.snapshot.snapshot_node). Prints a Markdown table.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time


def docker(*args):
    return subprocess.run(["docker"] + list(args), capture_output=True, text=True, check=True).stdout.strip()


def timed_run(argv):
    started = time.monotonic()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - started


def summary(values):
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "mean": statistics.fmean(ordered),
            "p90": ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]}


def end_to_end(runtime, image, count):
    samples = {"runc": [], runtime: []}
    base = ["docker", "run", "--rm", "--network", "none"]
    for name in samples:  # warm up both paths once
        timed_run(base + ["--runtime", name, image, "true"])
    for _round in range(count):
        for name in samples:
            samples[name].append(timed_run(base + ["--runtime", name, image, "true"]))
    diffs = [b - a for a, b in zip(samples["runc"], samples[runtime])]
    return samples, diffs


def render_shim(shim_path, work):
    """A copy of the installed shim whose runc is /bin/true (same code path, no container work)."""
    with open(shim_path) as handle:
        text = handle.read()
    text = re.sub(r"^RUNC=.*$", "RUNC=/bin/true", text, count=1, flags=re.M)
    text = re.sub(r"^STATE=.*$", "STATE=%s" % os.path.join(work, "state"), text, count=1, flags=re.M)
    path = os.path.join(work, "shim")
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o755)
    return path


def per_call(shim_path, count):
    work = tempfile.mkdtemp(prefix="inferops-bench-")
    shim = render_shim(shim_path, work)
    bundle = os.path.join(work, "bundle")
    os.mkdir(bundle)
    # A real-sized OCI config without the marker (about 9 KB like Docker's).
    env = ["VAR_%d=%s" % (i, "x" * 40) for i in range(60)]
    with open(os.path.join(bundle, "config.json"), "w") as handle:
        json.dump({"ociVersion": "1.0.2", "process": {"env": env, "args": ["true"]}, "mounts": [{"destination": "/m%d" % i}
                   for i in range(40)]}, handle)
    cid = "0" * 64
    glob = ["--root", "/run/x", "--log", os.path.join(bundle, "log.json"), "--log-format", "json"]
    calls = {
        "create": glob + ["create", "--bundle", bundle, "--pid-file", os.path.join(bundle, "init.pid"), cid],
        "start": glob + ["start", cid],
        "delete": glob + ["delete", cid],
        "state": glob + ["state", cid],
    }
    rows = {}
    for name, args in calls.items():
        direct = [timed_run(["/bin/true"] + args) for _call in range(count)]
        shimmed = [timed_run([shim] + args) for _call in range(count)]
        rows[name] = (statistics.median(direct), statistics.median(shimmed))
    subprocess.run(["rm", "-rf", "--one-file-system", work], check=False)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--runtime", default="inferops-restore", help="registered runtime name")
    parser.add_argument("--image", default="inferops/base:bookworm")
    parser.add_argument("-n", "--count", type=int, default=30, help="docker runs per runtime")
    parser.add_argument("--calls", type=int, default=200, help="shim calls per kind")
    args = parser.parse_args()

    runtimes = json.loads(docker("info", "--format", "{{json .Runtimes}}"))
    if args.runtime not in runtimes:
        raise SystemExit("runtime %r is not registered with dockerd (%s); install it with the snapshot_node role"
                         % (args.runtime, ", ".join(sorted(runtimes))))
    shim_path = runtimes[args.runtime]["path"]

    print("machine: %s, %d cores, kernel %s, docker %s, runc %s" % (
        platform.node(), os.cpu_count(), platform.release(), docker("version", "--format", "{{.Server.Version}}"),
        subprocess.run(["runc", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0].split()[-1]))
    samples, diffs = end_to_end(args.runtime, args.image, args.count)
    print("\n`docker run --rm --network none %s true`, %d runs each, interleaved:\n" % (args.image, args.count))
    print("| runtime | median | mean | p90 |\n|---|---|---|---|")
    for name, values in samples.items():
        s = summary(values)
        print("| %s | %.0f ms | %.0f ms | %.0f ms |" % (name, s["median"] * 1e3, s["mean"] * 1e3, s["p90"] * 1e3))
    print("\nmedian of the pairwise differences (runtime - runc): %+.1f ms; stdev of one run: %.0f ms"
          % (statistics.median(diffs) * 1e3, statistics.stdev(samples["runc"]) * 1e3))

    rows = per_call(shim_path, args.calls)
    print("\nthe shim alone, with runc replaced by /bin/true, median of %d calls:\n" % args.calls)
    print("| call | /bin/true | shim + /bin/true | shim's cost |\n|---|---|---|---|")
    for name, (direct, shimmed) in rows.items():
        print("| %s | %.2f ms | %.2f ms | %+.2f ms |" % (name, direct * 1e3, shimmed * 1e3, (shimmed - direct) * 1e3))


if __name__ == "__main__":
    main()

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Markdown tables and a PNG chart from a benchmarks/run.py result (bench.json).

    .venv/bin/python benchmarks/report.py results/latest/bench.json   # rewrite results.md and chart.png beside it

Every number in the tables is the median of the runs (n is given); nothing here is extrapolated.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import sys

TTFA = [("cold_start", "cold start (docker run, warmup included)"),
        ("snapshot_restore", "snapshot_restore via ansible-playbook"),
        ("snapshot_restore_cold_cache", "snapshot_restore via ansible-playbook, snapshot not in page cache"),
        ("raw_docker_start_checkpoint", "raw docker start --checkpoint + device restore"),
        ("raw_criu_restore_bare", "raw criu restore (bare process) + device restore")]
STAGES = ["verify", "prepare", "host_restore", "device_restore", "health"]
CHECKPOINT = [("raw_criu_dump", "raw criu dump (bare process)"),
              ("host_checkpoint_criu", "host_checkpoint engine=criu"),
              ("raw_runc_checkpoint", "raw runc checkpoint"),
              ("raw_runc_checkpoint_tmpfs", "raw runc checkpoint to tmpfs"),
              ("host_checkpoint_runc_hash_after", "host_checkpoint method=runc, hash_during_checkpoint=false"),
              ("host_checkpoint_runc_unlock_task", "host_checkpoint method=runc, engine resumed by a task after it"),
              ("host_checkpoint_runc", "host_checkpoint method=runc"),
              ("host_checkpoint_runc_encrypted", "host_checkpoint method=runc, encryption_key"),
              ("raw_docker_checkpoint", "raw docker checkpoint create"),
              ("host_checkpoint_docker", "host_checkpoint method=docker")]
HOST_RESTORE = [("raw_criu_restore_bare", "raw criu restore (bare)"),
                ("raw_docker_start_checkpoint", "raw docker start --checkpoint"),
                ("snapshot_restore", "snapshot_restore host_restore stage")]
VERIFY = [("snapshot_verify_module", "snapshot_verify (ansible task)"),
          ("snapshot_verify_inprocess", "_manifest.verify in-process"),
          ("snapshot_verify_inprocess_1worker", "_manifest.verify in-process, 1 worker"),
          ("sha256sum_c", "sha256sum -c"),
          ("sha256sum_parallel", "sha256sum, one per file, xargs -P nproc"),
          ("read_only", "read only, no hashing")]


def limit(limits, key, which="best"):
    """A limit from bench.json: {"best", "median", "n"} (older results: a plain median)."""
    value = limits.get(key)
    if isinstance(value, dict):
        return value.get(which)
    return value if which != "n" else None


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def pick(samples, section, variant, size=None, key="seconds"):
    out = []
    for s in samples:
        if s["section"] == section and s["variant"] == variant and (size is None or s["size_mb"] == size):
            value = s
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            out.append(value)
    return [v for v in out if v is not None]


def med(samples, section, variant, size=None, key="seconds"):
    return median(pick(samples, section, variant, size, key))


def best(samples, section, variant, size=None, key="seconds"):
    """The least of the samples (a floor's best sample: what the machine did when nothing got in its way)."""
    values = pick(samples, section, variant, size, key)
    return min(values) if values else None


def spread(samples, section, variant, size=None, key="seconds"):
    """'min-max' of the samples, or '' with fewer than two."""
    values = pick(samples, section, variant, size, key)
    return "%s-%s" % (fmt(min(values)), fmt(max(values))) if len(values) > 1 else ""


def fmt(value, digits=2, unit=""):
    if value is None:
        return "–"
    if isinstance(value, float):
        if abs(value) >= 100:
            return "%.0f%s" % (value, unit)
        return ("%." + str(digits) + "f%s") % (value, unit)
    return "%s%s" % (value, unit)


def gb(size_mb):
    return "%g GiB" % (size_mb / 1024.0)


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


DOCKER_RUN = [("docker_run_runtime", "docker run --runtime (restore on create, no Ansible)"),
              ("docker_run_runtime_lazy", "docker run --runtime, lazy pages (snapshot_node_lazy_pages)"),
              ("docker_run_runtime_staged", "docker run --runtime from a staged, verified copy (snapshot_stage)"),
              ("docker_run_runtime_cold_cache", "docker run --runtime, snapshot not in page cache")]
GOALS = {"docker_run": 1.15, "playbook_s": 3.0, "staged_playbook_s": 1.6, "slope": 0.7, "lock_window": 1.3,
         "durability": 1.2, "host_checkpoint": 1.5, "verify_rate": 0.9}
GIB = 1024.0


def render_secure_default(samples):
    """The secure default (a signed snapshot, the node requiring a signature) against the unauthenticated fast path
    (the same engine's unsigned snapshot, a node that trusts no key), docker run --runtime, side by side."""
    rows = []
    for size in sizes(samples):
        plain, signed = (med(samples, "ttfa", v, size) for v in ("docker_run_runtime_unauthenticated", "docker_run_runtime"))
        if plain is None:
            continue
        both = [pick(samples, "ttfa", v, size, "restored") for v in ("docker_run_runtime", "docker_run_runtime_unauthenticated")]
        rows.append([gb(size), fmt(plain), fmt(signed), ratio(signed, plain), "<= 1.15x",
                     "yes" if all(all(r) for r in both) else "**NO**",
                     "%d / %d" % (n_of(samples, "ttfa", "docker_run_runtime", size),
                                  n_of(samples, "ttfa", "docker_run_runtime_unauthenticated", size))])
    if not rows:
        return []
    return ["\n### The secure default against the unauthenticated fast path (seconds, docker run --runtime)\n\n",
            "To the first correct answer, warm page cache. Unauthenticated: the engine's unsigned snapshot on a node "
            "that trusts no key and requires no signature (it restores, with a warning). Secure default: its signed "
            "snapshot on a node that trusts the controller's key and therefore requires a signature (snapshot_node's "
            "defaults). Both read only bytes hashed in the same read (docs/security.md).\n\n",
            table(["state", "unauthenticated", "secure default", "secure ÷ unauthenticated", "goal", "both restored",
                   "n"], rows)]


def ttfa_variants(result):
    variants = list(TTFA)
    default = result.get("restore_default")
    if default:
        variants = [(v, label.replace("snapshot_restore ", "snapshot_restore (default method %s) " % default, 1)
                     if v.startswith("snapshot_restore") else label) for v, label in variants]
    for method in reversed(result.get("restore_methods", [])[1:]):
        variants.insert(3, ("snapshot_restore_%s_cold_cache" % method,
                            "snapshot_restore method=%s via ansible-playbook, snapshot not in page cache" % method))
        variants.insert(3, ("snapshot_restore_" + method, "snapshot_restore method=%s via ansible-playbook" % method))
    if result.get("staging"):
        variants.insert(3, ("snapshot_restore_runtime_staged", "snapshot_restore method=runtime via ansible-playbook, "
                                                               "from a staged, verified copy (snapshot_stage)"))
    at = [v for v, _l in variants].index("raw_docker_start_checkpoint")
    return variants[:at] + DOCKER_RUN + variants[at:]


def fastest_method(result):
    if "fastest_method" in result:
        return result["fastest_method"]
    methods = result.get("restore_methods", [])[1:]
    return "runtime" if "runtime" in methods else (methods[-1] if methods else None)


def floors(result, size):
    """The floors of a restore of this size, from what the same run measured (medians; seconds).

    fixed: a trivial container of the image (docker run) + CRIU restoring a tiny process;
    hash: the snapshot's bytes at SHA-256 on all cores; hash_cpu: on one core (core-seconds);
    criu: the bytes through one preadv into fresh memory (CRIU's page restore, one core);
    device: the device copy alone at this size (max(host copy, modelled DMA)); device_cpu: its host copy;
    overlapped = fixed + max((hash_cpu + criu + device_cpu) / cores, criu + device, hash): every part at its own
    floor and all of them overlapped as far as the cores and the order (pages before the device copy) allow;
    serial = fixed + hash + criu + device: the same parts one after another; playbook = a one-task playbook +
    overlapped.
    """
    samples = result["samples"]
    limits = result.get("limits") or {}
    nbytes = med(samples, "checkpoint", "host_checkpoint_runc", size, "total_bytes")
    rates = dict((key, limit(limits, key, "median")) for key in ("sha256_all_cores", "sha256_one_core", "criu_copy"))
    device = med(samples, "device_copy", "device_copy", size)
    device_cpu = med(samples, "device_copy", "device_copy", size, "restore.copy_s")
    trivial, tiny = med(samples, "fixed", "docker_run_trivial"), med(samples, "fixed", "criu_restore_tiny")
    ansible = med(samples, "fixed", "ansible_one_task")
    if None in (nbytes, device, device_cpu, trivial, tiny) or None in rates.values():
        return None
    mb = nbytes / 1e6
    out = {"bytes": nbytes, "fixed": trivial + tiny, "hash": mb / rates["sha256_all_cores"],
           "hash_cpu": mb / rates["sha256_one_core"], "criu": mb / rates["criu_copy"], "device": device,
           "device_cpu": device_cpu, "ansible": ansible}
    cores = result["machine"]["nproc"] or 1
    out["overlapped"] = out["fixed"] + max((out["hash_cpu"] + out["criu"] + device_cpu) / cores, out["criu"] + device, out["hash"])
    out["serial"] = out["fixed"] + out["hash"] + out["criu"] + device
    out["playbook"] = (ansible or 0.0) + out["overlapped"]
    return out


def generation_floors(samples, size, variant="host_checkpoint_runc"):
    """A generation at ``size`` and the floors measured beside it (medians; seconds; None where not measured): its
    host_checkpoint ``total`` and ``host`` part (without the device backup, the simulator's copy), raw ``runc`` (and
    ``runc_best``), the ``fsync`` write of the same bytes, the ``durable`` floor (the larger of the two), its lock
    ``window`` and that window's floor, this generation's backup + raw runc (``window_floor``, ``window_floor_best``)."""
    total = med(samples, "checkpoint", variant, size)
    runc = med(samples, "checkpoint", "raw_runc_checkpoint", size)
    runc_best = best(samples, "checkpoint", "raw_runc_checkpoint", size)
    fsync = med(samples, "floor", "fsync_write", size)
    backup = med(samples, "lock_window", variant, size, "backup_s")
    return {"total": total, "runc": runc, "runc_best": runc_best, "fsync": fsync,
            "host": total - (med(samples, "checkpoint", variant, size, "stages.device_backup") or 0.0)
            if total is not None else None,
            "durable": max(runc, fsync) if runc is not None and fsync is not None else None,
            "window": med(samples, "lock_window", variant, size),
            "window_floor": backup + runc if backup is not None and runc is not None else None,
            "window_floor_best": backup + runc_best if backup is not None and runc_best is not None else None}


def slope(points):
    """Least-squares seconds per GiB through (size MiB, seconds) points; None with fewer than two sizes."""
    points = [(x / GIB, y) for x, y in points if y is not None]
    if len(points) < 2:
        return None
    mx = sum(x for x, _y in points) / len(points)
    my = sum(y for _x, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _y in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def ratio(value, floor):
    return "%s×" % fmt(value / floor, 2) if value is not None and floor else "–"


def render_floors(result):
    """The goals of each part of a restore and of a generation against its floor, in the same run."""
    samples = result["samples"]
    out = []
    method = fastest_method(result)
    restore = "snapshot_restore" + ("_" + method if method else "")
    size_list = sizes(samples)
    out.append("\n## Each part against its floor, measured in the same run\n")
    out.append("Floors are medians of this run's own measurements (see docs/benchmarks.md for each one); a ratio of 1.00× "
               "is the floor itself. Goals (at 2 GiB): `docker run --runtime` ≤ %.2f× the overlapped floor; "
               "`snapshot_restore` playbook ≤ %.1f s, from a staged, verified snapshot ≤ %.1f s; slope ≤ %.1f s per GiB; "
               "lock window ≤ %.1f× (device backup + raw `runc checkpoint`); generation with fsync ≤ %.1f× an fsync'd "
               "write of the snapshot.\n\n"
               % (GOALS["docker_run"], GOALS["playbook_s"], GOALS["staged_playbook_s"], GOALS["slope"], GOALS["lock_window"],
                  GOALS["durability"]))
    rows = []
    for size in size_list:
        f = floors(result, size)
        if f is None:
            continue
        run_s = med(samples, "ttfa", "docker_run_runtime", size)
        lazy_s = med(samples, "ttfa", "docker_run_runtime_lazy", size)
        play = med(samples, "ttfa", restore, size)
        staged = med(samples, "ttfa", "snapshot_restore_runtime_staged", size)
        rows.append([gb(size), fmt(f["bytes"] / 1e6, 0), fmt(f["fixed"]), fmt(f["hash"]), fmt(f["criu"]), fmt(f["device"]),
                     fmt(f["overlapped"]), fmt(f["serial"]), fmt(run_s), ratio(run_s, f["overlapped"]),
                     fmt(lazy_s), ratio(lazy_s, f["overlapped"]),
                     fmt(play), fmt(f["playbook"]), ratio(play, f["playbook"]), fmt(staged)])
    out.append("### Restore to the first correct answer (seconds, warm page cache)\n\n")
    out.append(table(["state", "snapshot MB", "fixed: trivial container + tiny CRIU restore", "hash, all cores", "CRIU page copy",
                      "device copy", "overlapped floor", "serial floor", "docker run --runtime", "÷ overlapped floor",
                      "docker run --runtime, lazy pages", "÷ overlapped floor",
                      "%s (ansible-playbook)" % restore, "one-task playbook + overlapped floor", "÷ that floor",
                      "playbook from a staged, verified copy"], rows))

    out.append("\n### Slope from the smallest to the largest size (seconds per GiB, least squares over the medians)\n\n")
    rows = []
    for variant, label in (("docker_run_runtime", "docker run --runtime"), (restore, "%s (ansible-playbook)" % restore),
                           ("docker_run_runtime_cold_cache", "docker run --runtime, not in page cache")):
        value = slope([(size, med(samples, "ttfa", variant, size)) for size in size_list])
        if value is not None:
            rows.append([label, fmt(value), "≤ %.1f" % GOALS["slope"]])
    for section, variant, label in (("checkpoint", "host_checkpoint_runc", "host_checkpoint (device backup included)"),
                                    ("checkpoint", "raw_runc_checkpoint", "raw runc checkpoint"),
                                    ("lock_window", "host_checkpoint_runc", "lock window"),
                                    ("floor", "fsync_write", "fsync'd write of the snapshot's bytes")):
        value = slope([(size, med(samples, section, variant, size)) for size in sizes(samples, section)])
        if value is not None:
            rows.append([label, fmt(value), ""])
    for key, label in (("overlapped", "overlapped floor"), ("serial", "serial floor"), ("device", "device copy alone")):
        value = slope([(size, (floors(result, size) or {}).get(key)) for size in size_list])
        if value is not None:
            rows.append([label, fmt(value), ""])
    out.append(table(["what", "s per GiB", "goal"], rows))
    if size_list:
        out.append("\nSizes: %s.\n" % ", ".join(gb(x) for x in size_list))

    out.append("\n### The lock window during generation (seconds; the engine's own log of its transitions)\n\n")
    out.append("From the start of the engine's lock to the end of its unlock, as its agent logged them (docker logs "
               "timestamps). Between: from the end of the backup to the start of the resume (the host checkpoint and "
               "what drives it), of which the first part passed before host_checkpoint's task started (Ansible between "
               "the two tasks). Floor: this generation's device backup + raw `runc checkpoint` of the same size. "
               "host_checkpoint_runc is the roles' generation (with `device_backup`, host_checkpoint locks and backs up "
               "the engine itself after its checks: one task from the lock to the resume); "
               "host_checkpoint_runc_backup_task the same with the backup in a task of its own before it.\n\n")
    rows = []
    for variant in ("host_checkpoint_runc", "host_checkpoint_runc_backup_task", "host_checkpoint_runc_unlock_task",
                    "host_checkpoint_runc_hash_after",
                    "host_checkpoint_runc_encrypted", "host_checkpoint_docker"):
        for size in sizes(samples, "lock_window"):
            g = generation_floors(samples, size, variant)
            if g["window"] is None:
                continue
            rows.append([variant, gb(size), fmt(g["window"]), spread(samples, "lock_window", variant, size),
                         fmt(med(samples, "lock_window", variant, size, "lock_s")),
                         fmt(med(samples, "lock_window", variant, size, "backup_s")),
                         fmt(med(samples, "lock_window", variant, size, "between_s")),
                         fmt(med(samples, "lock_window", variant, size, "to_checkpoint_s")),
                         fmt(med(samples, "lock_window", variant, size, "restore_s")),
                         fmt(med(samples, "lock_window", variant, size, "unlock_s")), fmt(g["runc"]),
                         spread(samples, "checkpoint", "raw_runc_checkpoint", size), fmt(g["window_floor"]),
                         ratio(g["window"], g["window_floor"]), ratio(g["window"], g["window_floor_best"]),
                         n_of(samples, "lock_window", variant, size)])
    out.append(table(["generation", "state", "lock window", "its spread", "lock", "backup", "between",
                      "of which before host_checkpoint's task", "restore", "unlock",
                      "raw runc checkpoint (median)", "its spread", "floor: backup + runc", "÷ floor",
                      "÷ floor with runc's best", "n"], rows))

    out.append("\n### Generation with durability (seconds)\n\n")
    out.append("`host_checkpoint` (the device backup, the CRIU checkpoint with the images hashed as CRIU writes them, "
               "the resume, the images written out from there on, the seal with every file fsync'd, the publish, which removes the "
               "previous snapshot) against its floors from the same run: raw `runc checkpoint` into page cache (medians "
               "of the samples taken right before and after each generation) and the same bytes written to one file on "
               "the same filesystem and fsync'd (a durable write cannot be faster than the disk). The host part is "
               "host_checkpoint without the device backup (the simulator's copy, judged in its own table); the durable "
               "floor is the larger of raw runc and the fsync'd write. Goals: host part ≤ %.1f× raw runc, "
               "host_checkpoint ≤ %.1f× the fsync'd write.\n\n" % (GOALS["host_checkpoint"], GOALS["durability"]))
    rows = []
    for size in sizes(samples, "checkpoint"):
        g = generation_floors(samples, size)
        if g["total"] is None:
            continue

        def stage(name, size=size):
            return med(samples, "checkpoint", "host_checkpoint_runc", size, "stages." + name)
        rows.append([gb(size), fmt((med(samples, "checkpoint", "host_checkpoint_runc", size, "total_bytes") or 0) / 1e6, 0),
                     fmt(g["total"]), spread(samples, "checkpoint", "host_checkpoint_runc", size),
                     fmt(stage("device_backup") or 0.0), fmt(stage("checkpoint")), fmt(stage("dump")),
                     fmt(stage("seal")), fmt(med(samples, "checkpoint", "host_checkpoint_runc", size, "hashing.fsync_seconds")),
                     fmt(stage("publish")), fmt(g["host"]), fmt(g["runc"]), ratio(g["host"], g["runc"]),
                     ratio(g["host"], g["runc_best"]), fmt(g["fsync"]),
                     fmt(med(samples, "floor", "fsync_write", size, "mb_s"), 0), ratio(g["total"], g["fsync"]),
                     ratio(g["host"], g["durable"]), fmt(med(samples, "generate", "host_checkpoint_runc", size))])
    out.append(table(["state", "snapshot MB", "host_checkpoint", "its spread", "device backup", "checkpoint",
                      "of which the runc call", "seal",
                      "fsync (overlapped with hashing)", "publish", "host part", "raw runc", "host part ÷ raw runc",
                      "÷ raw runc's best", "fsync'd write of the same bytes", "its MB/s", "host_checkpoint ÷ fsync'd write",
                      "host part ÷ durable floor", "generate playbook wall"], rows))

    rows = []
    for size in sizes(samples, "verify"):
        rate = med(samples, "verify", "snapshot_verify_module_warm", size, "module_mb_s")
        if rate is None:
            continue
        sha = med(samples, "floor", "sha256_all_cores", size, "mb_s")
        sha_best = max(pick(samples, "floor", "sha256_all_cores", size, "mb_s") or [None])
        rows.append([gb(size), fmt(rate, 0), fmt(sha, 0), fmt(sha_best, 0),
                     "%s×" % fmt(rate / sha, 2) if sha else "–", "%s×" % fmt(rate / sha_best, 2) if sha_best else "–",
                     n_of(samples, "verify", "snapshot_verify_module_warm", size)])
    if rows:
        out.append("\n### snapshot_verify's hashing rate (MB/s, snapshot in the page cache)\n\n")
        out.append("The module's own rate (its `throughput_mb_s`: every byte of the snapshot read and hashed, chunks of a "
                   "big file on every core) against SHA-256 on all cores from memory, measured right after it (3 tries); "
                   "goal ≥ %.1f×.\n\n" % GOALS["verify_rate"])
        out.append(table(["state", "snapshot_verify", "SHA-256 all cores, median", "best", "÷ median", "÷ best", "n"], rows))

    out.append("\n### The device copy (the simulated NPU's cost, not the collection's)\n\n")
    gbps = list(pick(samples, "device_copy", "device_copy", None, "restore.gbps"))
    out.append("The simulator alone (benchmarks/device_copy.py: no CRIU, no Docker, no collection code) backing up and "
               "restoring this size's device memory, after a device reset as deleting the pod does. Modelled: bytes / "
               "ACL_SIM_COPY_GBPS (%s GB/s in this run; docs/simulator.md \"The cost model\"); the call takes max(host copy, "
               "modelled). Old model: each restore into a fresh sparse shmem file. In the pipeline: the device_restore stage "
               "of the restore-on-create runtime (agent restore + unlock over its socket).\n\n"
               % (fmt(gbps[0], 1) if gbps else "?"))
    rows = []
    for size in sizes(samples, "device_copy"):
        def dc(key, size=size, variant="device_copy"):
            return med(samples, "device_copy", variant, size, key)
        mapped, rss = dc("mapping_kb_after.ShmemPmdMapped"), dc("mapping_kb_after.Rss")
        nbytes = dc("restore.bytes")
        rows.append([gb(size), fmt((nbytes or 0) / 1e6, 0), fmt(dc("restore_s")), fmt(dc("restore.copy_s")), fmt(dc("restore.modelled_s")),
                     fmt(nbytes / 1e9 / dc("restore_s"), 1) if nbytes and dc("restore_s") else "–",
                     "%d %%" % round(100.0 * mapped / rss) if mapped is not None and rss else "–",
                     fmt(dc("backup_s")), fmt(dc("backup.modelled_s")),
                     fmt(dc("restore_s", variant="device_copy_fresh_shmem")), fmt(dc("backup_s", variant="device_copy_fresh_shmem")),
                     fmt(med(samples, "ttfa", restore, size, "runtime.durations.device_restore")),
                     fmt(med(samples, "ttfa", "docker_run_runtime", size, "runtime.durations.device_restore"))])
    out.append(table(["state", "device MB", "restore", "host copy", "modelled", "GB/s", "in 2 MiB pages", "backup",
                      "backup modelled", "restore, old model", "backup, old model", "device_restore stage (%s)" % restore,
                      "device_restore stage (docker run --runtime)"], rows))

    if result.get("encryption"):
        enc_sizes = sizes(samples, "checkpoint")
        rows = []
        for size in enc_sizes:
            if not pick(samples, "checkpoint", "host_checkpoint_runc_encrypted", size) and \
                    not [x for x in samples if x["variant"] == "host_checkpoint_runc_encrypted" and x["size_mb"] == size]:
                continue
            cipher = med(samples, "floor", "aes_gcm_all_cores", size)

            def measured(section, variant, size=size):
                return med(samples, section, variant, size)

            def unpublished(section, variant, size=size):
                """Host_checkpoint less its publish step: the plain generation replaces the snapshot its workload's
                first generation published (removing 2 GiB takes about a second), the encrypted one publishes into
                an empty place; without the step both do the same work."""
                return median([x["seconds"] - x["stages"].get("publish", 0) for x in samples if x["section"] == section
                               and x["variant"] == variant and x["size_mb"] == size and x.get("stages")])
            for label, plain, encrypted, section, copy, measure in (
                    ("host_checkpoint", "host_checkpoint_runc", "host_checkpoint_runc_encrypted", "checkpoint",
                     "encryption_copy_to_store", measured),
                    ("host_checkpoint, publish not counted", "host_checkpoint_runc", "host_checkpoint_runc_encrypted",
                     "checkpoint", "encryption_copy_to_store", unpublished),
                    ("%s (ansible-playbook)" % restore, restore, restore + "_encrypted", "ttfa", "encryption_copy_from_store",
                     measured),
                    ("docker run --runtime", "docker_run_runtime", "docker_run_runtime_encrypted", "ttfa",
                     "encryption_copy_from_store", measured)):
                a, b = measure(section, plain), measure(section, encrypted)
                copied = med(samples, "floor", copy, size)
                added = max(copied, cipher) if copied is not None and cipher is not None else None
                least = a + added if a is not None and added is not None else None
                errors = [x.get("error") or x.get("reason") for x in samples if x["section"] == section and x["variant"] == encrypted
                          and x["size_mb"] == size and (x.get("error") or x.get("restored") is False)]
                rows.append([gb(size), label, fmt(a), fmt(b), ratio(b, a), fmt(copied), fmt(cipher), fmt(added),
                             ratio(b, least), ratio(least, a), "; ".join(str(e)[:160] for e in errors if e) or ""])
        out.append("\n### Encrypted vs plain (seconds; host_checkpoint encryption_key, AES-256-GCM)\n\n")
        out.append("What encryption adds at least, measured in the same run: one more copy of the snapshot's bytes "
                   "(tmpfs -> the store's filesystem for a generation, the store -> tmpfs for a restore; a kernel copy) "
                   "and AES-256-GCM over them on all cores; pipelined, the larger of the two. The last ratio is the "
                   "lowest encrypted ÷ plain this machine allows. \"publish not counted\": the plain generation replaces "
                   "an older snapshot of its workload (removing it is part of its publish step), the encrypted one "
                   "publishes into an empty place; the row without that step compares the same work.\n\n")
        out.append(table(["state", "step", "plain", "encrypted", "encrypted ÷ plain", "copy", "AES-GCM, all cores",
                          "least added", "encrypted ÷ (plain + least added)", "lowest possible ÷ plain", "problems"], rows))

    out.extend(render_secure_default(samples))

    out.append("\n### Fixed costs (seconds, size-independent; 3 times per repetition)\n\n")
    rows = [[label, fmt(med(samples, "fixed", key)), fmt(min(pick(samples, "fixed", key) or [0]) or None), n_of(samples, "fixed", key, None)]
            for key, label in (("ansible_one_task", "ansible-playbook, one task with a trivial module (ping, connection local)"),
                               ("docker_run_trivial", "docker run --detach of the workload image (sleep): create + start"),
                               ("criu_restore_tiny", "criu restore --restore-detached of a checkpointed sleep"))]
    out.append(table(["what", "median", "best", "n"], rows))

    world_sizes = sizes(samples, "world_files")
    if world_sizes:
        size = world_sizes[-1]
        out.append("\n### A mounted model file of %s: generation and restore (seconds)\n\n" % gb(size))
        out.append("What a snapshot's world records of every file in its mounts (world.py): its identity (device, "
                   "inode, size, ctime) and, at generation, its full SHA-256. A restore finds an unchanged file by its "
                   "identity (no read); the same bytes under another identity (a copy, or chmod as here) are read in "
                   "full once, then known from the node's digest cache. Page cache dropped before each.\n\n")
        rows = [[label, fmt(med(samples, "world_files", key, size), 4), fmt(med(samples, "world_files", key, size, "mb_s"), 0),
                 "yes" if all(s.get("correct", True) for s in samples if s["section"] == "world_files"
                              and s["variant"] == key) else "**NO**", n_of(samples, "world_files", key, size)]
                for key, label in (("generation_digest", "generation: identity + full SHA-256 (after the engine resumed)"),
                                   ("restore_unchanged", "restore, file unchanged: identity only"),
                                   ("restore_other_identity_first", "restore, same bytes, another identity: full read"),
                                   ("restore_other_identity_cached", "restore, that identity again: the digest cache"))]
        out.append(table(["what", "seconds", "MB/s", "matched", "n"], rows))
    return out


def sizes(samples, section="ttfa"):
    return sorted(set(s["size_mb"] for s in samples if s["section"] == section and s["size_mb"] is not None))


def n_of(samples, section, variant, size):
    return len(pick(samples, section, variant, size))


def render(result):
    samples = result["samples"]
    m = result["machine"]
    out = ["# inferops.snapshot benchmark results\n"]
    out.append("Run %s to %s (%s s), `benchmarks/run.py %s`. Medians of n runs; the load average is the 1-minute "
               "value read at each sample.\n" % (result["started_at"], result.get("finished_at"), result.get("duration_s"),
                                                 " ".join(result["args"].get("argv") or [])))
    load1 = [s["load1"] for s in samples]
    out.append(table(["machine", ""], [
        ["CPU", "%s, %s cores (%s)" % (m["cpu_model"], m["nproc"], m.get("virtualization") or "bare metal?")],
        ["memory", "%s GiB" % m["mem_total_gib"]], ["OS / kernel", "%s / %s" % (m.get("os"), m["kernel"])],
        ["docker server / CLI / containerd", "%s / %s / %s" % (m["docker_server"], m["docker_cli"], m.get("containerd"))],
        ["storage driver / work dir fs", "%s / %s on %s" % (m["storage_driver"], m["workdir_fs"]["type"], m["workdir_fs"]["source"])],
        ["runc / CRIU", "%s / %s" % (m["runc"], m["criu"])], ["ansible-core / python", "%s / %s" % (m["ansible_core"], m["python"])],
        ["commit", "%s%s" % (m["git_commit"], " (dirty)" if m["git_dirty"] else "")],
        ["load average at start / end", "%s / %s" % (result["load_at_start"], result.get("load_at_end"))],
        ["1-min load during samples: median / max", "%s / %s" % (fmt(median(load1)), fmt(max(load1) if load1 else None))],
        ["warmup (WORKLOAD_WARMUP_SECONDS)", "%s s" % result["args"]["warmup"]],
        ["state split", "%d %% device memory (backed up into the process), %d %% host memory"
         % (result["device_share"] * 100, 100 - result["device_share"] * 100)],
    ]))

    limits = result.get("limits") or {}
    out.append("\n## Physical limits measured on this machine\n")
    out.append("Measured at the start of every run and at the end (3 tries each): the best value is the machine's limit, "
               "the median shows what the load of the other users left.\n\n")
    labels = [("sha256_one_core", "SHA-256, one core (hashlib)"), ("sha256_all_cores", "SHA-256, all %s cores" % m["nproc"]),
              ("memcpy", "copy into newly allocated memory (one core, page faults included)"),
              ("memcpy_faulted", "copy into memory already faulted in (one core)"),
              ("criu_copy", "CRIU's page copy: one preadv of a cached file into fresh anonymous memory (one core)"),
              ("fault_in_fresh_memory", "fault-in of fresh memory (calloc of 256 MiB after a settle)")]
    rows = [[label, fmt(limit(limits, key)), fmt(limit(limits, key, "median")), limit(limits, key, "n") or "–"]
            for key, label in labels]
    rows += [["storage read, cold page cache, %s snapshot (no hashing)" % gb(s), fmt(max(pick(samples, "verify", "read_only_cold", s, "mb_s") or [0])),
              fmt(med(samples, "verify", "read_only_cold", s, "mb_s")), n_of(samples, "verify", "read_only_cold", s)]
             for s in sizes(samples, "verify") if pick(samples, "verify", "read_only_cold", s, "mb_s")]
    out.append(table(["limit", "best MB/s", "median MB/s", "n"], rows))

    out.append("\n## Time to first correct answer (seconds)\n")
    variants = ttfa_variants(result)
    present = [(v, label) for v, label in variants if pick(samples, "ttfa", v)]
    header = ["state"] + [label for _v, label in present] + ["all answers correct", "n"]
    rows, notes = [], {}
    for size in sizes(samples):
        correct = all(s.get("correct", True) for s in samples if s["section"] == "ttfa" and s["size_mb"] == size)
        cells = []
        for v, _l in present:
            cold = [s for s in samples if s["section"] == "ttfa" and s["variant"] == v and s["size_mb"] == size
                    and s.get("restored") is False]
            cell = fmt(med(samples, "ttfa", v, size))
            if cold:
                mark = notes.setdefault(cold[0].get("reason") or "not restored", "†" * (len(notes) + 1))
                cell += " %s (%d of %d runs started cold)" % (mark, len(cold), n_of(samples, "ttfa", v, size))
            cells.append(cell)
        rows.append([gb(size)] + cells + ["yes" if correct else "**NO**", n_of(samples, "ttfa", "snapshot_restore", size)])
    out.append(table(header, rows))
    for reason, mark in notes.items():
        out.append("%s The restore was not used and the container started cold: `%s`\n" % (mark, reason))
    if notes:
        out.append("\n\"all answers correct\" counts such a run as not correct: the answers were right, but not from the restore.\n")
    out.append("\n### Speed-up over the cold start (cold start median / restore median)\n")
    rows = []
    for size in sizes(samples):
        cold = med(samples, "ttfa", "cold_start", size)
        rows.append([gb(size)] + ["%s×" % fmt(cold / med(samples, "ttfa", v, size), 1) if cold and med(samples, "ttfa", v, size) else "–"
                                  for v, _l in present if v != "cold_start"])
    out.append(table(["state"] + [label for v, label in present if v != "cold_start"], rows))

    out += render_floors(result)

    for variant, label in [(v, l) for v, l in present if v.startswith("snapshot_restore") or v.startswith("docker_run_runtime")]:
        out.append("\n### Where %s's time goes (seconds, medians)\n" % label)
        used = sorted(set("%s (%s)" % (x.get("method"), x.get("method_reason") or "asked for") for x in samples
                          if x["section"] == "ttfa" and x["variant"] == variant and x.get("method")))
        if used:
            out.append("\nMethod the module used: %s.\n\n" % "; ".join(used))
        rows = []
        for size in sizes(samples):
            rows.append([gb(size)] + [fmt(med(samples, "ttfa", variant, size, "stages." + st)) for st in STAGES] +
                        [fmt(med(samples, "ttfa", variant, size, "module_total_s")), fmt(med(samples, "ttfa", variant, size, "task_wall_s")),
                         fmt(med(samples, "ttfa", variant, size, "playbook_wall_s")), fmt(med(samples, "ttfa", variant, size))])
        out.append(table(["state"] + STAGES + ["module total", "ansible task", "ansible-playbook", "first answer"], rows))
        if pick(samples, "ttfa", variant, None, "runtime.durations.total"):
            keys = ["prepare", "verify", "host_restore", "metadata", "device_restore", "total"]
            rows = [[gb(size)] + [fmt(med(samples, "ttfa", variant, size, "runtime.durations." + k)) for k in keys] for size in sizes(samples)]
            out.append("\nInside it, what the restore-on-create runtime recorded (it runs within the module's host_restore stage):\n\n")
            out.append(table(["state"] + ["runtime " + k for k in keys], rows))

    out.append("\n## Host checkpoint (seconds; device already BACKED_UP)\n")
    present = [(v, label) for v, label in CHECKPOINT if pick(samples, "checkpoint", v)]
    rows = []
    for size in sizes(samples, "checkpoint"):
        row = [gb(size), fmt((med(samples, "checkpoint", "raw_runc_checkpoint", size, "total_bytes") or 0) / 1e6, 0)]
        for v, _label in present:
            total = med(samples, "checkpoint", v, size)
            if v.startswith("host_checkpoint"):
                stage = fmt(med(samples, "checkpoint", v, size, "stages.checkpoint"))
                row.append("%s (checkpoint %s + seal %s)" % (fmt(total), stage, fmt(med(samples, "checkpoint", v, size, "stages.seal"))))
            else:
                row.append(fmt(total))
        rows.append(row)
    out.append(table(["state", "image MB"] + [label for _v, label in present], rows))

    out.append("\n## Host restore alone (seconds; the process is back, device not yet restored)\n")
    present = [(v, label) for v, label in HOST_RESTORE if pick(samples, "host_restore", v)]
    rows = [[gb(size)] + [fmt(med(samples, "host_restore", v, size)) for v, _l in present] for size in sizes(samples, "host_restore")]
    out.append(table(["state"] + [label for _v, label in present], rows))

    out.append("\n## Where Docker's checkpoint path spends its time (medians)\n")
    out.append("CPU seconds and bytes passed through read()/write() per process during the one command; the shim's CPU "
               "includes runc and criu, which it reaps. Disk = the whole machine's block device counters.\n\n")
    rows = []
    for size in sizes(samples, "checkpoint"):
        for section, variant, label in (("checkpoint", "raw_docker_checkpoint", "docker checkpoint create"),
                                        ("host_restore", "raw_docker_start_checkpoint", "docker start --checkpoint")):
            if not pick(samples, section, variant, size):
                continue

            def get(key, section=section, variant=variant, size=size):
                return med(samples, section, variant, size, "profile." + key)
            rows.append([gb(size), label, fmt(med(samples, section, variant, size)),
                         fmt(get("shim.children_cpu_s") + get("shim.cpu_s") if get("shim.cpu_s") is not None else None),
                         fmt(get("containerd.cpu_s")), fmt(get("dockerd.cpu_s")),
                         fmt(get("containerd.write_mb"), 0), fmt(get("containerd.read_mb"), 0),
                         fmt(get("dockerd.write_mb"), 0), fmt(get("dockerd.read_mb"), 0), fmt(get("system.disk_write_mb"), 0),
                         fmt(get("system.iowait_s"))])
    out.append(table(["state", "command", "wall s", "shim+runc+criu CPU s", "containerd CPU s", "dockerd CPU s",
                      "containerd write MB", "containerd read MB", "dockerd write MB", "dockerd read MB", "disk write MB",
                      "iowait s"], rows))

    out.append("\n## snapshot_verify vs sha256sum (MB/s, medians; same files)\n")
    rows = []
    for size in sizes(samples, "verify"):
        for cache in ("warm", "cold"):
            rows.append([gb(size), cache] + [fmt(med(samples, "verify", "%s_%s" % (v, cache), size, "mb_s"), 0) for v, _l in VERIFY] +
                        [fmt(med(samples, "verify", "snapshot_verify_module_%s" % cache, size, "module_mb_s"), 0),
                         fmt(med(samples, "verify", "snapshot_verify_module_%s" % cache, size)),
                         fmt(med(samples, "verify", "snapshot_verify_module_%s" % cache, size, "module_total_s"))])
    out.append(table(["state", "page cache"] + [label for _v, label in VERIFY] +
                     ["module's own hash MB/s", "ansible task s", "module total s"], rows))

    out.append("\n## Generation as ansible runs it (seconds, medians)\n")
    rows = []
    for variant in ("host_checkpoint_runc", "host_checkpoint_runc_backup_task", "host_checkpoint_runc_unlock_task",
                    "host_checkpoint_runc_hash_after",
                    "host_checkpoint_runc_encrypted", "host_checkpoint_docker", "host_checkpoint_criu"):
        for size in sizes(samples, "generate"):
            if not pick(samples, "generate", variant, size):
                continue
            totals = [sum(s["module_totals"].values()) for s in samples
                      if s["section"] == "generate" and s["variant"] == variant and s["size_mb"] == size]
            walls = [sum(s["task_walls"].values()) for s in samples
                     if s["section"] == "generate" and s["variant"] == variant and s["size_mb"] == size]
            rows.append([variant, gb(size), fmt(med(samples, "generate", variant, size)), fmt(median(walls)), fmt(median(totals)),
                         fmt(med(samples, "generate", variant, size, "module_totals.npu_snapshot_backup")),
                         fmt(med(samples, "generate", variant, size, "module_totals.host_checkpoint")),
                         fmt(med(samples, "generate", variant, size, "module_totals.npu_snapshot_lock")),
                         n_of(samples, "generate", variant, size)])
    out.append(table(["variant", "state", "ansible-playbook wall", "sum of task walls", "sum of module times",
                      "backup module", "host_checkpoint module", "resume module", "n"], rows))

    out.append("\n## Orchestration overhead: N inventory aliases of localhost (connection local, one workload each)\n")
    out.append("All hosts share this one %s-core machine, so their modules compete for the same CPUs and disk.\n\n" % m["nproc"])
    rows = []
    for s in sorted(set((x["variant"], x["hosts"], x["size_mb"]) for x in samples if x["section"] == "orchestration")):
        variant, hosts, size = s
        wall = med(samples, "orchestration", variant, size)
        max_module = median([x["max_module_s"] for x in samples if x["section"] == "orchestration" and x["variant"] == variant])
        sum_module = median([x["sum_module_s"] for x in samples if x["section"] == "orchestration" and x["variant"] == variant])
        max_task = median([x["max_task_wall_s"] for x in samples if x["section"] == "orchestration" and x["variant"] == variant])
        methods = sorted(set(str(x.get("method")) for x in samples if x["section"] == "orchestration" and x["variant"] == variant))
        rows.append([variant.split("_")[0] + " (method %s)" % "/".join(methods), hosts, gb(size), fmt(wall), fmt(max_task), fmt(max_module), fmt(sum_module),
                     fmt(wall - max_module if wall is not None and max_module is not None else None),
                     n_of(samples, "orchestration", variant, size)])
    out.append(table(["step", "hosts", "state per host", "ansible-playbook wall", "slowest host's task walls",
                      "slowest host's module time", "sum of module times", "wall − slowest module", "n"], rows))
    return "\n".join(out)


def chart(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-error

    samples = result["samples"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 10.5))
    m = result["machine"]
    load1 = [x["load1"] for x in samples]
    fig.suptitle("inferops.snapshot on %s × %s (%s), kernel %s, docker %s, CRIU %s — medians of %s runs; 1-min load: %.2f at start, "
                 "median %.2f during the run" % (m["nproc"], m["cpu_model"], m.get("virtualization") or "?", m["kernel"], m["docker_server"],
                                                 m["criu"], result["args"]["runs"], result["load_at_start"][0], median(load1) or 0), fontsize=10)

    def bars(ax, groups, series, values, ylabel, title, log=False, fmt_value="%.2g"):
        width = 0.8 / max(1, len(series))
        for i, label in enumerate(series):
            xs = [g + (i - (len(series) - 1) / 2.0) * width for g in range(len(groups))]
            ys = [values[label][g] if values[label][g] is not None else 0 for g in range(len(groups))]
            drawn = ax.bar(xs, ys, width, label=label)
            for x, y, rect in zip(xs, ys, drawn):
                if y:
                    ax.annotate(fmt_value % y, (x, rect.get_height()), ha="center", va="bottom", fontsize=7, rotation=90,
                                xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
            top = max([v for vals in values.values() for v in vals if v] or [1])
            bottom = min([v for vals in values.values() for v in vals if v] or [1])
            ax.set_ylim(bottom / 2.0, top * 12)  # room above the bars for the legend
        else:
            ax.margins(y=0.25)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        ax.grid(axis="y", alpha=0.3)

    size_list = sizes(samples)
    groups = [gb(s) for s in size_list]
    present = [(v, l) for v, l in ttfa_variants(result) if pick(samples, "ttfa", v)]
    short = {"cold_start": "cold start (warmup %gs)" % result["args"]["warmup"], "snapshot_restore": "snapshot_restore (ansible)",
             "snapshot_restore_cold_cache": "snapshot_restore (ansible), snapshot not cached",
             "raw_docker_start_checkpoint": "raw docker start --checkpoint",
             "raw_criu_restore_bare": "raw criu restore, bare process", "docker_run_runtime": "docker run --runtime (no ansible)",
             "docker_run_runtime_cold_cache": "docker run --runtime, not cached"}
    for method in result.get("restore_methods", [])[1:]:
        short["snapshot_restore_" + method] = "snapshot_restore %s (ansible)" % method
        short["snapshot_restore_%s_cold_cache" % method] = "snapshot_restore %s (ansible), not cached" % method
    values = {}
    for v, label in present:
        values[short.get(v, label)] = [med(samples, "ttfa", v, s) for s in size_list]
    bars(axes[0][0], groups, list(values), values, "seconds (log scale)", "Time to first correct answer", log=True)

    ax = axes[0][1]
    restore_variants = [v for v in ["snapshot_restore"] + ["snapshot_restore_" + x for x in result.get("restore_methods", [])[1:]]
                        if pick(samples, "ttfa", v)]
    parts = [("verify", "verify (module)"), ("prepare", "prepare: create container, metadata"),
             ("host", "host restore (docker start --checkpoint / runc restore)"), ("verify2", "verify again (runtime)"),
             ("other", "docker start + runtime overhead"), ("device", "device restore (simulated NPU, ACL_SIM_COPY_GBPS)"),
             ("health", "health"), ("ansible", "ansible: start + task overhead")]
    colors = dict(zip([key for key, _l in parts], ["#1f77b4", "#ff7f0e", "#2ca02c", "#17becf", "#bcbd22", "#d62728", "#9467bd", "#7f7f7f"]))
    width = 0.8 / max(1, len(restore_variants))
    drawn = set()
    for i, variant in enumerate(restore_variants):
        xs = [g + (i - (len(restore_variants) - 1) / 2.0) * width for g in range(len(size_list))]
        bottom = [0.0] * len(size_list)
        for key, label in parts:
            ys = []
            for s_mb in size_list:
                def get(k, s_mb=s_mb, variant=variant):
                    return med(samples, "ttfa", variant, s_mb, k) or 0.0
                rt = "runtime.durations."
                value = {"verify": get("stages.verify"), "prepare": get("stages.prepare"), "health": get("stages.health"),
                         "ansible": get("playbook_wall_s") - get("module_total_s")}.get(key)
                if value is None:
                    if get(rt + "total"):
                        value = {"host": get(rt + "host_restore"), "verify2": get(rt + "verify"), "device": get(rt + "device_restore"),
                                 "other": get("stages.host_restore") - get(rt + "host_restore") - get(rt + "verify") - get(rt + "device_restore")}[key]
                    else:
                        value = {"host": get("stages.host_restore"), "device": get("stages.device_restore")}.get(key, 0.0)
                ys.append(max(0.0, value))
            ax.bar(xs, ys, width * 0.9, bottom=bottom, color=colors[key], label=None if key in drawn else label)
            drawn.add(key)
            bottom = [b + y for b, y in zip(bottom, ys)]
        for x, total in zip(xs, bottom):
            ax.annotate("%.1f" % total, (x, total), ha="center", va="bottom", fontsize=7)
        for x in xs:
            ax.annotate(result.get("restore_default", "docker") if variant == "snapshot_restore" else variant.split("_")[-1], (x, 0),
                        ha="center", va="top",
                        fontsize=6, xytext=(0, -1), textcoords="offset points")
    ax.set_xticks(range(len(size_list)))
    ax.set_xticklabels(["\n" + g for g in groups])
    ax.set_ylabel("seconds")
    ax.set_title("Where snapshot_restore's time goes, method docker | runtime (bar = ansible-playbook wall)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(axis="y", alpha=0.3)

    ck_sizes = sizes(samples, "checkpoint")
    gen_series = [("runc", "raw runc checkpoint (floor)"), ("fsync", "fsync'd write of the same bytes (floor)"),
                  ("host", "host_checkpoint without the device backup"), ("total", "host_checkpoint"),
                  ("window_floor", "device backup + raw runc (lock window floor)"), ("window", "the engine's lock window")]
    generations = [generation_floors(samples, s) for s in ck_sizes]
    values = dict((label, [g[key] for g in generations]) for key, label in gen_series)
    bars(axes[1][0], [gb(s) for s in ck_sizes], list(values), values, "seconds (log scale)",
         "Generation against its floors, measured beside it", log=True)

    ax = axes[1][1]
    v_sizes = sizes(samples, "verify")
    largest = max(v_sizes) if v_sizes else None
    if not any(s["section"] == "verify" and s["variant"] != "snapshot_verify_module_warm" for s in samples):
        # --focus: only the module's own rate, and SHA-256 on all cores measured right after it
        values = {"snapshot_verify (the module's own rate, page cache)":
                  [med(samples, "verify", "snapshot_verify_module_warm", x, "module_mb_s") for x in v_sizes],
                  "SHA-256, all cores, beside it (median)": [med(samples, "floor", "sha256_all_cores", x, "mb_s")
                                                             for x in v_sizes]}
        bars(ax, [gb(x) for x in v_sizes], list(values), values, "MB/s", "Verification against SHA-256 on all cores",
             fmt_value="%.0f")
    else:
        shown = [(v, label) for v, label in VERIFY if v != "read_only"]
        labels = [label for _v, label in shown]
        for i, cache in enumerate(("warm", "cold")):
            ys = [med(samples, "verify", "%s_%s" % (v, cache), largest, "mb_s") or 0 for v, _l in shown]
            xs = [x + (i - 0.5) * 0.38 for x in range(len(shown))]
            drawn = ax.bar(xs, ys, 0.38, label="%s page cache" % cache)
            for x, y, rect in zip(xs, ys, drawn):
                ax.annotate("%.0f" % y, (x, rect.get_height()), ha="center", va="bottom", fontsize=7)
        limits = result.get("limits") or {}
        for key, style, label in (("sha256_one_core", "r--", "SHA-256 limit, 1 core"), ("sha256_all_cores", "m:", "SHA-256 limit, all cores")):
            if limit(limits, key):
                ax.axhline(limit(limits, key), color=style[0], linestyle=style[1:], label="%s (best %.0f MB/s)" % (label, limit(limits, key)))
        cold_read = med(samples, "verify", "read_only_cold", largest, "mb_s")
        if cold_read:
            ax.axhline(cold_read, color="g", linestyle="-.", label="storage read, cold cache, no hashing (%.0f MB/s)" % cold_read)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels([label.replace(" (", "\n(").replace(", one", ",\none").replace(" in-", "\nin-").replace(", 1", ",\n1")
                            for label in labels], fontsize=7)
        ax.set_ylabel("MB/s")
        ax.set_title("Verification throughput, %s snapshot" % (gb(largest) if largest else "?"), fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.15)

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result, out_dir):
    with open(os.path.join(out_dir, "results.md"), "w") as handle:
        handle.write(render(result))
    chart(result, os.path.join(out_dir, "chart.png"))


def main(argv):
    if len(argv) != 2:
        raise SystemExit("usage: report.py RESULTS/bench.json")
    with open(argv[1]) as handle:
        result = json.load(handle)
    write_report(result, os.path.dirname(os.path.abspath(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

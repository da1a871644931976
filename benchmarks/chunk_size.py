# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A check's hashing rate by chunk size, on one snapshot, against SHA-256 on all cores measured beside it.

    .venv/bin/python benchmarks/chunk_size.py SNAPSHOT_DIR [--sizes-mib 64 16] [--rounds 4] [--tries 5] [--floor-mib 256]

What chunk size the seal should write (manifest.CHUNK_BYTES): a chunk is one SHA-256 stream, so the jobs of a
small snapshot may not split evenly over the cores. For each round and each size (interleaved, so that the load
of the machine falls on every size alike), the snapshot's files are hashed as a verification hashes them
(hashing.hash_tree: files larger than a chunk by chunks, every byte once, from the page cache, which a first read
fills), ``tries`` times, and the median rate is put beside the median of three SHA-256 runs on all cores from
memory. Prints one line per size and round, then the medians, and one JSON object last. Needs the collection on
build/collections (make collection); no root, no Docker.
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import statistics

from common import MIB  # pylint: disable=import-error  # also puts the collection on sys.path
from floors import Floors  # pylint: disable=import-error
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import hashing, manifest, seal


def sha256_all_cores(buf):
    """MB/s of every core hashing ``buf`` at once: the bench's own floor (Floors.sha256_seconds)."""
    cores = os.cpu_count() or 1
    return len(buf) * cores / 1e6 / Floors.sha256_seconds(buf, cores)


def check_rate(root, files, chunk_bytes):
    """MB/s of one verification-like pass over ``files`` with chunks of ``chunk_bytes``, and the reader used."""
    chunked = seal.chunked_files(root, files, chunk_bytes)  # the files a seal with this chunk size would chunk
    whole = [rel for rel in files if rel not in chunked]
    _results, _chunks, stats = hashing.hash_tree(root, whole, chunked)
    return stats["throughput_mb_s"], stats["reader"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("snapshot_dir")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 16])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--floor-mib", type=int, default=256, help="what each core hashes for the floor (default 256)")
    args = parser.parse_args(argv)
    files = manifest.list_files(args.snapshot_dir)
    total = sum(os.lstat(os.path.join(args.snapshot_dir, rel)).st_size for rel in files)
    buf = os.urandom(args.floor_mib * MIB)
    samples = dict((size, []) for size in args.sizes_mib)
    for round_index in range(args.rounds):
        for size in args.sizes_mib:
            rates = [check_rate(args.snapshot_dir, files, size * MIB) for _try in range(args.tries)]
            rate = statistics.median(rate for rate, _reader in rates)
            floor = statistics.median(sha256_all_cores(buf) for _try in range(3))
            samples[size].append({"check_mb_s": rate, "sha256_all_cores_mb_s": round(floor, 1),
                                  "ratio": round(rate / floor, 3), "reader": rates[-1][1]})
            print("round %d, chunks of %3d MiB: check %6.0f MB/s, SHA-256 all cores %6.0f MB/s, ratio %.3f (%s)"
                  % (round_index, size, rate, floor, rate / floor, rates[-1][1]))
    summary = {"snapshot_bytes": total, "files": len(files), "cpus": os.cpu_count(), "rounds": args.rounds,
               "tries": args.tries, "sizes": {}}
    for size in args.sizes_mib:
        ratios = [sample["ratio"] for sample in samples[size]]
        summary["sizes"][size] = {"median_ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                  "median_check_mb_s": statistics.median(s["check_mb_s"] for s in samples[size])}
        print("chunks of %3d MiB: check / SHA-256 all cores, median of %d rounds %.3f (%.3f-%.3f)"
              % (size, args.rounds, statistics.median(ratios), min(ratios), max(ratios)))
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()

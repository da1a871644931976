# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device copy on its own: what the simulated NPU costs a backup and a restore of N MiB.

    python3 benchmarks/device_copy.py LIBRARY DEVICE_MB      # prints one JSON object

Run by benchmarks/run.py in a fresh process per measurement, with ACL_SIM_DEVICE_DIR,
ACL_SIM_DEVICE_MEM_BYTES, ACL_SIM_DEVICE_PREALLOC and ACL_SIM_COPY_GBPS set as the engine has them.
It does what the engine and a restore do to the device, through the collection's own binding
(core/agent/acl.py): the device is installed (aclsim_ctl create, as a node has its NPU before any
pod; not timed), DEVICE_MB are allocated and written, then lock, backup (timed), the device is
wiped as deleting the pod does (aclsim_ctl reset; not timed), restore (timed), unlock, and the bytes
are compared. No collection code, CRIU or Docker is involved: this line is the simulator's cost, the
part of a restore an NPU would spend copying the backup back into HBM.
"""

from __future__ import absolute_import, division, print_function

import ctypes
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "plugins", "module_utils", "core", "agent"))
sys.path.insert(0, os.path.join(REPO, "tests", "simulator"))
import acl  # noqa: E402  pylint: disable=import-error,wrong-import-position
import aclsim_ctl  # noqa: E402  pylint: disable=import-error,wrong-import-position

MIB = 1024 * 1024
CHUNK = 64 * MIB


class CopyStats(ctypes.Structure):  # aclsimCopyStats (tests/simulator/include/acl/acl_snapshot_sim.h)
    _fields_ = [("kind", ctypes.c_int32), ("devices", ctypes.c_int32), ("bytes", ctypes.c_uint64),
                ("copySeconds", ctypes.c_double), ("modelledSeconds", ctypes.c_double),
                ("totalSeconds", ctypes.c_double), ("gbps", ctypes.c_double)]


def last_copy(lib):
    stats = CopyStats()
    lib.aclsimGetLastCopy.argtypes = [ctypes.POINTER(CopyStats)]
    if lib.aclsimGetLastCopy(ctypes.byref(stats)) != 0:
        return None
    return {"bytes": stats.bytes, "copy_s": round(stats.copySeconds, 4), "modelled_s": round(stats.modelledSeconds, 4),
            "total_s": round(stats.totalSeconds, 4), "gbps": stats.gbps}


def device_mapping_kb(dev):
    """Rss and ShmemPmdMapped (kB) of this process's mapping of the device file: 2 MiB pages or not."""
    path = aclsim_ctl.device_path(dev)
    fields, inside = {}, False
    with open("/proc/self/smaps") as handle:
        for line in handle:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                inside = line.rstrip("\n").endswith(path)
            elif inside and head[0] in ("Rss:", "ShmemPmdMapped:"):
                fields[head[0][:-1]] = fields.get(head[0][:-1], 0) + int(head[1])
    return fields


def main(argv):
    library, device_mb = argv[1], int(argv[2])
    nbytes = device_mb * MIB
    out = {"device_mb": device_mb, "prealloc": aclsim_ctl.prealloc_mode(),
           "device_mem_bytes": aclsim_ctl.parse_size(os.environ["ACL_SIM_DEVICE_MEM_BYTES"])}
    t0 = time.monotonic()
    if out["prealloc"] != "none":
        aclsim_ctl.create(0, out["device_mem_bytes"])
    out["create_s"] = round(time.monotonic() - t0, 3)
    rt = acl.AclRuntime(library)
    rt.set_device(0)
    ptr = rt.malloc(nbytes)
    block = bytearray(os.urandom(CHUNK))
    digest = hashlib.sha256()
    t0 = time.monotonic()
    for offset in range(0, nbytes, CHUNK):
        size = min(CHUNK, nbytes - offset)
        block[:8] = offset.to_bytes(8, "little")  # every chunk differs
        rt.memcpy_to_device(ptr + offset, bytes(block[:size]))
        digest.update(block[:size])
    out["fill_s"] = round(time.monotonic() - t0, 3)
    out["mapping_kb_before"] = device_mapping_kb(0)
    rt.snapshot_lock()
    t0 = time.monotonic()
    rt.snapshot_backup()
    out["backup_s"] = round(time.monotonic() - t0, 4)
    out["backup"] = last_copy(rt.lib)
    t0 = time.monotonic()
    aclsim_ctl.reset(0)  # pod deleted: the device's memory is wiped
    out["reset_s"] = round(time.monotonic() - t0, 3)
    t0 = time.monotonic()
    rt.snapshot_restore()
    out["restore_s"] = round(time.monotonic() - t0, 4)
    out["restore"] = last_copy(rt.lib)
    out["mapping_kb_after"] = device_mapping_kb(0)
    rt.snapshot_unlock()
    check = hashlib.sha256()
    for offset in range(0, nbytes, CHUNK):
        check.update(rt.memcpy_from_device(ptr + offset, min(CHUNK, nbytes - offset)))
    out["correct"] = check.digest() == digest.digest()
    rt.free(ptr)
    rt.reset_device(0)
    print(json.dumps(out, sort_keys=True))
    return 0 if out["correct"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

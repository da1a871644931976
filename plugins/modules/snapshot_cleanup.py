#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_cleanup
short_description: Remove failed, stale and orphaned snapshots under a snapshot root by a retention policy
version_added: 0.1.0
description:
  - Scans O(root) (C(<root>/<namespace>/<service>/<instance>/<pod>), the layout the roles use) and, when
    given, the device snapshot root O(npu_root), and removes what the policy O(remove) names.
  - C(failed) - pods whose status record says C(failed) - the leftovers of that generation and the record.
  - C(orphaned) - leftovers of a generation that never finished (staging C(.partial) dirs, C(generating)
    records older than O(generation_grace)), records saying C(completed) for a snapshot that is gone,
    device snapshot dirs that no host snapshot, record or running container goes with, and with
    O(known_pods) the snapshots of pods that the service no longer has.
  - C(stale) - published snapshots older than O(max_age), and with O(check_images) those whose image is no
    longer on the host (they can never be restored).
  - Never removes a snapshot in use, that is one a running container was restored from (read from the
    metadata file the restore wrote into it), one being generated (a C(generating) record or a staging
    dir younger than O(generation_grace)), or a device dir a running container was started with as its
    C(VLLM_NPU_SNAPSHOT_PATH). Never follows a symlink. Every removal and every kept snapshot is reported
    with the reason.
  - A pod with no published snapshot but its last one aside in C(.<pod>.old.<pid>) - where a publish that could not
    swap the two directories in one step (a filesystem without C(renameat2) C(RENAME_EXCHANGE), such as NFS) was
    killed between its two renames - gets it back first (when that pid is no live process and the snapshot is
    complete by its manifest), and the policy then judges it as any published snapshot. RV(put_back) lists them.
  - Also removes the CRIU work directories (C(inferops-dump-*), C(inferops-restore-*) in the temp dir) that a killed
    checkpoint or restore left, once the process that made them is gone and no process uses them any more (an
    orphaned runc or CRIU still writing its log keeps its directory until it ends). RV(work_dirs_removed) lists them.
requirements:
  - the Docker CLI (O(docker_cli)) on the target host - it tells the snapshots running containers were restored from
    or started with, which are never removed, and with O(check_images) the images the host has
  - jsonschema (Python library) on the target host, with O(known_pods) (each is checked as a snapshot identity)
  - root, for snapshots the roles wrote (owned by root, 0700)
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: Reports what would be removed and removes nothing.
  diff_mode:
    support: full
    details: One line per path removed (in check mode, that would be), with its category and why.
  idempotent:
    support: full
options:
  root:
    description: The host snapshot root (C(hostSnapshotPath)). A root that does not exist holds nothing to clean.
    type: path
    required: true
  npu_root:
    description: The device snapshot root (C(npuSnapshotPath)); a pod's dir there goes with its host snapshot.
    type: path
  remove:
    description: Which categories to remove.
    type: list
    elements: str
    choices: [failed, orphaned, stale]
    default: [failed, orphaned, stale]
  max_age:
    description: Published snapshots older than this many seconds (by their manifest's C(created_at)) are stale.
    type: int
  check_images:
    description: A published snapshot whose image is no longer on this host is stale.
    type: bool
    default: true
  known_pods:
    description:
      - The pods the services have now, as identities. A snapshot of a listed namespace/service whose
        instance/pod is not listed is orphaned. Snapshots of services that are not listed are left alone.
    type: list
    elements: dict
  generation_grace:
    description:
      - Seconds a C(generating) record or a staging dir counts as a generation in progress. Older ones are
        the leftovers of a run that died.
    type: int
    default: 3600
  metadata_path:
    description: Path, inside containers, of the metadata file a restore writes (tells which snapshot a container came from).
    type: path
    default: /run/inferops-snapshot/metadata.json
  docker_cli:
    description: Docker CLI executable.
    type: str
    default: docker
seealso:
  - module: inferops.snapshot.snapshot_status
  - module: inferops.snapshot.snapshot_info
"""

EXAMPLES = r"""
- name: What would go (check mode)
  inferops.snapshot.snapshot_cleanup:
    root: /var/lib/inferops/snapshots
    npu_root: /var/lib/inferops/npu
  check_mode: true
  register: plan

- name: Remove failed generations and snapshots older than a week
  inferops.snapshot.snapshot_cleanup:
    root: /var/lib/inferops/snapshots
    npu_root: /var/lib/inferops/npu
    remove: [failed, stale]
    max_age: 604800
"""

RETURN = r"""
removed:
  description: What was removed (in check mode, what would be), with C(path), C(kind) (C(snapshot), C(status),
    C(staging), C(old), C(npu)), C(category), C(identity) and C(reason).
  returned: always
  type: list
  elements: dict
kept:
  description: Every other pod found, with C(identity), C(snapshot_dir), C(status), C(published) and C(reason).
  returned: always
  type: list
  elements: dict
in_use:
  description: Snapshot dirs that running containers were restored from, and the container.
  returned: always
  type: dict
put_back:
  description: The snapshots put back at their pod's path from C(.<pod>.old.<pid>) (in check mode, that would be),
    as C(path) (the snapshot) and C(from).
  returned: always
  type: list
  elements: dict
work_dirs_removed:
  description: The CRIU work directories of killed checkpoints and restores removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
summary:
  description: Counts per category removed, and kept.
  returned: always
  type: dict
  sample: {failed: 1, orphaned: 0, stale: 2, kept: 4}
"""

import os
import time

from ansible_collections.inferops.snapshot.plugins.module_utils import _diff, _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.docker_cli import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import leftovers
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import paths
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import retention
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import seal

ARGUMENT_SPEC = dict(
    root=dict(type="path", required=True),
    npu_root=dict(type="path"),
    remove=dict(type="list", elements="str", default=["failed", "orphaned", "stale"],
                choices=["failed", "orphaned", "stale"]),
    max_age=dict(type="int"),
    check_images=dict(type="bool", default=True),
    known_pods=dict(type="list", elements="dict"),
    generation_grace=dict(type="int", default=3600),
    metadata_path=dict(type="path", default=layout.DEFAULT_METADATA_FILE),
    docker_cli=dict(type="str", default="docker"),
)


def put_back(entries, check_mode, now):
    """The last snapshot of each pod that has none published, left aside by a killed publish (seal.put_back): put back
    -- in check mode, seen as put back -- so that the policy judges it as published, never as a leftover."""
    found = []
    for entry in entries:
        if entry["published"] or not any(item["kind"] == "old" for item in entry["leftovers"]):
            continue
        snapshot_dir = entry["snapshot_dir"]
        leftover = seal.replaced_leftover(snapshot_dir) if check_mode else seal.put_back(snapshot_dir)
        if leftover:
            found.append({"path": snapshot_dir, "from": leftover})
        if leftover and check_mode:  # as retention.scan will see it once it is back
            retention.mark_published(entry, leftover, now)
            entry["leftovers"] = [item for item in entry["leftovers"] if item["path"] != leftover]
    return found


def main_logic(module):
    params = module.params
    retention.check_policy(params["remove"], params["max_age"], params["generation_grace"], params["known_pods"])
    root = paths.validate_snapshot_dir(params["root"], field="root")
    npu_root = paths.validate_snapshot_dir(params["npu_root"], field="npu_root") if params["npu_root"] else None
    now = time.time()
    docker = DockerCli(params["docker_cli"])
    in_use, npu_in_use = {}, {}
    for container in retention.running_containers(docker, params["metadata_path"]):
        if container["restored_from"]:
            in_use[container["restored_from"]] = "container %s" % container["name"]
        if container["npu_snapshot_path"]:
            npu_in_use[container["npu_snapshot_path"]] = "container %s" % container["name"]
    images = docker.image_ids() if params["check_images"] else None
    entries = retention.scan(root, now) if os.path.isdir(root) else []
    restored = put_back(entries, module.check_mode, now)
    if restored and not module.check_mode:
        entries = retention.scan(root, now)
    npu_dirs = retention.scan_npu(npu_root) if npu_root and os.path.isdir(npu_root) else {}
    policy = dict(remove=params["remove"], max_age=params["max_age"], generation_grace=params["generation_grace"],
                  known_pods=params["known_pods"])
    removals, kept = retention.decide(entries, npu_dirs, policy, in_use, npu_in_use, images, now)
    if not module.check_mode:
        for item in removals:
            retention.remove_path(item["path"])
    summary = dict((category, len(set(tuple(sorted(r["identity"].items())) for r in removals
                                      if r["category"] == category)))
                   for category in retention.CATEGORIES)
    summary["kept"] = len(kept)
    # the CRIU work dirs that killed checkpoints or restores left in the temp dir (their maker gone, nothing using them)
    swept = leftovers.sweep_work_dirs(remove=not module.check_mode)
    return dict(changed=bool(removals or swept or restored), removed=removals, kept=kept, in_use=in_use,
                summary=summary, put_back=restored, work_dirs_removed=swept)


def main():
    _module.run(ARGUMENT_SPEC, main_logic, requires=(), diff=_diff.cleanup)


if __name__ == "__main__":
    main()

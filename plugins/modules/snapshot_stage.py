#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_stage
short_description: Stage a verified copy of a snapshot in a node's cache, so that its restore pays no hashing
version_added: 0.2.0
description:
  - Copies the published snapshot O(snapshot_dir) into a private directory of the node's cache O(stage_dir)
    (directories 0700, files 0600, through a C(.partial) directory and one rename), verifies the copy in full
    (every file's SHA-256, the manifest, and the signature by one of O(trusted_keys) when they are given), and
    writes a verdict bound to the snapshot's fingerprint and to every file of the copy as the kernel knows it
    (path, size, inode, device, mtime and ctime).
  - A restore whose node has this cache (role C(snapshot_node) C(snapshot_node_stage_dir), or
    C(snapshot_restore) O(stage_dir)) and finds a copy that is still exactly the one verified restores from it
    without hashing it again; the requested snapshot's own checksum list, signature, manifest, identity and world
    are still checked. A copy that changed in any way is dropped and the snapshot verified in full.
  - Idempotent. A snapshot already staged and unchanged since it was verified is left alone (C(changed=false));
    one that was regenerated (another fingerprint) is staged again and its old copy removed.
  - Retention after each staging, the oldest verified first, never an entry a restore is reading; at most
    O(keep) entries and O(max_bytes) bytes.
  - Run it after generation (role C(snapshot_generate)) on the nodes that will restore, or ahead of a scale-out.
requirements:
  - jsonschema (Python library) on the target host
  - cryptography (Python library) on the target host, with O(trusted_keys)
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.trust
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: Says whether it would copy (C(changed)) and creates nothing.
  diff_mode:
    support: full
    details: The cache entry the verified copy is written to (in check mode, would be), and why.
  idempotent:
    support: full
options:
  snapshot_dir:
    description: The published snapshot directory to cache.
    type: path
    required: true
  stage_dir:
    description:
      - The node's cache, a directory only root can write (every component of the path owned by root and not
        writable by others; created 0700 when missing, an existing one keeps its mode). It may neither be inside the
        snapshot nor hold it.
      - The same path as the node runtime's C(snapshot_node_stage_dir).
    type: path
    required: true
  keep:
    description: Entries the cache keeps at most.
    type: int
    default: 4
  max_bytes:
    description: Bytes the cache holds at most (a snapshot larger than this is refused).
    type: int
    default: 68719476736
  min_size:
    description: The snapshot's files must add up to at least this many bytes.
    type: int
    default: 1024
  workers:
    description: Files copied and hashed in parallel. Default is the number of CPUs.
    type: int
seealso:
  - module: inferops.snapshot.snapshot_restore
  - module: inferops.snapshot.snapshot_verify
"""

EXAMPLES = r"""
- name: Stage the new snapshot on the node that will restore it
  inferops.snapshot.snapshot_stage:
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    stage_dir: /var/lib/inferops/stage
    trusted_keys: [/etc/inferops/keys/release.pub]
"""

RETURN = r"""
fingerprint:
  description: The snapshot's fingerprint, the SHA-256 of its C(checksum.sha256) (the cache entry's name).
  returned: always
  type: str
entry:
  description: The cache entry's directory.
  returned: always
  type: str
staged:
  description: The verified copy (C(dir)) and when it was verified (C(verified_at)); null in check mode when it would copy.
  returned: always
  type: dict
  sample: {dir: /var/lib/inferops/stage/5f2b.../snapshot, verified_at: "2026-11-29T12:00:03.123456Z"}
reason:
  description: Why it copied (not staged, or what made the old copy stale) or why not.
  returned: always
  type: str
authenticated:
  description: Whether the copy carries a valid signature by one of O(trusted_keys).
  returned: when staged
  type: bool
key_id:
  description: Id of the key that signed it.
  returned: when staged
  type: str
bytes:
  description: Bytes of the snapshot.
  returned: always
  type: int
durations:
  description: Seconds spent copying and verifying.
  returned: always
  type: dict
  sample: {copy: 1.2, verify: 0.6, total: 1.9}
retention:
  description: What retention did (C(dropped) and C(in_use) fingerprints, C(entries) and C(bytes) left).
  returned: when it copied
  type: dict
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _diff, _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import cache
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import signature

ARGUMENT_SPEC = dict(
    trusted_keys=_module.TRUST_ARGS["trusted_keys"],
    snapshot_dir=dict(type="path", required=True),
    stage_dir=dict(type="path", required=True),
    keep=dict(type="int", default=layout.STAGE_DEFAULT_KEEP),
    max_bytes=dict(type="int", default=layout.STAGE_DEFAULT_MAX_BYTES),
    min_size=dict(type="int", default=1024),
    workers=dict(type="int"),
)


def main_logic(module):
    params = module.params
    _module.sizes(params)
    trusted = signature.load_public_keys(params["trusted_keys"], "trusted_keys")
    result = cache.stage(params["snapshot_dir"], params["stage_dir"], trusted=trusted, min_size=params["min_size"],
                         workers=params["workers"], keep=params["keep"], max_bytes=params["max_bytes"],
                         check_mode=module.check_mode)
    result.pop("hashing", None)
    return result


def main():
    _module.run(ARGUMENT_SPEC, main_logic, diff=_diff.stage)


if __name__ == "__main__":
    main()

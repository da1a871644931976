#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_verify
short_description: Verify a published snapshot before it is restored
version_added: 0.1.0
description:
  - Checks that the snapshot at O(snapshot_dir) exists, adds up to more than O(min_size) bytes, that
    the SHA-256 of every file matches C(checksum.sha256) (files streamed and hashed in parallel, each
    read once), that C(manifest.json) is valid against the collection's manifest schema, and that it
    matches what would run now (pod identity, image id, CRIU major version, ACL runtime version).
  - An invalid snapshot is a result (RV(valid=false) with RV(reasons)), not a task failure, unless
    O(fail_on_invalid=true). Bad parameters are a failure. Nothing is ever deleted.
requirements:
  - jsonschema (Python library) on the target host
  - the Docker CLI (O(docker_cli)) on the target host, with an O(image) given by name
  - cryptography (Python library) on the target host, with O(trusted_keys)
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.trust
  - inferops.snapshot.identity
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: Verification only reads; it runs in check mode too.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  snapshot_dir:
    description: The published snapshot directory (never its C(.partial) staging sibling).
    type: path
    required: true
  min_size:
    description: The snapshot's files must add up to at least this many bytes (guards against empty files).
    type: int
    default: 1024
  image:
    description:
      - Image the restored container would run, as an image id (C(sha256:...)) or a name Docker resolves
        to an id. A snapshot taken from another image is invalid.
    type: str
  criu_version:
    description:
      - CRIU version the restore would use; its major version must match the snapshot's.
        C(auto) asks the CRIU on this host (skipped when none is installed); C(skip) does not check.
    type: str
    default: auto
  runtime_version:
    description: ACL runtime version the engine would load; must equal the snapshot's when given.
    type: str
  fail_on_invalid:
    description: Fail the task when the snapshot is invalid, instead of returning RV(valid=false).
    type: bool
    default: false
  workers:
    description: Files hashed in parallel. Default is the number of CPUs.
    type: int
  docker_cli:
    description: Docker CLI used to resolve O(image) names.
    type: str
    default: docker
seealso:
  - module: inferops.snapshot.snapshot_restore
"""

EXAMPLES = r"""
- name: Verify the snapshot of pod vllm-0 against the image it would run
  inferops.snapshot.snapshot_verify:
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}
    image: inferops/workload:latest
  register: check

- name: Fall back to a cold start when it is not usable
  ansible.builtin.debug:
    msg: "cold start: {{ check.reasons | join('; ') }}"
  when: not check.valid
"""

RETURN = r"""
valid:
  description: Whether the snapshot can be restored.
  returned: always
  type: bool
  sample: false
authenticated:
  description:
    - Whether the snapshot carries a valid signature by one of O(trusted_keys) (always false without them).
  returned: always
  type: bool
key_id:
  description: Id of the key that signed it (the first 16 hex digits of the SHA-256 of the raw public key), when checked.
  returned: always
  type: str
checksum:
  description: SHA-256 of the snapshot's C(checksum.sha256), its fingerprint (null when it has none).
  returned: always
  type: str
reasons:
  description: Why it cannot, one string per problem, C(<kind>:) followed by the detail (empty when valid).
  returned: always
  type: list
  elements: str
  sample: ["checksum_mismatch: host/pages-1.img"]
bytes:
  description: Bytes hashed.
  returned: always
  type: int
  sample: 226492416
files:
  description: Files hashed.
  returned: always
  type: int
  sample: 42
throughput_mb_s:
  description: Hashing throughput in MB/s (10^6 bytes per second).
  returned: always
  type: float
  sample: 1310.5
workers:
  description: Files hashed in parallel.
  returned: always
  type: int
  sample: 2
reader:
  description:
    - How the files were read for hashing. C(mapped) hashed mappings of the page cache in a child process (no copy;
      a file truncated meanwhile makes the snapshot invalid, C(unreadable:)); C(read) read them into a buffer (the
      module's process had other threads, or the platform cannot map); null when nothing was hashed.
  returned: always
  type: str
  sample: mapped
manifest:
  description:
    - Identity, generation, creation time, expiry, image and versions recorded in the manifest (when it was readable).
  returned: always
  type: dict
  sample: {identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}, created_at: "2026-11-29T12:00:00Z"}
durations:
  description: Seconds spent per stage.
  returned: always
  type: dict
  sample: {hash: 0.17, total: 0.18}
progress:
  description: Progress lines (bytes hashed and elapsed time), also logged; shown by the roles at -v.
  returned: always
  type: list
  elements: str
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import Stopwatch
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients.docker_cli import DockerCli
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.progress import Progress
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import paths
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore import verify
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import signature

ARGUMENT_SPEC = dict(
    trusted_keys=_module.TRUST_ARGS["trusted_keys"],
    snapshot_dir=dict(type="path", required=True),
    min_size=dict(type="int", default=1024),
    identity=dict(type="dict", options=_module.IDENTITY_OPTIONS),
    image=dict(type="str"),
    criu_version=dict(type="str", default="auto"),
    runtime_version=dict(type="str"),
    fail_on_invalid=dict(type="bool", default=False),
    workers=dict(type="int"),
    docker_cli=dict(type="str", default="docker"),
)


def main_logic(module):
    params = module.params
    watch = Stopwatch()
    _module.sizes(params)
    snapshot_dir = paths.validate_snapshot_dir(params["snapshot_dir"])
    if params["identity"]:
        schema.validate("manifest", params["identity"], "identity", definition="identity")
    image = params["image"]
    if image and not image.startswith("sha256:"):
        image = DockerCli(params["docker_cli"]).image_id(image)
    expect = verify.expectations(params["identity"], image, params["criu_version"], params["runtime_version"])
    progress = Progress("verify %s" % snapshot_dir, module.log, watch=watch)
    trusted = signature.load_public_keys(params["trusted_keys"], "trusted_keys")
    # The restore pipeline's own verdict, so that this module and a restore never disagree.
    verdict = verify.for_restore(snapshot_dir, None, expect, params["min_size"], params["workers"],
                                 progress=progress.bytes_done, trusted=trusted)
    recorded = verdict["manifest"] or {}
    progress.final("valid" if verdict["valid"] else "invalid")
    result = dict(
        changed=False, valid=verdict["valid"], reasons=verdict["reasons"], authenticated=verdict["authenticated"],
        key_id=verdict["key_id"], checksum=verdict["fingerprint"], bytes=verdict["bytes"], files=verdict["files"],
        throughput_mb_s=verdict["throughput_mb_s"], workers=verdict["workers"], reader=verdict["reader"],
        manifest={key: recorded.get(key) for key in ("identity", "generation", "created_at", "expires", "image", "engine",
                                                     "runtime", "devices")},
        durations={"hash": verdict["hashing_s"], "total": round(watch.elapsed(), 6)},
        progress=progress.lines, snapshot_dir=snapshot_dir,
    )
    if not verdict["valid"] and params["fail_on_invalid"]:
        raise SnapshotError("snapshot %s is invalid: %s" % (snapshot_dir, verify.reason(verdict)), **result)
    return result


def main():
    _module.run(ARGUMENT_SPEC, main_logic)


if __name__ == "__main__":
    main()

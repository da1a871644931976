#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_refresh
short_description: Sign again, on the controller, the statement of each identity's latest generation in a store
version_added: 0.4.0
description:
  - A node that trusts signing keys restores a snapshot only while the controller's signed statement of the identity's
    latest generation (C(.<pod>.latest.json) beside the snapshot) names it or an older generation, and only until the
    statement expires. M(inferops.snapshot.host_checkpoint) writes the statement with each generation; this module
    signs it again with a new time, for every identity below O(root), so that it does not expire while no new
    generation is taken. Run it on a schedule, more often than O(validity) (the playbook C(refresh.yml), daily) -
    when it does not run, restores of identities without a newer generation start cold (C(stale:)) once their
    statement expired.
  - Signed on the controller by the action plugin of the same name, with O(signing_key); the key never goes to the
    node. The host holding the store sends up what it has of each identity - its statement and the published
    snapshot's checksum list, signature and manifest - and the plugin signs the highest generation it can vouch for -
    of the signer's record O(signing_ledger) (what this controller published), the statement and the published
    snapshot - each only when signed by O(signing_key)'s own key. A statement a generation wrote meanwhile is never
    replaced (RV(changed_meanwhile)).
  - See docs/security.md ("Freshness across nodes") and docs/workflows.md ("Refresh").
requirements:
  - jsonschema (Python library) on the host
  - cryptography (Python library) on the controller, for O(signing_key)
  - root on the host
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: Reads the store and signs nothing; says which statements would be signed again.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every run signs the statements again with a new time; that is its purpose.
options:
  root:
    description:
      - The snapshot root on the host (C(<root>/<namespace>/<service>/<instance>/<pod>)), checked as a snapshot path is.
        With a store that several hosts share, run the task on one of them (C(run_once)).
    type: path
    required: true
  signing_key:
    description:
      - The controller's Ed25519 private key that signs the statements, as for
        O(inferops.snapshot.host_checkpoint#module:signing_key) - PEM text, or the path of a 0600 PEM file on the
        controller. Read by the action plugin on the controller only.
      - Default - C(signing.pem) in the controller's key directory (C(~/.inferops/keys)); it must exist. No key is made
        here - a new key would be one the nodes do not trust.
    type: str
  signing_ledger:
    description:
      - The signer's record on the controller, as for O(inferops.snapshot.host_checkpoint#module:signing_ledger) (default
        - beside the key file). Its record of what this controller published is the authority when the store has been
        rolled back; without it the refresh vouches for what the store still shows.
    type: path
  validity:
    description: Seconds each statement signed again is good for. Default - a week (604800); docs/security.md says why.
    type: float
  statements:
    description:
      - Set by the action plugin for its second run - the statements it signed, each with its identity and the digest
        of the statement it replaces. Never set it in a task.
    type: list
    elements: dict
notes:
  - With a store several hosts share, every host that runs the task signs every statement again; one is enough.
seealso:
  - module: inferops.snapshot.host_checkpoint
  - module: inferops.snapshot.snapshot_signing_key
"""

EXAMPLES = r"""
- name: Sign again the statements of the latest generations (daily, e.g. an AWX schedule)
  inferops.snapshot.snapshot_refresh:
    root: /var/lib/inferops/snapshots
  run_once: true
"""

RETURN = r"""
refreshed:
  description: The statements signed again (in check mode, that would be) - C(identity), C(generation), C(source)
    (C(ledger), C(statement) or C(snapshot) - where the generation was known from) and C(expires).
  returned: success
  type: list
  elements: dict
  sample: [{identity: default/qwen/p0/vllm-0, generation: 1765000000, source: ledger, expires: "2026-12-14T16:00:00Z"}]
unvouched:
  description: Identities of the store for which nothing was signed by this key (nothing signed again), with why.
  returned: success
  type: list
  elements: dict
changed_meanwhile:
  description: Snapshot paths whose statement a generation replaced while this ran (left as that generation wrote it).
  returned: success
  type: list
  elements: str
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import refresh

ARGUMENT_SPEC = dict(
    root=dict(type="path", required=True),
    signing_key=dict(type="str", no_log=True),
    signing_ledger=dict(type="path"),
    validity=dict(type="float"),
    statements=dict(type="list", elements="dict"),
)


def main():
    _module.run(ARGUMENT_SPEC, lambda module: refresh.refresh(module.params, module.check_mode))


if __name__ == "__main__":
    main()

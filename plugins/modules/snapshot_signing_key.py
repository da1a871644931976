#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_signing_key
short_description: The controller's snapshot signing key pair, made on first use
version_added: 0.4.0
description:
  - Makes an Ed25519 key pair in O(path) on the controller when there is none (C(signing.pem), PKCS#8, mode 0600, and
    its public half C(signing.pub)) and returns the public key. An existing key is kept and returned.
  - Runs on the controller only, as an action plugin in the controller's process, whatever the task's host or
    C(delegate_to) - no module is sent to any host and the private key never leaves the controller.
    M(inferops.snapshot.host_checkpoint) signs there with it (its O(inferops.snapshot.host_checkpoint#module:signing_key));
    the nodes get the public half (the roles install it, as C(trusted_keys)).
  - The roles C(snapshot_generate), C(snapshot_node), C(snapshot_restore) and C(k8s_snapshot) run it, so that snapshots
    are signed and nodes trust only signed ones by default. Where the controller keeps nothing between runs (an AWX
    execution environment) give the key as an AWX credential instead; see docs/security.md.
requirements:
  - cryptography (Python library) on the controller
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.attributes
attributes:
  check_mode:
    support: full
    details:
      - Makes nothing; reports whether a key would be made.
      - Stands in for a missing key with one made in memory and never written (its public half), so that a restore in
        check mode requires signatures as the run will.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  path:
    description:
      - The directory on the controller that holds the key pair (and host_checkpoint's signer's record,
        C(generations.json)), an absolute path. Made 0700 when missing; an existing one must belong to the user running
        Ansible and be closed to everyone else (mode 0700), or the task fails - it is never changed. C(~) is the
        controller user's home.
    type: path
    default: ~/.inferops/keys
notes:
  - Back the directory up - snapshots signed by a lost key are refused by nodes that trust only its successor - and
    rotate as docs/security.md says.
seealso:
  - module: inferops.snapshot.host_checkpoint
"""

EXAMPLES = r"""
- name: The controller's signing key (made on first use)
  inferops.snapshot.snapshot_signing_key:
  register: signing
  run_once: true

- name: Take a snapshot signed with it on the controller
  inferops.snapshot.host_checkpoint:
    container: vllm-0
    snapshot_dir: /var/lib/inferops/snapshots/default/qwen/p0/vllm-0
    identity: {namespace: default, service: qwen, instance: p0, pod: vllm-0}
    signing_key: "{{ signing.private_key }}"
"""

RETURN = r"""
private_key:
  description: Path of the private key on the controller (give it to host_checkpoint's O(inferops.snapshot.host_checkpoint#module:signing_key)).
  returned: always
  type: str
  sample: /home/ops/.inferops/keys/signing.pem
public_key:
  description: The public key, PEM (what nodes trust); in check mode when no key exists yet, the public half of a stand-in made in memory, which signs nothing.
  returned: always
  type: str
public_key_path:
  description: Path of the public key on the controller.
  returned: always
  type: str
key_id:
  description: The key's id, as C(signature.json) and the verify results name it; in check mode when no key exists yet, the stand-in's.
  returned: always
  type: str
  sample: 3f6c1d2e3a4b4c5d
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout

ARGUMENT_SPEC = dict(path=dict(type="path", default=layout.CONTROLLER_KEYS_DIR))


def main():
    _module.run(ARGUMENT_SPEC, _module.controller_only, requires=())


if __name__ == "__main__":
    main()

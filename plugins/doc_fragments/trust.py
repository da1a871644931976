# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # Matches TRUST_ARGS in plugins/module_utils/_module.py.
    DOCUMENTATION = r"""
options:
  trusted_keys:
    description:
      - Ed25519 public keys (PEM text, or absolute paths of PEM files owned by root) whose signatures this host
        trusts. When given, a snapshot is usable only with a valid C(signature.json) by one of them; an unsigned
        snapshot, a wrong signature or one by another key is refused with the reason (C(unsigned:),
        C(signature_invalid:), C(signature_untrusted:)). Several keys may be trusted at once, for key rotation.
      - An entry may be a dict of C(key) (PEM text or path) and C(identities) (C(<namespace>/<service>) patterns) - that key is trusted
        only for snapshots of those identities (C(team-a/*), C(team-b/qwen); C(team-a) alone is C(team-a/*)). A
        snapshot of another identity signed by it is refused (C(signature_untrusted:)), before its images are read.
      - Without it nothing is authenticated (the result says C(authenticated) is false); the checksums prove the snapshot is
        complete and unchanged since it was sealed, not who sealed it. See docs/security.md.
      - Needs the Python library C(cryptography) on the target.
    type: list
    elements: raw
    default: []
"""

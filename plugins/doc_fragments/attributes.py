# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    description: Running the module twice with the same arguments changes nothing the second time.
"""

    ACTIONGROUP = r"""
options: {}
attributes:
  action_group:
    description: Use C(group/inferops.snapshot.snapshot) in C(module_defaults) to set defaults for this module.
    support: full
    membership:
      - inferops.snapshot.snapshot
"""

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # Matches IDENTITY_OPTIONS in plugins/module_utils/_module.py. The two variants differ only in
    # `required`: ansible-doc replaces a whole option when a module redefines it.
    DOCUMENTATION = r"""
options:
  identity:
    description:
      - Identity of the pod the snapshot belongs to. Its O(identity.pod) name must be a component of the
        snapshot path, so that two pods never share one.
    type: dict
    suboptions:
      namespace:
        description: Namespace (or site) of the service.
        type: str
        required: true
      service:
        description: Name of the inference service.
        type: str
        required: true
      instance:
        description: Instance of the service (for example the P or D instance index).
        type: str
        required: true
      pod:
        description: Pod or container name, unique within the instance.
        type: str
        required: true
"""

    REQUIRED = r"""
options:
  identity:
    description:
      - Identity of the pod the snapshot belongs to. Its O(identity.pod) name must be a component of the
        snapshot path, so that two pods never share one; a snapshot of another pod is never used.
    type: dict
    required: true
    suboptions:
      namespace:
        description: Namespace (or site) of the service.
        type: str
        required: true
      service:
        description: Name of the inference service.
        type: str
        required: true
      instance:
        description: Instance of the service (for example the P or D instance index).
        type: str
        required: true
      pod:
        description: Pod or container name, unique within the instance.
        type: str
        required: true
"""

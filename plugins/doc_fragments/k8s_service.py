# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # The service options of the k8s modules: SERVICE_ARGS in plugins/module_utils/k8s/service.py. Their connection
    # options are kubernetes.core's own (its doc fragment kubernetes.core.k8s_auth_options, its AUTH_ARG_SPEC).
    DOCUMENTATION = r"""
options:
  namespace:
    description: Namespace of the service's pods.
    type: str
    required: true
  service:
    description:
      - Name of the inference service. Its pods carry the label O(service_label)C(=<service>).
    type: str
    required: true
  config:
    description:
      - The service's snapshot configuration, in the shape of the seed design's C(snapshotConfig)
        (C(enabled), C(npuSnapshotPath), C(hostSnapshotPath), C(timeoutSeconds), C(minSizeBytes), C(engine),
        C(endpoint)), validated against the collection's C(schemas/snapshot-config.schema.json).
      - Absent, empty or C(enabled=false) means the service runs without snapshots.
    type: dict
  instance:
    description:
      - Instance of the service to snapshot. Default is the first instance, in natural order of the
        O(instance_label) values (C(p2) before C(p10)).
    type: str
  container:
    description: Name of the inference engine's container in each pod. Default is the first container.
    type: str
  service_label:
    description: Label that names the service a pod belongs to.
    type: str
    default: inferops.org/service
  instance_label:
    description: Label that names the instance of the service a pod belongs to.
    type: str
    default: inferops.org/instance
requirements:
  - jsonschema and kubernetes >= 24.2.0 (Python libraries) and the kubernetes.core collection where the module runs
    (the controller)
"""

    ACTIONGROUP = r"""
options: {}
attributes:
  action_group:
    description:
      - Use C(group/inferops.snapshot.k8s) in C(module_defaults) to set the options of this module. That group
        extends C(group/kubernetes.core.k8s), so its connection options reach kubernetes.core's modules too.
    support: full
    membership:
      - inferops.snapshot.k8s
"""

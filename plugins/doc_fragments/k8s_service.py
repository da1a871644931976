# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # Matches AUTH_ARGS in plugins/module_utils/_k8s.py: the same names and environment variables as
    # kubernetes.core, so one set of connection settings serves both collections.
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path of a kubeconfig file. Default C(~/.kube/config); inside a pod without one, the pod's service
        account (in-cluster configuration) is used.
      - Can also be set with the E(K8S_AUTH_KUBECONFIG) environment variable.
    type: path
  context:
    description:
      - The kubeconfig context to use. Can also be set with E(K8S_AUTH_CONTEXT).
    type: str
  host:
    description:
      - URL of the Kubernetes API server, overriding the kubeconfig's. Can also be set with E(K8S_AUTH_HOST).
    type: str
  api_key:
    description:
      - Bearer token for the API server. Can also be set with E(K8S_AUTH_API_KEY).
    type: str
  validate_certs:
    description:
      - Verify the API server's TLS certificate. Can also be set with E(K8S_AUTH_VERIFY_SSL).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description:
      - CA certificate of the API server. Can also be set with E(K8S_AUTH_SSL_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description:
      - Client certificate for the API server. Can also be set with E(K8S_AUTH_CERT_FILE).
    type: path
    aliases: [cert_file]
  client_key:
    description:
      - Key of O(client_cert). Can also be set with E(K8S_AUTH_KEY_FILE).
    type: path
    aliases: [key_file]
requirements:
  - kubernetes >= 24.2.0 (the Python client) on the host that runs the task
"""

    SERVICE = r"""
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
"""

    ACTIONGROUP = r"""
options: {}
attributes:
  action_group:
    description: Use C(group/inferops.snapshot.k8s) in C(module_defaults) to set the connection options of this module.
    support: full
    membership:
      - inferops.snapshot.k8s
"""

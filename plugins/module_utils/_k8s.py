# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one client of the Kubernetes API in this collection. PRIVATE to inferops.snapshot.

Built on the kubernetes Python client, with the connection options of kubernetes.core (same
names, same K8S_AUTH_* environment fallbacks, kubeconfig or in-cluster service account), so one
set of role variables serves both collections. Objects travel as plain dicts in the API's own
field names; every change is a JSON merge patch (RFC 7386), never a strategic merge or a
replace. API errors become ``K8sError`` carrying the HTTP status and the server's message.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time
import traceback

from ansible_collections.inferops.snapshot.plugins.module_utils.core.clock import wait_for
from ansible_collections.inferops.snapshot.plugins.module_utils.core.errors import SnapshotError, SnapshotTimeout

try:
    import kubernetes
    from kubernetes.client.exceptions import ApiException
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError:
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

    class ApiException(Exception):
        pass

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 30

# Matches plugins/doc_fragments/k8s_auth.py; the names and environment fallbacks of kubernetes.core.
AUTH_ARGS = dict(
    kubeconfig=dict(type="path"),
    context=dict(type="str"),
    host=dict(type="str"),
    api_key=dict(type="str", no_log=True),
    validate_certs=dict(type="bool", aliases=["verify_ssl"]),
    ca_cert=dict(type="path", aliases=["ssl_ca_cert"]),
    client_cert=dict(type="path", aliases=["cert_file"]),
    client_key=dict(type="path", aliases=["key_file"], no_log=False),
)
AUTH_ENV = dict(kubeconfig="K8S_AUTH_KUBECONFIG", context="K8S_AUTH_CONTEXT", host="K8S_AUTH_HOST",
                api_key="K8S_AUTH_API_KEY", validate_certs="K8S_AUTH_VERIFY_SSL", ca_cert="K8S_AUTH_SSL_CA_CERT",
                client_cert="K8S_AUTH_CERT_FILE", client_key="K8S_AUTH_KEY_FILE")


class K8sError(SnapshotError):
    """The Kubernetes API refused a request or could not be reached; ``status`` is the HTTP status."""


def auth_settings(params, environ=None):
    """The connection options given to the task, else from K8S_AUTH_* like kubernetes.core."""
    environ = os.environ if environ is None else environ
    settings = {}
    for key, env in AUTH_ENV.items():
        value = params.get(key)
        if value is None and environ.get(env) not in (None, ""):
            value = environ[env]
            if key == "validate_certs":
                value = value.lower() not in ("0", "false", "no", "off")
        settings[key] = value
    return settings


def build_api_client(settings, environ=None):
    """An ApiClient from a kubeconfig (given, or ~/.kube/config), a host + token, or in-cluster."""
    environ = os.environ if environ is None else environ
    configuration = kubernetes.client.Configuration()
    kubeconfig = settings.get("kubeconfig")
    default_kubeconfig = os.path.expanduser(kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    in_cluster = bool(environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if kubeconfig or (not settings.get("host") and (not in_cluster or os.path.exists(default_kubeconfig))):
            path = kubeconfig or default_kubeconfig
            if not os.path.exists(path):
                raise K8sError("kubeconfig: %s does not exist; give the path of a kubeconfig file (kubeconfig or "
                               "K8S_AUTH_KUBECONFIG), or host and api_key, or run in a pod with a service account"
                               % path)
            kubernetes.config.load_kube_config(config_file=path, context=settings.get("context"),
                                               client_configuration=configuration, persist_config=False)
        elif not settings.get("host"):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException as exc:
        raise K8sError("cannot load the Kubernetes connection settings: %s" % exc)
    if settings.get("host"):
        configuration.host = settings["host"]
    if settings.get("api_key"):
        configuration.api_key = {"authorization": "Bearer " + settings["api_key"]}
    if settings.get("validate_certs") is not None:
        configuration.verify_ssl = settings["validate_certs"]
    for key, attr in (("ca_cert", "ssl_ca_cert"), ("client_cert", "cert_file"), ("client_key", "key_file")):
        if settings.get(key):
            setattr(configuration, attr, settings[key])
    return kubernetes.client.ApiClient(configuration)


def _server_message(exc):
    try:
        body = json.loads(exc.body)
        return body.get("message") or body.get("reason") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return getattr(exc, "reason", None) or str(exc)


class K8sClient:
    """Pods and ConfigMaps of one namespace, as dicts; merge patches only."""

    def __init__(self, api_client, request_timeout=REQUEST_TIMEOUT, clock=time.monotonic, sleep=time.sleep):
        self.api_client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.host = api_client.configuration.host
        self.request_timeout = request_timeout
        self._clock = clock
        self._sleep = sleep

    @classmethod
    def from_params(cls, params):
        return cls(build_api_client(auth_settings(params)))

    def _call(self, what, method, *args, **kwargs):
        kwargs.update(_preload_content=False, _request_timeout=self.request_timeout)
        try:
            response = method(*args, **kwargs)
        except ApiException as exc:
            raise K8sError("Kubernetes API: %s failed: HTTP %s %s" % (what, exc.status, _server_message(exc)),
                           status=exc.status, api_host=self.host)
        except Exception as exc:  # connection refused, TLS, DNS: the API is not reachable
            raise K8sError("Kubernetes API at %s: %s failed: %s" % (self.host, what, exc), api_host=self.host)
        data = response.data
        return json.loads(data) if data else {}

    def list_pods(self, namespace, labels):
        """Pods of ``namespace`` carrying every label in ``labels`` (server-side equality selector)."""
        selector = ",".join("%s=%s" % (key, value) for key, value in sorted(labels.items()))
        listing = self._call("list pods in %s (labelSelector %s)" % (namespace, selector),
                             self.core.list_namespaced_pod, namespace, label_selector=selector)
        return listing.get("items") or []

    def get_pod(self, namespace, name):
        """The pod, or None when it does not exist."""
        try:
            return self._call("get pod %s/%s" % (namespace, name), self.core.read_namespaced_pod, name, namespace)
        except K8sError as exc:
            if exc.result.get("status") == 404:
                return None
            raise

    def patch_pod(self, namespace, name, patch):
        return self._call("merge-patch pod %s/%s" % (namespace, name), self.core.patch_namespaced_pod, name,
                          namespace, patch, _content_type=MERGE_PATCH)

    def create_pod(self, namespace, body):
        return self._call("create pod %s/%s" % (namespace, body["metadata"]["name"]),
                          self.core.create_namespaced_pod, namespace, body)

    def delete_pod(self, namespace, name):
        return self._call("delete pod %s/%s" % (namespace, name), self.core.delete_namespaced_pod, name, namespace)

    def wait_pod_gone(self, namespace, name, uid, timeout):
        """Wait until the pod ``name`` with ``uid`` is gone (404, or a pod of another uid took the name)."""
        def gone():
            pod = self.get_pod(namespace, name)
            if pod is None or (uid and pod["metadata"].get("uid") not in (None, uid)):
                return True, None
            return False, {"phase": (pod.get("status") or {}).get("phase"),
                           "deletionTimestamp": pod["metadata"].get("deletionTimestamp")}
        try:
            return wait_for(gone, timeout, 0.2, clock=self._clock, sleep=self._sleep)[1]
        except SnapshotTimeout as exc:
            raise SnapshotTimeout("pod %s/%s was not gone %.0f s after its deletion (last: %s)"
                                  % (namespace, name, timeout, exc.result.get("last_state")),
                                  last_state=exc.result.get("last_state"))

    def get_configmap(self, namespace, name):
        try:
            return self._call("get configmap %s/%s" % (namespace, name), self.core.read_namespaced_config_map,
                              name, namespace)
        except K8sError as exc:
            if exc.result.get("status") == 404:
                return None
            raise

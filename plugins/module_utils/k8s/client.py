# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one way to the Kubernetes API: kubernetes.core's client. PRIVATE to inferops.snapshot.

The modules take kubernetes.core's connection options as they are (``AUTH_ARG_SPEC``, documented by its
doc fragment ``kubernetes.core.k8s_auth_options``: kubeconfig file or dict, context, host, token, basic auth,
certificates, proxy, impersonation, the K8S_AUTH_* variables) and get their client from kubernetes.core's
``get_api_client``, so one set of settings -- ``module_defaults`` for ``group/inferops.snapshot.k8s``,
which extends ``group/kubernetes.core.k8s`` -- serves both collections. The event source
(extensions/eda) connects the same way.

Objects travel as plain dicts in the API's own field names; every change is a JSON merge patch (RFC 7386),
never a strategic merge or a replace. API errors become ``K8sError`` with the HTTP status; a read of
something that is not there is None (``_read``, the one place that says so).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import time
import traceback

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.clock import wait_for
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import SnapshotError, SnapshotTimeout
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client

try:  # kubernetes.core's client needs the kubernetes library: its absence is a clear error (LIBRARY, below)
    from kubernetes.client import Configuration
    from kubernetes.dynamic.exceptions import DynamicApiError
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError:
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

    class DynamicApiError(Exception):
        pass


# What the k8s modules give _module.run as ``requires``: the library, whether it imported, and why not.
LIBRARY = ("kubernetes", HAS_KUBERNETES, KUBERNETES_IMPORT_ERROR)

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 30
CONNECTION_HINT = ("give kubeconfig (or K8S_AUTH_KUBECONFIG), or host with api_key, or run in a pod with a "
                   "service account")


class K8sError(SnapshotError):
    """The Kubernetes API refused a request or could not be reached; ``status`` is the HTTP status."""


def auth_params(params):
    """kubernetes.core's connection options out of a module's (or the event source's) arguments."""
    return dict((key, params.get(key)) for key in AUTH_ARG_SPEC)


def connect(params):
    """A Client from kubernetes.core's connection options (unset ones: K8S_AUTH_*, ~/.kube/config, in-cluster)."""
    try:
        # kubernetes.core starts from the kubernetes library's default configuration, which a kubeconfig loaded
        # earlier in this process leaves behind with a hook that puts that kubeconfig's server back on every request:
        # each connection starts from none (the event source is a long-lived process)
        Configuration.set_default(None)
        api = get_api_client(**auth_params(params))
    except Exception as exc:  # kubernetes.core's CoreException, a kubeconfig that cannot be read, ...
        raise K8sError("cannot connect to the Kubernetes API: %s; %s" % (exc, CONNECTION_HINT))
    return Client(api)


def _server_message(exc):
    body = getattr(exc, "body", None)
    try:
        parsed = json.loads(body)
        return parsed.get("message") or parsed.get("reason") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return getattr(exc, "reason", None) or str(exc)


class Client:
    """Pods and ConfigMaps of a namespace, as dicts, through kubernetes.core's K8SClient; merge patches only."""

    def __init__(self, api, request_timeout=REQUEST_TIMEOUT, clock=time.monotonic, sleep=time.sleep):
        self.api = api
        self.host = api.configuration.host
        self.request_timeout = request_timeout
        self._clock = clock
        self._sleep = sleep
        self._resources = {}

    def _resource(self, kind):
        if kind not in self._resources:
            self._resources[kind] = self._call("discover %s (v1)" % kind, self.api.resource, kind, "v1", raw=True)
        return self._resources[kind]

    def _call(self, what, method, *args, **kwargs):
        raw = kwargs.pop("raw", False)
        if not raw:
            kwargs["_request_timeout"] = self.request_timeout
        try:
            response = method(*args, **kwargs)
        except DynamicApiError as exc:
            raise K8sError("Kubernetes API: %s failed: HTTP %s %s" % (what, exc.status, _server_message(exc)),
                           status=exc.status, api_host=self.host)
        except Exception as exc:  # connection refused, TLS, DNS, discovery: the API is not reachable
            raise K8sError("Kubernetes API at %s: %s failed: %s" % (self.host, what, exc), api_host=self.host)
        return response if raw else (response.to_dict() if response is not None else {})

    def _read(self, what, kind, namespace, name):
        """The object, or None when it does not exist (HTTP 404): the one place a missing object is not an error."""
        try:
            return self._call(what, self.api.get, self._resource(kind), name=name, namespace=namespace)
        except K8sError as exc:
            if exc.result.get("status") == 404:
                return None
            raise

    def list_pods(self, namespace, labels=None):
        """Pods of ``namespace`` carrying every label in ``labels`` (server-side equality selector; none: all)."""
        selector = ",".join("%s=%s" % (key, value) for key, value in sorted((labels or {}).items())) or None
        listing = self._call("list pods in %s%s" % (namespace, " (labelSelector %s)" % selector if selector else ""),
                             self.api.get, self._resource("Pod"), namespace=namespace, label_selector=selector)
        return listing.get("items") or []

    def get_pod(self, namespace, name):
        return self._read("get pod %s/%s" % (namespace, name), "Pod", namespace, name)

    def patch_pod(self, namespace, name, patch):
        return self._call("merge-patch pod %s/%s" % (namespace, name), self.api.patch, self._resource("Pod"), patch,
                          name=name, namespace=namespace, content_type=MERGE_PATCH)

    def create_pod(self, namespace, body):
        return self._call("create pod %s/%s" % (namespace, body["metadata"]["name"]), self.api.create,
                          self._resource("Pod"), body, namespace=namespace)

    def delete_pod(self, namespace, name):
        return self._call("delete pod %s/%s" % (namespace, name), self.api.delete, self._resource("Pod"),
                          name=name, namespace=namespace)

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
        return self._read("get configmap %s/%s" % (namespace, name), "ConfigMap", namespace, name)

    def create_configmap(self, namespace, body):
        return self._call("create configmap %s/%s" % (namespace, body["metadata"]["name"]), self.api.create,
                          self._resource("ConfigMap"), body, namespace=namespace)

    def patch_configmap(self, namespace, name, patch):
        return self._call("merge-patch configmap %s/%s" % (namespace, name), self.api.patch,
                          self._resource("ConfigMap"), patch, name=name, namespace=namespace,
                          content_type=MERGE_PATCH)

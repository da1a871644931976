# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admission policy that keeps restore requests in the namespaces an operator lists. PRIVATE to inferops.snapshot.

A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) and its binding, as the API's dicts: a pod of a
namespace the policy does not list is refused when it names the restore-on-create runtime's RuntimeClass, carries
(or is given) an annotation of a restore request (``org.inferops.*``), or has a container with the env of one
(``INFEROPS_RESTORE_FROM`` and the others of ``layout.RESTORE_REQUEST_KEYS``). Only an API server enforces it: the
node's runtime checks the requester on its own (docs/security.md, Tenants), this keeps the request from being made.

The CEL is built from layout's names here and nowhere else; tests/unit evaluates it. The namespace list lives in
the policy itself (a CEL variable), so that one object says what is allowed and the binding only turns it on.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError

API_VERSION = "admissionregistration.k8s.io/v1"
# The engine's own settings, read by its agent in every pod: where it writes its metadata file and listens. They ask
# the runtime for nothing, and an engine pod of any namespace may set them.
_OWN_SETTINGS = ("metadata_file", "agent_socket_dir")
RESTORE_ENV = tuple(env for key, _annotation, env in layout.RESTORE_REQUEST_KEYS if env and key not in _OWN_SETTINGS)
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")              # RFC 1123 label
_RUNTIME_CLASS = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")         # RFC 1123 subdomain


def _names(values, field, pattern, what):
    if not isinstance(values, (list, tuple)) or not values:
        raise ParameterError("%s: give a non-empty list of %s names (got %r)" % (field, what, values))
    for index, value in enumerate(values):
        if not isinstance(value, str) or not pattern.match(value):
            raise ParameterError("%s[%d]: %r is not a %s name: lower-case letters, digits and '-'%s, starting and "
                                 "ending with a letter or digit" % (field, index, value, what,
                                                                    " and '.'" if "." in pattern.pattern else ""))
    return sorted(set(values))


def _cel(value):
    """A CEL literal: JSON's strings and lists are CEL's (the names are checked above: no escapes needed)."""
    return json.dumps(value)


def _any_env(containers, name):
    """CEL: a container of ``object.spec.<containers>`` has the env ``name``."""
    inner = "c, has(c.env) && c.env.exists(e, e.name == %s)" % name
    if containers == "containers":
        return "object.spec.containers.exists(%s)" % inner
    return "(has(object.spec.%s) && object.spec.%s.exists(%s))" % (containers, containers, inner)


_FIX = (" may not ask for a snapshot restore: run the pod in a namespace that the admission policy %s lists "
        "(k8s_snapshot_admission_namespaces), or remove it from the pod" % layout.K8S_ADMISSION_POLICY)


def _messages(field, offender):
    """(messageExpression, message) of a refusal: the field and its offending value, the namespace and the fix (the
    static message, for an API server that cannot evaluate the expression, names the field alone)."""
    expression = "'%s ' + %s + ': pods of namespace ' + request.namespace + '%s'" % (field, offender, _FIX)
    return expression, "%s: pods of this namespace%s" % (field, _FIX)


def policy(namespaces, runtime_classes):
    """The ValidatingAdmissionPolicy: pods of the listed namespaces pass, others may not ask for a restore.

    Spec fields are immutable, so the RuntimeClass and the containers' env are checked when a pod is created; an
    ephemeral container (added by an update of pods/ephemeralcontainers) and an annotation are checked whenever they
    come, an annotation only when it is new or changed (a pod admitted before the policy can still be updated)."""
    namespaces = _names(namespaces, "namespaces", _NAMESPACE, "namespace")
    runtime_classes = _names(runtime_classes, "runtime_classes", _RUNTIME_CLASS, "RuntimeClass")
    prefix = _cel(layout.RESTORE_ANNOTATION_PREFIX)
    old = "oldObject.metadata.annotations"
    variables = [
        ("allowedNamespaces", _cel(namespaces)),
        ("runtimeClasses", _cel(runtime_classes)),
        ("restoreEnv", _cel(list(RESTORE_ENV))),
        ("listed", "request.namespace in variables.allowedNamespaces"),
        ("requestedRuntimeClass", "request.operation == 'CREATE' && has(object.spec.runtimeClassName) && "
                                  "object.spec.runtimeClassName in variables.runtimeClasses"),
        ("requestedEnv", "variables.restoreEnv.filter(n, (request.operation == 'CREATE' && (%s || %s)) || %s)"
         % (_any_env("containers", "n"), _any_env("initContainers", "n"), _any_env("ephemeralContainers", "n"))),
        ("requestedAnnotations", "has(object.metadata.annotations) ? object.metadata.annotations.filter(k, "
                                 "k.startsWith(%s) && (oldObject == null || !has(%s) || !(k in %s) || "
                                 "%s[k] != object.metadata.annotations[k])) : []" % (prefix, old, old, old)),
    ]
    validations = [
        ("!variables.requestedRuntimeClass", _messages("spec.runtimeClassName", "object.spec.runtimeClassName")),
        ("size(variables.requestedAnnotations) == 0",
         _messages("metadata.annotations", "variables.requestedAnnotations[0]")),
        ("size(variables.requestedEnv) == 0",
         _messages("spec.containers[].env", "variables.requestedEnv[0]")),
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": layout.K8S_ADMISSION_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["pods", "pods/ephemeralcontainers"]}]},
            "variables": [{"name": name, "expression": expression} for name, expression in variables],
            "validations": [{"expression": "variables.listed || " + expression, "messageExpression": messages[0],
                             "message": messages[1], "reason": "Forbidden"} for expression, messages in validations],
        },
    }


def binding():
    """Its binding: every namespace, refused requests denied (the policy itself lets the listed ones through)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": layout.K8S_ADMISSION_POLICY},
        "spec": {"policyName": layout.K8S_ADMISSION_POLICY, "validationActions": ["Deny"]},
    }


def objects(namespaces, runtime_classes):
    """[policy, binding], in the order they are applied."""
    return [policy(namespaces, runtime_classes), binding()]

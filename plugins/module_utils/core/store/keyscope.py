# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which identities a key is for: the node-side policy of trusted keys and decryption keys. PRIVATE.

A key entry is either the key alone (PEM text, key text or a path) -- good for every identity, as before -- or
``{key: <the key>, identities: [<pattern>, ...]}``: the key signs (or decrypts) only snapshots whose identity's
``<namespace>/<service>`` matches one of the shell patterns (``team-a/*``, ``team-b/qwen``; a pattern without
``/`` names a namespace: ``team-a`` is ``team-a/*``). One team's key then cannot vouch for another team's engine.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import re

from ..base.errors import ParameterError

ALL = None   # the scope of a key given alone: every identity
_PATTERN = re.compile(r"\A[A-Za-z0-9._*?\[\]-]+(/[A-Za-z0-9._*?\[\]-]+)?\Z")


def entry(value, field):
    """(the key as given, its scope: ALL or a tuple of ``namespace/service`` patterns) of one configured entry."""
    if isinstance(value, str):
        return value, ALL
    if not isinstance(value, dict) or set(value) - {"key", "identities"} or not isinstance(value.get("key"), str):
        raise ParameterError("%s: give a key (PEM text, key text or a path) or {key: ..., identities: [namespace/service "
                             "patterns]}, got %s" % (field, _shape(value)), field=field)
    patterns = value.get("identities")
    if not isinstance(patterns, list) or not patterns:
        raise ParameterError("%s.identities: a non-empty list of namespace/service patterns (team-a/*, team-b/qwen)"
                             % field, field=field)
    scope = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not _PATTERN.match(pattern):
            raise ParameterError("%s.identities: %r is not a namespace/service pattern (team-a/*, team-b/qwen)"
                                 % (field, pattern), field=field)
        scope.append(pattern if "/" in pattern else pattern + "/*")
    return value["key"], tuple(scope)


def _shape(value):
    if isinstance(value, dict):
        return "a dict with the keys %s" % ", ".join(sorted(str(k) for k in value))
    return "a %s" % type(value).__name__


def allows(scope, identity):
    """Whether a key of ``scope`` is for a snapshot of ``identity`` (its namespace and service)."""
    if scope is ALL:
        return True
    name = "%s/%s" % ((identity or {}).get("namespace"), (identity or {}).get("service"))
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in scope)


def describe(scope):
    return "every identity" if scope is ALL else ", ".join(scope)


def merge(scopes, key_id, scope):
    """The scope of a key configured twice is the union of both (one entry alone: every identity)."""
    if key_id not in scopes:
        scopes[key_id] = scope
    elif scopes[key_id] is ALL or scope is ALL:
        scopes[key_id] = ALL
    else:
        scopes[key_id] = tuple(sorted(set(scopes[key_id]) | set(scope)))


class Scoped(dict):
    """{key id: key} with the identities each key is for (``scopes``: {key id: ALL or patterns})."""

    def __init__(self, *args, **kwargs):
        super(Scoped, self).__init__(*args, **kwargs)
        self.scopes = {}

    def allows(self, key_id, identity):
        return key_id in self and allows(self.scopes.get(key_id, ALL), identity)

    def scope_of(self, key_id):
        return self.scopes.get(key_id, ALL)

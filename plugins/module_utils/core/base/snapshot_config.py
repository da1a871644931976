# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one normaliser of a service's snapshotConfig (schemas/snapshot-config.schema.json). PRIVATE.

Used by the roles' controller-side filter and by the Kubernetes modules alike, so that one config
means the same thing on a Docker host and in a cluster.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import difflib
import posixpath

from . import layout, schema
from .errors import ParameterError

ROOTS = ("npuSnapshotPath", "hostSnapshotPath")


def normalize(config, what="snapshot_config"):
    """The validated config with the schema's defaults filled in, plus ``configured``.

    None (no snapshotConfig at all) gives ``{"enabled": False, "configured": False}``: the service works
    as if the feature did not exist. Raises ParameterError naming the failing field.
    """
    if config is None or config == {}:
        return {"enabled": False, "configured": False}
    if not isinstance(config, dict):
        raise ParameterError("%s: expected a mapping in the shape of snapshotConfig (see "
                             "schemas/snapshot-config.schema.json), got %s" % (what, type(config).__name__))
    keys = sorted(schema.SCHEMAS["snapshot-config"]["properties"])
    unknown = sorted(set(config) - set(keys), key=str)
    if unknown:  # said first: a misspelt required key would otherwise read as that key missing
        raise ParameterError("%s: %s %s not %s of snapshotConfig, whose keys are %s (see "
                             "schemas/snapshot-config.schema.json)"
                             % (what, ", ".join(_with_guess(key, keys) for key in unknown),
                                "is" if len(unknown) == 1 else "are", "a key" if len(unknown) == 1 else "keys",
                                ", ".join(keys)), field=str(unknown[0]))
    schema.validate("snapshot-config", config, what)
    result = dict(layout.CONFIG_DEFAULTS)
    result.update(copy.deepcopy(config))
    for key in ROOTS:
        if key in result:
            result[key] = posixpath.normpath(result[key])
            if result[key] == "/":
                raise ParameterError("%s.%s: '/' cannot be a snapshot root; give a directory such as %s"
                                     % (what, key, layout.DEFAULT_SNAPSHOT_ROOT), field=key)
    if result["enabled"] and result["npuSnapshotPath"] == result["hostSnapshotPath"]:
        raise ParameterError("%s: npuSnapshotPath and hostSnapshotPath are both %s; give the device and the host "
                             "snapshots separate roots" % (what, result["hostSnapshotPath"]))
    result["configured"] = True
    return result


def _with_guess(key, keys):
    close = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
    return "%r (did you mean %r?)" % (key, close[0]) if close else repr(key)


def disabled_reason(normal):
    if not normal["configured"]:
        return "no snapshotConfig given: the service runs without snapshots"
    if not normal["enabled"]:
        return "snapshotConfig.enabled is false: the service runs without snapshots"
    return None

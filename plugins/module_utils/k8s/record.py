# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The service's record: the ConfigMap ``inferops-snapshot-<service>``. PRIVATE to inferops.snapshot.

One JSON entry per pod name (schemas/k8s-record.schema.json, ``$defs/entry``): the identity, node, paths,
image, status, checksum and reason of the pod's last generation. The pods' annotations go with the pods;
the restore decides from this record, which outlives them. One writer (``entry`` + ``write``) and one
reader (``parse``), both held to the schema: an entry that does not match it is reported as invalid and
never restored from.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import time

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout, schema
from ansible_collections.inferops.snapshot.plugins.module_utils.k8s.client import K8sError

INVALID = "invalid"  # the key of what parse() makes of an entry that does not match the schema: why


def name(service):
    return layout.K8S_RECORD_PREFIX + service


def entry(identity, host_path, status, node=None, npu_path=None, image=None, checksum=None, total_bytes=None,
          reason=None):
    """One pod's entry, checked against the schema."""
    document = {"identity": identity, "node": node, "host_path": host_path, "npu_path": npu_path, "image": image,
                "status": status, "checksum": checksum, "total_bytes": total_bytes, "reason": reason,
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    schema.validate("k8s-record", document, "the record entry of pod %s" % identity.get("pod"), definition="entry")
    return document


def parse(configmap):
    """{pod name: entry} from the record ConfigMap (None: no record yet). An entry that is not JSON or does not
    match the schema is ``{"invalid": why}``: the restore starts that pod normally, saying why."""
    entries = {}
    for key, value in ((configmap or {}).get("data") or {}).items():
        try:
            document = json.loads(value)
        except ValueError as exc:
            entries[key] = {INVALID: "not JSON (%s)" % exc}
            continue
        problems = schema.errors("k8s-record", document, definition="entry")
        entries[key] = {INVALID: "; ".join(problems)} if problems else document
    return entries


def _same(old, new):
    """Whether an entry says the same as another, whenever it was written."""
    return old is not None and INVALID not in old and \
        dict(old, updated_at=None) == dict(new, updated_at=None)


def manifest(namespace, service, service_label, data):
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name(service), "namespace": namespace, "labels": {service_label: service}},
            "data": data}
    schema.validate("k8s-record", body, "the record ConfigMap of service %s" % service)
    return body


def write(client, namespace, service, service_label, entries, check_mode=False):
    """Merge ``entries`` ({pod name: entry()}) into the record: created when missing, else merge-patched with the
    entries that say something new. (before, after) of the entries it changed (would change, in check mode)."""
    current = client.get_configmap(namespace, name(service))
    existing = parse(current)
    changed = dict((pod, document) for pod, document in entries.items() if not _same(existing.get(pod), document))
    if not changed or check_mode:
        return dict((pod, existing.get(pod)) for pod in changed), changed
    data = dict((pod, json.dumps(document, sort_keys=True)) for pod, document in changed.items())
    if current is None:
        body = manifest(namespace, service, service_label, data)
        try:
            client.create_configmap(namespace, body)
            return dict((pod, None) for pod in changed), changed
        except K8sError as exc:  # another run created it meanwhile: merge into that one
            if exc.result.get("status") != 409:
                raise
    client.patch_configmap(namespace, name(service), {"data": data})
    return dict((pod, existing.get(pod)) for pod in changed), changed

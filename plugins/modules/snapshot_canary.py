#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_canary
short_description: Record the warmed-up engine's answer to one request, which every restore asks again
version_added: 0.2.0
description:
  - Sends one HTTP request (O(url), O(method), O(body), O(headers)) to the running engine -- from inside the
    engine's own network namespace, so C(127.0.0.1) is the engine's loopback even in a container or a pod -- and
    keeps the request and the answer as C(canary.json) in the snapshot's staging directory (the hidden sibling
    C(.<name>.partial) of O(snapshot_dir)), where M(inferops.snapshot.host_checkpoint) seals (and signs) it with the
    rest of the snapshot.
  - Every restore of the snapshot, by any path, asks the restored engine the same request after its device state is
    back and before it says C(restored), and compares the answers (O(compare)). A different answer kills the
    restored process and starts the engine cold, with both answers in the reason (C(canary_mismatch:)).
  - Run it before the device snapshot (M(inferops.snapshot.npu_snapshot_backup)); a locked engine does not answer.
    The request must be deterministic for a given engine state, e.g. a completion with greedy decoding and a fixed
    seed.
requirements:
  - jsonschema (Python library) on the target host
  - the Docker CLI (O(docker_cli)) on the target host, with O(container) naming a Docker container
  - containerd's C(ctr) on the target host, with O(container) as C(containerd://<id>)
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.identity
  - inferops.snapshot.generation
  - inferops.snapshot.attributes
  - inferops.snapshot.attributes.ACTIONGROUP
attributes:
  check_mode:
    support: full
    details: Asks the engine and reports the answer; writes nothing.
  diff_mode:
    support: full
    details: The request and answer C(canary.json) held and holds now (in check mode, would hold).
  idempotent:
    support: full
    details: Recording the same answer again changes nothing.
options:
  snapshot_dir:
    description: The pod's snapshot directory (the canary goes into its staging sibling).
    type: path
    required: true
  container:
    description:
      - The engine's running container (its main process's network namespace is used) - a Docker container's name or
        id, or a Kubernetes pod's container on a containerd node as its C(containerID) names it, C(containerd://<id>),
        found through containerd on O(containerd_address).
    type: str
  containerd_address:
    description: The socket of the node's containerd, for a O(container) given as C(containerd://<id>).
    type: path
    default: /run/containerd/containerd.sock
  pid:
    description: Host pid of the engine process (instead of O(container)).
    type: int
  url:
    description: An C(http://) URL as the engine itself would reach its server, for example C(http://127.0.0.1:8000/v1/completions).
    type: str
    required: true
  method:
    description: HTTP method; default C(POST) with a O(body), C(GET) without.
    type: str
  body:
    description: Request body; a mapping or list is sent as JSON (with C(Content-Type) C(application/json)).
    type: raw
  headers:
    description:
      - Request headers, for example an C(Authorization) the engine wants. Their values are C(no_log) secrets to
        Ansible, never in a task result or log (the invocation shows their names only). They are kept in
        C(canary.json), 0600, encrypted with the rest of the snapshot when it is, and sent again at every restore.
    type: dict
    default: {}
  compare:
    description:
      - What must be equal after a restore. V(exact) the status and the whole body; V(status) the status only;
        V(json:<path>) the status and one field of a JSON answer, by a dotted path with list indexes, for example
        V(json:choices.0.text) (engines put request ids and times in their answers).
    type: str
    default: exact
  timeout:
    description: Seconds to wait for the answer.
    type: float
    default: 30
  docker_cli:
    description: Docker CLI executable.
    type: str
    default: docker
seealso:
  - module: inferops.snapshot.host_checkpoint
  - module: inferops.snapshot.snapshot_restore
"""

EXAMPLES = r"""
- name: Keep llama.cpp's answer to a greedy completion, asked again after every restore
  inferops.snapshot.snapshot_canary:
    snapshot_dir: /var/lib/inferops/snapshots/default/llama/p0/llama-0
    identity: {namespace: default, service: llama, instance: p0, pod: llama-0}
    container: llama-0
    url: http://127.0.0.1:8000/v1/completions
    body: {prompt: "The capital of France is", max_tokens: 8, temperature: 0, seed: 1}
    compare: json:choices.0.text
"""

RETURN = r"""
took_over:
  description:
    - The claim of another generation this task took over because that run was over (its lease ran out, or the process
      that stood for it on this host is gone), with C(why) and what the task C(cleaned) up of what it left (its
      runc or CRIU still running, their work dir, the pod's staging directory). Null when there was none.
  returned: always
  type: dict
  sample:
    id: 0f6c1d2e-3a4b-5c5d-8e9f-00112233aabb
    holder: {host: node-1, pid: 4242, what: python3 ansible-playbook}
    why: "the run that held it is gone: its process (pid 4242, python3 ansible-playbook) is gone"
    cleaned: ["removed its staging dir /var/lib/inferops/snapshots/default/qwen/p0/.vllm-0.partial"]
answer:
  description: What was recorded of the answer (C(status), and C(field) with a V(json:) O(compare)).
  returned: success
  type: dict
  sample: {status: 200, field: " Paris, the city of"}
canary_path:
  description: Where the canary was written (in the staging directory; it is published with the snapshot).
  returned: success
  type: str
"""

import os

from ansible_collections.inferops.snapshot.plugins.module_utils import _diff, _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.generate import claim
from ansible_collections.inferops.snapshot.plugins.module_utils.core.linux import paths
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import canary

ARGUMENT_SPEC = dict(
    _module.GENERATION_ARGS,
    snapshot_dir=dict(type="path", required=True),
    identity=dict(type="dict", options=_module.IDENTITY_OPTIONS),
    container=dict(type="str"),
    pid=dict(type="int"),
    url=dict(type="str", required=True),
    method=dict(type="str"),
    body=dict(type="raw"),
    headers=dict(type="dict", default={}, no_log=True),
    compare=dict(type="str", default="exact"),
    timeout=dict(type="float", default=30.0),
    docker_cli=dict(type="str", default="docker"),
    containerd_address=dict(type="path", default=layout.CONTAINERD_ADDRESS),
)


def main_logic(module):
    params = module.params
    _module.positive(params, "timeout", "generation_lease")
    snapshot_dir = paths.validate_snapshot_dir(params["snapshot_dir"])
    paths.check_identity(params["identity"], snapshot_dir)
    spec = canary.check_spec(dict((key, params[key]) for key in ("url", "method", "body", "headers", "compare")))
    pid = params["pid"] or _module.container_pid(params)
    staging = paths.validate_snapshot_dir(layout.staging_dir(snapshot_dir), field="snapshot_dir (staging sibling)")
    seen = canary.answer(pid, spec, params["timeout"])
    before = canary.load(staging) if os.path.isdir(staging) else None
    same = before is not None and (before["request"], before["answer"]) == (spec, seen)
    held = None
    if not same and not module.check_mode:
        held = claim.join(snapshot_dir, params["generation_id"], params["generation_lease"])
        canary.write(staging, spec, seen)
    path = os.path.join(staging, layout.CANARY)
    result = dict(changed=not same, answer=seen, canary_path=path, took_over=(held or {}).get("took_over"))
    if module._diff:
        was = dict((key, before[key]) for key in ("request", "answer")) if before is not None else None
        result["diff"] = _diff.canary(was, {"request": spec, "answer": seen}, path)
    return result


def main():
    _module.run(ARGUMENT_SPEC, main_logic, mutually_exclusive=[("container", "pid")],
                required_one_of=[("container", "pid")])


if __name__ == "__main__":
    main()

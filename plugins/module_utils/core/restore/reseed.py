# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After every restore, the restored process's randomness its own. PRIVATE to the inferops.snapshot collection.

Every process restored from one snapshot -- each restore, each clone -- starts with the same memory, so with the
same state of every pseudo-random generator in it: every copy would repeat the same "random" request ids, TLS
secrets and sampling seeds. The pipeline gives each restore a fresh nonce (``Attempt.restore_nonce``), which the
driver writes into the metadata file, and its ``reseed`` stage -- right after the metadata file, before the
device state is back and the engine unlocked -- tells the restored process's agent (protocol.OP_RESUMED, with the
nonce): the agent re-seeds the generators it can reach in the interpreter and calls the engine's RESTORE_POST
hooks with the nonce (agent/reseed.py, docs/agent.md).

- A process whose snapshot has a device part has an agent: its socket is waited for, as the device stage does, and
  its restore lease is made to end with this restore's deadline plus LEASE_MARGIN (``bound_restore_lease``).
  Otherwise a process without an agent's socket cannot be told; its metadata file has the nonce, the result
  says so (``told: false``) and so do the module's warnings and the runtime's log (``not_told``).
- An agent older than the operation refuses it as a bad request: the restore goes on, and the result says why the
  engine was not re-seeded (its image's copy of the agent predates this).
- An agent that is there and cannot do it -- a hook of the engine that fails, a generator it cannot re-seed, no
  answer -- fails the stage: a cold start (``reseed_failed:``), since copies of one snapshot could then share
  their random streams.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ..agent import protocol
from ..base.errors import RuntimeRefusedError
from ..clients.control import LEASE_MARGIN, AgentSocketClient

AGENT_WAIT = 5.0      # the socket comes back with its process (device.resume_process waits the same way)
REQUEST_TIMEOUT = 10.0


def bound_restore_lease(client, remaining):
    """The restored engine's restore lease (docs/agent.md) ends with this restore: its ``remaining`` seconds and
    LEASE_MARGIN, then the agent finishes the restore itself if this run has not (it was killed). An engine that is
    not locked holds none, and an agent older than the restore lease takes this as a lease of the backup's kind,
    which its watchdog acts on the same way: either is fine."""
    try:
        client.request(protocol.OP_RENEW, REQUEST_TIMEOUT, lease=min(remaining + LEASE_MARGIN, protocol.MAX_LEASE))
    except RuntimeRefusedError:
        pass


def tell(pid, socket_dir, nonce, timeout, wait=False, gone=None):
    """Tell the agent of the restored process ``pid`` that it was restored, with the restore's ``nonce``; returns what
    happened (``told``, and what was re-seeded or why nothing was). SnapshotError when the agent could not do it."""
    if not socket_dir:
        return {"told": False, "why": "no agent socket directory for this restore"}
    client = AgentSocketClient.for_pid(pid, socket_dir)
    if wait:
        client.wait_listening(min(timeout, AGENT_WAIT), gone=gone)
        bound_restore_lease(client, timeout)
    elif not client.listening():
        return {"told": False, "why": "the restored process has no agent socket at %s: only its metadata file has the "
                                      "restore's nonce" % client.path}
    try:
        reply = client.request(protocol.OP_RESUMED, min(timeout, REQUEST_TIMEOUT), nonce=nonce)
    except RuntimeRefusedError as exc:
        error = exc.result.get("error") or {}
        if error.get("kind") != protocol.KIND_BAD_REQUEST:
            raise
        return {"told": False, "why": "the engine's agent predates re-seeding after a restore (%s): copy the "
                                      "collection's agent into the image again" % error.get("message")}
    resumed = reply.get("resumed") or {}
    return {"told": True, "reseeded": resumed.get("reseeded"), "hooks": resumed.get("hooks")}


def not_told(told):
    """The warning of a restore whose engine was not told (``tell``'s answer, ``told: false``), or None: copies of the
    snapshot may then share the state of every generator in them, and whoever runs them should know."""
    if not isinstance(told, dict) or told.get("told") is not False:
        return None
    return ("reseed: not_told: %s; every copy restored from this snapshot may repeat the others' random numbers "
            "(request ids, sampling seeds) unless the engine re-seeds from the metadata file's restore_nonce"
            % told.get("why"))

# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of inferops.snapshot.host_checkpoint: the snapshot is signed here, on the controller.

With ``signing_key`` the key is read here and never sent to the node. The module runs twice under the generation's
claim (core/generate/checkpointer.py): ``seal`` takes and seals the snapshot into its staging directory and sends its checksum
list and manifest up; this plugin checks that the manifest is the one listed, of the task's identity, with the
generation it gave out (from its signer's ledger, ``signing_ledger``) and the expiry it asked for, signs the list's
exact bytes and sends the signature down -- with its statement that this generation is the identity's latest
(store/statement.py) --; ``publish`` writes both beside them and publishes, and the ledger records the generation as
published (what the refresh signs again). Anything wrong in between is an ``abort``: the sealed snapshot is removed and
the generation recorded failed. No snapshot is ever published unsigned when a key is given, and no node can get a
signature for an identity the task did not name.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import math
import os

from ansible.plugins.action import ActionBase

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout, schema
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError, SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import freshness, manifest, signature, statement

MODULE = "inferops.snapshot.host_checkpoint"


def to_sign_problem(to_sign, identity, generation, expires):
    """Why the sealed snapshot the node sent up must not be signed (None when it may): its manifest must be the one its
    checksum list lists, of the task's identity, with the generation and expiry given to it."""
    try:
        checksums, recorded = to_sign["checksums"], to_sign["manifest"]
        listed = manifest.parse_checksums(checksums)
        document = json.loads(recorded)
    except (KeyError, TypeError, ValueError) as exc:
        return "the node sent no checksum list and manifest that can be read: %s" % exc
    if listed.get(layout.MANIFEST) != hashlib.sha256(recorded.encode("utf-8")).hexdigest():
        return "the manifest the node sent is not the one its %s lists" % layout.CHECKSUMS
    if document.get("identity") != identity:
        return "the manifest is of %s, and the task asked for %s" % (
            layout.identity_string(document.get("identity") or {}), layout.identity_string(identity))
    if document.get("generation") != generation or document.get("expires") != expires:
        return "the manifest carries generation %r and expiry %r, and the signer gave out %r and %r" % (
            document.get("generation"), document.get("expires"), generation, expires)
    return None


def identity_problem(identity):
    if not isinstance(identity, dict) or sorted(identity) != sorted(layout.IDENTITY_KEYS) or \
            not all(isinstance(identity[key], str) and identity[key] for key in layout.IDENTITY_KEYS):
        return "identity: expected a dict with the keys %s, got %r" % (", ".join(layout.IDENTITY_KEYS), identity)
    return None


def signing_problem(args, ledger):
    """Why the options the plugin itself uses cannot be (None when they can): checked before a generation is taken
    from the signer's ledger, so that a task that then fails has written nothing on the controller."""
    problem = identity_problem(args.get("identity"))
    if problem:
        return problem
    try:
        schema.validate("manifest", args["identity"], "identity", definition="identity")
    except SnapshotError as exc:
        return exc.msg
    for name in ("max_age", "timeout", "generation_lease", "statement_validity"):  # as the module checks them
        value = args.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = None
        if seconds is None or not (seconds > 0 and math.isfinite(seconds)):
            return "%s: must be a positive number of seconds, got %r" % (name, value)
    if not isinstance(ledger, str) or "\x00" in ledger or not os.path.isabs(os.path.expanduser(ledger)):
        return "signing_ledger: %r is not an absolute path; give the signer's record's path on the controller, " \
               "e.g. %s" % (ledger, os.path.join(layout.CONTROLLER_KEYS_DIR, layout.SIGNER_LEDGER_FILE))
    return None


def ledger_beside(key_spec):
    """The signer's record: beside a key file, or in the controller's key directory for a key given as text."""
    if key_spec and not key_spec.lstrip().startswith("-----BEGIN"):
        return os.path.join(os.path.dirname(os.path.expanduser(key_spec)), layout.SIGNER_LEDGER_FILE)
    return os.path.join(layout.CONTROLLER_KEYS_DIR, layout.SIGNER_LEDGER_FILE)


def merged(first, second):
    """The task's result: the seal phase's (checkpoint, hashing, durations) updated by the publish phase's."""
    result = dict(first)
    result.update((key, value) for key, value in second.items() if key not in ("durations", "progress", "invocation"))
    result["durations"] = dict(first.get("durations") or {}, **{
        "publish": (second.get("durations") or {}).get("publish", 0.0)})
    result["progress"] = list(first.get("progress") or []) + list(second.get("progress") or [])
    return result


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        key_spec = args.pop("signing_key", None)
        ledger = args.pop("signing_ledger", None) or ledger_beside(key_spec)
        if args.pop("controller_signing", None) is not None:
            result.update(failed=True, msg="controller_signing: set by host_checkpoint's action plugin only; give "
                                           "signing_key to have the snapshot signed on the controller")
            return result
        try:
            result.update(self._run(args, key_spec, ledger, task_vars))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _module(self, args, task_vars, **signing):
        if signing:
            args = dict(args, controller_signing=signing)
        return self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)

    def _run(self, args, key_spec, ledger, task_vars):
        if not key_spec:
            return self._module(args, task_vars)
        try:
            key = signature.load_private_key(os.path.expanduser(key_spec), "signing_key")
        except ParameterError as exc:
            return dict(failed=True, msg=exc.msg)
        problem = signing_problem(args, ledger)
        if problem:  # before a generation is taken from the ledger, in check mode too
            return dict(failed=True, msg=problem)
        if self._task.check_mode:  # nothing is taken or published: say whose signature it would carry
            return dict(self._module(args, task_vars), signed_by=signature.key_id(key.public_key()))
        identity = args.get("identity")
        try:
            generation = freshness.SignerLedger(os.path.expanduser(ledger)).allocate(identity)
        except (freshness.CounterError, OSError) as exc:
            return dict(failed=True, msg="signing_ledger: the signer's record of generations %s cannot be used: %s"
                                         % (ledger, exc))
        expires = freshness.expires_at(float(args["max_age"])) if args.get("max_age") is not None else None
        sealed = self._module(args, task_vars, phase="seal", generation=generation, expires=expires)
        if sealed.get("failed") or sealed.get("status") != "sealed":  # failed, or an existing snapshot was kept
            return sealed
        to_sign = sealed.pop("to_sign", None)
        later = dict(args, generation_id=sealed["generation_id"])
        problem = to_sign_problem(to_sign, identity, generation, expires)
        if problem:
            aborted = self._module(later, task_vars, phase="abort", reason=problem)
            return dict(sealed, failed=True, status="failed", cleaned=aborted.get("cleaned"),
                        msg="signing_refused: the controller did not sign the sealed snapshot: %s; it was removed" % problem)
        checksums = to_sign["checksums"].encode("utf-8")
        document, fingerprint = signature.document(checksums, key), hashlib.sha256(checksums).hexdigest()
        latest = statement.make(identity, generation, fingerprint, key,
                                float(args.get("statement_validity") or layout.LATEST_VALIDITY))
        published = self._module(later, task_vars, phase="publish", signature=json.dumps(document, sort_keys=True),
                                 statement=latest.decode("utf-8"))
        if not published.get("failed"):
            try:
                freshness.SignerLedger(os.path.expanduser(ledger)).published(identity, generation, fingerprint)
            except (freshness.CounterError, OSError) as exc:  # published and stated; the refresh falls back on the store
                published.setdefault("warnings", []).append("signing_ledger: %s: cannot record generation %d as "
                                                            "published: %s" % (ledger, generation, exc))
        return merged(sealed, published)

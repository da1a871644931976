# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of inferops.snapshot.snapshot_refresh: the statements of the latest generations, signed again here.

The key is read on the controller and never sent to the host. The module runs twice: first it sends up what the store
holds of each identity (core/node/refresh.survey), then it writes the statements this plugin signed, each only where
the statement it read is still there. What is signed is the highest generation this controller can vouch for
(store/statement.latest_known): its own record of what it published, and what in the store carries its own signature.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import os
import time

from ansible.plugins.action import ActionBase

from ansible_collections.inferops.snapshot.plugins.action.host_checkpoint import ledger_beside
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import freshness, signature, statement

MODULE = "inferops.snapshot.snapshot_refresh"


def validity_problem(value):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = None
    if seconds is None or not (seconds > 0 and math.isfinite(seconds)):
        return "validity: must be a positive number of seconds, got %r; e.g. %d (a week)" % (value, layout.LATEST_VALIDITY)
    return None


def plan(found, records, key, validity, now=None):
    """(statements to write, what was refreshed, identities nothing could be vouched for) for the survey ``found``,
    the signer's ``records`` ({identity string: entry}) and the controller's private ``key``."""
    public = {signature.key_id(key.public_key()): key.public_key()}
    now = int(time.time() if now is None else now)
    statements, refreshed, unvouched = [], [], []
    for item in found:
        name = layout.identity_string(item["identity"])
        known = statement.latest_known(item, records.get(name), public)
        if known is None:
            unvouched.append({"identity": name, "why": "neither this controller's record nor the store holds a "
                                                       "generation signed by key %s" % list(public)[0]})
            continue
        generation, fingerprint, source = known
        data = statement.make(item["identity"], generation, fingerprint, key, validity, now)
        statements.append({"identity": item["identity"], "statement": data.decode("utf-8"),
                           "replaces": item.get("statement_sha256")})
        refreshed.append({"identity": name, "generation": generation, "source": source,
                          "expires": statement.format_time(now + int(validity))})
    return statements, refreshed, unvouched


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        try:
            result.update(self._run(dict(self._task.args), task_vars))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _module(self, args, task_vars):
        return self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)

    def _run(self, args, task_vars):
        if args.pop("statements", None) is not None:
            return dict(failed=True, msg="statements: set by snapshot_refresh's action plugin only; give root and "
                                         "signing_key")
        key_spec = args.pop("signing_key", None) or os.path.join(layout.CONTROLLER_KEYS_DIR, layout.SIGNING_KEY_FILE)
        ledger = args.pop("signing_ledger", None) or ledger_beside(key_spec)
        validity = args.pop("validity", None)
        validity = layout.LATEST_VALIDITY if validity is None else validity
        problem = validity_problem(validity)
        if problem:
            return dict(failed=True, msg=problem)
        try:
            key = signature.load_private_key(os.path.expanduser(key_spec), "signing_key")
            records = freshness.SignerLedger(os.path.expanduser(ledger)).read()
        except ParameterError as exc:
            return dict(failed=True, msg=exc.msg)
        except (freshness.CounterError, OSError) as exc:
            return dict(failed=True, msg="signing_ledger: the signer's record %s cannot be used: %s" % (ledger, exc))
        surveyed = self._module(args, task_vars)
        if surveyed.get("failed"):
            return surveyed
        statements, refreshed, unvouched = plan(surveyed.get("found") or [], records, key, float(validity))
        done = dict(changed=bool(statements), refreshed=refreshed, unvouched=unvouched, changed_meanwhile=[])
        if not statements or self._task.check_mode:
            return done
        written = self._module(dict(args, statements=statements), task_vars)
        if written.get("failed"):
            return written
        moved = written.get("changed_meanwhile") or []
        left = set("/".join(path.rstrip("/").split("/")[-len(layout.IDENTITY_KEYS):]) for path in moved)
        return dict(done, changed=bool(written.get("written")), changed_meanwhile=moved,
                    refreshed=[item for item in refreshed if item["identity"] not in left])

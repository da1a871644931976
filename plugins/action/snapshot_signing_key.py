# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of inferops.snapshot.snapshot_signing_key: the controller's signing key pair, made on first use.

Runs on the controller only, in the controller's own process (no module is sent to any host): the private key never
leaves the controller. host_checkpoint's action plugin signs with it there; the nodes get the public half.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.plugins.action import ActionBase

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError, SnapshotError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.store import signature


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path",))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        unknown = sorted(set(self._task.args) - self._VALID_ARGS)
        if unknown:
            return dict(result, failed=True, msg="%s: not an option of snapshot_signing_key (path)" % ", ".join(unknown))
        directory = self._task.args.get("path")
        if directory is None:  # left out (a role's default(omit)); "" is a mistake, refused naming path
            directory = layout.CONTROLLER_KEYS_DIR
        try:
            pair = signature.key_pair(directory, create=not self._task.check_mode)
        except ParameterError as exc:
            return dict(result, failed=True, msg=exc.msg)
        except SnapshotError as exc:  # fs.ensure_dir's UnsafePathError
            return dict(result, failed=True, msg="path: %s" % exc.msg)
        except (IOError, OSError) as exc:
            return dict(result, failed=True, msg="path: cannot make or read the signing key in %s: %s" % (directory, exc))
        result.update(pair, changed=pair.pop("created"))
        return result

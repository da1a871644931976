# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of inferops.snapshot.snapshot_node_files: a directory of the controller installed in one module run.

ansible.builtin.copy of a directory runs two modules per file (a stat, then the copy): the collection's core, 61
files, took 25 s on an idle 2-core node and over 250 s on a loaded one, on every snapshot_node run. Here the tree is
read on the controller and sent in the module's arguments: one module run, whatever the number of files.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.inferops.snapshot.plugins.module_utils import _node_files

MODULE = "inferops.snapshot.snapshot_node_files"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        if args.get("files") is not None:
            return dict(result, failed=True, msg="files: set from src by the action plugin; give src instead")
        src = args.pop("src", None)
        if not src:
            return dict(result, failed=True, msg="src: required, the directory on the controller whose files to install")
        try:
            source = self._find_needle("files", src)
        except AnsibleError as exc:
            return dict(result, failed=True, msg="src: %s" % exc)
        if not os.path.isdir(source):
            return dict(result, failed=True, msg="src: %s is not a directory on the controller" % source)
        args["files"] = _node_files.read_tree(source)
        result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
        # The invocation would echo every file's bytes into the result (each AWX job event keeps it): names only.
        shown = (result.get("invocation") or {}).get("module_args") or {}
        if isinstance(shown.get("files"), dict):
            shown["files"] = sorted(shown["files"])
        return result

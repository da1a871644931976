#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_node_files
short_description: Install a directory of the controller on a node in one module run
version_added: 0.4.0
description:
  - Installs the regular files below O(src) on the controller (byte code and links left out) into O(dest) on the
    host, in one module run; each file whose bytes, mode or owner differ is written through a temporary file and a
    rename. M(ansible.builtin.copy) of a directory runs two modules per file, which made the role C(snapshot_node)
    take minutes on a loaded node; the role installs the collection's restore path with this module.
  - Files that an earlier run of this module installed in O(dest) and that are no longer below O(src) are removed.
    Only those - the list of what it installed is kept in O(dest) as C(.inferops-installed.json) - so other files
    in O(dest) are never touched.
  - The files are owned by the user the module runs as (root, with C(become)).
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.attributes
attributes:
  check_mode:
    support: full
    details: Writes nothing; C(written) and C(removed) say what a run would change.
  diff_mode:
    support: full
    details: The files that would be written and removed.
  idempotent:
    support: full
options:
  src:
    description:
      - The directory on the controller (a role's C(files/) is searched, as for M(ansible.builtin.copy)). Read by the
        action plugin, which sends its files in O(files).
    type: path
  files:
    description:
      - Set by the action plugin from O(src) (relative path to base64 content); not given in a task.
    type: dict
    required: true
  dest:
    description: The directory on the host that holds the files (made with O(directory_mode) when missing).
    type: path
    required: true
  mode:
    description: The mode of every file, as an octal string.
    type: str
    default: "0644"
  directory_mode:
    description: The mode of the directories it makes, as an octal string.
    type: str
    default: "0755"
seealso:
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Install the collection's restore path on the node
  become: true
  inferops.snapshot.snapshot_node_files:
    src: "{{ role_path }}/../../plugins/module_utils/core/"
    dest: /usr/local/lib/inferops-snapshot/inferops_snapshot
"""

RETURN = r"""
written:
  description: The files written (in check mode, that would be), relative to O(dest).
  returned: always
  type: list
  elements: str
  sample: [restore/pipeline.py]
removed:
  description: The files an earlier run installed that are gone from O(src), removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
files:
  description: How many files O(dest) holds from O(src).
  returned: always
  type: int
  sample: 61
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _diff, _module, _node_files
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError

ARGUMENT_SPEC = dict(
    src=dict(type="path"),
    files=dict(type="dict", required=True),
    dest=dict(type="path", required=True),
    mode=dict(type="str", default="0644"),
    directory_mode=dict(type="str", default="0755"),
)


def octal(params, field):
    try:
        value = int(params[field], 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o7777:
        raise ParameterError("%s: %r is not an octal mode; give it as a string like '0644'" % (field, params[field]),
                             field=field)
    return value


def main_logic(module):
    params = module.params
    result = _node_files.install(params["dest"], params["files"], octal(params, "mode"),
                                 octal(params, "directory_mode"), check_mode=module.check_mode)
    result["changed"] = bool(result["written"] or result["removed"])
    return result


def main():
    _module.run(ARGUMENT_SPEC, main_logic, requires=(), diff=_diff.node_files)


if __name__ == "__main__":
    main()

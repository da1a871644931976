#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: snapshot_node_containerd
short_description: Register the restore-on-create runtime as a runtime handler of containerd's CRI plugin
version_added: 0.4.0
description:
  - Adds (or removes) a runtime handler for the restore-on-create runtime to the containerd of a Kubernetes node
    (containerd 1.6 or 1.7, its CRI plugin, a version 2 configuration), as a drop-in file that the node's
    configuration imports. The role C(inferops.snapshot.snapshot_node) runs it with C(snapshot_node_containerd=true);
    its errors name the role's variables, which set these options.
  - containerd merges an imported file's plugin sections whole, so the drop-in carries the node's whole CRI section
    - that of the file that defines it, as containerd itself reads it (C(containerd config dump)) - plus the handler,
    a copy of the node's default runtime (C(io.containerd.runc.v2) and its options) with O(binary) as its
    C(BinaryName) and O(annotations) as its C(pod_annotations) and C(container_annotations).
  - Refuses, before it writes anything, when it cannot tell which configuration is in force - no containerd listens
    on O(socket), the daemon there reads another file than O(config), C(containerd config dump) fails or lists other
    files than the imports say - when that daemon runs without its CRI plugin, when O(dropin) would not be imported or
    another file would replace the CRI section after it, and when containerd does not read the drop-in back with the
    handler in it.
  - containerd loads the drop-in at its next start; running pods survive a containerd restart. This module never
    restarts it; C(in_force) says whether the daemon started after the drop-in was last written (or removed).
  - O(state=absent) removes the drop-in; it refuses while tasks run with O(binary) (their bundles' C(options.json)
    below O(state_dir)) unless O(force), since containerd could not stop them once the binary is gone.
author:
  - inferops.snapshot maintainers (@inferops)
extends_documentation_fragment:
  - inferops.snapshot.attributes
attributes:
  check_mode:
    support: full
    details: Reads the configuration and asks containerd to read the drop-in it would write; writes nothing.
  diff_mode:
    support: full
    details: The drop-in before and after.
  idempotent:
    support: full
requirements:
  - Python 3.11 or later on the node (tomllib), containerd and ctr.
options:
  state:
    description: Whether the handler is registered (V(present)) or not (V(absent)).
    type: str
    choices: [present, absent]
    default: present
  name:
    description: The handler's name, which a RuntimeClass names as its C(handler).
    type: str
    required: true
  binary:
    description: The runtime the handler runs in place of runc (the snapshot_node role's shim).
    type: path
    required: true
  config:
    description: The configuration file the node's containerd reads (its C(--config)).
    type: path
    default: /etc/containerd/config.toml
  socket:
    description: containerd's socket (its C([grpc] address)).
    type: path
    default: /run/containerd/containerd.sock
  dropin:
    description: The drop-in file; O(config) must import it (for example C(imports = ["/etc/containerd/conf.d/*.toml"])).
    type: path
    default: /etc/containerd/conf.d/inferops-restore.toml
  state_dir:
    description: containerd's state directory (its C(state)), where the bundles of running tasks are.
    type: path
    default: /run/containerd
  runc_root:
    description: The handler's C(options.Root), runc's root; unset, the default runtime's.
    type: path
  annotations:
    description: The pod and container annotations the handler lets through to the runtime.
    type: list
    elements: str
    default: ["org.inferops.*"]
  force:
    description: With O(state=absent), remove the handler even while tasks run with O(binary).
    type: bool
    default: false
seealso:
  - module: inferops.snapshot.snapshot_node_files
"""

EXAMPLES = r"""
- name: Register the restore-on-create runtime with the node's containerd
  become: true
  inferops.snapshot.snapshot_node_containerd:
    name: inferops-restore
    binary: /usr/local/bin/inferops-restore-runtime
  register: handler

- name: Restart containerd so that it loads the handler (running pods survive it)
  become: true
  ansible.builtin.service:
    name: containerd
    state: restarted
  when: not handler.in_force
"""

RETURN = r"""
dropin:
  description: The drop-in file.
  returned: always
  type: str
  sample: /etc/containerd/conf.d/inferops-restore.toml
in_force:
  description:
    - Whether the daemon runs with the drop-in as it is now (present) or without it (absent), that is, started after
      it was last written or removed. False, containerd loads the change at its next start.
  returned: always
  type: bool
source:
  description: The file whose CRI section the drop-in carries; null for containerd's defaults.
  returned: when state=present
  type: str
  sample: /etc/containerd/config.toml
daemon:
  description: The containerd on O(socket) - pid, the configuration it reads, when it started (seconds since the epoch).
  returned: when a daemon listens there
  type: dict
  sample: {pid: 812, config: /etc/containerd/config.toml, started_at: 1765100000.12, executable: /usr/bin/containerd}
users:
  description: The tasks that run with O(binary) (C(<namespace>/<pod> (<container id>))).
  returned: when state=absent
  type: list
  elements: str
"""

from ansible_collections.inferops.snapshot.plugins.module_utils import _module
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.node import cri_handler

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    name=dict(type="str", required=True),
    binary=dict(type="path", required=True),
    config=dict(type="path", default=cri_handler.DEFAULT_CONFIG),
    socket=dict(type="path", default=layout.CONTAINERD_ADDRESS),
    dropin=dict(type="path", default="/etc/containerd/conf.d/inferops-restore.toml"),
    state_dir=dict(type="path", default="/run/containerd"),
    runc_root=dict(type="path"),
    annotations=dict(type="list", elements="str", default=[layout.RESTORE_ANNOTATION_PREFIX + "*"]),
    force=dict(type="bool", default=False),
)


def main_logic(module):
    params = module.params
    handler = cri_handler.RuntimeHandler(params["name"], params["binary"], params["config"], params["socket"],
                                         params["dropin"], params["state_dir"], params["runc_root"], params["annotations"])
    if params["state"] == "present":
        plan = handler.present()
    else:
        plan = handler.absent(params["force"])
    if plan["changed"]:  # loaded (or forgotten) at containerd's next start
        plan["in_force"] = False
        if not module.check_mode:
            handler.apply(plan["after"])
    result = dict((key, value) for key, value in plan.items() if key not in ("before", "after"))
    result["dropin"] = params["dropin"]
    if module._diff:
        result["diff"] = {"before": plan["before"] or "", "after": plan["after"] or "",
                          "before_header": params["dropin"], "after_header": params["dropin"]}
    return result


def main():
    _module.run(ARGUMENT_SPEC, main_logic, requires=())


if __name__ == "__main__":
    main()

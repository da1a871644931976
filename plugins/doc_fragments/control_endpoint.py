# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # Matches CONTROL_TARGET_ARGS in plugins/module_utils/_module.py.
    DOCUMENTATION = r"""
options:
  pid:
    description:
      - Host pid of the inference process. Its agent socket is reached through C(/proc/PID/root), so
        this works for containerized and bare processes alike.
      - Exactly one of O(pid), O(container) and O(endpoint) is required.
    type: int
  container:
    description:
      - Name or id of a running Docker container whose main process runs the engine under the
        inferops agent launcher.
      - Or a Kubernetes pod's container on a containerd node as the pod's C(status.containerStatuses[].containerID)
        names it, C(containerd://<id>), found through containerd on O(containerd_address).
    type: str
  endpoint:
    description:
      - Control endpoint of the process, given directly.
      - C(unix:///path/agent.sock) or an absolute socket path for the collection's agent;
        C(http://host:port) for an engine's own HTTP control endpoint (see O(endpoint_paths)).
    type: str
  endpoint_paths:
    description:
      - For an HTTP O(endpoint), the path of each operation. Keys are C(state), C(lock), C(backup),
        C(restore), C(unlock), C(renew); missing keys default to C(/snapshot/<operation>).
    type: dict
  agent_socket_dir:
    description:
      - Directory, inside the target's filesystem, where the agent puts its socket
        C(agent.<pid-in-namespace>.sock). Used with O(pid) and O(container).
    type: path
    default: /run/inferops-snapshot
  timeout:
    description:
      - Seconds each snapshot operation may take inside the process. On expiry the task fails with the
        last observed state; the ACL call itself cannot be interrupted and the agent refuses further
        requests until it ends. The default is above the ACL runtime's own 60 s wait for its
        background threads, so a lock that cannot complete reports error 507905.
    type: float
    default: 90
  docker_cli:
    description:
      - Docker CLI executable used to resolve O(container).
    type: str
    default: docker
  containerd_address:
    description:
      - The socket of the node's containerd, for a O(container) given as C(containerd://<id>).
    type: path
    default: /run/containerd/containerd.sock
"""

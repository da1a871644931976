# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # Matches GENERATION_ARGS in plugins/module_utils/_module.py.
    DOCUMENTATION = r"""
options:
  generation_id:
    description:
      - The generation this task is part of (the roles give one id to all the tasks of one run). While another
        generation's claim on the pod (C(.<pod>.generation.json) beside the snapshot) is live, the task is refused
        with the holder's id, host and start time, and a cleanup removes nothing of what that generation wrote.
      - A claim whose run is over is taken over at once, not refused - its lease ran out, or its holder is provably
        gone. The claim names the process that stands for its run on the host (ansible-playbook for a local
        connection, the SSH connection's sshd session once it has served two of its tasks) with its start time and
        the boot id; that process is gone, or the host rebooted. The task then removes what the dead run left
        (its runc or CRIU still dumping, after 30 s; their work dir; the pod's staging directory) and says so in
        its result (C(took_over)). A holder that runs, or runs on another host, is never overridden.
      - The claim lives in the store, where a writer of the store could forge it, so of what it names the task acts
        only on a CRIU work dir of this node whose maker is gone and a container id under a runc root of this node;
        anything else it names is ignored, and C(took_over.cleaned) says so.
      - Without it the task claims the pod for its own duration only.
    type: str
  generation_lease:
    description:
      - Seconds the claim of O(generation_id) lasts from this task on; a claim whose holder was killed lapses then,
        so a later generation can take the pod. A long task (M(inferops.snapshot.host_checkpoint)) renews it while
        it works, so the lease need only cover the gaps between the generation's tasks.
    type: float
    default: 180
"""

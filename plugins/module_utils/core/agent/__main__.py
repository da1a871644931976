# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``python3 -m inferops_agent -- ENGINE ...``: the agent launcher, with this folder copied into the image
as the package ``inferops_agent`` (see docs/agent.md)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import sys

if __name__ == "__main__":
    from .launcher import main

    sys.exit(main())  # pylint: disable=ansible-bad-function

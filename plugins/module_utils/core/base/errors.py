# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Typed errors of the collection. PRIVATE: no compatibility promise for other users.

Every error carries the partial result gathered before it happened; modules turn them into
``fail_json`` in exactly one place (``_common.run_module``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class SnapshotError(Exception):
    """Base class: ``msg`` for the operator, ``result`` merged into the failed task result."""

    def __init__(self, msg, **result):
        super(SnapshotError, self).__init__(msg)
        self.msg = msg
        self.result = result


class ParameterError(SnapshotError):
    """A parameter or config value is wrong; the message names the field and the fix."""


class UnsafePathError(SnapshotError):
    """A snapshot path failed validation (traversal, symlink, ownership, permissions)."""


class EndpointError(SnapshotError):
    """The control endpoint inside the target process could not be reached or answered badly."""


class RuntimeRefusedError(SnapshotError):
    """The ACL runtime (through the endpoint) refused or failed an operation."""


class CommandError(SnapshotError):
    """An external command (docker, criu, runc) failed; the result carries cmd, rc, stdout, stderr."""


class SnapshotTimeout(SnapshotError):
    """A wait or an operation ran out of time; the result carries the last observed state."""


class MissingLibrary(SnapshotError):
    """A Python library the operation needs (jsonschema, cryptography) is not installed; the message says which."""

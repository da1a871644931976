# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Protobuf's wire format, read as far as the collection needs it: CRIU's image entries (store/criu_images.py) and the
runtime options containerd keeps for a container (clients/containerd_cli.py). PRIVATE to inferops.snapshot.

No generated code and no protobuf library on the nodes: a message is read field by field, its numbers and wire types
checked by the caller, and bytes that are no protobuf message are a ValueError.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def varint(data, pos):
    """(the varint at ``pos`` of ``data``, the position after it)."""
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint at byte %d" % pos)
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(message):
    """(field number, wire type, value) of a protobuf message."""
    pos = 0
    while pos < len(message):
        key, pos = varint(message, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(message, pos)
        elif wire == 2:
            length, pos = varint(message, pos)
            value, pos = message[pos:pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = message[pos:pos + size], pos + size
        else:
            raise ValueError("unsupported protobuf wire type %d" % wire)
        if pos > len(message):
            raise ValueError("truncated protobuf field %d" % number)
        yield number, wire, value

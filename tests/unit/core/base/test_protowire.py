"""Protobuf's wire format as the collection reads it (base/protowire.py): every wire type of a message, numbers of
more than one byte, and bytes that are no message refused with a ValueError -- never a wrong field."""

import struct

import pytest

from conftest import protobuf_varint

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import protowire


def test_every_wire_type_is_read_with_its_number_and_value():
    message = (protobuf_varint(1 << 3) + protobuf_varint(300) +                     # varint
               protobuf_varint(2 << 3 | 2) + protobuf_varint(3) + b"abc" +          # length-delimited
               protobuf_varint(3 << 3 | 1) + struct.pack("<d", 1.5) +               # 64-bit
               protobuf_varint(20 << 3 | 5) + struct.pack("<I", 7) +                # 32-bit, a two-byte key
               protobuf_varint(4 << 3) + protobuf_varint(-1))                       # a negative int64
    assert list(protowire.fields(message)) == [
        (1, 0, 300), (2, 2, b"abc"), (3, 1, struct.pack("<d", 1.5)), (20, 5, struct.pack("<I", 7)),
        (4, 0, (1 << 64) - 1)]
    assert protowire.varint(protobuf_varint(1 << 35) + b"rest", 0) == (1 << 35, 6)  # 36 bits: 6 bytes
    assert list(protowire.fields(b"")) == []


@pytest.mark.parametrize("message, error", [
    (b"\x80", "truncated or overlong varint at byte 1"),
    (protobuf_varint(2 << 3 | 2) + protobuf_varint(9) + b"abc", "truncated protobuf field 2"),
    (protobuf_varint(3 << 3 | 1) + b"\x00" * 4, "truncated protobuf field 3"),
    (protobuf_varint(5 << 3 | 3), "unsupported protobuf wire type 3"),
    (b"\xff" * 11, "truncated or overlong varint"),
])
def test_bytes_that_are_no_message_are_refused(message, error):
    with pytest.raises(ValueError, match=error):
        list(protowire.fields(message))

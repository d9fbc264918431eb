"""The protocol's bytes where the master writes them itself: field keys and varints.

The master serializes a reply's bulk (a catch-up's points, a thousand ranks' records) in pieces
it joins, and the run dir's metrics log is scanned for records after damage: both need a
field's key as bytes. A key is the field's number and wire type as a varint, both read here
from the generated descriptors, never written by hand, so that a field renumbered in
``orchestrator.proto`` (or one numbered 16 or more, whose key takes two bytes) stays right.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

# The wire types (protobuf's encoding guide): how the bytes after a key are laid out.
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5

_FIXED64 = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
_FIXED32 = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32}
_DELIMITED = {FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE}


def varint(n: int) -> bytes:
    """``n`` (at least 0) as a protobuf varint."""
    if n < 0:
        raise ValueError(f"a varint here is never negative, got {n}")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def wire_type(field: Any) -> int:
    """How ``field``'s values are laid out after its key (a packed repeated number: delimited).
    ``field``: a ``FieldDescriptor``, of either protobuf backend."""
    if field.type in _DELIMITED or field.is_packed:
        return LENGTH_DELIMITED
    if field.type in _FIXED64:
        return FIXED64
    if field.type in _FIXED32:
        return FIXED32
    return VARINT


def field_key(message: type[Message], name: str) -> bytes:
    """The key that starts field ``name`` of ``message`` on the wire."""
    field = message.DESCRIPTOR.fields_by_name[name]
    return varint(field.number << 3 | wire_type(field))

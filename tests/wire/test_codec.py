"""orch.wire.codec: the bytes the master writes itself (field keys, varints) are protobuf's own,
for every field of every message, and what it joins by hand parses back to what it held."""

from __future__ import annotations

from array import array

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from orch.master.control.series import Series
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import field_key, varint

MESSAGES = [getattr(pb, name) for name in pb.DESCRIPTOR.message_types_by_name]

# A value of each field type that protobuf writes out (not its default).
SAMPLE: dict[int, object] = {
    FieldDescriptor.TYPE_DOUBLE: 1.5,
    FieldDescriptor.TYPE_FLOAT: 1.5,
    FieldDescriptor.TYPE_INT64: 7,
    FieldDescriptor.TYPE_UINT64: 7,
    FieldDescriptor.TYPE_INT32: 7,
    FieldDescriptor.TYPE_UINT32: 7,
    FieldDescriptor.TYPE_SINT32: 7,
    FieldDescriptor.TYPE_SINT64: 7,
    FieldDescriptor.TYPE_FIXED32: 7,
    FieldDescriptor.TYPE_FIXED64: 7,
    FieldDescriptor.TYPE_SFIXED32: 7,
    FieldDescriptor.TYPE_SFIXED64: 7,
    FieldDescriptor.TYPE_BOOL: True,
    FieldDescriptor.TYPE_STRING: "x",
    FieldDescriptor.TYPE_BYTES: b"x",
    FieldDescriptor.TYPE_ENUM: 1,
}


def only(message: type[Message], field: FieldDescriptor) -> bytes:
    """``message`` with ``field`` alone set, serialized."""
    m = message()
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        sub = getattr(m, field.name).add() if field.is_repeated else getattr(m, field.name)
        sub.SetInParent()
    elif field.is_repeated:
        getattr(m, field.name).append(SAMPLE[field.type])
    else:
        setattr(m, field.name, SAMPLE[field.type])
    return m.SerializeToString()


def test_every_fields_key_is_the_one_protobuf_writes() -> None:
    checked = 0
    for message in MESSAGES:
        for field in message.DESCRIPTOR.fields:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                continue  # a map's entries are messages of their own, keyed like one
            key = field_key(message, field.name)
            assert only(message, field).startswith(key), (message.__name__, field.name)
            checked += 1
    assert checked > 150  # every message of the protocol, not a few


def test_a_field_numbered_16_or_more_takes_a_two_byte_key() -> None:
    wide = [(m, f) for m in MESSAGES for f in m.DESCRIPTOR.fields if f.number >= 16 and not f.is_repeated]
    assert wide, "the protocol has fields numbered 16 or more"
    message, field = wide[0]
    assert len(field_key(message, field.name)) == 2
    assert only(message, field).startswith(field_key(message, field.name))


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_a_varint_decodes_to_its_number(n: int) -> None:
    data = varint(n)
    assert _DecodeVarint(data, 0) == (n, len(data))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**31 - 1),
    st.text(max_size=40),
    st.lists(
        st.tuples(
            st.integers(min_value=-(2**62), max_value=2**62),
            st.floats(allow_nan=True, allow_infinity=True),
            st.floats(min_value=0, max_value=2e9),
        ),
        max_size=60,
    ),
    st.data(),
)
def test_a_series_encoded_by_hand_parses_back_as_the_points_held(
    rank: int, name: str, points: list[tuple[int, float, float]], data: st.DataObject
) -> None:
    s = Series(rank, name)
    s.steps = array("q", [p[0] for p in points])
    s.values = array("d", [p[1] for p in points])
    s.times = array("d", [p[2] for p in points])
    first = data.draw(st.integers(0, len(points)))
    last = data.draw(st.integers(first, len(points)))
    parsed = pb.Series.FromString(s.encode(rank, name, 0, first, last))
    held = s.copy(rank, name, 0, first, last)
    assert parsed.SerializeToString(deterministic=True) == held.SerializeToString(deterministic=True)
    assert (parsed.rank, parsed.name, list(parsed.steps)) == (rank, name, [p[0] for p in points[first:last]])

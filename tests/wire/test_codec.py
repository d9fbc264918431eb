"""orch.wire.codec: the bytes the master writes itself (field keys, varints) are protobuf's own,
for every field of every message, and what it joins by hand parses back to what it held."""

from __future__ import annotations

import dataclasses
import json
from array import array
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from orch.master.control.series import Series
from orch.record.rundir import RunRecord
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.client import StateMirror
from orch.wire.codec import (
    COMMANDS,
    HOST_ACTIONS,
    MESSAGES,
    decode,
    encode,
    field_key,
    put_status,
    take_status,
    varint,
)
from orch.wire.model import STATUS_FIELDS, JobView, Registration, RunStatus
from orch.wire.states import RankState, RunState

PROTOCOL = [getattr(pb, name) for name in pb.DESCRIPTOR.message_types_by_name]

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
    for message in PROTOCOL:
        for field in message.DESCRIPTOR.fields:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                continue  # a map's entries are messages of their own, keyed like one
            key = field_key(message, field.name)
            assert only(message, field).startswith(key), (message.__name__, field.name)
            checked += 1
    assert checked > 150  # every message of the protocol, not a few


def test_a_field_numbered_16_or_more_takes_a_two_byte_key() -> None:
    wide = [(m, f) for m in PROTOCOL for f in m.DESCRIPTOR.fields if f.number >= 16 and not f.is_repeated]
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


# -- a run's status: the wire and result.json carry every field of RunStatus, and give it back --
_TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30)
_BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "str": _TEXT,
    "int": st.integers(-(2**31), 2**31 - 1),  # int32 on the wire, the narrowest of them
    "float": st.floats(allow_nan=False),
    "bool": st.booleans(),
    "RunState": st.sampled_from(list(RunState)),
    "JobView | None": st.none() | st.builds(JobView, _TEXT, _TEXT, _TEXT, _TEXT, _TEXT),
}
statuses = st.builds(RunStatus, **{f.name: _BY_TYPE[str(f.type)] for f in STATUS_FIELDS})


@settings(max_examples=300, deadline=None)
@given(statuses)
def test_a_status_crosses_the_wire_whole(status: RunStatus) -> None:
    reply = pb.GetStateResponse()
    put_status(status, reply)
    wired = pb.GetStateResponse.FromString(reply.SerializeToString())
    assert take_status(wired) == dataclasses.replace(status).settled()


@settings(max_examples=300, deadline=None)
@given(status=statuses)
def test_a_status_kept_in_result_json_loads_back(status: RunStatus, tmp_path_factory: Any) -> None:
    mirror = StateMirror()
    mirror.take(status)
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "run.json").write_text("{}")
    (run_dir / "result.json").write_text(json.dumps(mirror.as_dict()))
    loaded = RunRecord(run_dir).state()
    expected = dataclasses.replace(status).settled()
    for f in STATUS_FIELDS:  # result.json keeps some seconds to the millisecond
        if f.metadata["digits"] is not None:
            setattr(expected, f.name, round(getattr(expected, f.name), f.metadata["digits"]))
    expected.registered = 0  # counted from the ranks the record holds: none here
    assert loaded.status() == expected


def test_every_field_of_a_status_is_one_of_the_replys() -> None:
    names = {f.name for f in pb.GetStateResponse.DESCRIPTOR.fields}
    assert {f.name for f in STATUS_FIELDS} <= names


# -- the plain values that mirror a message: every one crosses and comes back whole ---------------
_INT32, _INT64 = st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1)
_FLOAT = st.floats(allow_nan=False)  # a NaN crosses too, but is not equal to itself


def _values(annotation: str) -> st.SearchStrategy[Any]:
    """Values of a model field's annotation (the text ``from __future__`` leaves), any width
    the protocol allows: int64 where it is one, else int32."""
    simple: dict[str, st.SearchStrategy[Any]] = {
        "str": _TEXT,
        "int": _INT32,
        "bool": st.booleans(),
        "float": _FLOAT,
        "int | None": st.none() | _INT32,
        "RankState | None": st.none() | st.sampled_from(list(RankState)),
        "Sequence[str]": st.lists(_TEXT, max_size=4),
        "Sequence[int]": st.lists(_INT64, max_size=6),
        "Sequence[float]": st.lists(_FLOAT, max_size=6),
        "Mapping[str, float]": st.dictionaries(_TEXT, _FLOAT, max_size=4),
    }
    if annotation in simple:
        return simple[annotation]
    if annotation.endswith(" | None"):
        return st.none() | _values(annotation.removesuffix(" | None"))
    if annotation.startswith("Sequence["):
        return st.lists(_values(annotation[len("Sequence[") : -1]), max_size=3)
    kind = next(k for k in MESSAGES if k.__name__ == annotation)
    return st.builds(kind, **{f.name: _values(str(f.type)) for f in dataclasses.fields(kind)})


def _plain(value: Any) -> Any:
    """``value`` with its sequences as lists and mappings as dicts (a decoded value keeps the
    message's own), to compare."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, [_plain(getattr(value, f.name)) for f in dataclasses.fields(value)])
    if isinstance(value, str | bytes) or value is None:
        return value
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("kind", list(MESSAGES), ids=lambda k: k.__name__)
def test_every_mirrored_message_round_trips(kind: type[Any]) -> None:
    # int64 fields take the whole range: the others int32
    wide = {f.name for f in MESSAGES[kind].DESCRIPTOR.fields if f.type in (f.TYPE_INT64, f.TYPE_UINT64)}
    values = st.builds(
        kind,
        **{
            f.name: (_INT64 if f.name in wide and f.type == "int" else _values(str(f.type)))
            for f in dataclasses.fields(kind)
        },
    )

    @settings(max_examples=150, deadline=None)
    @given(values)
    def round_trip(value: Any) -> None:
        message = encode(value)
        assert type(message) is MESSAGES[kind]
        wired = type(message).FromString(message.SerializeToString())
        back = decode(kind, wired)
        assert _plain(back) == _plain(value)
        assert encode(back) == wired

    round_trip()


def test_an_optional_field_not_sent_is_none_and_a_zero_sent_is_zero() -> None:
    assert decode(Registration, pb.RegisterRequest(worker_id="w")).rank is None
    assert decode(Registration, pb.RegisterRequest(worker_id="w", rank=0)).rank == 0


def test_every_command_and_host_action_has_its_protocol_number() -> None:
    assert {pb.Command.Name(n) for n in COMMANDS.values()} == {"CONTINUE", "STOP", "ABORT"}
    assert {pb.HostAction.Name(n) for n in HOST_ACTIONS.values()} == set(pb.HostAction.keys())

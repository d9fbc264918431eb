"""Where plain values (:mod:`.model`) become protocol messages and back, and the protocol's
bytes where the master writes them itself: field keys and varints.

The master serializes a reply's bulk (a catch-up's points, a thousand ranks' records) in pieces
it joins, and the run dir's metrics log is scanned for records after damage: both need a
field's key as bytes. A key is the field's number and wire type as a varint, both read here
from the generated descriptors, never written by hand, so that a field renumbered in
``orchestrator.proto`` (or one numbered 16 or more, whose key takes two bytes) stays right.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from typing import Any, TypeVar, overload

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.model import (
    STATUS_FIELDS,
    Barrier,
    Beat,
    Command,
    Completion,
    Event,
    Frame,
    HostAction,
    HostReport,
    JobView,
    MetricBatch,
    Points,
    ProcessStats,
    Registration,
    RunStatus,
    Stack,
    StepTiming,
)
from orch.wire.states import RANK_STATE_FROM_PB, RANK_STATE_PB, RUN_STATE_PB, RunState

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


# -- a run's status, on and off the wire (field by field, by name, for every field of RunStatus) --
_SPECIAL = {"state", "job"}
_PLAIN = [f.name for f in STATUS_FIELDS if f.name not in _SPECIAL]
_RUN_STATES = {number: RunState(name) for name, number in RUN_STATE_PB.items()}


def put_status(status: RunStatus, reply: pb.GetStateResponse) -> None:
    """Set ``reply``'s run-level fields from ``status``."""
    for name in _PLAIN:
        setattr(reply, name, getattr(status, name))
    reply.state = RUN_STATE_PB[status.state.value]
    if status.job is not None:
        reply.job.CopyFrom(pb.ClusterJob(**status.job.as_dict()))


def take_status(reply: pb.GetStateResponse) -> RunStatus:
    """The run-level fields of ``reply``, as a master of any version sends them."""
    status = RunStatus(**{name: getattr(reply, name) for name in _PLAIN})
    status.state = _RUN_STATES[reply.state]
    if reply.HasField("job"):
        j = reply.job
        status.job = JobView(j.scheduler, j.job_id, j.state, j.reason, j.nodes)
    return status.settled()


def put_event(event: Event, reply: pb.GetStateResponse) -> None:
    reply.events.append(pb.Event(time=event.time, kind=event.kind, rank=event.rank, message=event.message))


# -- a metrics log's records (orch.record.metrics_log frames them) ---------------------------------
# The keys of MetricRecord's fields rank, attempt and series: a scan after damage reads a key as
# one byte (fields numbered below 16), which this checks where it is imported.
RECORD_KEYS = b"".join(field_key(pb.MetricRecord, name) for name in ("rank", "attempt", "series"))
if len(RECORD_KEYS) != 3:
    raise ImportError("MetricRecord's rank, attempt and series must be numbered below 16 (one-byte keys)")


def metric_record(rank: int, attempt: int, series: Iterable[Points] | Iterable[pb.Series]) -> bytes:
    """One heartbeat's points of ``rank`` in ``attempt``, as a metrics log keeps them (a
    beat's own ``Series`` messages go in as they came)."""
    messages = [
        s
        if isinstance(s, pb.Series)
        else pb.Series(name=s.name, steps=s.steps, values=s.values, times=s.times)
        for s in series
    ]
    return pb.MetricRecord(rank=rank, attempt=attempt, series=messages).SerializeToString()


def metric_batch(payload: bytes) -> MetricBatch | None:
    """A metrics log record's points (None: not a record: it does not parse, or a series has
    more steps than values). The steps, values and times are protobuf's own sequences."""
    record = pb.MetricRecord()
    try:
        record.ParseFromString(payload)
    except DecodeError:
        return None
    if any(len(s.steps) != len(s.values) for s in record.series):
        return None
    series = [Points(s.name, s.steps, s.values, s.times) for s in record.series]
    return MetricBatch(record.rank, record.attempt, series)


# -- plain values of model.py that mirror one message field by field ------------------------------
MESSAGES: dict[type[Any], type[Message]] = {
    Beat: pb.HeartbeatRequest,
    Points: pb.Series,
    StepTiming: pb.StepTiming,
    ProcessStats: pb.ProcessStats,
    Stack: pb.Stack,
    Frame: pb.Frame,
    Registration: pb.RegisterRequest,
    Barrier: pb.CanStartTrainingResponse,
    Completion: pb.CompletionRequest,
    HostReport: pb.HostSyncRequest,
}
T = TypeVar("T")


_BY_MESSAGE = {message.DESCRIPTOR.full_name: kind for kind, message in MESSAGES.items()}


def _plan(kind: type[Any]) -> list[tuple[str, str, type[Any] | None]]:
    """Each field of ``kind``, how it crosses and the plain type of its messages: "value",
    "optional" (None when not sent), "many" (a repeated field), "map",
    "message" (one plain value, None when not sent), "messages" (a tuple of them) or
    "rank_state"."""
    message = MESSAGES[kind]
    out: list[tuple[str, str, type[Any] | None]] = []
    for f in dataclasses.fields(kind):
        field = message.DESCRIPTOR.fields_by_name[f.name]  # a model field the message lacks fails here
        sub = field.message_type
        if f.type == "RankState | None":
            out.append((f.name, "rank_state", None))
        elif sub is not None and sub.GetOptions().map_entry:
            out.append((f.name, "map", None))
        elif sub is not None:
            out.append((f.name, "messages" if field.is_repeated else "message", _BY_MESSAGE[sub.full_name]))
        elif field.is_repeated:
            out.append((f.name, "many", None))
        elif field.has_presence:
            out.append((f.name, "optional", None))
        else:
            out.append((f.name, "value", None))
    return out


_PLANS = {kind: _plan(kind) for kind in MESSAGES}
# A heartbeat is decoded on the master's hot path: each kind's fields are read in one call, and
# the value is made from them in field order. Repeated numbers and maps stay the message's own
# sequences and mappings (read-only to the master), not copied.
_AS_SENT = ("value", "many", "map")
_READ = {kind: operator.attrgetter(*(name for name, _, _ in plan)) for kind, plan in _PLANS.items()}
_CONVERT = {
    kind: [(i, name, how, sub) for i, (name, how, sub) in enumerate(plan) if how not in _AS_SENT]
    for kind, plan in _PLANS.items()
}


def decode(kind: type[T], message: Message) -> T:
    """``message`` as the plain value ``kind`` that mirrors it."""
    values = list(_READ[kind](message))
    for i, name, how, sub in _CONVERT[kind]:
        v = values[i]
        if how == "messages":
            values[i] = tuple([decode(sub, m) for m in v])  # type: ignore[arg-type]
        elif how == "message":
            values[i] = decode(sub, v) if message.HasField(name) else None  # type: ignore[arg-type]
        elif how == "optional":
            values[i] = v if message.HasField(name) else None
        else:  # rank_state
            values[i] = RANK_STATE_FROM_PB.get(v)
    return kind(*values)


@overload
def encode(value: Beat) -> pb.HeartbeatRequest: ...


@overload
def encode(value: Points) -> pb.Series: ...


@overload
def encode(value: StepTiming) -> pb.StepTiming: ...


@overload
def encode(value: ProcessStats) -> pb.ProcessStats: ...


@overload
def encode(value: Stack) -> pb.Stack: ...


@overload
def encode(value: Frame) -> pb.Frame: ...


@overload
def encode(value: Registration) -> pb.RegisterRequest: ...


@overload
def encode(value: Barrier) -> pb.CanStartTrainingResponse: ...


@overload
def encode(value: Completion) -> pb.CompletionRequest: ...


@overload
def encode(value: HostReport) -> pb.HostSyncRequest: ...


def encode(value: Any) -> Message:
    """A plain value of :data:`MESSAGES`' as its message."""
    kind = type(value)
    fields: dict[str, Any] = {}
    for name, how, _ in _PLANS[kind]:
        v = getattr(value, name)
        if v is None:
            continue
        if how == "rank_state":
            v = RANK_STATE_PB[v.value]
        elif how == "message":
            v = encode(v)
        elif how == "messages":
            v = [encode(m) for m in v]
        fields[name] = v
    return MESSAGES[kind](**fields)


# The protocol's numbers of the model's commands and host actions.
COMMANDS: dict[Command, Any] = {c: pb.Command.Value(c.value) for c in Command}
HOST_ACTIONS: dict[HostAction, Any] = {a: pb.HostAction.Value("HOST_" + a.value) for a in HostAction}

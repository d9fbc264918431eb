"""Checks on what callers send, before any state is touched: pure functions that raise
:class:`Reject`, whose ``kind`` the gRPC layer maps to a status code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.limits import (
    MAX_BEATS_PER_BATCH,
    MAX_ERROR_LEN,
    MAX_ID_LEN,
    MAX_METRICS_PER_RANK,
    MAX_NAME_LEN,
    MAX_REASON_LEN,
    MAX_SECTIONS,
)
from orch.wire.states import RANK_STATE_FROM_PB, RankState

BACKENDS = ("", "gloo", "nccl")

RejectKind = Literal[
    "invalid_argument", "failed_precondition", "not_found", "resource_exhausted", "already_exists"
]
# The grpc status code of each kind, by number (grpc.StatusCode's values; this module
# does not import grpc).
STATUS_CODE: dict[str, int] = {
    "invalid_argument": 3,
    "failed_precondition": 9,
    "not_found": 5,
    "resource_exhausted": 8,
    "already_exists": 6,
}


class Reject(Exception):
    """A request the master refuses; ``kind`` maps to a gRPC status code."""

    def __init__(self, kind: RejectKind, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def check_id(name: str, value: str, *, required: bool = True) -> None:
    if required and not value:
        raise Reject("invalid_argument", f"{name} is empty: pass a non-empty {name}")
    if len(value) > MAX_ID_LEN:
        raise Reject("invalid_argument", f"{name} is {len(value)} characters; the limit is {MAX_ID_LEN}")


def check_register(req: pb.RegisterRequest) -> None:
    check_id("worker_id", req.worker_id)
    check_id("host", req.host, required=False)
    check_id("address", req.address, required=False)
    if req.pid < 0:
        raise Reject("invalid_argument", f"pid must be >= 0, got {req.pid}")
    if not 0 <= req.rendezvous_port < 65536:
        raise Reject("invalid_argument", f"rendezvous_port {req.rendezvous_port} is not a port")
    if req.backend not in BACKENDS:
        raise Reject("invalid_argument", f"backend {req.backend!r} is not one of gloo, nccl")
    if req.HasField("rank") and req.rank < 0:
        raise Reject("invalid_argument", f"worker {req.worker_id} asked for rank {req.rank}: a rank is >= 0")
    if req.world_size < 0:
        raise Reject("invalid_argument", f"world_size must be >= 0 (0: not said), got {req.world_size}")


def check_heartbeat(req: pb.HeartbeatRequest) -> None:
    if req.step < 0 or req.total_steps < 0 or req.dropped_points < 0:
        raise Reject("invalid_argument", "step, total_steps and dropped_points must be >= 0")
    if len(req.series) > MAX_METRICS_PER_RANK:
        raise Reject(
            "invalid_argument",
            f"a heartbeat carries {len(req.series)} series; the limit is {MAX_METRICS_PER_RANK}",
        )
    if len(req.dropped_reason) > MAX_REASON_LEN:
        raise Reject("invalid_argument", f"dropped_reason is longer than {MAX_REASON_LEN} characters")
    if len(req.note) > MAX_REASON_LEN:
        raise Reject("invalid_argument", f"note is longer than {MAX_REASON_LEN} characters")
    if req.HasField("timing"):
        check_timing(req.timing)
    for s in req.series:
        if not s.name or len(s.name) > MAX_NAME_LEN:
            raise Reject(
                "invalid_argument",
                f"every series needs a name of 1-{MAX_NAME_LEN} characters; one has {len(s.name)}",
            )
        if len(s.steps) != len(s.values) or (s.times and len(s.times) != len(s.steps)):
            raise Reject(
                "invalid_argument",
                f"series {s.name!r}: steps, values and times must have the same length",
            )


def check_heartbeats(beats: Sequence[pb.HeartbeatRequest]) -> list[Reject | None]:
    """A host agent's batch: refused whole when it is too big; else each beat's refusal, in
    order (None: it passed), so that one bad beat costs only its own reply."""
    if len(beats) > MAX_BEATS_PER_BATCH:
        raise Reject(
            "invalid_argument",
            f"a batch carries {len(beats)} heartbeats; the limit is {MAX_BEATS_PER_BATCH}",
        )
    checked: list[Reject | None] = []
    for req in beats:
        try:
            check_heartbeat(req)
            checked.append(None)
        except Reject as e:
            checked.append(e)
    return checked


MAX_SECONDS = 1e6  # any one duration a heartbeat reports (NaN is not in range either)


# What may mark a rank's steps (StepTiming.timed_by; empty: an older worker's ctx.steps).
TIMED_BY_VALUES = ("", "ctx.steps", "ctx.data", "ctx.log", "off")


def check_timing(t: pb.StepTiming) -> None:
    """A heartbeat's step times: counts and durations that can be real."""
    values = [t.step_seconds, t.data_seconds, t.collective_seconds, t.other_seconds, *t.sections.values()]
    if t.steps < 0 or not all(0 <= v <= MAX_SECONDS for v in values):
        raise Reject("invalid_argument", f"timing: steps must be >= 0 and seconds from 0 to {MAX_SECONDS:g}")
    if len(t.sections) > MAX_SECTIONS or any(not 0 < len(n) <= 64 for n in t.sections):
        raise Reject(
            "invalid_argument", f"timing: at most {MAX_SECTIONS} sections, each named in 1-64 characters"
        )
    if t.timed_by not in TIMED_BY_VALUES:
        raise Reject(
            "invalid_argument",
            f"timing: timed_by is one of {', '.join(map(repr, TIMED_BY_VALUES))}, got {t.timed_by[:40]!r}",
        )


def check_completion(req: pb.CompletionRequest) -> RankState:
    """The outcome the rank reports (an ended state)."""
    outcome = RANK_STATE_FROM_PB.get(req.outcome)
    if outcome not in (RankState.SUCCEEDED, RankState.FAILED, RankState.STOPPED):
        raise Reject("invalid_argument", "outcome must be RANK_SUCCEEDED, RANK_FAILED or RANK_STOPPED")
    if len(req.param_checksum) > MAX_ID_LEN:
        raise Reject("invalid_argument", "param_checksum is too long")
    if req.exit_code and outcome is not RankState.FAILED:
        raise Reject("invalid_argument", "exit_code goes only with RANK_FAILED: a process that died")
    return outcome


def check_run_id(run_id: str, ours: str) -> None:
    """A worker's request names the run it belongs to: this master's."""
    if not run_id:
        raise Reject(
            "failed_precondition",
            "the request carries no run_id: call Register first and use the run_id it returns",
        )
    if run_id != ours:
        raise Reject(
            "failed_precondition",
            f"this master runs run {ours}, not {run_id}: the worker belongs to another run",
        )


def parse_cursor(cursor: bytes, max_points: int) -> pb.StateCursor:
    """The cursor of a GetState call (empty: a full reply), checked to be one a master made."""
    if max_points < 0:
        raise Reject("invalid_argument", f"max_points must be >= 0, got {max_points}")
    prev = pb.StateCursor()
    if cursor:
        try:
            prev.ParseFromString(cursor)
        except Exception as e:  # protobuf raises DecodeError; any parse failure is bad input
            raise Reject("invalid_argument", "cursor is not one this master returned") from e
        if len(prev.keys) != len(prev.offsets):
            raise Reject("invalid_argument", "cursor is not one this master returned")
    return prev


def check_host_sync(req: pb.HostSyncRequest, world_size: int) -> None:
    check_id("host", req.host)
    if req.attempt < 0:
        raise Reject("invalid_argument", f"attempt must be >= 0 (0: none started yet), got {req.attempt}")
    if len(req.worker_ids) > world_size:
        raise Reject(
            "invalid_argument",
            f"host {req.host} names {len(req.worker_ids)} workers; the run has only {world_size} ranks",
        )
    for worker_id in req.worker_ids:
        check_id("worker_id", worker_id)
    if len(req.failure) > MAX_ERROR_LEN:
        raise Reject(
            "invalid_argument", f"failure is {len(req.failure)} characters; the limit is {MAX_ERROR_LEN}"
        )

"""orch.master.control.validate: the checks every request passes before it touches the master's state.

Each check is a pure function that raises :class:`Reject`; these tests pin the ``kind`` (the
gRPC status it maps to) and that the message names the field that was wrong.
"""

from __future__ import annotations

from typing import Any

import pytest

from orch.master.control.validate import (
    Reject,
    check_completion,
    check_heartbeat,
    check_heartbeats,
    check_id,
    check_register,
    check_run_id,
    parse_cursor,
)
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.limits import MAX_BEATS_PER_BATCH, MAX_ID_LEN, MAX_METRICS_PER_RANK
from orch.wire.states import RankState


def rejected(fn: Any, *args: Any) -> Reject:
    """The Reject that ``fn(*args)`` raises."""
    with pytest.raises(Reject) as info:
        fn(*args)
    return info.value


# -- check_id ------------------------------------------------------------------------------


def test_check_id_accepts_up_to_the_limit() -> None:
    check_id("worker_id", "w")
    check_id("worker_id", "x" * MAX_ID_LEN)
    check_id("host", "", required=False)


def test_check_id_rejects_an_empty_required_id_by_name() -> None:
    err = rejected(check_id, "worker_id", "")
    assert err.kind == "invalid_argument"
    assert "worker_id is empty" in str(err)


def test_check_id_rejects_a_long_id_with_its_length() -> None:
    err = rejected(check_id, "address", "x" * (MAX_ID_LEN + 1))
    assert err.kind == "invalid_argument"
    assert str(err) == f"address is {MAX_ID_LEN + 1} characters; the limit is {MAX_ID_LEN}"


def test_check_id_limits_optional_ids_too() -> None:
    with pytest.raises(Reject) as info:
        check_id("host", "h" * (MAX_ID_LEN + 1), required=False)
    assert info.value.kind == "invalid_argument"
    assert str(info.value).startswith(f"host is {MAX_ID_LEN + 1} characters")


# -- check_register ------------------------------------------------------------------------


def register(**fields: Any) -> pb.RegisterRequest:
    values: dict[str, Any] = {"worker_id": "w0", "host": "h", "pid": 1, "backend": "gloo"}
    values.update(fields)
    return pb.RegisterRequest(**values)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"host": "", "address": "", "pid": 0, "backend": ""},
        {"rendezvous_port": 0},
        {"rendezvous_port": 65535},
        {"backend": "nccl"},
        {"address": "a" * MAX_ID_LEN},
    ],
)
def test_check_register_accepts_valid_requests(fields: dict[str, Any]) -> None:
    check_register(register(**fields))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"worker_id": ""}, "worker_id is empty"),
        ({"worker_id": "w" * (MAX_ID_LEN + 1)}, "worker_id is"),
        ({"host": "h" * (MAX_ID_LEN + 1)}, "host is"),
        ({"address": "a" * (MAX_ID_LEN + 1)}, "address is"),
        ({"pid": -1}, "pid must be >= 0, got -1"),
        ({"rendezvous_port": -1}, "rendezvous_port -1 is not a port"),
        ({"rendezvous_port": 65536}, "rendezvous_port 65536 is not a port"),
        ({"backend": "mpi"}, "backend 'mpi' is not one of gloo, nccl"),
    ],
)
def test_check_register_rejects_the_bad_field(fields: dict[str, Any], named: str) -> None:
    err = rejected(check_register, register(**fields))
    assert err.kind == "invalid_argument"
    assert named in str(err)


# -- check_heartbeat -----------------------------------------------------------------------


def heartbeat(*series: pb.Series, **fields: Any) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(run_id="r", worker_id="w", series=list(series), **fields)


def test_check_heartbeat_accepts_points_with_and_without_times() -> None:
    check_heartbeat(
        heartbeat(
            pb.Series(name="loss", steps=[1, 2], values=[0.5, 0.4], times=[10.0, 11.0]),
            pb.Series(name="acc", steps=[1], values=[0.9]),
            step=2,
            total_steps=10,
            dropped_points=3,
        )
    )


def test_check_heartbeat_accepts_exactly_the_metric_limit() -> None:
    series = [pb.Series(name=f"m{i}", steps=[1], values=[1.0]) for i in range(MAX_METRICS_PER_RANK)]
    check_heartbeat(heartbeat(*series))


@pytest.mark.parametrize("field", ["step", "total_steps", "dropped_points"])
def test_check_heartbeat_rejects_negative_counts(field: str) -> None:
    err = rejected(check_heartbeat, heartbeat(**{field: -1}))
    assert err.kind == "invalid_argument"
    assert field in str(err) and ">= 0" in str(err)


def test_check_heartbeat_rejects_too_many_series() -> None:
    series = [pb.Series(name=f"m{i}") for i in range(MAX_METRICS_PER_RANK + 1)]
    err = rejected(check_heartbeat, heartbeat(*series))
    assert err.kind == "invalid_argument"
    assert f"carries {MAX_METRICS_PER_RANK + 1} series; the limit is {MAX_METRICS_PER_RANK}" in str(err)


@pytest.mark.parametrize("name", ["", "n" * (MAX_ID_LEN + 1)])
def test_check_heartbeat_rejects_a_bad_series_name(name: str) -> None:
    err = rejected(check_heartbeat, heartbeat(pb.Series(name=name, steps=[1], values=[1.0])))
    assert err.kind == "invalid_argument"
    assert f"1-{MAX_ID_LEN} characters" in str(err)


@pytest.mark.parametrize(
    "series",
    [
        pb.Series(name="loss", steps=[1, 2], values=[1.0]),
        pb.Series(name="loss", steps=[1], values=[1.0, 2.0]),
        pb.Series(name="loss", steps=[1, 2], values=[1.0, 2.0], times=[5.0]),
    ],
)
def test_check_heartbeat_rejects_ragged_columns_naming_the_series(series: pb.Series) -> None:
    err = rejected(check_heartbeat, heartbeat(series))
    assert err.kind == "invalid_argument"
    assert "series 'loss'" in str(err) and "same length" in str(err)


# -- check_heartbeats ----------------------------------------------------------------------


def test_check_heartbeats_gives_each_beat_its_own_refusal_in_order() -> None:
    good = pb.HeartbeatRequest(worker_id="w0", step=1)
    bad = pb.HeartbeatRequest(worker_id="w1", step=-1)
    checked = check_heartbeats([good, bad, good])
    assert checked[0] is None and checked[2] is None
    assert isinstance(checked[1], Reject) and checked[1].kind == "invalid_argument"
    assert check_heartbeats([]) == []


def test_check_heartbeats_refuses_a_batch_too_big_whole() -> None:
    beats = [pb.HeartbeatRequest(worker_id="w0")] * MAX_BEATS_PER_BATCH
    assert check_heartbeats(beats) == [None] * MAX_BEATS_PER_BATCH
    err = rejected(check_heartbeats, [*beats, pb.HeartbeatRequest(worker_id="w0")])
    assert err.kind == "invalid_argument"
    assert (
        str(err)
        == f"a batch carries {MAX_BEATS_PER_BATCH + 1} heartbeats; the limit is {MAX_BEATS_PER_BATCH}"
    )


# -- check_completion ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (pb.RANK_SUCCEEDED, RankState.SUCCEEDED),
        (pb.RANK_FAILED, RankState.FAILED),
        (pb.RANK_STOPPED, RankState.STOPPED),
    ],
)
def test_check_completion_returns_the_ended_state(outcome: int, state: RankState) -> None:
    assert check_completion(pb.CompletionRequest(outcome=outcome)) is state


@pytest.mark.parametrize(
    "outcome", [pb.RANK_STATE_UNSPECIFIED, pb.RANK_REGISTERED, pb.RANK_RUNNING, pb.RANK_LOST, 99]
)
def test_check_completion_rejects_a_state_that_is_no_reported_end(outcome: int) -> None:
    err = rejected(check_completion, pb.CompletionRequest(outcome=outcome))
    assert err.kind == "invalid_argument"
    assert "outcome must be RANK_SUCCEEDED, RANK_FAILED or RANK_STOPPED" in str(err)


def test_check_completion_limits_the_checksum() -> None:
    ok = pb.CompletionRequest(outcome=pb.RANK_SUCCEEDED, param_checksum="c" * MAX_ID_LEN)
    assert check_completion(ok) is RankState.SUCCEEDED
    err = rejected(
        check_completion, pb.CompletionRequest(outcome=pb.RANK_SUCCEEDED, param_checksum="c" * 257)
    )
    assert err.kind == "invalid_argument"
    assert "param_checksum" in str(err)


# -- check_run_id --------------------------------------------------------------------------


def test_check_run_id_accepts_this_run() -> None:
    check_run_id("run-a", "run-a")


def test_check_run_id_rejects_a_missing_run_id() -> None:
    err = rejected(check_run_id, "", "run-a")
    assert err.kind == "failed_precondition"
    assert "carries no run_id" in str(err) and "Register" in str(err)


def test_check_run_id_rejects_another_run_naming_both() -> None:
    err = rejected(check_run_id, "run-b", "run-a")
    assert err.kind == "failed_precondition"
    assert str(err).startswith("this master runs run run-a, not run-b")


# -- parse_cursor --------------------------------------------------------------------------


def test_parse_cursor_empty_is_a_fresh_cursor() -> None:
    cursor = parse_cursor(b"", 0)
    assert cursor == pb.StateCursor()


def test_parse_cursor_reads_back_a_cursor_the_master_made() -> None:
    made = pb.StateCursor(run_id="r", keys=["0/loss", "1/loss"], offsets=[3, 7], events=5, epoch=2)
    assert parse_cursor(made.SerializeToString(), 100) == made


def test_parse_cursor_rejects_a_negative_max_points() -> None:
    err = rejected(parse_cursor, b"", -1)
    assert err.kind == "invalid_argument"
    assert "max_points must be >= 0, got -1" in str(err)


def test_parse_cursor_rejects_bytes_that_are_no_cursor() -> None:
    err = rejected(parse_cursor, b"\xff", 0)
    assert err.kind == "invalid_argument"
    assert "cursor is not one this master returned" in str(err)


def test_parse_cursor_rejects_keys_and_offsets_of_different_lengths() -> None:
    forged = pb.StateCursor(run_id="r", keys=["0/loss", "0/acc"], offsets=[3]).SerializeToString()
    err = rejected(parse_cursor, forged, 0)
    assert err.kind == "invalid_argument"
    assert "cursor is not one this master returned" in str(err)

"""orch.wire.ranks: the one rank record, mapped to the protocol's RankInfo and to the run dir's JSON.

The mappings walk the record's fields, so these tests fill *every* field with a value other than
its default: a field that a mapping lost would read back as its default and fail the test.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from orch.errors import OrchError
from orch.record.rundir import _Fields
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.ranks import RankView
from orch.wire.states import RANK_STATE_PB, RankState

FIELD_NAMES = [f.name for f in dataclasses.fields(RankView)]
# What a record on disk reads back as.
# steps/s is kept: an ended rank's is its mean rate over the run (StateMirror.fill_mean_rates).
LIVE_ONLY = {"heartbeat_age": -1.0, "progress_age": -1.0}


def full_view(state: RankState = RankState.FAILED, loss: float = 0.25) -> RankView:
    """A record none of whose fields holds its default."""
    return RankView(
        rank=3,
        worker_id="w-3",
        host="node-b",
        pid=4242,
        state=state,
        step=120,
        total_steps=500,
        steps_per_sec=12.5,
        heartbeat_age=1.75,
        loss=loss,
        param_checksum="ab12cd",
        error="Traceback ...\nValueError: boom",
        exit_code=70,
        address="10.1.2.3",
        has_loss=True,
        dropped_points=17,
        timed=True,
        step_ms=41.5,
        data_ms=2.25,
        compute_ms=33.0,
        collective_ms=4.75,
        other_ms=1.5,
        relative_score=1.25,
        individual_score=1.125,
        slow_in="compute",
        progress_age=41.5,
        stack="  Cell In[3], line 10, in train\n    time.sleep(10**6)",
        rss_bytes=2_000_000_000,
        cpu_percent=97.5,
        cuda_allocated=3_000_000,
        cuda_reserved=4_000_000,
        cuda_peak=5_000_000,
        cuda_total=80_000_000_000,
        memory_limit=24_000_000_000,
        limit_kind="cgroup",
        memory_note="growing 20 MB a step",
        note="Accelerate sees 1 process, but this run has 2 ranks",
        dropped_reason="the master refused them: too many metrics",
        timed_by="ctx.data",
        section_ms={"augment": 20.5, "load": 1.25},
    )


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_views_equal(got: RankView, want: RankView) -> None:
    for name in FIELD_NAMES:
        a, b = getattr(got, name), getattr(want, name)
        assert same(a, b) if isinstance(b, float) else a == b, name


def test_the_full_view_sets_every_field() -> None:
    default = RankView(rank=0)
    view = full_view()
    assert [n for n in FIELD_NAMES if getattr(view, n) == getattr(default, n)] == []


# -- RankInfo ------------------------------------------------------------------------------


def test_to_pb_carries_every_field() -> None:
    info = full_view().to_pb()
    assert info.state == pb.RANK_FAILED
    assert info.dropped_points == 17 and info.has_loss and info.address == "10.1.2.3"
    for name in FIELD_NAMES:
        if name != "state":
            assert getattr(info, name) == getattr(full_view(), name), name


@pytest.mark.parametrize("state", list(RankState))
def test_rank_info_round_trip_keeps_every_field(state: RankState) -> None:
    view = full_view(state)
    info = view.to_pb()
    assert info.state == RANK_STATE_PB[state.value]
    wire = pb.RankInfo.FromString(info.SerializeToString())
    assert_views_equal(RankView.from_pb(wire), view)


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf, 0.0])
def test_rank_info_round_trip_keeps_any_loss(loss: float) -> None:
    back = RankView.from_pb(pb.RankInfo.FromString(full_view(loss=loss).to_pb().SerializeToString()))
    assert same(back.loss, loss)


def test_an_unknown_rank_state_reads_as_registered() -> None:
    assert RankView.from_pb(pb.RankInfo(rank=1)).state is RankState.REGISTERED
    assert RankView.from_pb(pb.RankInfo(rank=1, state=pb.RANK_LOST)).state is RankState.LOST


# -- JSON ----------------------------------------------------------------------------------


def test_as_dict_has_every_field_with_the_states_name() -> None:
    d = full_view(RankState.STOPPED).as_dict()
    assert list(d) == FIELD_NAMES
    assert d["state"] == "STOPPED"
    assert d["loss"] == 0.25 and d["dropped_points"] == 17
    json.dumps(d, allow_nan=False)


@pytest.mark.parametrize(("loss", "text"), [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")])
def test_as_dict_writes_a_loss_json_has_no_number_for_as_text(loss: float, text: str) -> None:
    d = full_view(loss=loss).as_dict()
    assert d["loss"] == text
    json.dumps(d, allow_nan=False)  # strict JSON: no NaN or Infinity literal


@pytest.mark.parametrize("loss", [0.25, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("state", [RankState.SUCCEEDED, RankState.LOST])
def test_json_round_trip_through_the_run_dirs_reader(loss: float, state: RankState) -> None:
    view = full_view(state, loss)
    stored = json.loads(json.dumps(view.as_dict(), allow_nan=False))
    back = RankView.from_fields(_Fields(stored, "result.json"), state)
    want = dataclasses.replace(view, **LIVE_ONLY)  # the live-only fields read as unknown
    assert_views_equal(back, want)


class DictReader:
    """A minimal FieldReader over a dict, which records what was asked for, by which method."""

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value
        self.asked: dict[str, str] = {}

    def _get(self, how: str, key: str, default: Any) -> Any:
        self.asked[key] = how
        return self.value.get(key, default)

    def integer(self, key: str, default: int | None = 0) -> int:
        v = self._get("integer", key, default)
        assert isinstance(v, int), key
        return v

    def text(self, key: str, default: str = "") -> str:
        return str(self._get("text", key, default))

    def number(self, key: str, default: float = 0.0) -> float:
        return float(self._get("number", key, default))

    def flag(self, key: str, default: bool = False) -> bool:
        return bool(self._get("flag", key, default))

    def numbers(self, key: str) -> dict[str, float]:
        return dict(self._get("numbers", key, {}))


def test_from_fields_reads_each_field_by_its_type() -> None:
    reader = DictReader(full_view().as_dict())
    RankView.from_fields(reader, RankState.FAILED)
    assert reader.asked == {
        "rank": "integer",
        "worker_id": "text",
        "host": "text",
        "pid": "integer",
        "step": "integer",
        "total_steps": "integer",
        "steps_per_sec": "number",
        "loss": "number",
        "param_checksum": "text",
        "error": "text",
        "exit_code": "integer",
        "address": "text",
        "has_loss": "flag",
        "dropped_points": "integer",
        "timed": "flag",
        "step_ms": "number",
        "data_ms": "number",
        "compute_ms": "number",
        "collective_ms": "number",
        "other_ms": "number",
        "relative_score": "number",
        "individual_score": "number",
        "slow_in": "text",
        "stack": "text",
        "rss_bytes": "integer",
        "cpu_percent": "number",
        "cuda_allocated": "integer",
        "cuda_reserved": "integer",
        "cuda_peak": "integer",
        "cuda_total": "integer",
        "memory_limit": "integer",
        "limit_kind": "text",
        "memory_note": "text",
        "note": "text",
        "dropped_reason": "text",
        "timed_by": "text",
        "section_ms": "numbers",
    }


def test_from_fields_takes_the_state_it_is_given_and_ignores_live_values() -> None:
    stored = full_view(RankState.RUNNING).as_dict()
    back = RankView.from_fields(DictReader(stored), RankState.LOST)
    assert back.state is RankState.LOST
    assert (back.heartbeat_age, back.progress_age) == (-1.0, -1.0)
    assert back.steps_per_sec == 12.5  # a record keeps each rank's mean rate


def test_from_fields_of_a_sparse_object_reads_the_defaults() -> None:
    back = RankView.from_fields(DictReader({"rank": 2}), RankState.SUCCEEDED)
    assert_views_equal(back, RankView(rank=2, state=RankState.SUCCEEDED))
    assert math.isnan(back.loss) and not back.has_loss and back.dropped_points == 0


def test_from_fields_needs_the_rank() -> None:
    with pytest.raises(OrchError) as info:
        RankView.from_fields(_Fields({"worker_id": "w"}, "result.json"), RankState.FAILED)
    assert "result.json: 'rank' is missing" in str(info.value)


# -- what the record says of itself --------------------------------------------------------


@pytest.mark.parametrize(
    ("has_loss", "loss", "diverged", "text"),
    [
        (False, math.nan, False, "-"),
        (True, 0.123456, False, "0.1235"),
        (True, 1.0678e-06, False, "1.068e-06"),  # four significant digits, never 0.0000
        (True, math.nan, True, "nan"),
        (True, math.inf, True, "inf"),
        (True, -math.inf, True, "-inf"),
    ],
)
def test_loss_text_and_divergence(has_loss: bool, loss: float, diverged: bool, text: str) -> None:
    view = RankView(rank=0, loss=loss, has_loss=has_loss)
    assert view.diverged is diverged
    assert view.loss_text() == text

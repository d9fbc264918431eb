"""orch.master.control.intake: what the ranks send, taken into memory: registration and
heartbeats, refused before anything is recorded when they come from the wrong caller."""

from __future__ import annotations

import math

import pytest

from orch.master.control.intake import Intake
from orch.master.control.validate import Reject
from orch.wire.limits import MAX_METRICS_PER_RANK
from orch.wire.model import Beat, Points, Registration, StepTiming
from orch.wire.states import RankState, RunState


def registered(world: int = 2) -> Intake:
    """Every rank of run r1 registered (w0, w1, ...) and let through the start barrier."""
    intake = Intake(world)
    for i in range(world):
        intake.register(Registration(worker_id=f"w{i}", host="h"), "r1", RunState.PENDING)
    for rec in intake.registry.ranks:
        rec.state = RankState.RUNNING
    return intake


def beat(worker_id: str = "w0", step: int = 1, run_id: str = "r1", **series: list[float]) -> Beat:
    req = Beat(run_id=run_id, worker_id=worker_id, step=step, total_steps=10, series=[])
    for name, values in series.items():
        req.series.append(Points(name=name, steps=list(range(len(values))), values=values))
    return req


def refusal(call: object, *args: object) -> Reject:
    with pytest.raises(Reject) as e:
        call(*args)  # type: ignore[operator]
    return e.value


def test_registration_is_idempotent_and_names_new_workers() -> None:
    intake = Intake(2)
    a, new = intake.register(Registration(worker_id="a"), "r1", RunState.PENDING)
    again, new_again = intake.register(Registration(worker_id="a"), "r1", RunState.PENDING)
    assert (a.rank, new) == (0, True) and again is a and not new_again


def test_an_ended_run_takes_no_new_worker_but_a_known_one_may_register_again() -> None:
    intake = registered()
    err = refusal(intake.register, Registration(worker_id="late"), "r1", RunState.FAILED)
    assert (err.kind, str(err)) == ("failed_precondition", "run r1 is already FAILED")
    rec, new = intake.register(Registration(worker_id="w0", run_id="r1"), "r1", RunState.FAILED)
    assert rec.rank == 0 and not new


def test_a_registration_naming_another_run_is_refused() -> None:
    err = refusal(Intake(2).register, Registration(worker_id="a", run_id="r0"), "r1", RunState.PENDING)
    assert err.kind == "failed_precondition" and "another run" in str(err)


def test_known_checks_the_id_the_run_and_the_worker() -> None:
    intake = registered()
    assert intake.known("r1", "w1", "r1").rank == 1
    assert refusal(intake.known, "r1", "", "r1").kind == "invalid_argument"
    assert refusal(intake.known, "r1", "x" * 300, "r1").kind == "invalid_argument"
    assert "Register first" in str(refusal(intake.known, "", "w1", "r1"))
    assert refusal(intake.known, "r0", "w1", "r1").kind == "failed_precondition"
    assert refusal(intake.known, "r1", "zz", "r1").kind == "not_found"


def test_a_heartbeat_moves_the_record_and_appends_its_points() -> None:
    intake = registered()
    rec = intake.beat(beat(step=3, loss=[3.0, 2.0], acc=[0.5]), "r1", 1, 50.0, 1e9)
    assert rec is intake.registry.ranks[0]
    assert (rec.step, rec.total_steps, rec.last_heartbeat, rec.beats) == (3, 10, 50.0, 1)
    assert rec.has_loss and rec.loss == 2.0
    loss = intake.points.get(0, "loss")
    assert list(loss.steps) == [0, 1] and list(loss.times) == [1e9, 1e9]  # no times sent: the wall's
    assert intake.points.points_in_memory == 3


def test_a_heartbeat_without_loss_keeps_the_last_one_and_timing_is_windowed() -> None:
    intake = registered()
    intake.beat(beat(loss=[math.inf]), "r1", 1, 50.0, 0.0)
    req = beat(step=2, acc=[1.0])
    req.timing = StepTiming(steps=5, step_seconds=0.5, collectives=True)
    rec = intake.beat(req, "r1", 1, 51.0, 0.0)
    assert rec.loss == math.inf and len(rec.timing.beats) == 1


def test_a_heartbeat_before_the_barrier_is_refused_and_records_nothing() -> None:
    intake = registered()
    intake.registry.ranks[1].state = RankState.REGISTERED
    err = refusal(intake.beat, beat("w1", loss=[1.0]), "r1", 1, 50.0, 0.0)
    assert err.kind == "failed_precondition" and "poll CanStartTraining" in str(err)
    assert intake.registry.ranks[1].beats == 0 and intake.points.points_in_memory == 0


def test_a_heartbeat_with_a_metric_too_many_is_refused_before_the_record_moves() -> None:
    intake = registered()
    for i in range(MAX_METRICS_PER_RANK):
        intake.beat(beat(**{f"m{i}": [0.0]}), "r1", 1, 50.0, 0.0)
    err = refusal(intake.beat, beat(step=9, extra=[0.0]), "r1", 1, 51.0, 0.0)
    assert err.kind == "invalid_argument"
    assert intake.registry.ranks[0].step == 1 and intake.registry.ranks[0].last_heartbeat == 50.0


def test_a_new_attempt_has_new_ranks_and_the_same_series() -> None:
    intake = registered()
    intake.beat(beat(loss=[1.0]), "r1", 1, 50.0, 0.0)
    points = intake.points
    intake.new_attempt(1)  # elastic: one rank left
    assert intake.registry.ranks == [] and intake.registry.world_size == 1
    assert intake.points is points and intake.points.points_in_memory == 1
    assert refusal(intake.known, "r1", "w0", "r1").kind == "not_found"

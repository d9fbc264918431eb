"""orch.master.control.straggler_watch: when the straggler judgement is made for a live run, and
what moves the mark. Ranks are bare :class:`RankRecord` objects fed step times; times are
plain floats."""

from __future__ import annotations

import pytest

from orch.master.control.registry import RankRecord
from orch.master.control.straggler_watch import JUDGE_EVERY, JUDGED_AT_ONCE, NOT_YET_JUDGED, StragglerWatch
from orch.wire.model import StepTiming
from orch.wire.states import RankState, RunState

R = RunState.RUNNING
EVEN = StepTiming(steps=10, step_seconds=0.400, collective_seconds=0.100, collectives=True)
SLOW = StepTiming(steps=10, step_seconds=0.400, collective_seconds=0.010, collectives=True)


def ranks(n: int = 4) -> list[RankRecord]:
    return [RankRecord(rank=i, worker_id=f"w{i}", state=RankState.RUNNING) for i in range(n)]


def feed(recs: list[RankRecord], now: float, slow: int | None = None) -> None:
    """Four beats from each rank at ``now`` (enough to push older ones out of the window):
    40 ms steps, 10 ms of them waiting in collectives, but for rank ``slow``, which computes
    longer and waits 1 ms (the others wait for it)."""
    for r in recs:
        for _ in range(4):
            r.timing.add(now, SLOW if r.rank == slow else EVEN)


def test_one_judgement_alone_does_not_mark_a_straggler_two_in_a_row_do() -> None:
    watch, recs = StragglerWatch(), ranks()
    feed(recs, 0.0, slow=2)
    assert watch.look(R, recs, 4, 0.0) is None
    assert watch.verdict is NOT_YET_JUDGED and all(r.slow_in == "" for r in recs)
    told = watch.look(R, recs, 4, JUDGE_EVERY)
    assert told is not None and (told.rank, told.section) == (2, "compute")
    assert told.note.startswith("rank 2 is the straggler, slow in compute")
    assert watch.verdict is told
    assert [r.slow_in for r in recs] == ["", "", "compute", ""]


def test_it_judges_at_most_once_every_second() -> None:
    watch, recs = StragglerWatch(), ranks()
    feed(recs, 0.0, slow=2)
    watch.look(R, recs, 4, 0.0)
    assert watch.look(R, recs, 4, JUDGE_EVERY - 0.01) is None  # too soon: not even counted
    assert watch.verdict is NOT_YET_JUDGED
    assert watch.look(R, recs, 4, JUDGE_EVERY) is not None


def test_a_big_run_is_judged_less_often_in_proportion_to_its_ranks() -> None:
    watch = StragglerWatch()
    assert watch.every(8) == watch.every(JUDGED_AT_ONCE) == JUDGE_EVERY
    assert watch.every(4 * JUDGED_AT_ONCE) == 4 * JUDGE_EVERY
    recs = ranks(2 * JUDGED_AT_ONCE)
    feed(recs, 0.0, slow=5)
    watch.look(R, recs, len(recs), 0.0)
    assert watch.look(R, recs, len(recs), 2 * JUDGE_EVERY - 0.01) is None  # too soon at this size
    told = watch.look(R, recs, len(recs), 2 * JUDGE_EVERY)
    assert told is not None and told.rank == 5


def test_each_straggler_is_told_once_and_a_new_one_again() -> None:
    watch, recs = StragglerWatch(), ranks()
    feed(recs, 0.0, slow=2)
    watch.look(R, recs, 4, 0.0)
    assert watch.look(R, recs, 4, 1.0) is not None
    assert watch.look(R, recs, 4, 2.0) is None and watch.verdict.rank == 2  # still it, not told again
    feed(recs, 10.0)  # an even spell: the mark leaves after two judgements agree
    assert watch.look(R, recs, 4, 10.0) is None and watch.verdict.rank == 2
    assert watch.look(R, recs, 4, 11.0) is None
    assert watch.verdict.judged and watch.verdict.rank == -1 and watch.verdict.note.startswith("no straggler")
    assert all(r.slow_in == "" for r in recs)
    feed(recs, 20.0, slow=2)  # the same straggler back: the log already names it
    watch.look(R, recs, 4, 20.0)
    assert watch.look(R, recs, 4, 21.0) is None and watch.verdict.rank == 2
    feed(recs, 30.0, slow=1)  # another one is news
    watch.look(R, recs, 4, 30.0)
    told = watch.look(R, recs, 4, 31.0)
    assert told is not None and told.rank == 1


def test_each_rank_shows_its_step_split_and_scores() -> None:
    watch, recs = StragglerWatch(), ranks()
    feed(recs, 0.0, slow=2)
    watch.look(R, recs, 4, 0.0)
    even, slow = recs[0], recs[2]
    assert even.timed and slow.timed
    assert (even.step_ms, even.collective_ms, even.data_ms, even.other_ms) == pytest.approx((40, 10, 0, 0))
    assert (even.compute_ms, slow.compute_ms) == pytest.approx((30, 39))
    assert (even.relative_score, slow.relative_score) == pytest.approx((1.0, 1.3))
    assert slow.individual_score == pytest.approx(1.0)  # its own best so far


def test_a_rank_without_step_times_is_shown_untimed_and_nothing_is_judged() -> None:
    watch, recs = StragglerWatch(), ranks(2)
    recs[0].timing.add(0.0, EVEN)
    watch.look(R, recs, 2, 0.0)
    watch.look(R, recs, 2, 1.0)
    assert recs[0].timed and not recs[1].timed
    assert not watch.verdict.judged
    assert watch.verdict.note == "not judged yet: too few steps (no step times yet from rank 1)"


def test_a_run_that_ends_before_any_step_time_says_not_judged_never_cannot() -> None:
    # At the start of every run, and in a run that fails at its 10th step before a heartbeat
    # carried step times: "not judged yet", and once it ended, "not judged: ... too few steps".
    watch, recs = StragglerWatch(), ranks(2)
    watch.look(R, recs, 2, 0.0)
    v = watch.verdict
    assert v.note == "not judged yet: too few steps (no rank has sent step times yet)"
    recs[1].state = RankState.FAILED  # a rank fails: the judgement stands from here
    assert watch.look(R, recs, 2, 1.0) is None and watch.verdict is v
    assert v.shown(run_ended=True) == (
        "not judged: the run ended after too few steps (no rank had sent step times)"
    )
    assert NOT_YET_JUDGED.shown(run_ended=True) == (
        "not judged: the run ended after too few steps (before the first judgement)"
    )


def test_ranks_with_their_timing_off_say_so() -> None:
    watch, recs = StragglerWatch(), ranks(2)
    for r in recs:
        r.timing.add(0.0, StepTiming(timed_by="off"))
    watch.look(R, recs, 2, 0.0)
    assert watch.verdict.note == (
        "stragglers cannot be judged: step timing is off (ORCH_STEP_TIMING=0) on rank 0, 1"
    )


def test_fewer_ranks_than_the_world_are_not_judged() -> None:
    watch, recs = StragglerWatch(), ranks(4)
    feed(recs, 0.0, slow=2)
    watch.look(R, recs, 5, 0.0)
    assert watch.look(R, recs, 5, 1.0) is None
    assert watch.verdict.note == "not judged yet: 4 of 5 ranks running (stragglers are judged once all run)"


@pytest.mark.parametrize(
    "state", [RunState.PENDING, RunState.RESTARTING, RunState.FAILED, RunState.SUCCEEDED]
)
def test_only_a_training_run_is_judged(state: RunState) -> None:
    watch, recs = StragglerWatch(), ranks()
    feed(recs, 0.0, slow=2)
    assert watch.look(state, recs, 4, 0.0) is None and watch.look(state, recs, 4, 1.0) is None
    assert watch.verdict is NOT_YET_JUDGED and not recs[0].timed
    watch.look(RunState.STOPPING, recs, 4, 1.0)  # a stopping run still trains: judged at once
    assert recs[0].timed


def test_once_a_rank_ended_the_last_judgement_stands() -> None:
    watch, recs = StragglerWatch(), ranks()
    feed(recs, 0.0, slow=2)
    watch.look(R, recs, 4, 0.0)
    watch.look(R, recs, 4, 1.0)
    recs[3].state = RankState.SUCCEEDED
    feed(recs, 10.0)
    for t in (10.0, 11.0, 12.0):
        assert watch.look(R, recs, 4, t) is None
    assert watch.verdict.rank == 2 and recs[2].slow_in == "compute"


def test_a_new_attempt_is_judged_afresh_and_its_straggler_told_again() -> None:
    watch, recs = StragglerWatch(), ranks()
    feed(recs, 0.0, slow=2)
    watch.look(R, recs, 4, 0.0)
    watch.look(R, recs, 4, 1.0)
    watch.new_attempt()
    assert watch.verdict is NOT_YET_JUDGED
    fresh = ranks()
    feed(fresh, 5.0, slow=2)
    assert watch.look(R, fresh, 4, 5.0) is None  # the judgement before a restart counts for nothing
    told = watch.look(R, fresh, 4, 6.0)
    assert told is not None and told.rank == 2


def test_a_rank_that_marks_no_step_while_its_peers_do_cannot_be_judged_not_too_few_steps() -> None:
    """``if ctx.rank == 0: ctx.log(step, ...)`` in a plain loop: rank 1 never marks a step. The
    run once said "not judged yet: too few steps" for all of its 60 steps, and its record "the
    run ended after too few steps"."""
    watch, recs = StragglerWatch(), ranks(2)
    logged = StepTiming(
        steps=10, step_seconds=0.4, collective_seconds=0.1, collectives=True, timed_by="ctx.log"
    )
    recs[0].timing.add(0.0, logged)
    watch.look(R, recs, 2, 0.0)
    assert watch.verdict.note.startswith("not judged yet: too few steps")  # rank 1 may be a beat behind
    for t in (0.5, 1.0, 1.5):
        recs[0].timing.add(t, logged)
    watch.look(R, recs, 2, JUDGE_EVERY + 1.5)
    v = watch.verdict
    assert not v.judged and v.note.startswith("stragglers cannot be judged: rank 1 has marked no step")
    assert "ctx.log" in v.note and v.shown(run_ended=True) == v.note  # a reason that stays
    recs[1].timing.add(2.0, logged)  # rank 1 marks its steps after all: judged
    watch.look(R, recs, 2, 2 * JUDGE_EVERY + 1.5)
    assert "marked no step" not in watch.verdict.note

"""orch.master.control.progress: a run whose ranks' steps stand still, told once, with the ranks'
stacks; the limit learned from the run's own pace. No coordinator, lock or clock."""

from __future__ import annotations

import pytest

from orch.master.control.judge import CauseKind
from orch.master.control.progress import HANG_FACTOR, HANG_FLOOR, ProgressWatch
from orch.master.control.registry import RankRecord, Registry
from orch.wire.model import Frame, Registration, Stack
from orch.wire.states import RankState, RunState

RUNNING = RunState.RUNNING


def ranks(world: int = 4, *, at: float = 100.0) -> list[RankRecord]:
    """``world`` ranks let through the barrier at ``at``."""
    reg = Registry(world)
    for i in range(world):
        reg.add(Registration(worker_id=f"w{i}", host="h", pid=10 + i), "r1")
    for rec in reg.ranks:
        reg.barrier(rec, open_=True, fixed_port=29500, backend="gloo", now=at)
    assert all(r.state is RankState.RUNNING for r in reg.ranks)
    return reg.ranks


def beat(recs: list[RankRecord], now: float, step: int) -> None:
    for r in recs:
        r.beat(now, step, 0, 0)


def stack(*frames: tuple[str, int, str, str, bool]) -> Stack:
    return Stack(frames=[Frame(file=f, line=n, function=fn, code=c, user=u) for f, n, fn, c, u in frames])


def at_a_steady_pace(recs: list[RankRecord], gap: float = 0.5, steps: int = 20) -> float:
    """Every rank advances one step every ``gap`` seconds from t=101; returns the last beat's time."""
    now = 101.0
    for step in range(1, steps + 1):
        beat(recs, now, step)
        now += gap
    return now - gap


def test_the_limit_is_learned_from_the_pace_with_a_floor_and_capped_by_hang_timeout() -> None:
    recs = ranks()
    at_a_steady_pace(recs, gap=5.0)
    assert ProgressWatch().limit(recs)[0] == pytest.approx(HANG_FACTOR * 5.0)
    fast = ranks()
    at_a_steady_pace(fast, gap=0.25)
    assert ProgressWatch().limit(fast)[0] == HANG_FLOOR  # 2.5 s would flag a slow evaluation
    assert ProgressWatch(hang_timeout=7.0).limit(recs) == (7.0, "hang_timeout=7s")


def test_the_first_advance_holds_start_up_and_teaches_no_pace() -> None:
    recs = ranks()
    beat(recs, 400.0, 1)  # 300 s of start-up before the first step
    assert all(not r.gaps for r in recs)
    beat(recs, 401.0, 2)
    assert [list(r.gaps) for r in recs] == [[1.0]] * 4


def test_a_stall_is_told_once_with_the_ranks_stacks_and_ends_when_they_move() -> None:
    recs = ranks()
    last = at_a_steady_pace(recs, gap=0.5)
    watch = ProgressWatch(hang_timeout=5.0)
    assert watch.look(RUNNING, recs, last + 4.9) == ([], None)
    tells, cause = watch.look(RUNNING, recs, last + 5.5)
    assert cause is None
    assert [t.kind for t in tells] == ["not_progressing"]
    assert tells[0].message.startswith("no progress for 6s: ranks 0-3 at step 20 (limit 5s: hang_timeout=5s)")
    assert all(r.stack_wanted for r in recs)  # every running rank is asked for its stack
    assert watch.look(RUNNING, recs, last + 6.0) == ([], None)  # told once; the stacks are awaited
    waits = ("/site/torch/autograd/graph.py", 9, "_engine_run_backward", "run_backward(", False)
    for r in recs:
        own = ("train.py", 12, "train", "loss.backward()", True)
        if r.rank == 1:
            r.take_stack(stack(("train.py", 10, "train", "time.sleep(10**6)", True)), last + 6.1)
        else:
            r.take_stack(stack(own, waits), last + 6.1)
    tells, _ = watch.look(RUNNING, recs, last + 6.2)
    assert [t.kind for t in tells] == ["stacks"]
    assert tells[0].message.splitlines()[:2] == [
        "ranks 0, 2, 3: in `loss.backward()` (train.py, line 12) → _engine_run_backward "
        "(the backward pass: DDP all-reduces the gradients in it)",
        "rank 1 (the odd one out): in `time.sleep(10**6)` (train.py, line 10)",
    ]
    assert watch.stalled_for(last + 10.0) == pytest.approx(10.0)
    beat(recs, last + 11.0, 21)
    tells, _ = watch.look(RUNNING, recs, last + 11.0)
    assert [t.kind for t in tells] == ["progressing"]
    assert watch.note(last + 11.0) == "" and watch.stalled_for(last + 11.0) == 0.0


def test_ranks_that_never_answer_are_named_and_a_frozen_one_is_told_apart() -> None:
    recs = ranks(2)
    last = at_a_steady_pace(recs, gap=0.5)
    watch = ProgressWatch(hang_timeout=5.0)
    watch.look(RUNNING, recs, last + 6.0)
    recs[0].take_stack(stack(("train.py", 3, "train", "x()", True)), last + 6.1)
    recs[0].last_heartbeat = recs[1].last_heartbeat = last + 6.1
    recs[1].last_heartbeat = last  # its heartbeats stopped with its step: a frozen process
    tells, _ = watch.look(RUNNING, recs, last + 11.5)  # past the stack wait
    text = tells[0].message
    assert "rank 0: in `x()` (train.py, line 3)" in text
    assert "rank 1: no stack (its heartbeats stopped too: the whole process is frozen" in text


def test_on_hang_fail_gives_a_root_cause_with_the_stacks() -> None:
    recs = ranks(2)
    last = at_a_steady_pace(recs, gap=0.5)
    watch = ProgressWatch(hang_timeout=5.0, on_hang="fail")
    watch.look(RUNNING, recs, last + 6.0)
    for r in recs:
        r.take_stack(stack(("train.py", 7, "train", "dist.barrier()", True)), last + 6.1)
    _, cause = watch.look(RUNNING, recs, last + 6.2)
    assert cause is not None and cause.kind is CauseKind.HUNG and cause.record is None
    assert cause.message.startswith("no progress for 6s: ranks 0, 1 at step 20")
    assert cause.message.endswith("on_hang='fail' ended it")
    assert "ranks 0, 1: in `dist.barrier()` (train.py, line 7)" in cause.error
    assert watch.look(RUNNING, recs, last + 7.0) == ([], None)  # the cause is given once


def test_before_the_first_step_start_up_has_its_own_limit() -> None:
    recs = ranks(2, at=100.0)
    watch = ProgressWatch(hang_timeout=5.0, startup_timeout=60.0)
    assert watch.look(RUNNING, recs, 150.0) == ([], None)  # importing, loading data: not a hang
    tells, _ = watch.look(RUNNING, recs, 161.0)
    assert tells[0].message == "no progress for 61s: ranks 0, 1 before their first step (start-up limit 60s)"


def test_a_run_that_is_not_running_is_not_watched() -> None:
    recs = ranks(2)
    last = at_a_steady_pace(recs)
    watch = ProgressWatch(hang_timeout=1.0)
    for state in (RunState.STOPPING, RunState.RESTARTING, RunState.FAILED):
        assert watch.look(state, recs, last + 100) == ([], None)
    recs[0].state = RankState.SUCCEEDED  # an ended rank stands still by right
    tells, _ = watch.look(RUNNING, recs, last + 100)
    assert "rank 1 at step 20" in tells[0].message


def test_on_hang_must_be_warn_or_fail() -> None:
    with pytest.raises(ValueError, match="on_hang must be one of"):
        ProgressWatch(on_hang="retry")

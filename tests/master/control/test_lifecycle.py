"""orch.master.control.lifecycle: the run's state machine (the TRANSITIONS table), attempts and timing."""

from __future__ import annotations

import itertools

import pytest

from orch.master.control.lifecycle import TRANSITIONS, IllegalTransition, Lifecycle
from orch.wire.states import RunState

S = RunState

# The transitions the RunState docstring promises, written out again: a change to the table
# must be a change to this test too.
EXPECTED: dict[RunState, set[RunState]] = {
    S.PENDING: {S.RUNNING, S.FAILED, S.STOPPED, S.PRUNED},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.STOPPED, S.PRUNED, S.STOPPING, S.RESTARTING},
    S.STOPPING: {S.STOPPED, S.PRUNED, S.FAILED},
    S.RESTARTING: {S.PENDING, S.FAILED, S.STOPPED, S.PRUNED},
    S.SUCCEEDED: set(),
    S.FAILED: set(),
    S.STOPPED: set(),
    S.PRUNED: set(),
}
PAIRS = list(itertools.product(RunState, RunState))


def name(state: RunState) -> str:
    return state.value


def at(state: RunState) -> Lifecycle:
    """A lifecycle in ``state``."""
    lc = Lifecycle(max_attempts=3)
    lc.state = state
    return lc


def test_the_table_is_the_documented_one() -> None:
    assert set(TRANSITIONS) == set(RunState)
    assert {k: set(v) for k, v in TRANSITIONS.items()} == EXPECTED


def test_final_states_have_no_way_out() -> None:
    for state in RunState:
        assert (TRANSITIONS[state] == frozenset()) is state.done


@pytest.mark.parametrize(("old", "new"), [p for p in PAIRS if p[1] in EXPECTED[p[0]]], ids=name)
def test_every_allowed_transition_works(old: RunState, new: RunState) -> None:
    lc = at(old)
    lc.to(new, 10.0)
    assert lc.state is new
    assert lc.attempt == (2 if new is S.PENDING else 1)
    assert lc.started_at == (10.0 if new is S.RUNNING else None)
    assert lc.ended_at == (10.0 if new.done else None)


@pytest.mark.parametrize(("old", "new"), [p for p in PAIRS if p[1] not in EXPECTED[p[0]]], ids=name)
def test_every_other_transition_is_illegal(old: RunState, new: RunState) -> None:
    lc = at(old)
    before = (lc.attempt, lc.started_at, lc.ended_at)
    with pytest.raises(IllegalTransition) as info:
        lc.to(new, 10.0)
    assert str(info.value) == f"a run cannot go from {old.value} to {new.value}"
    assert lc.state is old
    assert (lc.attempt, lc.started_at, lc.ended_at) == before


def test_a_new_lifecycle_is_pending_in_attempt_one() -> None:
    lc = Lifecycle()
    assert (lc.state, lc.attempt, lc.max_attempts) == (S.PENDING, 1, 1)
    assert lc.started_at is None and lc.ended_at is None
    assert lc.elapsed(100.0) == 0.0


def test_running_starts_the_clock_and_an_end_stops_it() -> None:
    lc = Lifecycle()
    lc.to(S.RUNNING, 10.0)
    assert lc.started_at == 10.0 and lc.ended_at is None
    assert lc.elapsed(15.0) == 5.0
    lc.to(S.STOPPING, 20.0)
    assert lc.ended_at is None and lc.elapsed(25.0) == 15.0
    lc.to(S.STOPPED, 30.0)
    assert lc.ended_at == 30.0
    assert lc.elapsed(1000.0) == 20.0  # an ended run's time stands


@pytest.mark.parametrize("end", [S.SUCCEEDED, S.FAILED, S.STOPPED])
def test_every_final_state_records_when_the_run_ended(end: RunState) -> None:
    lc = Lifecycle()
    lc.to(S.RUNNING, 1.0)
    lc.to(end, 4.0)
    assert lc.ended_at == 4.0 and lc.elapsed(9.0) == 3.0


def test_the_clock_starts_at_the_launch_and_counts_start_up() -> None:
    """One clock: the header, the terminal and the final line count from the launch, through
    the start-up (16 s of it, say) and training, not from the first barrier."""
    lc = Lifecycle(created_at=100.0)
    assert lc.elapsed(109.0) == 9.0  # PENDING, starting up: the clock runs
    lc.to(S.RUNNING, 116.0)
    assert lc.elapsed(121.5) == 21.5
    lc.to(S.SUCCEEDED, 121.5)
    assert lc.elapsed(500.0) == 21.5


def test_a_run_that_never_started_took_no_time() -> None:
    lc = Lifecycle()
    lc.to(S.FAILED, 5.0)
    assert lc.started_at is None and lc.ended_at == 5.0
    assert lc.elapsed(9.0) == 0.0


def test_each_pending_is_a_new_attempt() -> None:
    lc = Lifecycle(max_attempts=3)
    lc.to(S.RUNNING, 1.0)
    lc.to(S.RESTARTING, 2.0)
    assert lc.attempt == 1 and lc.ended_at is None  # not final
    lc.to(S.PENDING, 3.0)
    assert lc.attempt == 2
    lc.to(S.RUNNING, 4.0)
    assert lc.started_at == 4.0  # this attempt's barrier
    assert lc.elapsed(6.0) == 5.0  # the run's one clock goes on across attempts
    lc.to(S.RESTARTING, 5.0)
    lc.to(S.PENDING, 6.0)
    assert lc.attempt == 3
    lc.to(S.RUNNING, 7.0)
    lc.to(S.FAILED, 9.0)
    assert (lc.attempt, lc.started_at, lc.ended_at) == (3, 7.0, 9.0)

"""orch.master.control.stopping: a stop asked once and counted after, and the one step every
rank stops at. The ranks are bare :class:`RankRecord` objects with a progress history."""

from __future__ import annotations

import pytest

from orch.master.control.registry import RankRecord
from orch.master.control.stopping import STOP_LEAD_SECONDS, StopOrder, stop_step


def rank(n: int, *points: tuple[float, int]) -> RankRecord:
    """Rank ``n`` that was at step s at time t for each (t, s), in order."""
    rec = RankRecord(rank=n, worker_id=f"w{n}")
    for t, s in points:
        rec.progress.append((t, s))
        rec.step = s
    return rec


def test_only_the_first_request_sets_the_stop_and_every_one_is_counted() -> None:
    stop = StopOrder()
    assert (stop.requested, stop.requests, stop.at_step) == (False, 0, 0)
    assert stop.ask(done=False)
    assert [stop.ask(done=False) for _ in range(999)] == [False] * 999
    assert stop.requested and stop.requests == 1000


def test_a_request_after_the_end_is_counted_but_sets_nothing() -> None:
    stop = StopOrder()
    assert not stop.ask(done=True)
    assert not stop.requested and stop.requests == 1


def test_a_new_attempt_clears_the_step_but_keeps_the_stop() -> None:
    stop = StopOrder()
    stop.ask(done=False)
    stop.at_step = 140
    stop.new_attempt()
    assert stop.at_step == 0 and stop.requested and stop.requests == 1


def test_the_stop_step_is_ahead_of_the_furthest_rank_by_the_fastest_ranks_lead() -> None:
    fast = rank(0, (0.0, 0), (5.0, 100))  # 20 steps/s, at step 100
    slow = rank(1, (0.0, 0), (5.0, 99))
    assert stop_step([fast, slow]) == 100 + int(20 * STOP_LEAD_SECONDS)
    # The furthest rank need not be the fastest: the lead is the fastest's, from the furthest.
    behind_but_fast = rank(2, (0.0, 0), (1.0, 50))  # 50 steps/s
    assert stop_step([fast, behind_but_fast]) == 100 + int(50 * STOP_LEAD_SECONDS)


@pytest.mark.parametrize(
    ("ranks", "step"),
    [
        ([], 2),  # no rank registered: at least two steps ahead of 0
        ([RankRecord(rank=0, step=7)], 9),  # no rate yet
        ([RankRecord(rank=0, step=7), RankRecord(rank=1, step=3)], 9),
    ],
)
def test_the_stop_step_is_at_least_two_steps_ahead(ranks: list[RankRecord], step: int) -> None:
    assert stop_step(ranks) == step


def test_a_fractional_lead_rounds_up() -> None:
    slow = rank(0, (0.0, 0), (4.0, 1))  # 0.25 steps/s: half a step in the lead, at least 2
    assert stop_step([slow]) == 1 + 2
    odd = rank(0, (0.0, 0), (2.0, 3))  # 1.5 steps/s: 3.0 steps of lead
    assert stop_step([odd]) == 3 + 3
    odd2 = rank(0, (0.0, 0), (4.0, 7))  # 1.75 steps/s: 3.5 steps, rounded up to 4
    assert stop_step([odd2]) == 7 + 4


def test_a_stop_while_the_ranks_wait_at_a_sweeps_rung_ends_their_loops_right_after_it() -> None:
    """Rung 9: every rank logged steps up to 9 (9 + 1 = 10 steps done) or fewer and waits there;
    a loop without ctx.steps ends after step 9, not 2 s of steps later."""
    at_rung = rank(0, (0.0, 0), (0.5, 10))  # 20 steps/s
    behind = rank(1, (0.0, 0), (0.5, 8))
    assert stop_step([at_rung, behind], gate=9) == 10
    # A rank already past the rung (it did not wait there) gets the usual lead.
    past = rank(1, (0.0, 0), (0.6, 12))  # 20 steps/s too
    assert stop_step([at_rung, past], gate=9) == 12 + int(20 * STOP_LEAD_SECONDS)

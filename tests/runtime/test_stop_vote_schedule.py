"""The stop vote's spacing, on ranks simulated in one thread: a stand-in all-reduce (the MAX of
every rank's flag of the same vote) and an injected clock, no process group."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from orch.runtime import _stop_vote
from orch.runtime._stop_vote import MAX_SPACING, VOTE_EVERY_S, StopVote


class _World:
    """Every rank's votes, in order: the n-th vote of each rank is one all-reduce."""

    def __init__(self, size: int) -> None:
        self.votes: list[_Vote] = []
        self.cast = [0] * size

    def all_reduce(self, tensor: torch.Tensor, op: Any, group: Any, async_op: bool) -> Any:
        world, rank = group
        n = world.cast[rank]
        world.cast[rank] += 1
        if n == len(world.votes):
            world.votes.append(_Vote())
        world.votes[n].flags.append(tensor)
        return world.votes[n]


class _Vote:
    """One all-reduce, done at the first wait (every rank cast it by then: they run in lockstep)."""

    def __init__(self) -> None:
        self.flags: list[torch.Tensor] = []
        self.done = False

    def wait(self) -> None:
        if not self.done:
            self.done = True
            reduced = torch.stack(self.flags).max(dim=0).values
            for flag in self.flags:
                flag.copy_(reduced)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> _World:
    w = _World(2)
    monkeypatch.setattr(_stop_vote.dist, "all_reduce", w.all_reduce)
    return w


def _loop(world: _World, step_s: float, steps: int, heard_at: tuple[int, int] = (-1, -1), **cast: Any) -> Any:
    """Two ranks in lockstep, ``step_s`` seconds a step: the step each left at (None: ran to the end)."""
    clock = _Clock()
    votes = [StopVote((world, r), clock=clock) for r in (0, 1)]
    left: list[int | None] = [None, None]
    for step in range(steps):
        for r, vote in enumerate(votes):
            if left[r] is None and vote.cast(0 <= heard_at[r] <= step, **cast.get(f"rank{r}", {})):
                left[r] = step
        if None not in left:
            break
        clock.now += step_s
    return left, votes


def test_fast_steps_vote_about_every_tenth_of_a_second(world: _World) -> None:
    left, votes = _loop(world, 0.001, 3000)
    assert left == [None, None]
    spacing = round(VOTE_EVERY_S / 0.001)
    assert votes[0].spacing == votes[1].spacing and spacing - 1 <= votes[0].spacing <= spacing
    # the first two calls vote (no pace known yet), then one vote per spacing
    assert votes[0].votes == votes[1].votes <= 2 + 3000 // spacing + 1


def test_slow_steps_vote_every_step_and_tiny_ones_at_most_every_max_spacing(world: _World) -> None:
    _, slow = _loop(world, 0.5, 50)
    assert [v.spacing for v in slow] == [1, 1] and slow[0].votes == 50
    tiny = _World(2)
    _stop_vote.dist.all_reduce = tiny.all_reduce  # type: ignore[attr-defined]
    _, fast = _loop(tiny, 1e-6, 5000)
    assert [v.spacing for v in fast] == [MAX_SPACING, MAX_SPACING]


@pytest.mark.parametrize("heard_at", [(1500, 2900), (2900, 1500), (1000, 1000), (0, -1)])
def test_ranks_that_hear_at_different_steps_leave_at_the_same_one_within_two_spacings(
    world: _World, heard_at: tuple[int, int]
) -> None:
    left, votes = _loop(world, 0.001, 5000, heard_at)
    first = min(h for h in heard_at if h >= 0)
    assert left[0] == left[1] is not None, left
    assert first < left[0] <= first + 2 * votes[0].spacing + 1, (left, votes[0].spacing)


def test_a_rank_that_knows_a_rung_or_has_not_heard_the_master_makes_every_rank_vote_each_step(
    world: _World,
) -> None:
    _, votes = _loop(world, 0.001, 400, rank1={"hold": 30})
    assert [v.spacing for v in votes] == [1, 1] and votes[0].votes == 400
    assert [v.hold for v in votes] == [30, 30]  # agreed by every rank: each holds at the rung
    other = _World(2)
    _stop_vote.dist.all_reduce = other.all_reduce  # type: ignore[attr-defined]
    _, votes = _loop(other, 0.001, 400, rank0={"space": False})
    assert [v.spacing for v in votes] == [1, 1] and votes[0].votes == 400


def test_the_spacing_follows_the_pace_when_steps_grow_slower(world: _World) -> None:
    clock = _Clock()
    votes = [StopVote((world, r), clock=clock) for r in (0, 1)]
    for step in range(2000):
        for vote in votes:
            vote.cast(False)
        clock.now += 0.001 if step < 1000 else 0.05
    assert [v.spacing for v in votes] == [2, 2]

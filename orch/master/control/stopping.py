"""A stop asked of a run: the one request that sets it, a count of the rest, and the step where
loops without ``ctx.steps`` end. :class:`.fate.Fate` carries a stop out.

A stop reaches the ranks in their heartbeats' replies, each rank at its own moment. Ranks in a
DDP group must leave their collectives at the same step, or the ones still in an all-reduce
wait for peers that left; so the master names one step for all, far enough ahead of the
fastest rank that each hears of it before it gets there (:func:`stop_step`). A stop is asked
by people and scripts, as often as they like: only the request that sets it is news.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orch.master.control.registry import RankRecord
from orch.wire.states import RunState

STOP_LEAD_SECONDS = 2.0  # how far ahead of the ranks a stop step is set
STOP_GRACE = 10.0  # seconds ranks get to reach the stop before they are terminated


def stop_step(ranks: Sequence[RankRecord], gate: int = 0) -> int:
    """Where loops without ``ctx.steps`` end: one step count for every rank, far enough ahead
    (``STOP_LEAD_SECONDS`` of the fastest rank's steps, at least 2) that each rank hears of it
    before it gets there, so all leave their DDP collectives at the same step.

    ``gate``: a sweep's rung (a step) that every rank waits after until the sweep decides, and
    that each rank knew of before it got there. While no rank is past it, the loops end right
    after it: a pruned trial's plain loop (``ctx.data``, ``ctx.log`` alone) ends at its rung."""
    farthest = max((r.step for r in ranks), default=0)
    if gate > 0 and farthest <= gate + 1:
        return gate + 1  # steps done: ``ctx.log`` given step ``gate`` ends the loop
    ahead = max((r.steps_per_second() for r in ranks), default=0.0) * STOP_LEAD_SECONDS
    return farthest + max(2, math.ceil(ahead))


class StopOrder:
    """Whether a stop was asked for, how often, and the step it ends loops at."""

    def __init__(self) -> None:
        self.requested = False  # a stop was asked for (it carries over a restart)
        self.prune = False  # the stop that was set is a sweep's pruner's: the run ends PRUNED
        self.requests = 0  # every StopRun; only the one that set the stop is an event
        self.at_step = 0  # with a stop: the step count loops without ctx.steps end at
        self.asked_at: float | None = None  # the master's clock: when the running ranks were told
        self.stacks_asked = False  # the stop is late: the ranks' stacks were asked for
        self.note = ""  # how the stop ended, when it had to end ranks that never reached a step

    @property
    def ended(self) -> RunState:
        """The state a run this stop ends is in: STOPPED, or PRUNED for a pruner's stop."""
        return RunState.PRUNED if self.prune else RunState.STOPPED

    def ask(self, done: bool) -> bool:
        """Count one request; True when it is the one that sets the stop. The ones after it (a
        user clicking Stop again, a script in a loop), and any after the run is ``done``, are
        only counted: what callers make the master hold stays bounded."""
        self.requests += 1
        if done or self.requested:
            return False
        self.requested = True
        return True

    def new_attempt(self) -> None:
        """The next attempt counts its steps afresh: no stop step yet. A stop asked for stays."""
        self.at_step = 0
        self.asked_at = None
        self.stacks_asked = False

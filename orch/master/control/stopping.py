"""A stop asked of a run: the one request that sets it, a count of the rest, and the step where
loops without ``ctx.steps`` end; and :class:`Stops`, how the run's fate carries a stop out.

A stop reaches the ranks in their heartbeats' replies, each rank at its own moment. Ranks in a
DDP group must leave their collectives at the same step, or the ones still in an all-reduce
wait for peers that left; so the master names one step for all, far enough ahead of the
fastest rank that each hears of it before it gets there (:func:`stop_step`). A stop is asked
by people and scripts, as often as they like: only the request that sets it is news.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from orch.master.control.lifecycle import Lifecycle
from orch.master.control.registry import RankRecord, Registry
from orch.wire.stacks import ranks_text
from orch.wire.states import RankState, RunState

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


class Stops:
    """A stop as the run's fate carries it out (a part of :class:`.fate.Fate`): asked, reached
    at the stop step, or, when ranks do not get there within the grace, forced."""

    stop: StopOrder
    lifecycle: Lifecycle
    _tell: Callable[[str, int, str], None]
    _changed: Callable[[], None]

    if TYPE_CHECKING:  # the fate's own (declared here for the type checker only)

        @property
        def state(self) -> RunState: ...

        def finish(self, state: RunState, now: float) -> None: ...

        def _force_end(self, ranks: list[RankRecord], state: RankState, why: str, now: float) -> None: ...

    def request_stop(
        self, reason: str, registry: Registry, now: float, *, prune: bool = False, gate: int = 0
    ) -> RunState:
        """Ask the ranks to stop (see :class:`.stopping.StopOrder`); returns the run's state.
        A ``prune`` stop (a sweep's pruner's) ends the run PRUNED where a stop ends it STOPPED.
        ``gate``: a sweep's rung the ranks wait after (0: none); no rank past it, a loop without
        ctx.steps ends there (see :func:`.stopping.stop_step`)."""
        if not self.stop.ask(self.state.done):
            return self.state
        self.stop.prune = prune
        self._tell("pruned" if prune else "stop_requested", -1, reason or "stop requested")
        if self.state is RunState.PENDING:
            self.finish(self.stop.ended, now)
        elif self.state is RunState.RUNNING:
            self.lifecycle.to(RunState.STOPPING, now)
            self.stop.at_step = stop_step(registry.ranks, gate)
            self.stop.asked_at = now
            self._changed()
        return self.state  # RESTARTING: the launcher ends the run instead of restarting it

    def overdue_stop(self, registry: Registry, now: float, grace: float) -> bool:
        """A stop the ranks did not reach within ``grace`` seconds (ranks stuck in a collective
        never reach their next step): the ranks left are ended (their heartbeats' replies say
        ABORT; the launcher terminates what does not go) and the run is STOPPED, saying so.
        Half way through, their stacks are asked for, to show where they were stuck. True when
        the stacks are to be asked for now."""
        asked = self.stop.asked_at
        if self.state is not RunState.STOPPING or asked is None:
            return False
        left = [r for r in registry.ranks if not r.state.done]
        if now - asked <= grace or not left:
            if now - asked > grace / 2 and left and not self.stop.stacks_asked:
                self.stop.stacks_asked = True
                return True
            return False
        note = (
            f"stopped; {ranks_text([r.rank for r in left])} did not reach a step boundary within "
            f"{grace:g}s and {'was' if len(left) == 1 else 'were'} terminated"
        )
        self.stop.note = note
        self._tell("stop_escalated", -1, note)
        self._force_end(
            left,
            RankState.STOPPED,
            f"did not reach a step boundary within {grace:g}s of the stop: terminated",
            now,
        )
        self.finish(self.stop.ended, now)
        return False

"""Whether the ranks' steps advance: a hang shown as a hang, with every rank's stack.

A rank's heartbeats prove its process lives (a thread of their own sends them), not that its
training loop moves: a rank blocked in its own code, or waiting in an all-reduce for a peer
that never comes, beats on forever. So the master also watches each rank's step. A running
rank whose step has not advanced for longer than the run's *hang limit* is not progressing:

- past its first step, the limit is learned from the run's own pace: :data:`HANG_FACTOR` times
  the median time between the advances the master saw (at least :data:`HANG_FLOOR` seconds),
  capped by the user's ``hang_timeout``;
- before its first step, start-up (imports, data loading, the first collective) gets
  ``startup_timeout``.

When the run stops progressing, the master asks every running rank for its training thread's
stack (in its next heartbeat's reply), tells the event log which ranks stand still and where,
and, as :class:`.policies.HangPolicy` decides (``on_hang="fail"``), fails the run with that as
its root cause. The words and the
grouped stacks are what the panel, the dashboard and ``orch status`` show.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orch.master.control.judge import RootCause
from orch.master.control.policies import HangPolicy
from orch.master.control.registry import RankRecord
from orch.wire.stacks import Stacks, group, ranks_text
from orch.wire.states import RankState, RunState

HANG_FACTOR = 10.0  # a limit of 10x the usual time between advances: no pace wobbles that much
HANG_FLOOR = 30.0  # seconds; below it, a slow evaluation or checkpoint would read as a hang
STARTUP_TIMEOUT = 600.0  # seconds to the first step: imports, data sets, the first collective
STACK_WAIT = 5.0  # seconds the master waits for the ranks' stacks before it tells without them
RECENT_GAPS = 4  # of each rank's gaps, the last ones make the pace: O(ranks) per look
LOOK_EVERY = 0.5  # seconds between looks (the expiry tick and every GetState call one)
FROZEN = "its heartbeats stopped too: the whole process is frozen (SIGSTOP, or native code holding the GIL)"


@dataclass
class Tell:
    """An event for the run's log."""

    kind: str
    rank: int
    message: str


class ProgressWatch:
    """The stall of one attempt: which ranks stand still, since when, their stacks, the policy."""

    def __init__(
        self,
        hang_timeout: float | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        on_hang: HangPolicy | str = "warn",
        heartbeat_interval: float = 0.25,
    ) -> None:
        self.hang_timeout = hang_timeout
        self.startup_timeout = startup_timeout
        self.on_hang = on_hang if isinstance(on_hang, HangPolicy) else HangPolicy.named(on_hang)
        self.heartbeat_interval = heartbeat_interval
        self.stalled: list[RankRecord] = []  # running ranks past their limit, at the last look
        self.since: float | None = None  # the master's clock: when the oldest of them last moved
        self._asked: float | None = None  # when the stacks of this stall were asked for
        self._told_stacks = False
        self._failed = False
        self._limit = (HANG_FLOOR, "")
        self.stacks: Stacks | None = None  # the grouped stacks last taken
        self.stacks_taken = 0.0  # unix seconds
        self._looked = -math.inf

    def new_attempt(self) -> None:
        """A restarted group is watched afresh."""
        self.stalled, self.since, self._asked = [], None, None
        self._told_stacks = self._failed = False

    # -- the limit ---------------------------------------------------------------------------
    def limit(self, ranks: Sequence[RankRecord]) -> tuple[float, str]:
        """The hang limit past a rank's first step, and how it was set (words for the note)."""
        gaps = [g for r in ranks for g in list(r.gaps)[-RECENT_GAPS:]]
        if gaps:
            median = statistics.median(gaps)
            learned = max(HANG_FACTOR * median, HANG_FLOOR)
            how = f"{HANG_FACTOR:g}x the median {median:.2g}s between steps, at least {HANG_FLOOR:g}s"
        else:
            learned, how = HANG_FLOOR, f"no pace learned yet: {HANG_FLOOR:g}s"
        if self.hang_timeout is not None and self.hang_timeout < learned:
            return self.hang_timeout, f"hang_timeout={self.hang_timeout:g}s"
        return learned, how

    def _limit_of(self, rec: RankRecord) -> float:
        return self._limit[0] if rec.step > 0 else self.startup_timeout

    # -- the watch ---------------------------------------------------------------------------
    def look(
        self, state: RunState, ranks: Sequence[RankRecord], now: float
    ) -> tuple[list[Tell], RootCause | None]:
        """Look at the ranks: the events to tell, and the cause to fail the run with (what the
        hang policy decides once the stall's stacks are in, or were waited for long enough)."""
        if state is not RunState.RUNNING:
            return [], None  # a stop has its own deadline (see Fate.overdue_stop); an end ends it
        if now - self._looked < LOOK_EVERY and not (self._asked is not None and not self._told_stacks):
            return [], None  # a second's resolution is plenty for limits of 30 s and more
        self._looked = now
        self._limit = self.limit(ranks)
        running = [r for r in ranks if r.state is RankState.RUNNING and r.moved_at is not None]
        stalled = [r for r in running if now - r.moved_at > self._limit_of(r)]  # type: ignore[operator]
        tells: list[Tell] = []
        if not stalled:
            if self.stalled:
                assert self.since is not None
                tells.append(
                    Tell("progressing", -1, f"the ranks progress again after {now - self.since:.0f}s")
                )
                self.new_attempt()
            return tells, None
        self.stalled = stalled
        self.since = min(r.moved_at for r in stalled)  # type: ignore[type-var]
        if self._asked is None:
            self._asked = now
            for r in running:
                r.stack_wanted = True
            tells.append(Tell("not_progressing", -1, self.note(now)))
        cause = None
        if not self._told_stacks and (self._all_answered(running) or now - self._asked > STACK_WAIT):
            self._told_stacks = True
            stacks = self.grouped(ranks, now)
            tells.append(Tell("stacks", -1, str(stacks)))
            if not self._failed:
                cause = self.on_hang.decide(self.note(now), str(stacks))
                self._failed = cause is not None
        return tells, cause

    def _all_answered(self, running: Sequence[RankRecord]) -> bool:
        asked = self._asked
        return asked is not None and all(r.stack_at is not None and r.stack_at >= asked for r in running)

    def stalled_for(self, now: float) -> float:
        return now - self.since if self.stalled and self.since is not None else 0.0

    def note(self, now: float) -> str:
        """``no progress for 41s: ranks 0-3 at step 20 (limit 30s: ...)``; empty while the run moves."""
        if not self.stalled or self.since is None:
            return ""
        steps = sorted({r.step for r in self.stalled})
        at = f"at step {steps[0]}" if len(steps) == 1 else f"at steps {steps[0]}-{steps[-1]}"
        if steps == [0]:
            at = f"before their first step (start-up limit {self.startup_timeout:g}s)"
            limit = ""
        else:
            limit = f" (limit {self._limit[0]:.0f}s: {self._limit[1]})"
        who = ranks_text([r.rank for r in self.stalled])
        return f"no progress for {now - self.since:.0f}s: {who} {at}{limit}"

    # -- stacks ------------------------------------------------------------------------------
    def grouped(self, ranks: Sequence[RankRecord], now: float) -> Stacks:
        """Every rank's last stack, grouped; kept as :attr:`stacks`, what the run's state shows."""
        # A rank asked again and yet to answer shows as missing, not with its older stack.
        asked = {r.rank for r in ranks if r.state is RankState.RUNNING and r.stack_wanted}
        taken = {r.rank: r.stack_sent for r in ranks if r.stack_sent is not None and r.rank not in asked}
        missing = {
            r.rank: FROZEN if self._silent(r, now) else "it did not answer in time; its heartbeats go on"
            for r in ranks
            if r.rank in asked
        }
        self.stacks = group(taken, missing)
        self.stacks_taken = max((s.taken for s in taken.values()), default=0.0)
        return self.stacks

    def _silent(self, rec: RankRecord, now: float) -> bool:
        """No heartbeat for several intervals: its heartbeat thread cannot answer either."""
        beat = rec.last_heartbeat
        return beat is not None and now - beat > max(2.0, 8 * self.heartbeat_interval)

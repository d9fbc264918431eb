"""When and how the straggler judgement (:mod:`.stragglers`) is made and shown for a live run.

:func:`.stragglers.judge` says who holds the others back from one window of step times; this
decides when to ask it and what its answer does. It is asked at most once every
:data:`JUDGE_EVERY` seconds, since a judgement sorts every rank's parts (a thousand ranks) and
the master's expiry tick calls far more often; only while every rank trains, since a rank that
ended sends no more times and the last judgement stands. One judgement alone does not move
the mark: noise makes a rank slow in one window, seldom in two, so a straggler is shown once
two judgements in a row agree. Each straggler (and the part it is slow in) goes into the event
log once, however long it stays one. Each rank's record shows its step split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orch.master.control.registry import RankRecord
from orch.master.control.stragglers import OFF, Means, Verdict, judge, scores
from orch.wire.states import RunState

JUDGE_EVERY = 1.0  # seconds between straggler judgements
JUDGED_AT_ONCE = 1024  # ranks judged every JUDGE_EVERY; more ranks, proportionally less often
MARKED_BEATS = 3  # beats with steps from one rank, and none from another: that one marks none
NOT_YET_JUDGED = Verdict(
    False,
    note="not judged yet: stragglers are judged once every rank runs",
    ended="not judged: the run ended after too few steps (before the first judgement)",
)
STANDING_STILL = Verdict(False, note="stragglers are not judged while the ranks do not progress")


class StragglerWatch:
    """The verdict shown for the run, and what it takes to move it."""

    def __init__(self) -> None:
        self.verdict = NOT_YET_JUDGED
        self._told: tuple[int, str] = (-1, "")  # the straggler last put in the event log
        self._last: tuple[int, str] = (-1, "")  # the judgement before the last
        self._judged_at = -math.inf

    def standing_still(self) -> None:
        """The ranks' steps stand still: a run where nothing moves has no straggler, and the
        judgement from before the stall no longer holds."""
        self.verdict = STANDING_STILL
        self._last = STANDING_STILL.key

    def new_attempt(self) -> None:
        """A restarted group is judged afresh: its ranks and their timings are new."""
        self.verdict = NOT_YET_JUDGED
        self._told = self._last = (-1, "")

    def every(self, ranks: int) -> float:
        """Seconds between judgements: :data:`JUDGE_EVERY`, longer past :data:`JUDGED_AT_ONCE`
        ranks (a judgement costs the master in proportion to its ranks)."""
        return JUDGE_EVERY * max(1.0, ranks / JUDGED_AT_ONCE)

    def due(self, state: RunState, ranks: Sequence[RankRecord], now: float) -> bool:
        """Whether it is time to judge (and then the clock starts again)."""
        if state not in (RunState.RUNNING, RunState.STOPPING):
            return False
        if now - self._judged_at < self.every(len(ranks)):
            return False
        if any(r.state.done for r in ranks):
            return False  # ranks are ending: the last judgement stands
        self._judged_at = now
        return True

    @staticmethod
    def means(ranks: Sequence[RankRecord], now: float) -> dict[int, Means | None]:
        """The ranks' mean step parts over their windows (under the run's lock: beats add to
        the windows; a big run's are read a block of ranks at a time)."""
        out = {}
        for r in ranks:
            r.timing.trim(now)
            out[r.rank] = r.timing.means()
        return out

    def look(
        self, state: RunState, ranks: Sequence[RankRecord], world_size: int, now: float
    ) -> Verdict | None:
        """Judge the ranks when it is time to; returns the verdict to put in the event log (a
        straggler not told before), else None."""
        if not self.due(state, ranks, now):
            return None
        return self.conclude(ranks, world_size, self.means(ranks, now))

    def conclude(
        self, ranks: Sequence[RankRecord], world_size: int, means: dict[int, Means | None]
    ) -> Verdict | None:
        """The judgement over ``means`` (see :meth:`means`), shown on the ranks' records;
        returns the verdict to put in the event log (a straggler not told before), else None."""
        # A rank that never said what marks its steps while another has sent MARKED_BEATS beats
        # of them marks none: its loop calls none of ctx.steps, ctx.data and ctx.log (a loop
        # that logs on rank 0 alone). Under DDP its peers' steps are its own, a beat apart.
        marked = max((len(r.timing.beats) for r in ranks), default=0) >= MARKED_BEATS
        unmarked = [r.rank for r in ranks if not r.timing.timed_by] if marked else []
        verdict = judge(
            means, world_size, off=[r.rank for r in ranks if r.timing.timed_by == OFF], unmarked=unmarked
        )
        seen, self._last = self._last, verdict.key
        if verdict.key != self.verdict.key and verdict.key != seen:
            verdict = self.verdict  # one judgement alone does not move the mark
        self.verdict = verdict
        scored = scores(means, {r.rank: r.timing for r in ranks})
        for r in ranks:
            m = means[r.rank]
            r.timed = m is not None
            if m is not None:
                r.step_ms, r.data_ms, r.compute_ms = m.step * 1000, m.data * 1000, m.compute * 1000
                r.collective_ms, r.other_ms = m.collective * 1000, m.other * 1000
                r.relative_score, r.individual_score = scored.get(r.rank, (0.0, 0.0))
                r.timed_by = m.timed_by
                r.section_ms = {name: seconds * 1000 for name, seconds in m.sections.items()}
            r.slow_in = verdict.section if r.rank == verdict.rank else ""
        if verdict.rank >= 0 and verdict.key != self._told:
            self._told = verdict.key  # each straggler (and part) is told once
            return verdict
        return None

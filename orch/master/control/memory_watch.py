"""When the ranks' memory is judged (see :mod:`.memory`) for a live run, and what it tells.

Judged on the master's expiry tick, at most once every :data:`JUDGE_EVERY` seconds (a leak
is sampled once a second, so judging more often would only repeat itself), for the ranks
that run. Each warning (a leak, a near limit, a nearly full GPU) goes into the event log once
per rank and attempt; the rank's ``memory_note`` says what holds now.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orch.master.control.registry import RankRecord
from orch.wire.states import RankState

JUDGE_EVERY = 1.0  # seconds between two judgements of the ranks' memory


class MemoryWatch:
    def __init__(self) -> None:
        self._judged_at = -math.inf

    def look(self, ranks: Sequence[RankRecord], now: float) -> list[tuple[int, str]]:
        """Judge the running ranks when it is time to; returns the warnings to tell, (rank, text)."""
        if now - self._judged_at < JUDGE_EVERY:
            return []
        self._judged_at = now
        told = []
        for r in ranks:
            if r.state is RankState.RUNNING:
                r.memory_note, news = r.memory.judge(r)
                told += [(r.rank, text) for _, text in news]
        return told

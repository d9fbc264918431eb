"""Which of a metric log's points a restart replaced: the one rule the CSV and TensorBoard exports share."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path

from orch.record.store import MetricsDamage, read_metrics

SeriesKey = tuple[int, str]  # (rank, metric name)


class Attempts:
    """The restart rule of ``control.series.Series.add``, apart from the points it applies to.

    A restarted group replays the steps after its last checkpoint: a newer attempt's points
    replace those of the older one from its first step on, so no step is counted twice.
    """

    __slots__ = ("attempt", "last_step")

    def __init__(self) -> None:
        self.attempt = 0
        self.last_step: int | None = None

    def rewinds(self, steps: Sequence[int], attempt: int) -> bool:
        """Take a batch: True when it replaces the points held from ``steps[0]`` on."""
        if not steps:
            return False  # an empty batch says nothing of where its attempt starts
        rewound = attempt > self.attempt and self.last_step is not None and steps[0] <= self.last_step
        self.attempt = max(self.attempt, attempt)
        self.last_step = steps[-1]
        return rewound


class Replaced:
    """Where restarts replaced each series' points, from a first pass over a metrics log.

    A point logged in record ``p`` stays unless a later record rewound its series at a
    step at or below it; ``limit`` gives that step (the least of the later rewinds).
    """

    def __init__(self, metrics: Path) -> None:
        seen: dict[SeriesKey, Attempts] = {}
        rewinds: dict[SeriesKey, list[tuple[int, int]]] = {}  # (record position, first step)
        for position, record in enumerate(read_metrics(metrics, MetricsDamage())):
            for s in record.series:
                key = (record.rank, s.name)
                if seen.setdefault(key, Attempts()).rewinds(s.steps, record.attempt):
                    rewinds.setdefault(key, []).append((position, s.steps[0]))
        self._positions = {key: [p for p, _ in found] for key, found in rewinds.items()}
        self._floors: dict[SeriesKey, list[int]] = {}
        for key, found in rewinds.items():
            floors = [step for _, step in found]
            for i in range(len(floors) - 2, -1, -1):
                floors[i] = min(floors[i], floors[i + 1])
            self._floors[key] = floors

    def limit(self, key: SeriesKey, position: int) -> int | None:
        """The step from which the points of ``key`` logged at ``position`` were replaced, if any."""
        positions = self._positions.get(key)
        if positions is None:
            return None
        i = bisect.bisect_right(positions, position)
        return self._floors[key][i] if i < len(positions) else None

"""Which of a metric log's points a restart replaced (by :class:`.metrics_log.Attempts`' rule),
for the CSV and TensorBoard exports."""

from __future__ import annotations

import bisect
from pathlib import Path

from orch.record.metrics_log import Attempts, MetricsDamage, read_metrics

SeriesKey = tuple[int, str]  # (rank, metric name)


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

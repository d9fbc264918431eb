"""orch.master.control.pace: beats spaced out as callers grow, within the heartbeat timeout."""

from __future__ import annotations

import pytest

from orch.master.control.pace import MAX_CALLS_PER_SECOND, beat_interval


@pytest.mark.parametrize(
    ("callers", "want"),
    [
        (8, 0.25),  # few callers: the launch's own interval
        (64, 0.25),
        (128, 0.5),  # 128 host agents: 256 calls a second at 0.5 s
        (512, 2.0),
        (4096, 30.0 / 8),  # never past an eighth of the heartbeat timeout
    ],
)
def test_calls_per_second_stay_bounded_as_callers_grow(callers: int, want: float) -> None:
    interval = beat_interval(callers, 0.25, 30.0)
    assert interval == pytest.approx(want)
    assert callers / interval <= MAX_CALLS_PER_SECOND or interval == 30.0 / 8


def test_a_short_heartbeat_timeout_keeps_the_beats_frequent() -> None:
    assert beat_interval(512, 0.25, 3.0) == pytest.approx(0.375)
    assert beat_interval(512, 0.5, 2.0) == 0.5  # never below the launch's own

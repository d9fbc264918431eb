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


def test_host_syncs_are_spaced_out_as_hosts_grow() -> None:
    from orch.master.control.pace import SYNCS_PER_SECOND, sync_interval

    assert sync_interval(16, 30.0) == 1.0
    assert sync_interval(256, 30.0) == pytest.approx(256 / SYNCS_PER_SECOND)
    assert sync_interval(4096, 30.0) == pytest.approx(30.0 / 8)


def test_a_host_agent_syncs_as_often_as_its_master_asks() -> None:
    from orch.runtime._host_attempts import _Watch
    from orch.wire._proto import orchestrator_pb2 as pb

    class Agent:
        unreported: list[str] = []
        calls = 0

        def sync_host(self, request: pb.HostSyncRequest) -> pb.HostSyncResponse:
            Agent.calls += 1
            return pb.HostSyncResponse(action=pb.HOST_CONTINUE, attempt=1, interval=3.0)

    watch = _Watch(Agent(), "h:1", 1, ["w0"])  # type: ignore[arg-type]
    watch.start()
    try:
        import time

        deadline = time.monotonic() + 5
        while watch.interval != 3.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.interval == 3.0
        time.sleep(1.5)
        assert Agent.calls == 1  # the next sync waits the 3 s the master asked for
    finally:
        watch.stop()

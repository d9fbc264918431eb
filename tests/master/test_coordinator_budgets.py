"""What a token holder can make the master hold, without sockets: points, events, stop requests."""

from __future__ import annotations

import pytest

from coordinator_calls import heartbeat
from orch.master.control import events as events_module
from orch.master.control.plan import RunPlan
from orch.master.control.series import water_level
from orch.master.coordinator import Coordinator
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.client import StateMirror
from orch.wire.states import RunState


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def started(world: int = 2, clock: Clock | None = None, **kw: object) -> Coordinator:
    clock = clock or Clock()
    c = Coordinator(RunPlan(world, heartbeat_timeout=5.0, **kw), run_id="r1", clock=clock, wall=clock)  # type: ignore[arg-type]
    for i in range(world):
        c.register(pb.RegisterRequest(worker_id=f"w{i}", host="h", pid=1, rendezvous_port=29500))
    for i in range(world):
        assert c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id=f"w{i}")).ready
    return c


def points(c: Coordinator, wid: str, name: str, first: int, n: int) -> None:
    steps = list(range(first, first + n))
    heartbeat(
        c,
        pb.HeartbeatRequest(
            run_id="r1",
            worker_id=wid,
            step=steps[-1],
            series=[pb.Series(name=name, steps=steps, values=[float(s) for s in steps])],
        ),
    )


def held(c: Coordinator) -> int:
    return sum(len(c.series(rank, name)[0]) for rank, name in list(c.points))


def test_repeated_stop_requests_are_one_event_and_a_count() -> None:
    clock = Clock()
    c = started(clock=clock)
    for i in range(5000):
        clock.t += 0.001
        assert c.request_stop(f"stop {i}") is RunState.STOPPING
    stops = [e for e in c.events if e.kind == "stop_requested"]
    assert [e.message for e in stops] == ["stop 0"] and c.stop_requests == 5000
    assert len(c.snapshot().SerializeToString()) < 10_000  # the reply did not grow with them
    for wid in ("w0", "w1"):
        c.complete(pb.CompletionRequest(run_id="r1", worker_id=wid, outcome=pb.RANK_STOPPED))
    assert c.state is RunState.STOPPED
    c.request_stop("after the end")
    assert c.stop_requests == 5001 and sum(e.kind == "stop_requested" for e in c.events) == 1


def test_a_stop_before_the_start_is_one_event_too() -> None:
    c = Coordinator(RunPlan(2), run_id="r1", clock=Clock(), wall=Clock())
    for _ in range(100):
        assert c.request_stop() is RunState.STOPPED
    assert [e.kind for e in c.events] == ["stop_requested", "finished"] and c.stop_requests == 100


def _restart_cycles(c: Coordinator, clock: Clock, cycles: int, mirrors: list[StateMirror]) -> None:
    """A rank fails after progress and the group restarts: five events a cycle."""
    for _ in range(cycles):
        clock.t += 1.0
        c.register(pb.RegisterRequest(worker_id=f"w{c.attempt}", host="h", pid=1, rendezvous_port=29500))
        c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id=f"w{c.attempt}"))
        points(c, f"w{c.attempt}", "loss", c.attempt, 1)
        c.complete(
            pb.CompletionRequest(run_id="r1", worker_id=f"w{c.attempt}", outcome=pb.RANK_FAILED, error="boom")
        )
        assert c.state is RunState.RESTARTING
        c.restart()
        for m in mirrors:
            while True:
                reply = c.snapshot(m.cursor)
                m.apply(reply)
                if not reply.more:
                    break


def test_events_in_memory_are_bounded_and_the_dropped_ones_are_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events_module, "MAX_EVENTS_IN_MEMORY", 40)
    clock = Clock()
    c = Coordinator(RunPlan(1, max_attempts=1000), run_id="r1", clock=clock, wall=clock)
    follower = StateMirror()  # polls after every cycle: it sees every event once
    _restart_cycles(c, clock, 5, [follower])
    lagging = StateMirror()
    lagging.apply(c.snapshot())
    seen_by_lagging = len(lagging.events)
    _restart_cycles(c, clock, 40, [follower])  # 200 more events
    assert len(c.events) <= 40 and c.dropped_events > 0
    assert c.dropped_events + len(c.events) == len(follower.events) == 5 * 45
    assert not any(e[1] == "events_dropped" for e in follower.events)
    assert [e[1] for e in follower.events].count("restart") == 45
    # A client that comes late is told how many it missed, then gets the ones still held.
    late = StateMirror.of(c)
    assert late.events[0][1] == "events_dropped" and f"{c.dropped_events} earlier" in late.events[0][3]
    assert late.events[1:] == follower.events[c.dropped_events :]
    # One that fell behind is told how many of those after its cursor it missed.
    lagging.apply(c.snapshot(lagging.cursor))
    missed = c.dropped_events - seen_by_lagging
    assert lagging.events[seen_by_lagging][1] == "events_dropped"
    assert f"{missed} earlier" in lagging.events[seen_by_lagging][3]
    assert lagging.events[seen_by_lagging + 1 :] == follower.events[c.dropped_events :]


def test_a_reply_carries_a_bounded_size_of_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "MAX_EVENT_BYTES_PER_REPLY", 2000)
    clock = Clock()
    c = Coordinator(RunPlan(1, max_attempts=1000), run_id="r1", clock=clock, wall=clock)
    _restart_cycles(c, clock, 30, [])  # 150 events, about 100 bytes each as counted
    first = c.snapshot()
    assert first.more and 0 < len(first.events) < 150
    mirror = StateMirror.of(c)
    assert [e.kind for e in c.events] == [e[1] for e in mirror.events]


def test_event_messages_are_bounded_in_bytes_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "MAX_EVENT_BYTES_IN_MEMORY", 100_000)
    clock = Clock()
    c = Coordinator(RunPlan(1, max_attempts=1000), run_id="r1", clock=clock, wall=clock)
    for _ in range(40):  # each failure's event carries its 10 kB traceback
        clock.t += 1.0
        wid = f"w{c.attempt}"
        c.register(pb.RegisterRequest(worker_id=wid, host="h", pid=1, rendezvous_port=29500))
        c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id=wid))
        points(c, wid, "loss", c.attempt, 1)
        c.complete(
            pb.CompletionRequest(run_id="r1", worker_id=wid, outcome=pb.RANK_FAILED, error="x" * 10_000)
        )
        c.restart()
    assert sum(len(e.message) for e in c.events) <= 100_000 and c.dropped_events > 0


def test_the_water_level_cuts_the_biggest_series_first() -> None:
    assert water_level([10, 5, 1], 7) == 4  # 10 -> 4, 5 -> 4: 7 points freed
    assert water_level([100, 1, 1], 50) == 50
    assert water_level([3, 3, 3], 9) == 0
    assert water_level([], 0) == 0
    for lengths, excess in (([7, 7, 2], 5), ([1000, 999, 3, 0], 1500), ([5], 1)):
        level = water_level(lengths, excess)
        assert sum(max(0, n - level) for n in lengths) >= excess
        assert sum(max(0, n - (level + 1)) for n in lengths) < excess  # no lower cut than needed


def test_one_budget_of_points_for_the_whole_master_and_a_flood_trims_itself() -> None:
    c = started(max_points_in_memory=1000)
    follower = StateMirror()
    follower.apply(c.snapshot())
    for chunk in range(4):
        points(c, "w1", "loss", chunk * 25, 25)  # a real metric: 100 points
    for chunk in range(40):  # a flood: 40 x 300 points under rank 0's name
        points(c, "w0", "flood", chunk * 300, 300)
        assert c.points.points_in_memory == held(c) <= 1000
        while True:
            reply = c.snapshot(follower.cursor)
            follower.apply(reply)
            if not reply.more:
                break
    loss, _ = c.series(1, "loss")
    flood, _ = c.series(0, "flood")
    assert loss == list(range(100))  # the small series is left whole
    assert flood[-1] == 40 * 300 - 1 and len(flood) <= 900 and c.trimmed
    # a client that kept polling saw every point exactly once; cursors stayed valid
    assert follower.series[(0, "flood")].steps.tolist() == list(range(12_000))
    assert follower.series[(1, "loss")].steps.tolist() == list(range(100))
    late = StateMirror.of(c)  # a late client gets what is held
    assert late.series[(0, "flood")].steps.tolist() == flood


def test_many_series_share_the_budget() -> None:
    c = started(world=2, max_points_in_memory=6400)
    for round_ in range(10):
        for wid in ("w0", "w1"):
            req = pb.HeartbeatRequest(run_id="r1", worker_id=wid, step=round_)
            for m in range(64):
                steps = list(range(round_ * 20, round_ * 20 + 20))
                req.series.append(pb.Series(name=f"m{m}", steps=steps, values=[0.0] * 20))
            heartbeat(c, req)
    assert c.points.points_in_memory == held(c) <= 6400  # 25,600 logged across 128 series
    lengths = {len(c.series(r, n)[0]) for r, n in list(c.points)}
    assert max(lengths) - min(lengths) <= 20  # trimmed evenly: no series emptied for another

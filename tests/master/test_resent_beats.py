"""A beat sent again, its first sending taken by a master whose reply came too late (a master
stalled while its rank retried): its points are taken once, in memory and in the run dir."""

from __future__ import annotations

from pathlib import Path

from coordinator_calls import heartbeat
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.record.store import RunStore
from orch.wire._proto import orchestrator_pb2 as pb


def test_a_beat_sent_again_adds_its_points_once(tmp_path: Path) -> None:
    coord = Coordinator(RunPlan(1), run_id="r", clock=lambda: 100.0)
    coord.store = RunStore(tmp_path)
    coord.register(pb.RegisterRequest(worker_id="w", host="h", pid=1, rendezvous_port=29400))
    coord.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w"))
    beat = pb.HeartbeatRequest(
        run_id="r",
        worker_id="w",
        step=3,
        series=[pb.Series(name="loss", steps=[0, 1, 2], values=[3.0, 2.0, 1.0])],
    )
    for _ in range(4):  # the first sending and three retries, all of them taken
        heartbeat(coord, beat)
    nxt = pb.HeartbeatRequest(
        run_id="r", worker_id="w", step=4, series=[pb.Series(name="loss", steps=[3], values=[0.5])]
    )
    heartbeat(coord, nxt)
    assert coord.series(0, "loss") == ([0, 1, 2, 3], [3.0, 2.0, 1.0, 0.5])
    coord.store.close()

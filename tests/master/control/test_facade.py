"""orch.master.control.facade: the names callers read a run by, each read from the part that
holds it. The run here is made of bare parts, without a coordinator, lock or clock."""

from __future__ import annotations

from orch.master.control.cluster_job import JobWatch
from orch.master.control.events import EventLog
from orch.master.control.facade import RunFacade
from orch.master.control.fate import Fate
from orch.master.control.host_sync import HostSync
from orch.master.control.intake import Intake
from orch.master.control.judge import CauseKind
from orch.master.control.published import Published
from orch.master.control.straggler_watch import NOT_YET_JUDGED, StragglerWatch
from orch.master.control.stragglers import Verdict
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import RankState, RunState


class Run(RunFacade):
    def __init__(self, world: int = 2, *, max_attempts: int = 1, rendezvous_port: int = 0) -> None:
        self.run_id, self.world_size, self.total_steps = "r1", world, 0
        self.rendezvous_port = rendezvous_port
        self.intake = Intake(world, 500)
        self.event_log = EventLog()
        self.published = Published()
        self.fate = Fate(
            max_attempts,
            lambda k, r, m: self.event_log.append(pb.Event(kind=k, rank=r, message=m)),
            lambda: None,
        )
        self.host_sync = HostSync(True, 3)
        self.cluster_job = JobWatch()
        self.stragglers = StragglerWatch()

    def register_all(self, **fields: object) -> None:
        for i in range(self.world_size):
            req = pb.RegisterRequest(worker_id=f"w{i}", host=f"h{i}", address=f"10.0.0.{i}", **fields)  # type: ignore[arg-type]
            self.intake.register(req, self.run_id, self.state)
        self.fate.start(self.world_size, 100.0)


def test_the_state_machines_names() -> None:
    run = Run(max_attempts=3)
    assert run.lifecycle is run.fate.lifecycle and run.judge is run.fate.judge
    assert (run.state, run.attempt, run.max_attempts, run.started_at, run.ended_at) == (
        RunState.PENDING, 1, 3, None, None,
    )  # fmt: skip
    run.register_all()
    assert (run.state, run.started_at) == (RunState.RUNNING, 100.0)
    run.fate.finish(RunState.STOPPED, 130.0)
    assert (run.state, run.ended_at) == (RunState.STOPPED, 130.0)


def test_the_root_cause_names() -> None:
    run = Run()
    assert (run.root_cause, run.cause, run.failure) == (None, None, "")
    run.register_all()
    rec = run.ranks[1]
    rec.step = 1
    run.fate.end_rank(rec, RankState.FAILED, run.registry, 101.0, error="boom", kind=CauseKind.ERROR)
    assert run.root_cause is rec and run.cause is run.judge.cause
    assert run.failure == "rank 1 (host h1 at 10.0.0.1, pid 0) failed: boom"
    run = Run()
    run.fate.fail_outside("the launch failed", "", 1.0)
    assert run.root_cause is None and run.cause is not None and run.failure == "the launch failed"


def test_the_stops_names() -> None:
    run = Run()
    run.register_all()
    assert (run.stop_requested, run.stop_requests, run.stop_at_step) == (False, 0, 0)
    run.fate.request_stop("", run.registry, 101.0)
    run.fate.request_stop("", run.registry, 102.0)
    assert (run.stop_requested, run.stop_requests, run.stop_at_step) == (True, 2, 2)


def test_the_ranks_points_and_events_follow_the_current_parts() -> None:
    run = Run()
    run.register_all()
    assert run.ranks is run.intake.registry.ranks and [r.worker_id for r in run.ranks] == ["w0", "w1"]
    for rec in run.ranks:
        rec.state = RankState.RUNNING
    loss = pb.Series(name="loss", steps=[1, 2], values=[1, 2])
    run.intake.beat(pb.HeartbeatRequest(run_id="r1", worker_id="w0", series=[loss]), "r1", 1, 101.0, 0.0)
    assert (run.points_in_memory, run.max_points_in_memory) == (2, 500) and run.points is run.intake.points
    assert [e.kind for e in run.events] == ["started"] and run.dropped_events == 0
    run.intake.new_attempt(1)
    assert run.registry is run.intake.registry and run.ranks == [] and run.points_in_memory == 2


def test_the_rendezvous_port_is_the_fixed_one_or_rank_0s() -> None:
    run = Run()
    assert run.active_rendezvous_port() == 0
    run.register_all(rendezvous_port=29555)
    assert run.active_rendezvous_port() == 29555
    fixed = Run(rendezvous_port=29999)
    fixed.register_all(rendezvous_port=29555)
    assert fixed.active_rendezvous_port() == 29999


def test_the_hosts_job_and_verdict_names() -> None:
    run = Run()
    assert run.hosts is run.host_sync.hosts and run.restart_through_hosts
    assert run.min_world_size == 3
    run.min_world_size = 2  # a run may set its elastic floor after it was made
    assert run.host_sync.min_world_size == 2
    assert run.job is None
    run.cluster_job.update(pb.ClusterJob(scheduler="slurm", job_id="7", state="RUNNING"))
    assert run.job is not None and run.job.job_id == "7"
    assert run.verdict is NOT_YET_JUDGED
    run.stragglers.verdict = Verdict(True, 1, "data", "rank 1 is the straggler")
    assert run.verdict.rank == 1

"""What one run's parts hold, by the names callers have always used.

Launchers, the gRPC server, the CLI and the tests read a run as ``coordinator.state``,
``.attempt``, ``.failure``, ``.stop_at_step``... while the values live in the parts (the state
in the lifecycle, the failure in the root-cause judge, the stop in the stop order). This base of
:class:`~orch.master.coordinator.Coordinator` keeps those names in one place, out of the class
that does the work, and :mod:`.snapshot` reads a run through them. Reads only (but for the
elastic floor, which a run may set after it was made); they take no lock, as before the parts
were split: a caller that needs a consistent view takes ``Coordinator.snapshot``.
"""

from __future__ import annotations

from orch.master.control.cluster_job import JobWatch
from orch.master.control.events import EventLog
from orch.master.control.fate import Fate
from orch.master.control.host_sync import HostSync
from orch.master.control.hosts import HostTable
from orch.master.control.intake import Intake
from orch.master.control.judge import FailureJudge, RootCause
from orch.master.control.lifecycle import Lifecycle
from orch.master.control.progress import ProgressWatch
from orch.master.control.published import Published
from orch.master.control.registry import RankRecord, Registry
from orch.master.control.series import SeriesLog
from orch.master.control.startup import StartupWatch
from orch.master.control.straggler_watch import StragglerWatch
from orch.master.control.stragglers import Verdict
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import RunState


class RunFacade:
    """A run's configuration and parts (set by the subclass), and the names read from them."""

    run_id: str
    world_size: int
    total_steps: int
    rendezvous_port: int  # fixed by the launcher, or 0: the one rank 0 bound
    intake: Intake
    event_log: EventLog
    fate: Fate
    host_sync: HostSync
    cluster_job: JobWatch
    stragglers: StragglerWatch
    progress: ProgressWatch
    startup: StartupWatch
    published: Published  # the ranks' records as replies carry them

    # -- the state machine and the root cause ------------------------------------------------
    @property
    def lifecycle(self) -> Lifecycle:
        return self.fate.lifecycle

    @property
    def judge(self) -> FailureJudge:
        return self.fate.judge

    @property
    def state(self) -> RunState:
        return self.fate.lifecycle.state

    @property
    def attempt(self) -> int:
        return self.fate.lifecycle.attempt

    @property
    def max_attempts(self) -> int:
        return self.fate.lifecycle.max_attempts

    @property
    def started_at(self) -> float | None:
        return self.fate.lifecycle.started_at

    @property
    def ended_at(self) -> float | None:
        return self.fate.lifecycle.ended_at

    @property
    def root_cause(self) -> RankRecord | None:
        """The rank whose failure explains the run's (None: no rank, or no failure)."""
        cause = self.fate.judge.cause
        return cause.record if cause is not None else None

    @property
    def cause(self) -> RootCause | None:
        return self.fate.judge.cause

    @property
    def failure(self) -> str:
        return self.fate.failure

    # -- the stop ------------------------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        """A stop was asked for (it carries over a restart)."""
        return self.fate.stop.requested

    @property
    def stop_requests(self) -> int:
        """Every StopRun; only the one that set the stop is an event."""
        return self.fate.stop.requests

    @property
    def stop_at_step(self) -> int:
        """With a stop: the step count loops without ctx.steps end at (0: none)."""
        return self.fate.stop.at_step

    # -- ranks, points, events -----------------------------------------------------------------
    @property
    def registry(self) -> Registry:
        """The ranks of the current attempt (a new registry each attempt)."""
        return self.intake.registry

    @property
    def points(self) -> SeriesLog:
        return self.intake.points

    @property
    def ranks(self) -> list[RankRecord]:
        return self.intake.registry.ranks

    @property
    def events(self) -> list[pb.Event]:
        return self.event_log.events

    @property
    def dropped_events(self) -> int:
        return self.event_log.dropped

    @property
    def points_in_memory(self) -> int:
        return self.intake.points.points_in_memory

    @property
    def max_points_in_memory(self) -> int:
        return self.intake.points.max_points_in_memory

    def active_rendezvous_port(self) -> int:
        """The rendezvous port in use: the fixed one, or the one rank 0 bound (0: not yet)."""
        return self.intake.registry.rendezvous_port(self.rendezvous_port)

    # -- host agents, the scheduler's job, the stragglers ---------------------------------------
    @property
    def hosts(self) -> HostTable:
        return self.host_sync.hosts

    @property
    def restart_through_hosts(self) -> bool:
        return self.host_sync.restart_through_hosts

    @property
    def min_world_size(self) -> int | None:
        """Elastic: a restart goes on without hosts that fell silent while this many ranks remain."""
        return self.host_sync.min_world_size

    @min_world_size.setter
    def min_world_size(self, value: int | None) -> None:
        self.host_sync.min_world_size = value

    @property
    def job(self) -> pb.ClusterJob | None:
        """The scheduler's job the ranks run in (None: none)."""
        return self.cluster_job.job

    @property
    def verdict(self) -> Verdict:
        """The straggler judgement shown for the run."""
        return self.stragglers.verdict

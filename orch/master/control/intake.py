"""What the ranks send, taken into memory: who registers, and what their heartbeats carry.

A run's ranks are new each attempt (they register again, maybe fewer of them after an elastic
resize), while its metric series go on across attempts: so the registry is replaced on a
restart and the series log is not. Every call names the run and the worker it comes from; a
worker of another run, one never registered, or one that beats before the start barrier let
it through is refused here, before anything is recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orch.master.control.registry import RankRecord, Registry
from orch.master.control.series import MAX_POINTS_IN_MEMORY, SeriesLog
from orch.master.control.validate import Reject, check_id, check_run_id
from orch.wire.model import Beat, Registration
from orch.wire.states import RankState, RunState


class Intake:
    """The ranks of the current attempt and the run's series."""

    def __init__(self, world_size: int, max_points_in_memory: int = MAX_POINTS_IN_MEMORY) -> None:
        self.registry = Registry(world_size)
        self.points = SeriesLog(max_points_in_memory)

    def new_attempt(self, world_size: int) -> None:
        """The next attempt's ranks register afresh, ``world_size`` of them; the series go on."""
        self.registry = Registry(world_size)

    def register(self, req: Registration, run_id: str, state: RunState) -> tuple[RankRecord, bool]:
        """The worker's record, and True when it is new (see :meth:`.registry.Registry.add`).
        A run that ended (``state``) takes no new worker; a known one may register again."""
        if req.run_id:  # rank 0 registering again to say where its store listens names its run
            check_run_id(req.run_id, run_id)
        if self.registry.get(req.worker_id) is None and state.done:
            raise Reject("failed_precondition", f"run {run_id} is already {state.value}")
        return self.registry.add(req, run_id)

    def known(self, run_id: str, worker_id: str, ours: str) -> RankRecord:
        """The record of a registered worker of this run (``ours``), from a request naming both."""
        check_id("worker_id", worker_id)
        check_run_id(run_id, ours)
        return self.registry.known(worker_id, ours)

    def beat(
        self,
        req: Beat,
        run_id: str,
        attempt: int,
        now: float,
        wall: float,
        wire: Sequence[bytes] | None = None,
    ) -> RankRecord:
        """Take one heartbeat (checked by ``check_heartbeat``) into its rank's record and the
        series: its progress, step times and points (points without times get ``wall``;
        ``wire``: each series as the beat carried it, see :meth:`.series.SeriesLog.add`)."""
        rec = self.known(req.run_id, req.worker_id, run_id)
        if rec.state is RankState.REGISTERED:
            raise Reject(
                "failed_precondition",
                f"worker {req.worker_id} sent a heartbeat before the start barrier opened: "
                "poll CanStartTraining until ready first",
            )
        self.points.check_names(rec.rank, req.series)
        rec.beat(now, req.step, req.total_steps, req.dropped_points, req.dropped_reason)
        # The same beat sent again: its first sending's reply was lost to a deadline (a master
        # stalled while its rank retried), yet that sending was taken. Its points are in already.
        key = _fingerprint(req.series)
        rec.resent = key is not None and key == rec.last_series
        rec.last_series = key
        if req.timing is not None:
            rec.timing.add(now, req.timing)
        if req.process is not None:
            rec.memory.take(rec, req.process, now)
        if rec.resent:
            return rec
        loss = self.points.add(rec.rank, req.series, attempt, wall, wire)
        if loss is not None:
            rec.loss, rec.has_loss = loss, True
        return rec

    def refused(self, sender: tuple[str, str], run_id: str, why: Reject, now: float) -> None:
        """A heartbeat of ``sender`` (its run id and worker id) refused for what it carries (a
        bad field or a cap; not one out of order, nor of another run): it still shows that its
        running rank lives."""
        if why.kind != "invalid_argument" or sender[0] != run_id:
            return
        rec = self.registry.get(sender[1])
        if rec is not None and rec.state is RankState.RUNNING:
            rec.refused(now, str(why))


def _fingerprint(series: Any) -> int | None:
    """What tells a beat's points from the next beat's: each series' name, length, first and
    last step and last value (None: no points). A rank's beats never repeat it, but a beat
    sent again does."""
    if not series:
        return None
    return hash(
        tuple((s.name, len(s.steps), s.steps[0] if s.steps else -1, s.steps[-1] if s.steps else -1,
               s.values[-1] if s.values else 0.0) for s in series)
    )  # fmt: skip

"""The master's side of the host agents and of the run's scheduler job: a host agent's
``SyncHost`` answered, a restart across hosts moved on, what Slurm says of the job. A part of
:class:`~orch.master.coordinator.Coordinator`, under its lock (see
:mod:`orch.master.control.host_sync` for the decisions)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from orch.master.control.facade import RunFacade
from orch.master.control.pace import sync_interval
from orch.master.control.validate import STATUS_CODE, Reject, check_heartbeats, check_host_sync
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import RUN_STATE_PB

Write = Callable[[], None]  # a run dir write, done before the beat is acknowledged


class HostDesk(RunFacade):
    """A coordinator's host agents and job (a part of :class:`~orch.master.coordinator.Coordinator`)."""

    _lock: threading.Lock
    _changed: threading.Condition
    _clock: Callable[[], float]
    heartbeat_timeout: float

    if TYPE_CHECKING:  # the coordinator's own (declared here for the type checker only)

        def _restart(self, now: float) -> int: ...

        def _event(self, kind: str, rank: int, message: str) -> None: ...

        def _accept(
            self, req: pb.HeartbeatRequest
        ) -> tuple[pb.HeartbeatResponse, Callable[[], None] | None]: ...

    def accept_heartbeats(
        self, beats: Sequence[pb.HeartbeatRequest]
    ) -> tuple[list[pb.BeatReply], Callable[[], None] | None]:
        """A host agent's batch: each beat as the coordinator's ``accept_heartbeat`` takes it,
        under one lock. A refused beat gets its refusal in its reply; the others go on. Returns the
        replies, in order, and one run dir write for all the batch's points."""
        checked = check_heartbeats(beats)
        replies, writes = [], []
        with self._lock:
            for req, refused in zip(beats, checked, strict=True):
                if refused is None:
                    try:
                        reply, write = self._accept(req)
                    except Reject as e:
                        refused = e
                else:
                    self.intake.refused(req, self.run_id, refused, self._clock())
                if refused is not None:
                    replies.append(pb.BeatReply(code=STATUS_CODE[refused.kind], error=str(refused)))
                    continue
                if write is not None:
                    writes.append(write)
                replies.append(pb.BeatReply(reply=reply))
        return replies, (functools.partial(_run_all, writes) if writes else None)

    def sync_host(self, req: pb.HostSyncRequest) -> pb.HostSyncResponse:
        """A host agent's word: which ranks it started for which attempt, and whether they
        run. The answer says to go on, to start the ranks of the current attempt, to wait (a
        restart is under way) or to exit (the run ended)."""
        check_host_sync(req, self.world_size)
        with self._lock:
            now = self._clock()
            rec = self.host_sync.join(req, self.attempt, self.world_size, now)
            cause = self.host_sync.failure(req, rec, self.state, self.attempt)
            if cause is not None:
                self.fate.fail(cause, self.registry, now)
            self._settle_hosts(now)
            return pb.HostSyncResponse(
                attempt=self.attempt,
                run_id=self.run_id,
                restarts=self.restart_through_hosts and self.max_attempts > 1,
                heartbeat_timeout=self.heartbeat_timeout,
                state=RUN_STATE_PB[self.state.value],
                action=self.host_sync.action(req.host, rec, self.state, self.attempt),
                interval=sync_interval(len(self.hosts.hosts), self.heartbeat_timeout),
            )

    def _settle_hosts(self, now: float) -> None:
        """Carry out where a restart across hosts stands (see :meth:`HostSync.settle`)."""
        settled = self.host_sync.settle(
            self.state, self.attempt, self.ranks, now, self.heartbeat_timeout, stopping=self.stop_requested
        )
        if settled.resized:  # elastic: the next attempt runs on the hosts that are left
            self._event("resized", -1, settled.resized)
            self.world_size = settled.world_size
        if self.fate.settle(settled, self.registry, now):
            self._restart(now)

    def host_lost(self, host: str, why: str) -> bool:
        """The launcher knows the host agent ``host`` (its ``hostname:pid``) is gone with its
        node (``why``): its ranks are LOST now, naming it, and a restart across hosts goes on
        without waiting out the heartbeat timeout. False for a host that never called."""
        with self._lock:
            now = self._clock()
            rec = self.host_sync.hosts.lose(host, why)
            if rec is None:
                return False
            ended = [r for r in (self.registry.get(w) for w in sorted(rec.worker_ids)) if r is not None]
            self.fate.gone(ended, why, self.registry, now)
            self._settle_hosts(now)
            self._changed.notify_all()
            return True

    def set_job(self, job: pb.ClusterJob) -> None:
        """What the scheduler last said of the run's job; a change is an event."""
        with self._lock:
            news = self.cluster_job.update(job)
            if news is not None:
                self._event("job", -1, news)
                self._changed.notify_all()


def _run_all(writes: list[Callable[[], None]]) -> None:
    for write in writes:
        write()

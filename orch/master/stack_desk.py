"""The ranks' stacks at the master: asked of every running rank in its next heartbeat's reply,
read from outside a lost rank's process (py-spy), and served grouped by frame. A part of
:class:`~orch.master.coordinator.Coordinator`, under its lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from orch.master.control.progress import ProgressWatch
from orch.master.control.registry import RankRecord, Registry
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import RankState


class StackDesk:
    """The stacks of a coordinator's ranks (a part of :class:`~orch.master.coordinator.Coordinator`)."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    progress: ProgressWatch

    if TYPE_CHECKING:  # the coordinator's own (declared here for the type checker only)

        @property
        def registry(self) -> Registry: ...

        @property
        def ranks(self) -> list[RankRecord]: ...

        def _event(self, kind: str, rank: int, message: str) -> None: ...

    def _want_stacks(self) -> float:
        """Ask every running rank for its stack in its next heartbeat's reply; returns when."""
        now = self._clock()
        for r in self.ranks:
            if r.state is RankState.RUNNING:
                r.stack_wanted = True
        return now

    def lost_workers(self) -> list[str]:
        """The worker ids of LOST ranks (heartbeats stopped) without a stack taken since."""
        with self._lock:
            return [
                r.worker_id
                for r in self.ranks
                if r.state is RankState.LOST and (r.stack_at is None or r.stack_at < (r.ended_at or 0.0))
            ]

    def outside_stack(self, worker_id: str, text: str) -> None:
        """A lost rank's stack read from outside its process (py-spy), or why there is none: it
        goes with its error, which the root cause shows."""
        with self._lock:
            rec = self.registry.get(worker_id)
            if rec is None:
                return
            rec.stack, rec.stack_at = text, self._clock()
            rec.error = f"{rec.error}\n{text}" if rec.error else text
            self._event("stack", rec.rank, text)

    def ask_stacks(self) -> float:
        """Ask every running rank for its training thread's stack; returns the time asked (the
        master's clock) for :meth:`stacks_since`."""
        with self._lock:
            return self._want_stacks()

    def stacks_since(self, asked: float) -> bool:
        """True when every running rank sent its stack since ``asked`` (or none is running)."""
        with self._lock:
            return all(
                r.stack_at is not None and r.stack_at >= asked
                for r in self.ranks
                if r.state is RankState.RUNNING
            )

    def stacks(self) -> pb.GetStacksResponse:
        """Every rank's last stack, and the stacks grouped by frame."""
        with self._lock:
            grouped = self.progress.grouped(self.ranks, self._clock())
            reply = pb.GetStacksResponse(grouped=str(grouped))
            for r in self.ranks:
                if r.stack_pb is not None:
                    reply.ranks.append(pb.RankStack(rank=r.rank, stack=r.stack_pb, text=r.stack))
            return reply

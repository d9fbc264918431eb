"""The run's state as the master serves it: a snapshot after a reader's cursor (``GetState``,
the panel, ``orch status``), serialized in pieces for the gRPC master, and one series' points.
A part of :class:`~orch.master.coordinator.Coordinator`: it holds the coordinator's lock only
to draft a reply (:mod:`orch.master.control.snapshot`); the copies and the encoding happen
outside it, so that heartbeats never wait for a catch-up."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from orch.master.control.facade import RunFacade
from orch.master.control.series import yield_gil
from orch.master.control.snapshot import StateDraft, draft_reply
from orch.master.control.validate import parse_cursor
from orch.wire._proto import orchestrator_pb2 as pb


class StateDesk(RunFacade):
    """What a coordinator serves of its run (a part of :class:`~orch.master.coordinator.Coordinator`)."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    _wall: Callable[[], float]

    if TYPE_CHECKING:  # the coordinator's own (declared here for the type checker only)

        def expire(self) -> None: ...

    def series(self, rank: int, name: str) -> tuple[list[int], list[float]]:
        """The points of one series still held in memory."""
        with self._lock:
            s = self.points.get(rank, name)
            return list(s.steps), list(s.values)

    @property
    def trimmed(self) -> bool:
        """True when some points are only in the run dir's metrics log, no longer in memory."""
        with self._lock:
            return self.points.trimmed

    def snapshot(
        self,
        cursor: bytes = b"",
        *,
        skip_series: bool = False,
        max_points: int = 0,
        changed_ranks: bool = False,
    ) -> pb.GetStateResponse:
        """The run's state, with only the points and events after ``cursor``.

        At most ``max_points`` points (default and ceiling ``MAX_POINTS_PER_REPLY``) go in
        one reply; ``more`` then says to ask again with its cursor. ``skip_series``: no points.
        ``changed_ranks``: only the ranks whose records changed since ``cursor``.
        """
        self.expire()
        draft = self._draft(cursor, skip_series, max_points, changed_ranks)
        draft.publish()  # outside the lock: heartbeats never wait for a thousand ranks' records
        built = draft.copy()  # ... nor for a catch-up's copies
        if draft.trimmed_meanwhile():
            with self._lock:
                draft.recopy(built)
        return draft.finish(built)

    def snapshot_bytes(
        self,
        cursor: bytes = b"",
        *,
        skip_series: bool = False,
        max_points: int = 0,
        pause: Callable[[], None] = yield_gil,
        changed_ranks: bool = False,
    ) -> bytes:
        """:meth:`snapshot`, serialized, for the gRPC master: its ranks and points are built
        outside the lock, calling ``pause`` after each millisecond of it, so that a reply never
        holds the GIL (and the event loop that serves heartbeats) for long. ``changed_ranks``:
        only the ranks whose records changed since ``cursor``."""
        # No expire() here: the server's expiry thread runs it four times a second.
        draft = self._draft(cursor, skip_series, max_points, changed_ranks)
        draft.publish(pause)
        encoded = draft.encode(pause)
        if draft.trimmed_meanwhile():
            with self._lock:
                draft.reencode_trimmed(encoded)
        return draft.finish_bytes(encoded)

    def _draft(self, cursor: bytes, skip_series: bool, max_points: int, changed_ranks: bool) -> StateDraft:
        """The reply after ``cursor``, but for its ranks and points, drafted under the lock."""
        prev = parse_cursor(cursor, max_points)
        with self._lock:
            return draft_reply(
                self,
                cursor,
                prev,
                self._clock(),
                self._wall(),
                skip_series=skip_series,
                max_points=max_points,
                changed_ranks=changed_ranks,
            )

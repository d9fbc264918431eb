"""Which failure explains a failed run: the root cause, kept as a structured record.

The first failure reported is the root cause unless a better explanation arrives within
:data:`SETTLE_SECONDS`: the rank whose death broke a collective is often seen after the
peers that the broken collective failed, and a rank the launcher tore down explains nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import Enum

from orch.master.control.registry import RankRecord
from orch.wire.states import BARRIER_CLOSED, CALL_ENDED

SETTLE_SECONDS = 2.0
PEER_ERROR = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|gloo/transport|DistBackendError|DistNetworkError"
    r"|NCCL (error|communicator)|ProcessGroup\w* .*(timed out|abort)|"
    + re.escape(CALL_ENDED)
    + "|"
    + re.escape(BARRIER_CLOSED),
    re.IGNORECASE,
)
LOST_TOGETHER = "; lost at the same time: "


class CauseKind(str, Enum):
    """What ended the run, from the best explanation to the weakest."""

    ERROR = "error"  # the rank reported its own exception (or sys.exit with a failing code)
    EXITED = "exited"  # the rank's process died (an exit code or a signal) without reporting
    LOST = "lost"  # the rank's heartbeats stopped: its host or its link is gone, or it froze
    HUNG = "hung"  # no rank failed: their steps stopped advancing (on_hang="fail"); detail: the stacks
    PEER = "peer"  # the rank's collective failed because a peer was gone
    TORN_DOWN = "torn_down"  # the launcher ended the rank, or it ended itself because the run had failed
    OUTSIDE = "outside"  # no rank: the launch failed, or the run was closed or given up from outside

    @property
    def weight(self) -> int:
        """How well it explains a failure (0: best)."""
        return {CauseKind.PEER: 1, CauseKind.TORN_DOWN: 2}.get(self, 0)


def reported_kind(error: str) -> CauseKind:
    """The kind of a failure a rank reported itself, from its error text."""
    return CauseKind.PEER if PEER_ERROR.search(error) else CauseKind.ERROR


@dataclass
class RootCause:
    kind: CauseKind
    message: str  # one line: which rank, where, and the last line of its error
    record: RankRecord | None = None  # None: a failure from outside any rank
    together: list[RankRecord] = field(default_factory=list)  # ranks lost at the same time
    attempts: int = 1  # attempts made when the run ended on this cause (after restarts)
    reason: str = ""  # why no restart followed, when that is news
    detail: str = ""  # for a failure from outside: what it left to read (a job's output)

    @property
    def rank(self) -> int | None:
        return self.record.rank if self.record is not None else None

    @property
    def exit_code(self) -> int | None:
        return self.record.exit_code if self.record is not None else None

    @property
    def error(self) -> str:
        return self.record.error if self.record is not None else self.detail

    def describe(self) -> str:
        text = self.message
        if self.together:
            text += LOST_TOGETHER + ", ".join(f"rank {r.rank} ({r.address or r.host})" for r in self.together)
        notes = [f"after {self.attempts} attempts"] if self.attempts > 1 else []
        if self.reason:
            notes.append(self.reason)
        return f"{text} ({'; '.join(notes)})" if notes else text


class FailureJudge:
    """Keeps the root cause of the current attempt, and of the first failed attempt."""

    def __init__(self) -> None:
        self.cause: RootCause | None = None
        self.first: RootCause | None = None  # the first attempt's cause, once a restart followed
        self._at = 0.0

    def first_failure(self, cause: RootCause, now: float) -> None:
        self.cause, self._at = cause, now

    def later_failure(self, cause: RootCause, now: float, *, known: bool = False) -> bool:
        """Another rank failed after the first: it becomes the root cause when it explains
        the failure better and came within the settle time. ``known``: the launcher knows the
        rank's host is gone, which explains a peer's broken collective however late it says
        so. True when it did."""
        current = self.cause
        if current is None or current.record is None:
            return False
        if known and current.kind is CauseKind.PEER and cause.kind.weight < current.kind.weight:
            self.cause = cause
            return True
        if cause.kind.weight < current.kind.weight and now - self._at <= SETTLE_SECONDS:
            self.cause = cause
            return True
        return False

    def lost_together(self, lost: list[RankRecord], window: float) -> None:
        """Ranks found silent with the root cause's LOST rank fell silent with it (a host that
        dropped off takes all its ranks): name them with it. Ranks aborted because the run
        failed fall silent a whole timeout later, and are not named."""
        cause = self.cause
        if cause is None or cause.kind is not CauseKind.LOST or cause.record is None:
            return
        root = cause.record
        if root.last_heartbeat is None:
            return
        for r in lost:
            if r is root or r in cause.together or r.last_heartbeat is None:
                continue
            if root in lost or abs(r.last_heartbeat - root.last_heartbeat) <= window:
                cause.together.append(r)

    def outside(self, message: str, detail: str = "") -> None:
        """The run fails from outside any rank (the launcher, close(), a launch that failed)."""
        self.cause = RootCause(CauseKind.OUTSIDE, message, detail=detail)

    def new_attempt(self) -> None:
        if self.first is None:
            self.first = self.cause
        self.cause = None

    def final(self, attempts: int, reason: str) -> None:
        """No restart follows: the first attempt's cause stands, with how many were made."""
        if self.first is not None:
            self.cause = replace(self.first, attempts=attempts, reason=reason)
        elif self.cause is not None and reason:
            self.cause.reason = reason

"""The run's state machine: every transition declared here, and made only through :meth:`Lifecycle.to`."""

from __future__ import annotations

from orch.wire.states import RunState

S = RunState
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    # barrier opened; launch failed; stopped (or pruned) early
    S.PENDING: frozenset({S.RUNNING, S.FAILED, S.STOPPED, S.PRUNED}),
    S.RUNNING: frozenset({S.STOPPING, S.SUCCEEDED, S.FAILED, S.STOPPED, S.PRUNED, S.RESTARTING}),
    S.STOPPING: frozenset({S.STOPPED, S.PRUNED, S.FAILED}),  # every rank ended; a rank failed on the way
    S.RESTARTING: frozenset({S.PENDING, S.FAILED, S.STOPPED, S.PRUNED}),  # next attempt; gave up; stopped
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.STOPPED: frozenset(),
    S.PRUNED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


class Lifecycle:
    """State, attempt and timing of one run; times come from the caller's clock."""

    def __init__(self, max_attempts: int = 1, created_at: float | None = None) -> None:
        self.state = RunState.PENDING
        self.attempt = 1
        self.max_attempts = max_attempts
        self.created_at = created_at  # the run was launched: its clock starts here
        self.started_at: float | None = None  # this attempt's barrier opened
        self.ended_at: float | None = None
        self._first_start: float | None = None

    def to(self, new: RunState, now: float) -> None:
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"a run cannot go from {self.state.value} to {new.value}")
        self.state = new
        if new is RunState.RUNNING:
            self.started_at = now
            if self._first_start is None:
                self._first_start = now
        elif new is RunState.PENDING:  # the next attempt
            self.attempt += 1
            self.ended_at = None
        elif new.done:
            self.ended_at = now

    def elapsed(self, now: float) -> float:
        """One clock for the run: seconds since its launch, through start-up and every attempt,
        standing still once it ended (without a launch time: since its first barrier)."""
        begun = self.created_at if self.created_at is not None else self._first_start
        if begun is None:
            return 0.0
        return max(0.0, (self.ended_at if self.ended_at is not None else now) - begun)

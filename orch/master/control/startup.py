"""What a run is doing before its first step, in words, for the panel and the dashboard.

A cold start takes seconds (the worker pool imports torch, each rank registers, the ranks meet
at the start barrier and join the process group). The run's state alone says PENDING, then
RUNNING at 0 steps, which looks frozen. The launcher tells the master what it does (a
*phase*: "starting 4 workers: importing torch"); the registry and the ranks' first heartbeats
tell it the rest. :meth:`StartupWatch.note` puts them together:

- PENDING, no rank registered: the launcher's phase (else "waiting for N workers to register");
- PENDING, some registered: "3/4 registered";
- RUNNING, a rank that has not beaten yet: "at the start barrier: joining the process group";
- RUNNING, every rank beating, no step yet: "training: waiting for the first step";
- then nothing: the run's own numbers speak.

``seconds`` counts from the start of this attempt's start-up, so the number moves while the
words stand.
"""

from __future__ import annotations

from collections.abc import Sequence

from orch.master.control.registry import RankRecord
from orch.wire.states import RunState


class StartupWatch:
    """The launcher's phase and when this attempt's start-up began (the master's clock)."""

    def __init__(self, now: float) -> None:
        self.phase = ""
        self.began = now

    def set_phase(self, phase: str, now: float, *, new_attempt: bool = False) -> bool:
        """The launcher's words for what it does now; True when they changed."""
        if new_attempt:
            self.began = now
        changed = phase != self.phase
        self.phase = phase
        return changed

    def note(
        self, state: RunState, ranks: Sequence[RankRecord], world_size: int, now: float
    ) -> tuple[str, float]:
        """(what the run does before its first step, seconds since its start-up began);
        ("", 0.0) once a rank reported a step, or the run ended."""
        seconds = max(0.0, now - self.began)
        registered = len(ranks)
        if state is RunState.PENDING:
            if registered == 0:
                return self.phase or f"waiting for {world_size} workers to register", seconds
            return f"{registered}/{world_size} registered", seconds
        if state is not RunState.RUNNING or any(r.step > 0 or r.has_loss for r in ranks):
            return "", 0.0
        if any(r.beats == 0 for r in ranks):
            return "at the start barrier: joining the process group", seconds
        return "training: waiting for the first step", seconds

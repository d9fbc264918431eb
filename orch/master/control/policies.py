"""The run's policies as objects that return decisions: what a hang does, whether a failure
restarts the group.

Each is built once from the launch's options (``on_hang``, ``max_restarts``) and asked by
the part that meets the situation (:mod:`.progress` for a hang, :mod:`.fate` for a failure);
the words a decision carries are what the event log and the root cause say. A new rule (a
restart budget in time, a hang that dumps and restarts) is a new policy here, with its test,
and the parts that ask stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from orch.master.control.judge import CauseKind, RootCause

HangAction = Literal["warn", "fail"]
ON_HANG: tuple[str, ...] = get_args(HangAction)


@dataclass(frozen=True)
class HangPolicy:
    """What a stall past its limit does once its stacks are in: ``"warn"`` tells it (the event
    log, the panel, ``orch status``); ``"fail"`` also ends the run, with the hang as its root cause."""

    action: HangAction = "warn"

    @classmethod
    def named(cls, on_hang: str) -> HangPolicy:
        for action in get_args(HangAction):
            if on_hang == action:
                return cls(action)
        raise ValueError(f"on_hang must be one of {ON_HANG}, got {on_hang!r}")

    def decide(self, note: str, stacks: str) -> RootCause | None:
        """The root cause to fail the run with for the stall ``note`` describes (None: go on)."""
        if self.action != "fail":
            return None
        return RootCause(CauseKind.HUNG, f"{note}; on_hang='fail' ended it", detail=stacks)


@dataclass(frozen=True)
class RestartDecision:
    """Whether the group restarts after a failure, and, when it does not, why (``""``: nothing
    worth saying, as for a run that asked for no restarts)."""

    restart: bool
    reason: str = ""


@dataclass(frozen=True)
class RestartPolicy:
    """A failed attempt restarts the group while attempts are left (``max_attempts``, that is
    ``max_restarts + 1``) and the attempt got past start-up: a rank took a step. A failure
    before any step (a bad import, a wrong path) fails the same way again, so it ends the run."""

    max_attempts: int = 1

    def decide(self, attempt: int, stepped: bool) -> RestartDecision:
        """After attempt number ``attempt`` failed; ``stepped``: a rank of it took a step."""
        if attempt >= self.max_attempts:
            return RestartDecision(False, "no restarts left" if self.max_attempts > 1 else "")
        if not stepped:
            return RestartDecision(False, "it failed during start-up, before any step: not restarted")
        return RestartDecision(True)

"""What every run answers when it is read: the half of the run contract below the launchers.

A run read back from its run dir (:class:`~orch.record.rundir.RunRecord`) and every run a
user holds (:class:`~orch.launchers.contract.RunHandle`) implement :class:`RunSource`; the
panel reads a run through it alone: where its master is (``connect()``, None when there is
nothing to poll), its state, its logs, how to stop it, and its final state once it ended.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from orch.wire.client import MasterClient, StateMirror
from orch.wire.states import RunState


class RunSource(ABC):
    """A run, as read: its id, dir and master; its state, history and logs; Stop."""

    @property
    @abstractmethod
    def run_id(self) -> str: ...

    @property
    def run_dir(self) -> Path | None:
        """Its run dir (None for a master known by its address alone)."""
        return None

    @property
    def address(self) -> str:
        """Its master's HOST:PORT ("" when there is no master to reach)."""
        return ""

    @abstractmethod
    def state(self) -> StateMirror:
        """The run as its master (or its record) says, up to date."""

    @abstractmethod
    def stop(self, reason: str = "stopped from a notebook") -> RunState:
        """Ask its ranks to end after their step (a no-op once it ended); its state."""

    def history(self) -> dict[str, dict[int, dict[str, list[float]]]]:
        """``{metric: {rank: {"step": [...], "value": [...]}}}`` for every logged scalar."""
        return self.state().history()

    def log_files(self) -> dict[str, Path]:
        """Each rank's log by worker id (empty when the logs are on other hosts)."""
        return {}

    def connect(self) -> MasterClient | None:
        """A client of the run's master, for the panel to poll; None when there is none."""
        return None

    def final_state(self) -> StateMirror | None:
        """The run's state once it ended, else None."""
        return None

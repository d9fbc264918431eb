"""Accelerate's tracked metrics in orch: ``Accelerator(log_with=OrchTracker())``.

An Accelerate ``GeneralTracker``: what ``accelerator.log({"loss": ...}, step=step)`` logs is
recorded at its step. Accelerate calls ``log`` on its main process only, so the panel draws
rank 0's curve; ``orch.log(step, loss=...)`` in the loop draws every rank's. The world Accelerate
sees is held against the run's at every beat, tracker or not (:mod:`orch.runtime._world`).
"""

from __future__ import annotations

from typing import Any

from accelerate.tracking import GeneralTracker

from orch.runtime import current


class OrchTracker(GeneralTracker):
    """Ships ``accelerator.log`` values to the panel; does nothing outside an orch run."""

    name = "orch"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str = "orch") -> None:
        super().__init__()
        self.run_name = run_name

    @property
    def tracker(self) -> Any:
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        pass  # the run's config is in run.json

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        current.record(step, dict(values))

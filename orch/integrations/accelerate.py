"""Accelerate's tracked metrics in orch: ``Accelerator(log_with=OrchTracker())``.

An Accelerate ``GeneralTracker``: ``accelerator.log({"loss": ...}, step=step)`` records on every
rank (Accelerate calls its trackers on the main process only unless a tracker says otherwise:
this one says ``main_process_only = False``). The world Accelerate sees is held against the
run's at every beat anyway (:mod:`orch.runtime._world`).
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

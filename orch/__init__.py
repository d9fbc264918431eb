"""orch: run and watch distributed PyTorch (DDP) training from a notebook or a terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .api import AttachedRun, attach, launch
from .catalog import RunTable, close_all, runs
from .client import MasterClient, StateMirror
from .detach import DetachedRun
from .errors import (
    AuthError,
    ConfigError,
    MasterUnavailable,
    OrchError,
    PortInUseError,
    RunFailed,
    WorkerError,
)
from .launcher import Run, RunResult
from .rundir import LoadedRun, load_run
from .slurm import Slurm, SlurmError
from .states import RankState, RunState
from .sweep import Sweep, SweepResults, Trial, grid, sweep

if TYPE_CHECKING:
    from .comparison import compare
    from .context import Context
    from .panel import Panel

__version__ = "0.1.0"

__all__ = [
    "AttachedRun",
    "AuthError",
    "ConfigError",
    "Context",
    "DetachedRun",
    "LoadedRun",
    "MasterClient",
    "MasterUnavailable",
    "OrchError",
    "Panel",
    "PortInUseError",
    "RankState",
    "Run",
    "RunFailed",
    "RunResult",
    "RunState",
    "RunTable",
    "Slurm",
    "SlurmError",
    "StateMirror",
    "Sweep",
    "SweepResults",
    "Trial",
    "WorkerError",
    "attach",
    "close_all",
    "compare",
    "grid",
    "launch",
    "load_run",
    "runs",
    "sweep",
]


def __getattr__(name: str) -> Any:
    # The panel pulls in ipywidgets and matplotlib: only notebooks pay for that, not workers;
    # the context pulls in torch: `orch status` and `orch.attach` never need it.
    if name == "Panel":
        from .panel import Panel

        return Panel
    if name == "compare":  # the comparison panel: ipywidgets and matplotlib, as Panel
        from .comparison import compare

        return compare
    if name == "Context":
        from .context import Context

        return Context
    raise AttributeError(f"module 'orch' has no attribute {name!r}")

"""orch: run and watch distributed PyTorch (DDP) training from a notebook or a terminal."""

from __future__ import annotations

from .api import launch
from .client import MasterClient, StateMirror
from .context import Context
from .coordinator import RankState, RunState
from .errors import ConfigError, MasterUnavailable, OrchError, PortInUseError, RunFailed, WorkerError
from .launcher import Run, RunResult

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Context",
    "MasterClient",
    "MasterUnavailable",
    "OrchError",
    "PortInUseError",
    "RankState",
    "Run",
    "RunFailed",
    "RunResult",
    "RunState",
    "StateMirror",
    "WorkerError",
    "launch",
]

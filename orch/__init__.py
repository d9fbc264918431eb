"""orch: run and watch distributed PyTorch (DDP) training from a notebook or a terminal.

The public names are re-exported here and imported on first use: a worker process (which
imports this package before its own module) loads only the worker runtime and the wire,
``orch status`` never imports torch, and only a notebook that shows a panel pays for
ipywidgets and matplotlib. The layers under this face, each importing only those below it
(held by the import-linter contract in pyproject.toml)::

    orch (api, cli)        the face: launch, attach, sweep, runs, the command line
    orch.views             panels, comparison, terminal dashboard, static records
    orch.experiments       sweeps, the runs on disk
    orch.launchers         a run started here, detached or on Slurm; the run contract
    orch.master | orch.runtime   the coordinator and gRPC server | the worker and host agent
    orch.record            the run dir: store, reader, TensorBoard export
    orch.wire              protocol, auth, addresses, the client
    orch.errors, orch.wire.states, orch._version, orch._viewable
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from orch import _tracebacks, _viewable
from orch._version import __version__ as __version__

# gRPC's C core prints INFO lines of its own ("chttp2_transport.cc ... Got goaway ... connection
# idle" when the master closes an idle connection) on the process's stderr, which a notebook
# shows in the running cell. Its level is read once, when grpc is first imported: orch sets
# errors only, unless the user chose a level (GRPC_VERBOSITY) or imported grpc before orch.
if "grpc" not in sys.modules and "GRPC_VERBOSITY" not in os.environ:
    os.environ["GRPC_VERBOSITY"] = "ERROR"

if TYPE_CHECKING:
    from orch.api import attach, launch
    from orch.errors import (
        AuthError,
        ConfigError,
        MasterUnavailable,
        NestedRunError,
        OrchError,
        PortInUseError,
        RunFailed,
        WorkerError,
    )
    from orch.experiments.catalog import close_all
    from orch.experiments.pruning import ASHA, SHA, MedianStop
    from orch.experiments.results import SweepResults
    from orch.experiments.run_table import RunTable, runs
    from orch.experiments.space import choice, grid, loguniform, randint, uniform
    from orch.experiments.sweep import Sweep, sweep
    from orch.experiments.trial import Trial
    from orch.launchers.attached import AttachedRun
    from orch.launchers.contract import RunResult
    from orch.launchers.detached.run import DetachedRun
    from orch.launchers.gang import Gang, gang
    from orch.launchers.loaded import LoadedRun, load_run
    from orch.launchers.ray.options import Ray
    from orch.launchers.run import Run
    from orch.launchers.slurm.options import Slurm, SlurmError
    from orch.runtime.context import Context
    from orch.runtime.current import context, log
    from orch.views.comparison import compare
    from orch.views.panel import Panel
    from orch.wire.client import MasterClient, StateMirror
    from orch.wire.states import RankState, RunState

# Each public name and the module it lives in.
_EXPORTS = {
    "ASHA": "orch.experiments.pruning",
    "MedianStop": "orch.experiments.pruning",
    "SHA": "orch.experiments.pruning",
    "choice": "orch.experiments.space",
    "loguniform": "orch.experiments.space",
    "randint": "orch.experiments.space",
    "uniform": "orch.experiments.space",
    "AttachedRun": "orch.launchers.attached",
    "AuthError": "orch.errors",
    "ConfigError": "orch.errors",
    "Context": "orch.runtime.context",
    "DetachedRun": "orch.launchers.detached.run",
    "Gang": "orch.launchers.gang",
    "gang": "orch.launchers.gang",
    "LoadedRun": "orch.launchers.loaded",
    "MasterClient": "orch.wire.client",
    "MasterUnavailable": "orch.errors",
    "OrchError": "orch.errors",
    "Panel": "orch.views.panel",
    "PortInUseError": "orch.errors",
    "RankState": "orch.wire.states",
    "Ray": "orch.launchers.ray.options",
    "Run": "orch.launchers.run",
    "RunFailed": "orch.errors",
    "RunResult": "orch.launchers.contract",
    "RunState": "orch.wire.states",
    "RunTable": "orch.experiments.run_table",
    "Slurm": "orch.launchers.slurm.options",
    "SlurmError": "orch.launchers.slurm.options",
    "StateMirror": "orch.wire.client",
    "Sweep": "orch.experiments.sweep",
    "SweepResults": "orch.experiments.results",
    "Trial": "orch.experiments.trial",
    "NestedRunError": "orch.errors",
    "WorkerError": "orch.errors",
    "attach": "orch.api",
    "close_all": "orch.experiments.catalog",
    "compare": "orch.views.comparison",
    "grid": "orch.experiments.space",
    "launch": "orch.api",
    "load_run": "orch.launchers.loaded",
    "log": "orch.runtime.current",
    "context": "orch.runtime.current",
    "runs": "orch.experiments.run_table",
    "sweep": "orch.experiments.sweep",
}

__all__ = [  # noqa: RUF022 (in plain sorted order, as the README lists them)
    "ASHA",
    "AttachedRun",
    "AuthError",
    "ConfigError",
    "Context",
    "DetachedRun",
    "Gang",
    "LoadedRun",
    "MasterClient",
    "MasterUnavailable",
    "MedianStop",
    "NestedRunError",
    "OrchError",
    "Panel",
    "PortInUseError",
    "RankState",
    "Ray",
    "Run",
    "RunFailed",
    "RunResult",
    "RunState",
    "RunTable",
    "SHA",
    "Slurm",
    "SlurmError",
    "StateMirror",
    "Sweep",
    "SweepResults",
    "Trial",
    "WorkerError",
    "attach",
    "choice",
    "close_all",
    "compare",
    "context",
    "gang",
    "grid",
    "launch",
    "load_run",
    "log",
    "loguniform",
    "randint",
    "runs",
    "sweep",
    "uniform",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


def _panel_for(kind: str) -> Any:
    # The face wires the views into the runs and sweeps below it, which cannot import them:
    # ipywidgets and matplotlib load only when a panel is first wanted.
    if kind == "run":
        from orch.views.panel import Panel

        return Panel
    if kind == "gang":  # a gang's calls, as one session
        from orch.views.gang_panel import gang_panel

        return gang_panel
    from orch.views.sweep_panel import SweepPanel

    return SweepPanel


def _orch_cell(line: str, cell: str) -> Any:
    """``%%orch gang``: the cell's code on every rank of the gang (see :mod:`orch._magic`)."""
    from orch._magic import orch_cell

    return orch_cell(line, cell)


def _install_magic() -> None:
    """Register ``%%orch`` in this process's IPython shell, if there is one."""
    ipython = sys.modules.get("IPython")
    with contextlib.suppress(Exception):
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is not None:
            shell.register_magic_function(_orch_cell, magic_kind="cell", magic_name="orch")


_viewable.set_panel_factory(_panel_for)
_tracebacks.install()  # in a notebook, orch's errors lead with their message
_install_magic()

"""The run catalog: every run dir under a run root, as one table (``orch.runs()``, ``orch runs``).

A row is read from ``run.json`` (what was launched) and, once the run ended, ``result.json``
(how it ended, with each rank's last loss); ``metrics.pb`` is never read, so the table stays
cheap however long the runs were. A run without ``result.json`` is asked about where it is:

- a run of this process is read from its live :class:`~orch.launchers.run.Run` (marked *live here*);
- a run whose launching process (``run.json``'s ``pid`` on its ``host``) is alive is RUNNING;
- one whose launching process is gone is CRASHED: it ended without writing its record;
- one launched on another host, or by a process run.json does not name (``orch master``), is
  UNKNOWN from here.

A run dir whose JSON is half-written or hand-edited (:func:`orch.load_run` would refuse it) is
DAMAGED, its row saying why; it never hides the other rows.

This module holds what concerns the runs of this process (:func:`close_all`,
:func:`live_notice`); the catalog's parts live beside it, each imported from its own module:

- :mod:`orch.experiments.run_row`: one run dir read as a row (``RunRow``, ``read_row``);
- :mod:`orch.experiments.run_table`: the table of a run root (``runs``, ``RunTable``);
- :mod:`orch.experiments.run_detail`: one run for ``orch show`` and ``orch logs``
  (``find_run``, ``rank_log``, ``describe``).
"""

from __future__ import annotations

import contextlib
import time

from orch._text import printable
from orch.errors import OrchError
from orch.experiments.sweep import close_all_sweeps
from orch.launchers.apart.client import ApartRun, close_all_apart, live_apart_runs
from orch.launchers.gang import close_all_gangs
from orch.launchers.run import Run, close_all_runs, live_runs
from orch.record.rundir import read_json


# -- runs of this process ----------------------------------------------------------------------
def close_all() -> int:
    """End every run still live in this process (as ``run.close()``), every sweep's, which
    then starts no more, and every gang's ranks; returns how many runs there were."""
    count = len(live_runs()) + len(live_apart_runs())
    close_all_sweeps()  # first: a sweep would start its next config in the place of a closed one
    close_all_gangs()
    close_all_runs()
    close_all_apart()
    return count


def live_notice() -> str | None:
    """One line naming the runs of this process still live (None when there is none)."""
    live: list[Run | ApartRun] = [*live_runs(), *live_apart_runs()]
    if not live:
        return None
    now = time.time()
    described = []
    ids = [run.run_id for run in live]
    for run in live:
        started = None
        with contextlib.suppress(OrchError, ValueError, TypeError):
            value = read_json(run.run_dir / "run.json").get("started")
            started = float(value) if isinstance(value, int | float) else None
        when = f"launched {_ago(now - started)}" if started else "launching"
        label = f" {printable(run.spec.name, one_line=True)!r}" if run.spec.name else ""
        state = run.coordinator.state.value if isinstance(run, Run) else _state_of(run)
        described.append((f"{run.run_id}{label}", when, state))
    if len(described) == 1:
        what, when, state = described[0]
        return (
            f"orch: run {what} ({when}) is still {state} in this kernel; `run` will name the new "
            f"run: orch.attach({ids[0]!r}).stop() ends this one, orch.close_all() every run of "
            "this kernel (the new one too)"
        )
    listed = ", ".join(f"{what} ({state}, {when})" for what, when, state in described)
    return (
        f"orch: {len(described)} runs are still live in this kernel: {listed}; "
        f"orch.attach('<id>').stop() ends one (e.g. orch.attach({ids[0]!r}).stop()), "
        "orch.close_all() every run of this kernel (the new one too)"
    )


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{max(0, round(seconds))} s ago"
    if seconds < 5400:
        return f"{round(seconds / 60)} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _state_of(run: ApartRun) -> str:
    """A run whose master lives apart, as its master says (or the last it said)."""
    try:
        return run.state().state.value
    except OrchError:
        return run._last_state()

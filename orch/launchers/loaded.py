"""A run read back from its run dir, as a run: :func:`orch.load_run`.

The reading is the record's (:class:`~orch.record.rundir.RunRecord`); this adds the run
contract, so a loaded run answers ``wait()``, ``panel()`` and the rest as a live one does.
"""

from __future__ import annotations

from pathlib import Path

from orch.launchers.contract import RunHandle
from orch.record.rundir import DEFAULT_MAX_POINTS, RunRecord


class LoadedRun(RunRecord, RunHandle):
    """A run read back from its directory: ``history()``, ``state()``, ``panel()``, ``to_csv()``.

    It has ended, so ``wait()`` returns at once (raising :class:`orch.RunFailed` for a failed
    run, as a live run's would) and ``stop()`` changes nothing.
    """


def load_run(path: str | Path, *, max_points: int | None = DEFAULT_MAX_POINTS) -> LoadedRun:
    """Read a run back from ``runs/<run-id>/``, whether it finished or its master crashed.

    At most ``max_points`` points are held (``None``: every one); past that the series are
    down-sampled evenly (see :class:`~orch.record.rundir.RunRecord`), and ``to_csv()`` still
    exports every point.
    """
    return LoadedRun(path, max_points=max_points)

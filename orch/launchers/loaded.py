"""A run read back from its run dir, as a run: :func:`orch.load_run`.

The reading is the record's (:class:`~orch.record.rundir.RunRecord`); this adds the run
contract, so a loaded run answers ``wait()``, ``panel()`` and the rest as a live one does.
"""

from __future__ import annotations

from pathlib import Path

from orch.launchers.contract import RunHandle
from orch.record.names import no_run, run_dir_named
from orch.record.rundir import DEFAULT_MAX_POINTS, RunRecord


class LoadedRun(RunRecord, RunHandle):
    """A run read back from its directory: ``history()``, ``state()``, ``panel()``, ``to_csv()``.

    It has ended, so ``wait()`` returns at once (raising :class:`orch.RunFailed` for a failed
    run, as a live run's would) and ``stop()`` changes nothing.
    """


def load_run(
    path: str | Path, *, run_root: str | Path = "runs", max_points: int | None = DEFAULT_MAX_POINTS
) -> LoadedRun:
    """Read a run back from ``runs/<run-id>/``, whether it finished or its master crashed.

    ``path`` is a run dir, a run id under ``run_root`` or the unique start of one, as ``orch
    show`` takes it (``orch.load_run("afebeb388e40")``, ``orch.load_run("afeb")``).
    At most ``max_points`` points are held (``None``: every one); past that the series are
    down-sampled evenly (see :class:`~orch.record.rundir.RunRecord`), and ``to_csv()`` still
    exports every point.
    """
    target = Path(path)
    if not target.is_dir():  # a run id, or the start of one
        found = run_dir_named(path, run_root)
        if found is None:
            raise no_run(str(path), run_root)
        target = found
    return LoadedRun(target, max_points=max_points)

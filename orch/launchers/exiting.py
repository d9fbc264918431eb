"""Whether this process, the launcher of its runs, is going away.

A run ends with its launcher: a notebook kernel restarted or shut down, a script that exits
with a run still going. That is no rank's failure, and the record says so: ``launcher exited
(pid N)``. Two moments tell it: the interpreter's exit hook that closes the live runs
(:func:`orch.launchers.run.close_all_runs`), and, earlier, a Jupyter kernel's shutdown, which
sets its shell's ``exit_now`` and then terminates every child of the kernel (the workers'
forkserver among them, so the workers' exits can no longer be read: multiprocessing reports
255 for each).
"""

from __future__ import annotations

import contextlib
import os
import sys

_exiting = False
_launcher_pid: int | None = None  # the process that launched this one's runs, when it is not this one


def launched_for(pid: int) -> None:
    """This process hosts the runs of ``pid`` (:mod:`orch.launchers.apart.host`): their record
    names that process when it goes away."""
    global _launcher_pid
    _launcher_pid = pid


def begin_exit() -> None:
    """This process is exiting (its exit hook runs)."""
    global _exiting
    _exiting = True


def launcher_exiting() -> bool:
    """True once this process began to exit, or its notebook kernel began to shut down."""
    if _exiting or sys.is_finalizing():
        return True
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    with contextlib.suppress(Exception):
        shell = ipython.get_ipython()
        return bool(shell is not None and getattr(shell, "exit_now", False) is True)
    return False


def launcher_exit_message() -> str:
    """Why a run ended when its launcher went away, in the record's words."""
    pid = _launcher_pid or os.getpid()
    return (
        f"launcher exited (pid {pid}): the process that launched the run (a notebook "
        "kernel restarted or shut down, a script that ended) went away, and its workers with it"
    )

"""Every exception orch raises, in one place.

::

    OrchError                      base of everything below
    ├── ConfigError                bad arguments, caught before anything starts
    │   └── PortInUseError         a port the user named is taken
    ├── MasterUnavailable          no orch master answers at the address
    │   └── AuthError              it answered, but refused our token
    ├── RunFailed                  a run ended FAILED; carries the root cause
    ├── WorkerError                a worker could not join or finish its run
    └── NestedRunError             a rank started a distributed job of its own

    StopTraining (a BaseException) ends a training function that was asked to stop.
"""

from __future__ import annotations

import os
import re
import sysconfig


class OrchError(Exception):
    """Base class of every orch error."""


class ConfigError(OrchError, ValueError):
    """An argument is wrong; the message says which and what to pass instead."""


class PortInUseError(ConfigError):
    """A port the user asked for is taken."""

    def __init__(self, port: int, what: str, option: str) -> None:
        self.port, self.what, self.option = port, what, option
        super().__init__(
            f"port {port} ({what}) is already in use on this machine: "
            f"stop whatever holds it, or pass {option}=<another port> "
            f"(or 0 to pick a free one)"
        )

    def __reduce__(self) -> tuple[type[PortInUseError], tuple[int, str, str]]:
        # Raised where a run's master starts, which may be another process than the caller's.
        return (PortInUseError, (self.port, self.what, self.option))


class MasterUnavailable(OrchError):
    """No orch master answered at the given address."""


class AuthError(MasterUnavailable):
    """The master refused the call: a missing or wrong token."""


class WorkerError(OrchError):
    """A worker could not register, pass the start barrier, or report back."""


class NestedRunError(OrchError):
    """A rank of an orch run started a distributed job of its own (a nested ``orch.launch``,
    ``torch.multiprocessing.spawn``, a library re-executing the program): orch runs the ranks
    already, and a second set beside them would train apart from them."""


class RunFailed(OrchError):
    """A run ended FAILED. ``rank``, ``exit_code`` and ``traceback`` name the root cause."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        exit_code: int | None = None,
        traceback: str = "",
        state: object = None,
    ) -> None:
        self.rank = rank
        self.exit_code = exit_code
        self.traceback = traceback
        self.state = state
        where = raised_at(traceback)
        if where and where not in message:  # the user's file and line, not only the error's words
            message = f"{message} (at {where})"
        super().__init__(message)


# A frame of a formatted traceback: as Python writes it, and as IPython labels a notebook cell.
_FRAME = re.compile(
    r'^\s*(?:File "(?P<file>[^"]+)"|(?P<cell>Cell In\[\d+\])), line (?P<line>\d+), in (?P<fn>.+)$'
)
_ORCH_CELL = re.compile(r"<orch cell (In\[\d+\])>")  # orch.runtime.gang.run_cell's file name
_NOT_USER = tuple(
    os.path.join(os.path.abspath(p), "")
    for p in {
        os.path.dirname(os.path.abspath(__file__)),  # orch itself
        *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    if p
)


def raised_at(traceback: str) -> str:
    """Where the user's code raised, read from a formatted traceback: its deepest frame in a
    notebook cell or a file outside orch, the standard library and installed packages
    (``Cell In[3], line 7, in train`` or ``train.py, line 12, in main``); "" when none is."""
    found = ""
    for line in traceback.splitlines():
        m = _FRAME.match(line)
        if m is None:
            continue
        if m["cell"]:
            found = f"{m['cell']}, line {m['line']}, in {m['fn']}"
            continue
        path = m["file"]
        cell = _ORCH_CELL.fullmatch(path)
        if cell is not None:  # a %%orch cell's code, run on the ranks: named as the cell it is
            found = f"Cell {cell[1]}, line {m['line']}, in {m['fn']}"
            continue
        if path.startswith("<") or (
            os.path.abspath(path).startswith(_NOT_USER)
            and not path.endswith(os.path.join("orch", "example.py"))
        ):
            continue
        found = f"{path}, line {m['line']}, in {m['fn']}"
    return found


class StopTraining(BaseException):
    """Raised by ``ctx.log`` in a loop without ``ctx.steps`` once the run was asked to stop.

    Every rank raises it at the same step, so DDP's collectives end together; the rank ends
    STOPPED. A BaseException, so that ``except Exception`` in a training loop lets it through.
    """


class CallAborted(BaseException):
    """A gang's call failed on another rank while this one was still in it (waiting in a loop of
    its own, a sleep, a data loader): raised in its code so that it ends its part and the gang
    keeps its state. A BaseException, so that ``except Exception`` lets it through."""


class CallInterrupted(StopTraining, KeyboardInterrupt):
    """A gang's call was stopped (Stop, or the kernel's Interrupt during a ``%%orch`` cell): every
    rank raises it at the same step boundary (``ctx.steps``, ``ctx.log``, ``ctx.data``), as
    Ctrl-C raises KeyboardInterrupt in a loop here, so code after the loop does not run and
    ``finally`` blocks do. The call ends STOPPED and the gang stays up."""

"""``%%orch gang``: run a notebook cell's code on every rank of a gang, as ``%%px`` does.

``import orch`` in an IPython kernel registers the cell magic. ``%%orch NAME`` runs the cell
on the ranks of the gang the notebook calls ``NAME`` (``gang = orch.gang(world_size=4)``),
in each rank's namespace, which keeps its names from cell to cell (``ctx`` is there too, and
``ctx.state`` is the same namespace seen from ``gang.run`` functions). The cell shows the
call's panel while it runs and rank 0's output as it comes; the value of its last line, if
that is an expression, is rank 0's, as a cell's ``Out``. A failure raises the call's
:class:`orch.RunFailed`, its traceback naming the cell's line; Interrupt stops the call: its
ranks raise KeyboardInterrupt at their next step boundary (``ctx.steps``, ``ctx.log``,
``ctx.data``), every rank at the same one, and the gang stays up.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from orch.launchers.gang import Gang
from orch.views.output import OutputFollower

STOP_WAIT = 10.0  # seconds an interrupted cell waits for its call to stop


def orch_cell(line: str, cell: str) -> Any:
    """The ``%%orch`` cell magic (see the module docstring)."""
    from IPython import get_ipython
    from IPython.core.error import UsageError
    from IPython.display import display

    shell = get_ipython()
    name = line.strip() or "gang"
    gang = shell.user_ns.get(name) if shell is not None else None
    if not isinstance(gang, Gang):
        raise UsageError(
            f"%%orch {name}: the notebook has no gang called {name!r}: make one first, "
            f"`{name} = orch.gang(world_size=4)`, then `%%orch {name}` runs a cell on its ranks"
        )
    number = getattr(shell, "execution_count", 0)
    run = gang.run_cell(cell, f"<orch cell In[{number}]>")
    panel = run.panel()
    panel.output_in_record = False  # the cell prints rank 0's output itself, below the panel
    display(panel)  # type: ignore[no-untyped-call]
    follower = OutputFollower(run.run_dir / "logs", lambda: [(0, f"{run.run_id}-w0")], frozenset({0}))

    def show() -> None:
        for text in follower.lines():
            print(text)
        sys.stdout.flush()

    try:
        while True:
            try:
                result = run.wait(timeout=0.3)
                break
            except TimeoutError:
                show()
    except KeyboardInterrupt:
        run.stop("interrupted from the notebook (%%orch)")
        with contextlib.suppress(Exception):
            deadline = time.monotonic() + STOP_WAIT
            while not run.done and time.monotonic() < deadline:
                time.sleep(0.05)
        show()
        raise KeyboardInterrupt(
            f"the cell's call {run.run_id} was stopped: its ranks raised KeyboardInterrupt at their "
            f"next step boundary; gang {gang.gang_id} is up for the next cell"
        ) from None
    show()
    return result.value

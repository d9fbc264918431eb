"""``%%orch gang``: run a notebook cell's code on every rank of a gang, as ``%%px`` does.

``import orch`` in an IPython kernel registers the cell magic. ``%%orch NAME`` runs the cell
on the ranks of the gang the notebook calls ``NAME`` (``gang = orch.gang(world_size=4)``),
in each rank's namespace, which keeps its names from cell to cell (``ctx`` is there too, and
``ctx.state`` is the same namespace seen from ``gang.run`` functions). The cell shows the
call's panel while it runs and rank 0's output as it comes; the value of its last line, if
that is an expression, is rank 0's, as a cell's ``Out``. A failure raises the call's
:class:`orch.RunFailed`, naming the cell by its own count (``Cell In[3], line 2``) and saying
whether the gang kept its state; a ``NameError`` for a name the kernel has says how to give it
to the ranks (the cells do not see the kernel's names, as ``%%px`` cells do not). Interrupt
stops the call: its ranks raise KeyboardInterrupt at their next step boundary (``ctx.steps``,
``ctx.log``, ``ctx.data``), every rank at the same one, and the gang stays up.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
import types
from typing import Any

from orch.errors import RunFailed
from orch.launchers.gang import Gang
from orch.runtime.source import running_cell
from orch.views.output import OutputFollower

STOP_WAIT = 10.0  # seconds an interrupted cell waits for its call to stop
TRACEBACK = "Traceback (most recent call last):"


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
    count = running_cell()
    if count is None:  # run by other means than a cell (run_cell_magic from a script)
        count = max(1, int(getattr(shell, "execution_count", 1)) - 1)
    run = gang.run_cell(cell, f"<orch cell In[{count}]>", count)
    panel = run.panel()
    panel.output_in_record = False  # the cell prints rank 0's output itself, below the panel
    display(panel)  # type: ignore[no-untyped-call]
    follower = OutputFollower(run.run_dir / "logs", lambda: [(0, f"{run.run_id}-w0")], frozenset({0}))

    def show(failed: bool = False) -> None:
        """Rank 0's new output; after a failure, up to its traceback, which the error shows
        (cut to the user's frames: the log's copy holds orch's too)."""
        for text in follower.lines():
            if failed and text.startswith(TRACEBACK):
                break
            print(text)
        sys.stdout.flush()

    try:
        while True:
            try:
                result = run.wait(timeout=0.3)
                break
            except TimeoutError:
                show()
    except RunFailed as e:
        show(failed=True)
        hint = kernel_name_hint(e, shell.user_ns, name)
        if not hint:
            raise
        raise RunFailed(
            f"{e}\n{hint}", rank=e.rank, exit_code=e.exit_code, traceback=e.traceback, state=e.state
        ) from None
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


_NAME_ERROR = re.compile(r"NameError: name '(\w+)' is not defined")


def kernel_name_hint(failed: RunFailed, kernel: dict[str, Any], gang: str) -> str:
    """What to do when a ``%%orch`` cell failed on a name the kernel has: the cell runs in the
    ranks' namespaces, which hold only what their cells made and what was pushed."""
    found = _NAME_ERROR.search(failed.traceback) or _NAME_ERROR.search(str(failed))
    if found is None or found[1] not in kernel:
        return ""
    name, value = found[1], kernel[found[1]]
    push = f"`{gang}.push({name}={name})`"
    if isinstance(value, types.ModuleType):
        module = value.__name__
        line = f"import {module}" if module == name else f"import {module} as {name}"
        if "." in module and module.rsplit(".", 1)[1] == name:
            line = f"from {module.rsplit('.', 1)[0]} import {name}"
        return (
            f"`{name}` is the kernel's, not the ranks': a %%orch cell runs in each rank's own namespace. "
            f"Import it in the cell (`{line}`), once: the ranks keep it for the cells after"
        )
    return (
        f"`{name}` is the kernel's, not the ranks': a %%orch cell runs in each rank's own namespace. "
        f"Send it to every rank with {push}, or make it in a %%orch cell"
    )

"""The world a library in a rank sees, held against the run's.

A library that finds no distributed environment (or misreads it) trains each rank alone and
still ends without an error: Accelerate on a machine without GPUs builds a single-process
``Accelerator()`` unless told ``cpu=True``, and so does the HF Trainer, which stands on it.
Every beat the rank looks at the libraries it has imported (a dict lookup each, nothing is
imported here) and warns once (:meth:`orch.runtime.context.Context.warn`: its log, its row of
the panel, the run's events) when one counts another number of processes than the run's
ranks. The integrations (:mod:`orch.integrations`) tell theirs through :func:`check`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

HINTS = {
    "Accelerate": "on a machine without GPUs pass Accelerator(cpu=True) (TrainingArguments(use_cpu=True) "
    "for the HF Trainer): without it each rank trains alone, on all the data",
}


def _accelerate() -> int | None:
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None)
    n = shared.get("num_processes") if isinstance(shared, dict) else None
    return n if isinstance(n, int) else None


SEEN: dict[str, Callable[[], int | None]] = {"Accelerate": _accelerate}


def check(ctx: Any, library: str, processes: int) -> None:
    """Warn once when ``library`` counts ``processes`` where the run has another world size."""
    if processes == ctx.world_size:
        return
    hint = HINTS.get(library, "each process it counts trains apart from the others")
    ctx.warn(
        f"{library} sees {processes} process{'es' if processes != 1 else ''}, but this run has "
        f"{ctx.world_size} ranks: {hint}"
    )


def watcher(ctx: Any) -> Callable[[], None]:
    """What the heartbeat thread looks at before each beat."""

    def look() -> None:
        for library, seen in SEEN.items():
            n = seen()
            if n is not None:
                check(ctx, library, n)

    return look

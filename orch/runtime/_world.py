"""The world a library in a rank sees, held against the run's.

A library that finds no distributed environment (or misreads it) trains each rank alone and
still ends without an error: Accelerate on a machine without GPUs builds a single-process
``Accelerator()`` unless told ``cpu=True``, and so does the HF Trainer, which stands on it;
Lightning's default ``Trainer()`` (and ``Fabric()``) on CPU takes one device, a single-process
strategy (:mod:`orch.runtime._world_lightning` finds the instances). Every beat the rank
looks at the libraries it has imported (dict lookups, nothing is imported here) and warns once
(:meth:`orch.runtime.context.Context.warn`: its log, its row of the panel, the run's events)
when one counts another number of processes than the run's ranks. The integrations
(:mod:`orch.integrations`) tell theirs through :func:`check`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from orch.runtime._world_lightning import FABRICS, TRAINERS

_SIZES = 'devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=int(os.environ["GROUP_WORLD_SIZE"])'

HINTS = {
    "Accelerate": "on a machine without GPUs pass Accelerator(cpu=True) (TrainingArguments(use_cpu=True) "
    "for the HF Trainer): without it each rank trains alone, on all the data",
    "Lightning": f'pass Trainer(strategy="ddp", {_SIZES}), as under torchrun: without them each '
    "rank trains alone, on all the data",
    "Lightning Fabric": f'pass Fabric(strategy="ddp", {_SIZES}), as under torchrun: without them '
    "each rank trains alone, on all the data",
}


def _accelerate() -> Sequence[int]:
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None)
    n = shared.get("num_processes") if isinstance(shared, dict) else None
    return (n,) if isinstance(n, int) else ()


# what each library counts: one number a process (Accelerate), or one an instance (Lightning)
SEEN: dict[str, Callable[[], Sequence[int]]] = {
    "Accelerate": _accelerate,
    "Lightning": TRAINERS.world_sizes,
    "Lightning Fabric": FABRICS.world_sizes,
}


def warning(ctx: Any, library: str, processes: int) -> str | None:
    """What to say when ``library`` counts ``processes`` where the run has another world size."""
    if processes == ctx.world_size:
        return None
    hint = HINTS.get(library, "each process it counts trains apart from the others")
    return (
        f"{library} sees {processes} process{'es' if processes != 1 else ''}, but this run has "
        f"{ctx.world_size} ranks: {hint}"
    )


def check(ctx: Any, library: str, processes: int) -> None:
    """Warn once when ``library`` counts ``processes`` where the run has another world size."""
    text = warning(ctx, library, processes)
    if text is not None:
        ctx.warn(text)


def watcher(ctx: Any) -> Callable[[], None]:
    """What the heartbeat thread looks at before each beat."""

    judged: set[tuple[str, int]] = set()  # each count once: two warnings never take turns

    def look() -> None:
        texts = []
        for library, seen in SEEN.items():
            try:
                counts = seen()
            except Exception:  # a library in a state nobody foresaw: the heartbeat goes on
                continue
            for n in counts:
                if (library, n) not in judged:
                    judged.add((library, n))
                    texts.append(warning(ctx, library, n))
        said = [t for t in texts if t is not None]
        if said:  # one warning a beat carries: those found together go as one
            ctx.warn("; ".join(said))

    return look

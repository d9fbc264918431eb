"""A rank that starts a distributed job of its own is named at once, not left to train apart.

Code written to start its own processes (``torch.multiprocessing.spawn``, Lightning's
``ddp_spawn`` and ``ddp_notebook``, ``accelerate.notebook_launcher``, torch elastic's
``elastic_launch``, a nested ``orch.launch``) would, inside a rank, start a second world
beside the run's: each rank a job of its own, none of them the run orch shows. In a rank,
:func:`guard` makes ``torch.multiprocessing.spawn`` and ``start_processes`` raise
:class:`~orch.errors.NestedRunError` saying what to do instead; :func:`refuse_launch` is
what ``orch.launch``, ``orch.sweep`` and ``orch run`` call, in a rank or in any process a
rank started (the rank's environment marks it; see :data:`orch.runtime.current.RANK_ENV`).
"""

from __future__ import annotations

from typing import Any

from orch.errors import NestedRunError
from orch.runtime.current import rank_of


def _message(what: str, where: str) -> str:
    run_id, _, rank = where.partition(":")
    return (
        f"rank {rank} of orch run {run_id} started a distributed job of its own ({what}): orch "
        "starts the run's ranks already, and each rank runs this code, so the job would train "
        "apart from the run. Run the training itself in each rank instead: Lightning with "
        "strategy='ddp' (not 'ddp_spawn' or 'ddp_notebook'), Accelerate's function called "
        "directly (not through notebook_launcher), the function mp.spawn would start called "
        "with ctx.local_rank or $LOCAL_RANK; the run's world size is set by orch.launch / orch run"
    )


def refuse_launch(what: str) -> None:
    """Raise NestedRunError when this process is (or was started by) a rank of an orch run."""
    where = rank_of()
    if where:
        raise NestedRunError(_message(what, where))


def guard() -> None:
    """In a rank: ``torch.multiprocessing.spawn`` and ``start_processes`` refuse to start."""
    import torch.multiprocessing as tmp
    import torch.multiprocessing.spawn as spawn_module

    def refuse(name: str) -> Any:
        def stand_in(fn: Any, args: Any = (), nprocs: int = 1, *rest: Any, **kw: Any) -> Any:
            refuse_launch(f"{name}({getattr(fn, '__name__', 'fn')}, nprocs={nprocs})")

        stand_in.__name__ = name.rsplit(".", 1)[-1]
        return stand_in

    spawn, start = refuse("torch.multiprocessing.spawn"), refuse("torch.multiprocessing.start_processes")
    for module in (tmp, spawn_module):
        module.spawn = spawn  # type: ignore[attr-defined]
        module.start_processes = start  # type: ignore[attr-defined]

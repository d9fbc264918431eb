"""The notebook-facing entry points."""

from __future__ import annotations

from typing import Any

from .launcher import LaunchSpec, Run
from .worker import TrainFn


def launch(
    train: TrainFn | str | None = None,
    world_size: int = 4,
    config: dict[str, Any] | None = None,
    *,
    steps: int | None = None,
    master_port: int | None = None,
    rdzv_port: int | None = None,
    run_root: str = "runs",
    heartbeat_timeout: float = 30.0,
    threads: int | None = None,
) -> Run:
    """Start ``train(ctx)`` on ``world_size`` local workers; returns the running :class:`Run`.

    ``train`` is a function (notebook cells, closures and lambdas work), an import path
    ``"package.module:function"``, or ``None`` for the built-in example job.
    """
    spec = LaunchSpec(
        fn=train,
        world_size=world_size,
        config=dict(config or {}),
        steps=steps,
        master_port=master_port,
        rdzv_port=rdzv_port,
        run_root=run_root,
        heartbeat_timeout=heartbeat_timeout,
        threads=threads,
    )
    return Run(spec).start()

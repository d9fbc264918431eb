"""Lightning's metrics, progress and stop in orch: ``L.Trainer(logger=OrchLogger(), ...)``.

A Lightning ``Logger``: every rank records what ``self.log(...)`` logs, at the trainer's global
step (Lightning's other loggers keep to rank 0; this one draws every rank's curve). Pass it
beside others (``logger=[TensorBoardLogger(...), OrchLogger()]``). :class:`OrchCallback`
adds the run's total steps, a stop at the step every rank agreed on (``trainer.should_stop``)
and the trainer's world size held against the run's: ``callbacks=[OrchCallback()]``.
For the ``lightning`` package (``import lightning as L``); code on the older
``pytorch_lightning`` name gets the same through its TensorBoard logger's SummaryWriter.
"""

from __future__ import annotations

import argparse
from typing import Any

from lightning.pytorch import Callback
from lightning.pytorch.loggers import Logger

from orch.runtime import current


class OrchLogger(Logger):
    """Ships ``self.log`` metrics to the panel from every rank; does nothing outside an orch run."""

    @property
    def name(self) -> str:
        return "orch"

    @property
    def version(self) -> str:
        where = current.rank_of() or ""
        return where.partition(":")[0] or "0"

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        scalars = {k: v for k, v in metrics.items() if k != "epoch"}
        if scalars:
            current.record(step, scalars)
        if step is not None:
            current.progress(int(step) + 1)

    def log_hyperparams(self, params: dict[str, Any] | argparse.Namespace, *args: Any, **kwargs: Any) -> None:
        pass  # the run's config is in run.json


class OrchCallback(Callback):
    """The run's length, its stop, and Lightning's world size held against the run's."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        if total is None:
            try:
                total = int(trainer.estimated_stepping_batches)
            except (TypeError, ValueError, OverflowError):  # an endless loader
                total = 0
        current.set_total_steps(int(total))
        current.check_world("Lightning", int(trainer.world_size))
        current.watch_ddp(getattr(trainer.strategy, "model", None))  # DDP under strategy="ddp"

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        current.progress(int(trainer.global_step))
        if current.stop_due(int(trainer.global_step) - 1):
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        current.loop_ended()

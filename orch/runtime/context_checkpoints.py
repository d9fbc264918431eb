"""``ctx.save_checkpoint`` and ``ctx.load_checkpoint``, and the checkpoint ``ctx.steps`` takes
every rank at once: the part of :class:`~orch.runtime.context.Context` that keeps state in
the run dir (:mod:`orch.runtime.checkpoints` writes and reads the files)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from orch.record.checkpoint_index import Mode, check_keep
from orch.runtime._sender import HeartbeatSender
from orch.runtime.checkpoints import read_checkpoint, write_checkpoint
from orch.runtime.scalars_in import as_value


class Checkpoints:
    """The checkpoints of a rank's context (a part of :class:`~orch.runtime.context.Context`)."""

    rank: int
    attempt: int
    device: torch.device
    checkpoint_dir: Path | None
    resume_step: int
    _step: int
    _sender: HeartbeatSender | None
    _control_group: Any
    _watched: str | None
    _watched_value: float | None

    def _checkpoint_together(self, state: Any, *, keep: int, mode: Mode) -> Path | None:
        """A checkpoint of ``ctx.steps``, which every rank takes at the same step: rank 0 writes
        it only once every rank's points up to it are at the master. A restart resumes after
        it, so a rank killed between its peers' checkpoint and its own last beat would
        otherwise leave a hole of a few steps in its history. With a watched metric, the
        all-reduce of its value (the mean over ranks) is that meeting point."""
        if self._sender is not None:
            self._sender.flush()
        if self._watched is None:
            if self._control_group is not None:
                dist.barrier(group=self._control_group)
            return self.save_checkpoint(state, keep=keep, mode=mode)
        mine = self._watched_value
        # (sum of finite values, ranks with one, ranks whose value is NaN or infinite)
        parts = torch.tensor(
            [0.0, 0.0, 0.0] if mine is None else [mine, 1.0, 0.0] if math.isfinite(mine) else [0.0, 0.0, 1.0],
            dtype=torch.float64,
        )
        if self._control_group is not None:
            dist.all_reduce(parts, op=dist.ReduceOp.SUM, group=self._control_group)
        total, count, nonfinite = parts.tolist()
        value = math.nan if nonfinite else (total / count if count else None)
        return self.save_checkpoint(state, value=value, metric=self._watched, keep=keep, mode=mode)

    def save_checkpoint(
        self,
        state: Any,
        *,
        step: int | None = None,
        value: float | None = None,
        metric: str = "",
        keep: int = 2,
        mode: Mode = "min",
    ) -> Path | None:
        """Save ``state`` (anything ``torch.save`` takes) as of ``step`` (default: the current one).

        Rank 0 writes it, atomically, to the run dir's ``checkpoints/``; the other ranks
        hold the same DDP state and write nothing. Every rank first hands the master all the
        points it logged so far, so that a restart from this checkpoint finds the history
        up to it complete. Returns the file on rank 0.

        ``value`` (rank 0's; pass the same on every rank, such as an all-reduced validation
        loss) is the metric this checkpoint is ranked by, ``metric`` its name. After the write
        the ``keep`` best by value are kept (the least with ``mode="min"``, the greatest with
        ``"max"``; a checkpoint without a value, or with NaN, ranks after those with one),
        plus the newest: without values, the ``keep`` newest. ``run.best_checkpoint`` names the best.
        """
        if self.checkpoint_dir is None:
            raise RuntimeError("this worker has no run dir to keep checkpoints in")
        check_keep(keep, mode, "ctx.save_checkpoint")
        if value is not None:
            value = as_value(value)
        if not isinstance(metric, str):
            raise TypeError(f"ctx.save_checkpoint: metric is the name of the value, a string; got {metric!r}")
        step = self._step if step is None else step
        if self._sender is not None:
            self._sender.flush()
        if self.rank != 0:
            return None
        return write_checkpoint(
            self.checkpoint_dir, step, self.attempt, state, value=value, metric=metric, keep=keep, mode=mode
        )

    def load_checkpoint(self, *, weights_only: bool = True) -> Any:
        """The state of the newest checkpoint, or None; ``ctx.steps()`` then resumes after it.

        The file is loaded with ``torch.load(weights_only=True)``: tensors, numbers, strings
        and the lists, tuples and dicts of them (model and optimizer state dicts) load, and
        nothing in the file can run code. A state that holds other objects needs
        ``ctx.load_checkpoint(weights_only=False)``: only for checkpoint dirs nobody else can
        write, since unpickling such a file runs whatever it names. ``checkpoints/latest``
        must name a file :meth:`save_checkpoint` writes (``step-<9+ digits>.pt``), in that dir.

        A newest checkpoint that is damaged (truncated, or not a whole archive) is skipped for
        the newest one that loads; the rank's log names both (see :mod:`orch.runtime.checkpoints`).
        """
        saved = (
            None
            if self.checkpoint_dir is None
            else read_checkpoint(
                self.checkpoint_dir, self.device, weights_only=weights_only, writer=self.rank == 0
            )
        )
        if saved is None:
            return None
        self.resume_step = int(saved["step"]) + 1
        self._step = int(saved["step"])
        return saved["state"]

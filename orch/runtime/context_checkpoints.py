"""``ctx.save_checkpoint`` and ``ctx.load_checkpoint``, and the checkpoint ``ctx.steps`` takes
every rank at once: :class:`RankCheckpoints`, the part of :class:`~orch.runtime.context.Context`
that keeps state in the run dir (:mod:`orch.runtime.checkpoints` writes and reads the files)."""

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


class RankCheckpoints:
    """The checkpoints of a rank (a part of :class:`~orch.runtime.context.Context`): rank 0
    writes them to ``folder`` (None: the rank has no run dir), every rank reads them."""

    def __init__(
        self,
        *,
        rank: int,
        attempt: int,
        device: torch.device,
        folder: Path | None,
        sender: HeartbeatSender | None,
        control_group: Any,
    ) -> None:
        """``attempt``: the group's, recorded with each checkpoint; ``device``: where a loaded
        state's tensors go; ``sender``: the rank's heartbeat sender, flushed before each
        checkpoint (None outside a worker); ``control_group``: orch's group of every rank,
        where the ranks meet before ``ctx.steps`` takes one (None: a rank alone)."""
        self.rank = rank
        self.attempt = attempt
        self.device = device
        self.folder = folder
        self._sender = sender
        self._control_group = control_group

    def together(
        self, state: Any, *, step: int, metric: str | None, mine: float | None, keep: int, mode: Mode
    ) -> Path | None:
        """A checkpoint of ``ctx.steps`` at ``step``, which every rank takes at the same step:
        rank 0 writes it only once every rank's points up to it are at the master. A restart
        resumes after it, so a rank killed between its peers' checkpoint and its own last beat
        would otherwise leave a hole of a few steps in its history. With a watched ``metric``
        (``mine``: this rank's last logged value of it), the all-reduce of its value (the mean
        over ranks) is that meeting point."""
        if self._sender is not None:
            self._sender.flush()
        if metric is None:
            if self._control_group is not None:
                dist.barrier(group=self._control_group)
            return self.save(state, step=step, keep=keep, mode=mode)
        # (sum of finite values, ranks with one, ranks whose value is NaN or infinite)
        parts = torch.tensor(
            [0.0, 0.0, 0.0] if mine is None else [mine, 1.0, 0.0] if math.isfinite(mine) else [0.0, 0.0, 1.0],
            dtype=torch.float64,
        )
        if self._control_group is not None:
            dist.all_reduce(parts, op=dist.ReduceOp.SUM, group=self._control_group)
        total, count, nonfinite = parts.tolist()
        value = math.nan if nonfinite else (total / count if count else None)
        return self.save(state, step=step, value=value, metric=metric, keep=keep, mode=mode)

    def save(
        self,
        state: Any,
        *,
        step: int,
        value: float | None = None,
        metric: str = "",
        keep: int = 2,
        mode: Mode = "min",
    ) -> Path | None:
        """:meth:`Context.save_checkpoint <orch.runtime.context.Context.save_checkpoint>` of
        ``state`` as of ``step``: every rank flushes its points, rank 0 writes."""
        if self.folder is None:
            raise RuntimeError("this worker has no run dir to keep checkpoints in")
        check_keep(keep, mode, "ctx.save_checkpoint")
        if value is not None:
            value = as_value(value)
        if not isinstance(metric, str):
            raise TypeError(f"ctx.save_checkpoint: metric is the name of the value, a string; got {metric!r}")
        if self._sender is not None:
            self._sender.flush()
        if self.rank != 0:
            return None
        return write_checkpoint(
            self.folder, step, self.attempt, state, value=value, metric=metric, keep=keep, mode=mode
        )

    def load(self, *, weights_only: bool = True) -> tuple[int, Any] | None:
        """:meth:`Context.load_checkpoint <orch.runtime.context.Context.load_checkpoint>`: the
        newest checkpoint that loads, as (its step, its state), or None."""
        saved = (
            None
            if self.folder is None
            else read_checkpoint(self.folder, self.device, weights_only=weights_only, writer=self.rank == 0)
        )
        if saved is None:
            return None
        return int(saved["step"]), saved["state"]

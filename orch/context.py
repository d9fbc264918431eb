"""What a training function receives: its rank, device, config, and the orch hooks."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._sender import HeartbeatSender


class Context:
    """Passed to the training function as ``ctx``.

    ``ctx.rank``, ``ctx.world_size``, ``ctx.local_rank``, ``ctx.device`` and
    ``ctx.config`` describe this rank; ``ctx.ddp(model)`` wraps a model,
    ``ctx.steps(n)`` drives the loop and ``ctx.log(step, loss=..., **scalars)``
    reports progress without blocking.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        device: torch.device,
        config: dict[str, Any],
        run_id: str,
        sender: HeartbeatSender | None,
        control_group: Any = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.device = device
        self.config = config
        self.run_id = run_id
        self._sender = sender
        self._control_group = control_group
        self._stop = threading.Event()
        self._models: list[nn.Module] = []
        self.stopped = False  # True once ctx.steps() ended early because of a stop request

    @property
    def is_main(self) -> bool:
        """True on rank 0: the one rank that should print or write shared files."""
        return self.rank == 0

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        self._stop.set()

    def ddp(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        """Move ``model`` to this rank's device and wrap it in DistributedDataParallel."""
        model = model.to(self.device)
        self._models.append(model)
        if self.world_size == 1 or not dist.is_initialized():
            return model
        if self.device.type == "cuda":
            kwargs.setdefault("device_ids", [self.device.index])
        return nn.parallel.DistributedDataParallel(model, **kwargs)

    def steps(self, n: int) -> Iterator[int]:
        """Yield the step numbers ``0 .. n-1``; end early, on every rank at once, on a stop.

        The stop decision is shared with an asynchronous all-reduce launched one step
        ahead, so every rank leaves the loop at the same step without adding a blocking
        collective to each step.
        """
        if n < 0:
            raise ValueError(f"ctx.steps(n) needs n >= 0, got {n}")
        if self._sender is not None:
            self._sender.total_steps = n
        pending: Any = None
        flag = torch.zeros(1)
        try:
            for step in range(n):
                if self._control_group is not None:
                    if pending is not None:
                        pending.wait()
                        if flag.item() > 0:
                            self.stopped = True
                            return
                    flag = torch.ones(1) if self._stop.is_set() else torch.zeros(1)
                    pending = dist.all_reduce(
                        flag, op=dist.ReduceOp.MAX, group=self._control_group, async_op=True
                    )
                elif self._stop.is_set():
                    self.stopped = True
                    return
                if self._sender is not None:
                    self._sender.step = step
                yield step
            if self._sender is not None:
                self._sender.step = n
        finally:
            if pending is not None and not pending.is_completed():
                pending.wait()

    def log(self, step: int, loss: float | None = None, **scalars: float) -> None:
        """Record ``loss`` and any other scalars at ``step``; returns at once."""
        if loss is not None:
            scalars["loss"] = loss
        if self._sender is not None:
            self._sender.log(step, scalars)

    def param_checksum(self) -> str:
        """sha256 of every parameter of the models passed to :meth:`ddp`, in order."""
        h = hashlib.sha256()
        for model in self._models:
            for p in model.parameters():
                h.update(p.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
        return h.hexdigest() if self._models else ""

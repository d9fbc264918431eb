"""What a training function receives: its rank, device, config, and the orch hooks."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
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
        checkpoint_dir: Path | None = None,
        attempt: int = 1,
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
        self.attempt = attempt  # 1, then one more after each restart of the group
        self.checkpoint_dir = checkpoint_dir
        self.resume_step = 0  # the first step ctx.steps() yields (after a loaded checkpoint)
        self._step = -1

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

    def steps(self, n: int, *, checkpoint: Callable[[], Any] | None = None, every: int = 0) -> Iterator[int]:
        """Yield the step numbers ``resume_step .. n-1``; end early, on every rank at once, on a stop.

        ``resume_step`` is 0, or the step after the checkpoint :meth:`load_checkpoint`
        loaded. With ``checkpoint`` (a function returning the state to save) the state is
        saved every ``every`` steps and when a stop ends the loop. The stop decision is
        shared with an asynchronous all-reduce launched one step ahead, so every rank
        leaves the loop at the same step without a blocking collective in each step.
        """
        if n < 0:
            raise ValueError(f"ctx.steps(n) needs n >= 0, got {n}")
        if every < 0 or (every and checkpoint is None):
            raise ValueError("ctx.steps(every=k) needs k >= 0 and a checkpoint function")
        if self._sender is not None:
            self._sender.total_steps = n
        pending: Any = None
        flag = torch.zeros(1)
        try:
            for step in range(self.resume_step, n):
                if self._control_group is not None:
                    if pending is not None:
                        pending.wait()
                        stop = flag.item() > 0
                    else:
                        stop = False
                    flag = torch.ones(1) if self._stop.is_set() else torch.zeros(1)
                    pending = (
                        None
                        if stop
                        else dist.all_reduce(
                            flag, op=dist.ReduceOp.MAX, group=self._control_group, async_op=True
                        )
                    )
                else:
                    stop = self._stop.is_set()
                if stop:
                    self.stopped = True
                    if checkpoint is not None and self._step >= 0:
                        self.save_checkpoint(checkpoint())
                    return
                self._step = step
                if self._sender is not None:
                    self._sender.step = step
                yield step
                if every and (step + 1) % every == 0:
                    self.save_checkpoint(checkpoint())  # type: ignore[misc]
            if self._sender is not None:
                self._sender.step = n
        finally:
            if pending is not None and not pending.is_completed():
                pending.wait()

    def save_checkpoint(self, state: Any, *, step: int | None = None) -> Path | None:
        """Save ``state`` (anything ``torch.save`` takes) as of ``step`` (default: the current one).

        Rank 0 writes it, atomically, to the run dir's ``checkpoints/``; the other ranks
        hold the same DDP state and write nothing. Every rank first hands the master all the
        points it logged so far, so that a restart from this checkpoint finds the history
        up to it complete. Returns the file on rank 0.
        """
        if self.checkpoint_dir is None:
            raise RuntimeError("this worker has no run dir to keep checkpoints in")
        step = self._step if step is None else step
        if self._sender is not None:
            self._sender.flush()
        if self.rank != 0:
            return None
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = self.checkpoint_dir / f"step-{step:09d}.pt"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            torch.save({"step": step, "attempt": self.attempt, "state": state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        latest = self.checkpoint_dir / "latest"
        latest_tmp = self.checkpoint_dir / "latest.tmp"
        latest_tmp.write_text(path.name)
        os.replace(latest_tmp, latest)
        for old in sorted(self.checkpoint_dir.glob("step-*.pt"))[:-2]:
            old.unlink(missing_ok=True)  # keep the newest two
        return path

    def load_checkpoint(self) -> Any:
        """The state of the newest checkpoint, or None; ``ctx.steps()`` then resumes after it."""
        if self.checkpoint_dir is None:
            return None
        try:
            name = (self.checkpoint_dir / "latest").read_text().strip()
        except FileNotFoundError:
            return None
        # The file is this run's own, written by save_checkpoint above.
        saved = torch.load(self.checkpoint_dir / name, map_location=self.device, weights_only=False)
        self.resume_step = int(saved["step"]) + 1
        self._step = int(saved["step"])
        return saved["state"]

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

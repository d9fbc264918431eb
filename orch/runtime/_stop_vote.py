"""One decision to stop, taken by every rank at the same call of a loop.

A stop reaches each rank with its own heartbeat's reply, so the ranks hear of it at different
steps. A loop that left on hearing would leave its peers alone in the next collective. Here
each call all-reduces the rank's "I heard" (MAX) without waiting for it, and reads the
previous call's result: every rank learns the same answer at the same call, one call after
the first rank heard, at the cost of one small asynchronous all-reduce a step.

The same all-reduce carries the sweep's next rung as each rank last heard it (MAX: rungs only
move on), so that every rank holds at the same rung or none does; at the rung, once each rank
waited for the sweep's word, :meth:`StopVote.agree` makes "pruned" one answer for all of them
(a rank whose word came late goes the way its peers were told).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist


class StopVote:
    """Call :meth:`cast` once per step on every rank; True on all of them at the same call."""

    def __init__(self, group: Any) -> None:
        self.group = group  # a gloo group of every rank (orch's own, not the training's)
        self.decided = False
        self.hold = 0  # the sweep's next rung, as every rank agreed on it at the last call
        self._flag = torch.zeros(2, dtype=torch.float64)
        self._pending: Any = None

    def cast(self, heard: bool, hold: int = 0) -> bool:
        if self.decided:
            return True
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            self.hold = int(self._flag[1].item())
            if self._flag[0].item() > 0:
                self.decided = True
                return True
        self._flag = torch.tensor([1.0 if heard else 0.0, float(hold)], dtype=torch.float64)
        self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return False

    def agree(self, told: bool) -> bool:
        """At a rung every rank holds at: True on every rank when any of them was told to stop."""
        flag = torch.tensor([1.0 if told else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return flag.item() > 0

    def settle(self) -> None:
        """Wait for the vote still in flight (every rank cast it): before the group goes."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.is_completed():
            pending.wait()


class LibraryStop:
    """A library's loop's stop (a part of :class:`~orch.runtime.context.Context`): its step-end
    hook asks :meth:`stop_due` once a step on every rank."""

    stopped: bool
    _vote: StopVote | None
    _control_group: Any
    _stop: threading.Event
    _stop_at: int

    def stop_due(self, step: int) -> bool:
        """True when the run was asked to stop and every rank leaves its loop after this
        step: for a library's loop (``ctx.steps`` has its own). Every rank calls it once a step,
        from the library's step-end hook: with several ranks the decision is a vote of all of
        them (see :class:`StopVote`), so each learns of the stop at the same step however late
        its own heartbeat brought it. The vote runs on orch's group, made here the first time
        where the rank has none (a script made its own training group)."""
        if self._vote is None and dist.is_initialized() and dist.get_world_size() > 1:
            group = self._control_group or dist.new_group(backend="gloo")
            self._vote = StopVote(group)
        if self._vote is not None:
            due = self._vote.cast(self._stop.is_set())
        else:
            due = self._stop.is_set() or (bool(self._stop_at) and step + 1 >= self._stop_at)
        if due:
            self.stopped = True  # the library leaves its loop there: the rank ends STOPPED
        return due

    def settle_stop_vote(self) -> None:
        """The library's loop ended: wait for the stop vote still in flight, if any."""
        if self._vote is not None:
            self._vote.settle()


def sharded(batches: Any) -> bool:
    """A DataLoader whose sampler is a DistributedSampler: every rank iterates its own shard of
    the same length, so the ranks go through it batch for batch together."""
    from torch.utils.data import DistributedSampler

    sampler = getattr(batches, "sampler", None)
    batch_sampler = getattr(batches, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    return isinstance(sampler, DistributedSampler) or isinstance(inner, DistributedSampler)

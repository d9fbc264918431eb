"""One decision to stop, taken by every rank at the same call of a loop.

A stop reaches each rank with its own heartbeat's reply, so the ranks hear of it at different
steps. A loop that left on hearing would leave its peers alone in the next collective. Here
each call all-reduces the rank's "I heard" (MAX) without waiting for it, and reads the
previous call's result: every rank learns the same answer at the same call, one call after
the first rank heard, at the cost of one small asynchronous all-reduce a step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class StopVote:
    """Call :meth:`cast` once per step on every rank; True on all of them at the same call."""

    def __init__(self, group: Any) -> None:
        self.group = group  # a gloo group of every rank (orch's own, not the training's)
        self.decided = False
        self._flag = torch.zeros(1)
        self._pending: Any = None

    def cast(self, heard: bool) -> bool:
        if self.decided:
            return True
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            if self._flag.item() > 0:
                self.decided = True
                return True
        self._flag = torch.ones(1) if heard else torch.zeros(1)
        self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return False

    def settle(self) -> None:
        """Wait for the vote still in flight (every rank cast it): before the group goes."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.is_completed():
            pending.wait()

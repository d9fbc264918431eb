"""One decision to stop, taken by every rank at the same call of a loop.

A stop reaches each rank with its own heartbeat's reply, so the ranks hear of it at different
steps. A loop that left on hearing would leave its peers alone in the next collective. Here
a vote all-reduces each rank's "I heard" (MAX) without waiting for it, and the next vote
reads its result: every rank learns the same answer at the same call, one vote after the
first rank heard.

A vote costs far more than the step of a small model (an all-reduce on orch's own gloo group:
a few hundred µs of CPU across the rank's threads, about 0.7 ms on 2 shared cores), so the
ranks do not vote at every call. Each vote carries, besides the flag, the number of calls each
rank proposes until the next one (enough for about :data:`VOTE_EVERY_S` seconds at its pace,
at most :data:`MAX_SPACING`); every rank reads the same agreed number (the least proposed)
with the result, so every rank votes at the same calls::

    call    0      1        1+k1                 1+k1+k2
    rank 0  vote   vote     vote  (reads k2) ... vote
    rank 1  vote   vote     vote  (reads k2) ... vote
                 (reads k1)

A stop is then decided within two spacings of the first rank's hearing (about 0.1-0.2 s at
any step time, or a spacing of steps grown slower since), at a cost of one vote per spacing.
A rank proposes a vote at every call while it knows of a sweep's rung ahead (so that every
rank holds at the rung, below) or before it first heard from the master, so the first calls
vote as often as before.

The same all-reduce carries the sweep's next rung as each rank last heard it (MAX: rungs only
move on), so that every rank holds at the same rung or none does; at the rung, once each rank
waited for the sweep's word, :meth:`StopVote.agree` makes "pruned" one answer for all of them
(a rank whose word came late goes the way its peers were told).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

VOTE_EVERY_S = 0.1  # seconds of steps between two votes, as the ranks propose it
MAX_SPACING = 128  # calls between two votes at most: a loop whose steps grow slower hears late


class StopVote:
    """Call :meth:`cast` once per step on every rank; True on all of them at the same call."""

    def __init__(self, group: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self.group = group  # a gloo group of every rank (orch's own, not the training's)
        self.decided = False
        self.hold = 0  # the sweep's next rung, as every rank agreed on it at the last vote
        self.spacing = 1  # calls from one vote to the next, as every rank agreed at the last one
        self.votes = 0  # votes cast
        self._clock = clock
        self._left = 0  # calls until the next vote
        self._since_vote = 1  # calls from the last vote to the next
        self._voted_at = 0.0  # when the last vote was cast
        # (heard, rung, -proposed spacing): one MAX all-reduce agrees on all three
        self._flag = torch.zeros(3, dtype=torch.float64)
        self._values = self._flag.numpy()  # the same memory: written and read without torch's calls
        self._pending: Any = None

    def cast(self, heard: bool, hold: int = 0, space: bool = True) -> bool:
        """One call of the loop on this rank: True when every rank is to stop at this call.
        ``hold``: the sweep's next rung as this rank heard it; ``space``: this rank may
        propose to vote less often (it knows of no rung to hold at, and heard the master)."""
        if self.decided:
            return True
        self._left -= 1
        if self._left > 0:
            return False
        now = self._clock()
        values = self._values
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            self.hold = int(values[1])
            self.spacing = max(1, int(-values[2]))
            if values[0] > 0:
                self.decided = True
                return True
        propose = 1
        if space and not hold and self.votes:
            elapsed = now - self._voted_at  # the calls since the last vote, at this rank's pace
            fit = round(VOTE_EVERY_S * self._since_vote / elapsed) if elapsed > 0 else MAX_SPACING
            propose = max(1, min(MAX_SPACING, fit))
        self._voted_at = now
        values[0], values[1], values[2] = 1.0 if heard else 0.0, float(hold), -float(propose)
        self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self.votes += 1
        self._left = self._since_vote = self.spacing
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


class StopRequest:
    """The run's request to stop, as this rank heard it (with its heartbeat's reply, on the
    sender's thread): whether it came, and the step count a loop without ``ctx.steps`` ends at
    (``at``; 0: none named). Every part of the rank's context reads the one request."""

    def __init__(self) -> None:
        self._heard = threading.Event()
        self.at = 0

    def request(self, at_step: int = 0) -> None:
        """Stop; ``at_step``: where a loop without ``ctx.steps`` ends (the first one named holds)."""
        if at_step > 0 and not self.at:
            self.at = at_step
        self._heard.set()

    def is_set(self) -> bool:
        return self._heard.is_set()


class LibraryStop:
    """A library's loop's stop (a part of :class:`~orch.runtime.context.Context`): its step-end
    hook asks :meth:`due` once a step on every rank; with several ranks the answer is their
    vote, on ``control_group`` (orch's own group, made at the first call where there is none)."""

    def __init__(self, stop: StopRequest, control_group: Any) -> None:
        self.vote: StopVote | None = None
        self._stop = stop
        self._control_group = control_group

    def due(self, step: int) -> bool:
        """True when every rank leaves the library's loop after ``step`` (see
        :meth:`Context.stop_due <orch.runtime.context.Context.stop_due>`)."""
        if self.vote is None and dist.is_initialized() and dist.get_world_size() > 1:
            group = self._control_group or dist.new_group(backend="gloo")
            self.vote = StopVote(group)
        if self.vote is not None:
            return self.vote.cast(self._stop.is_set())
        return self._stop.is_set() or (bool(self._stop.at) and step + 1 >= self._stop.at)

    def settle(self) -> None:
        """The library's loop ended: wait for the stop vote still in flight, if any."""
        if self.vote is not None:
            self.vote.settle()


class Collectives:
    """How many collectives this rank's code ran on the process groups of every rank (orch's
    own aside): the sum of their sequence numbers, which c10d counts per group (a read of all of
    them costs about 2 µs). A loop whose batches hold such a collective (DDP's gradient
    all-reduce, FSDP's, the code's own) is iterated by every rank batch for batch: a loop only
    one rank iterates could not hold one, it would wait for itself forever."""

    def __init__(self, world_size: int, ours: Callable[[], tuple[Any, ...]]) -> None:
        self.world_size = world_size
        self._ours = ours  # orch's own groups (the stop votes'): their collectives are not the code's
        self.at_start = self.count()  # when the training function started

    def count(self) -> int | None:
        """The collectives so far; None where they cannot be counted (no process group, or a
        backend that keeps no sequence numbers)."""
        if not dist.is_initialized():
            return None
        try:
            ours = self._ours()
            total = 0
            for group in tuple(c10d._world.pg_map):
                if group not in ours and group.size() == self.world_size:
                    total += group._get_sequence_number_for_group()  # type: ignore[attr-defined]
            return total
        except Exception:  # a private API: an older or newer torch may lack it
            return None

    def none_yet(self) -> bool:
        """The code ran no collective of every rank since the training function started."""
        now = self.count()
        return now is not None and now == self.at_start


def sharded(batches: Any) -> bool:
    """A DataLoader whose sampler is a DistributedSampler: every rank iterates its own shard of
    the same length, so the ranks go through it batch for batch together."""
    from torch.utils.data import DistributedSampler

    sampler = getattr(batches, "sampler", None)
    batch_sampler = getattr(batches, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    return isinstance(sampler, DistributedSampler) or isinstance(inner, DistributedSampler)

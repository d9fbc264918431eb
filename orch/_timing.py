"""Where a rank's step time goes, measured in the rank with no change to the user's loop.

Under DDP every rank waits for the slowest one in each gradient all-reduce, so all ranks run
at the same steps/s and the rate alone never shows which rank holds the others back. What
does: the slow rank waits least in the collectives, while the others wait for it. So each
rank splits its step time:

- ``ctx.steps`` times each step, from its start to the next one's;
- ``ctx.ddp`` wraps the gradient all-reduce in a communication hook that times each bucket
  from its launch to its completion (the union of those intervals: the time a collective was
  in flight, which a rank spends waiting for its peers);
- ``ctx.data(loader)`` times the wait for the next batch;
- ``with ctx.section("name"):`` times a part the user marks;
- what orch does between steps (the stop check, checkpoints) is "other";
- compute is the rest.

The sums go to the master with the next heartbeat (a few numbers per rank, not per step);
the master judges (:mod:`orch.control.stragglers`). ``ORCH_STEP_TIMING=0`` turns it off.
"""

# No ``from __future__ import annotations`` here: DDP checks a hook's annotations by identity
# (the bucket a dist.GradBucket, the result a Future of a Tensor), not as strings.
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ._proto import orchestrator_pb2 as pb

clock = time.perf_counter


def enabled() -> bool:
    return os.environ.get("ORCH_STEP_TIMING", "1") not in ("0", "false", "no", "off")


class StepTimes:
    """Sums of one rank's step time, split, since the last :meth:`take` (the heartbeat's).

    The training thread adds steps, data waits and sections; the collectives' completion
    callbacks add from their own thread; the heartbeat thread takes: one short lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.collectives = False  # a hook times the gradient collectives (ctx.ddp)
        self._reset()
        self._in_flight_until = 0.0  # the end of the collective time counted so far

    def _reset(self) -> None:
        self.steps = 0
        self.step_s = 0.0
        self.data_s = 0.0
        self.collective_s = 0.0
        self.other_s = 0.0
        self.sections: dict[str, float] = {}

    def step(self, seconds: float, own: float) -> None:
        """One step done: its wall time, and how much of it was orch's own work."""
        with self._lock:
            self.steps += 1
            self.step_s += seconds
            self.other_s += own

    def data(self, seconds: float) -> None:
        with self._lock:
            self.data_s += seconds

    def section(self, name: str, seconds: float) -> None:
        with self._lock:
            self.sections[name] = self.sections.get(name, 0.0) + seconds

    def collective(self, start: float, end: float) -> None:
        """A collective was in flight from ``start`` to ``end``; overlapping ones count once."""
        with self._lock:
            begin = max(start, self._in_flight_until)
            if end > begin:
                self.collective_s += end - begin
            self._in_flight_until = max(self._in_flight_until, end)

    def take(self) -> pb.StepTiming | None:
        """The sums since the last take (None when no step was timed), and start again."""
        with self._lock:
            if not self.steps:
                return None
            timing = pb.StepTiming(
                steps=self.steps,
                step_seconds=self.step_s,
                data_seconds=self.data_s,
                collective_seconds=self.collective_s,
                other_seconds=self.other_s,
                sections=self.sections,
                collectives=self.collectives,
            )
            self._reset()
            return timing


class TimedHook:
    """The DDP communication hook ``ctx.ddp`` registers: the gradient all-reduce (DDP's own,
    or the hook the user registers later, which this one then calls), timed per bucket."""

    def __init__(self, times: StepTimes, group: Any = None) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.times = times
        self.inner: Callable[[Any, Any], Any] = default_hooks.allreduce_hook
        self.inner_state: Any = group

    def hook(self) -> Callable[..., Any]:
        """The function to register (DDP reads its annotations)."""
        import torch
        import torch.distributed as dist

        def timed(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # type: ignore[name-defined]
            start = clock()
            future = self.inner(self.inner_state, bucket)
            times = self.times

            def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                times.collective(start, clock())
                return f.value()

            return future.then(done)  # type: ignore[no-any-return]

        return timed

    def replace(self, state: Any, hook: Callable[[Any, Any], Any]) -> None:
        """What ``model.register_comm_hook(state, hook)`` does on a model from ``ctx.ddp``:
        DDP takes one hook, and this one stays, calling the user's."""
        self.inner, self.inner_state = hook, state

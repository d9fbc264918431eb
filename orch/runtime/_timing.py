"""Where a rank's step time goes, measured in the rank with no change to the user's loop.

Under DDP every rank waits for the slowest one in each gradient all-reduce, so all ranks run
at the same steps/s and the rate alone never shows which rank holds the others back. What
does: the slow rank waits least in the collectives, while the others wait for it. So each
rank splits its step time:

- the steps are marked by ``ctx.steps`` (each step, from its start to the next one's); in a
  loop without it, by ``ctx.data`` (each batch it yields is a step, from one request for a
  batch to the next, its wait for the batch included); in a loop with neither, by
  ``ctx.log`` (from one logged step to the next: a call that logs step 40 after step 30
  closes 10 steps). A step timed by ``ctx.log`` alone is not split into data and compute;
- ``ctx.ddp`` asks DDP's reducer for its runtime statistics every iteration (read at most
  every :data:`READ_EVERY_S` of steps: the last iteration's wait stands for the steps since
  the reading before): the gradient communication not overlapped with the rank's own
  backward compute is its wait for its peers;
- ``ctx.data(loader)`` times the wait for the next batch;
- ``with ctx.section("name"):`` times a part the user marks;
- what orch does between steps (the stop check, checkpoints) is "other";
- compute is the rest.

The sums go to the master with the next heartbeat (a few numbers per rank, not per step);
the master judges (:mod:`orch.master.control.stragglers`). ``ORCH_STEP_TIMING=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from orch.wire.limits import MAX_SECTIONS, MORE_SECTIONS
from orch.wire.model import StepTiming

log = logging.getLogger(__name__)
clock = time.perf_counter
# The step's own parts, which no section may be named ("own time": a step timed by ctx.log).
RESERVED = frozenset({"data", "compute", "other", "collective wait", "own time", MORE_SECTIONS})
# What marks the steps, strongest first: a loop timed by one never counts the steps of the next.
BY_STEPS, BY_DATA, BY_LOG = "ctx.steps", "ctx.data", "ctx.log"
TIMED_BY_RANK = {"": 0, BY_LOG: 1, BY_DATA: 2, BY_STEPS: 3}
# Seconds of steps between two readings of DDP's timers: a reading builds a dict of some forty
# fields (about 7 µs), which every step of a 1 ms loop would pay; at 20 ms, the first step's
# and each step of a slower loop's are read, and a heartbeat (0.25 s) brings a dozen readings.
READ_EVERY_S = 0.02


def enabled() -> bool:
    return os.environ.get("ORCH_STEP_TIMING", "1") not in ("0", "false", "no", "off")


class StepTimes:
    """Sums of one rank's step time, split, since the last :meth:`take` (the heartbeat's).

    The training thread adds; the heartbeat thread takes: one short lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.collectives = False  # a hook times the gradient collectives (ctx.ddp)
        self._names: set[str] = set()  # the section names this rank has marked, for good
        self._told = False
        self.timed_by = ""  # what marks the steps (BY_STEPS, BY_DATA, BY_LOG): the strongest seen
        self._reset()

    def _reset(self) -> None:
        self.steps = 0
        self.step_s = 0.0
        self.data_s = 0.0
        self.collective_s = 0.0
        self.other_s = 0.0
        self.sections: dict[str, float] = {}

    def marks(self, by: str) -> bool:
        """Whether ``by`` marks this rank's steps, taking it over from a weaker one: ctx.steps
        over ctx.data over ctx.log (one loop's steps are never counted twice)."""
        if by == self.timed_by:
            return True
        if TIMED_BY_RANK[by] < TIMED_BY_RANK[self.timed_by]:
            return False
        self.timed_by = by
        return True

    def step(self, seconds: float, own: float, count: int = 1) -> None:
        """``count`` steps done: their wall time, and how much of it was orch's own work."""
        with self._lock:
            self.steps += count
            self.step_s += seconds
            self.other_s += own

    def data(self, seconds: float) -> None:
        with self._lock:
            self.data_s += seconds

    def section(self, name: str, seconds: float) -> None:
        with self._lock:
            if name not in self._names:
                if len(self._names) >= MAX_SECTIONS - 1:
                    # A run's first MAX_SECTIONS - 1 names are its sections; the rest are timed
                    # together, and said so once (the master tells the run's event log too).
                    if not self._told:
                        self._told = True
                        log.warning(
                            "ctx.section(%r): this rank already marked %d section names, the most "
                            "orch times apart; this one and any later new name are timed together "
                            "as %r (name sections by what they do, not by step or batch)",
                            name,
                            len(self._names),
                            MORE_SECTIONS,
                        )
                    name = MORE_SECTIONS
                else:
                    self._names.add(name)
            self.sections[name] = self.sections.get(name, 0.0) + seconds

    def collective(self, seconds: float) -> None:
        """Time this rank waited for its peers in gradient collectives."""
        with self._lock:
            self.collective_s += seconds

    def take(self) -> StepTiming | None:
        """The sums since the last take (None when no step was timed), and start again."""
        with self._lock:
            if not self.steps:
                return None
            timing = StepTiming(
                steps=self.steps,
                step_seconds=self.step_s,
                data_seconds=self.data_s,
                collective_seconds=self.collective_s,
                other_seconds=self.other_s,
                sections=dict(self.sections),
                collectives=self.collectives,
                timed_by=self.timed_by,
            )
            self._reset()
            return timing


OFF = StepTiming(timed_by="off")  # what a rank whose step timing is turned off tells the master


class CollectiveWait:
    """How long a rank waited for its gradient collectives, from DDP's own runtime statistics.

    DDP's reducer times each iteration's backward in C++ (its compute, its communication, and
    their overlap), sampled every iteration once asked; the wait is the communication not
    overlapped with this rank's own backward compute: what it spent waiting for the slowest
    peer. A reading costs about 7 µs (taken at most every READ_EVERY_S of steps); a Python
    communication hook would cost ~0.3 ms/step.
    """

    def __init__(self, models: list[Any]) -> None:
        self.models = models
        self._seen: dict[int, int] = {}  # model index -> the last iteration counted
        self.iterations = 0  # the iterations the last take() saw go by (it read the last one's wait)
        self._steps = 0  # steps done since the last reading
        self._seconds = 0.0  # ... and how long they took
        self._read = False  # a reading was taken (the first steps' is taken at once)

    def after(self, steps: int, seconds: float) -> float | None:
        """The wait of the steps since the last reading, once ``steps`` more steps (``seconds``
        long) ended and :data:`READ_EVERY_S` went by since it; None in between (their wait
        comes with the next reading) and until DDP's statistics said anything. The last
        iteration's wait stands for each step since the reading before."""
        self._steps += steps
        self._seconds += seconds
        if self._seconds < READ_EVERY_S and self._read:
            return None
        steps, self._steps, self._seconds = self._steps, 0, 0.0
        waited = self.take()
        if waited is None:
            return None
        self._read = True
        return waited * max(1, min(steps, self.iterations))

    def skip(self) -> None:
        """The iterations since the last reading were not of timed steps: forget them."""
        self._steps, self._seconds = 0, 0.0
        self.take()

    @staticmethod
    def watch(model: Any) -> bool:
        """Ask ``model`` (a DistributedDataParallel) for statistics every iteration; False
        where this torch cannot."""
        setter = getattr(model, "_set_ddp_runtime_logging_sample_rate", None)
        if setter is None or not hasattr(model, "_get_ddp_logging_data"):
            return False
        setter(1)
        return True

    def take(self) -> float | None:
        """Seconds waited in the iterations since the last call; None until DDP's statistics
        said anything (a reducer that keeps none: the Python reducer, several devices per
        process), so that no wait is ever reported as zero for want of a measurement."""
        waited: float | None = None
        self.iterations = 0
        for i, model in enumerate(self.models):
            data = model._get_ddp_logging_data()
            iteration = int(data.get("iteration", 0))
            seen = self._seen.get(i, -1)
            if iteration == seen or "backward_comm_time" not in data:
                continue
            self._seen[i] = iteration
            self.iterations = max(self.iterations, iteration - seen if seen >= 0 else 1)
            comm = float(data["backward_comm_time"])
            overlap = float(data.get("backward_compute_comm_overlap_time", 0))
            waited = (waited or 0.0) + max(0.0, comm - overlap) / 1e9
        return waited

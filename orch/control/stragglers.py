"""Which rank holds the others back, judged from where each rank's step time goes.

Under DDP every rank waits for the slowest in each gradient all-reduce, so steps/s are equal
everywhere and mark nothing. The split of each rank's step (:mod:`orch._timing`) does: the
straggler spends longer in some part of its own step (compute, the wait for data, a section
the user marked) than the others do, and it is the one that waits least in the collectives,
while the others wait for it. Each rank's heartbeats carry sums; this keeps the last
``WINDOW`` seconds of them per rank and judges on their per-step means.

The judgement is honest about what it cannot see: with no step times (a loop without
``ctx.steps``) or no timed collectives (a model not wrapped by ``ctx.ddp``) it says that
stragglers cannot be judged, and why, rather than "no straggler".
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from .._proto import orchestrator_pb2 as pb

WINDOW = 3.0  # seconds of heartbeats a rank's per-step means cover
# A rank is the straggler in a part of the step when it spends at least this much more there
# than the median of the others (a share of the median step, and at least a few ms) ...
MIN_EXCESS_SHARE = 0.10
MIN_EXCESS_SECONDS = 0.002
# ... and when it waits less in the collectives than the others, by at least this share of
# its excess: the others wait for it. (A rank slower by chance in one window seldom is both.)
WAIT_SHARE = 0.5


@dataclass
class Means:
    """One rank's per-step means over the window, in seconds."""

    steps: int
    step: float
    data: float
    collective: float
    other: float
    sections: dict[str, float]
    collectives: bool

    @property
    def compute(self) -> float:
        return max(0.0, self.step - self.data - self.collective - self.other)

    def part(self, name: str) -> float:
        if name == "data":
            return self.data
        if name == "compute":
            return self.compute
        return self.sections.get(name, 0.0)


@dataclass
class TimingWindow:
    """The step times a rank sent over the last WINDOW seconds, and its best compute so far."""

    beats: deque[tuple[float, pb.StepTiming]] = field(default_factory=deque)
    best_compute: float = 0.0

    def add(self, now: float, timing: pb.StepTiming) -> None:
        if timing.steps > 0:
            self.beats.append((now, timing))
        self.trim(now)

    def trim(self, now: float) -> None:
        while self.beats and now - self.beats[0][0] > WINDOW:
            self.beats.popleft()

    def means(self) -> Means | None:
        steps = sum(t.steps for _, t in self.beats)
        if not steps:
            return None
        sections: dict[str, float] = {}
        for _, t in self.beats:
            for name, seconds in t.sections.items():
                sections[name] = sections.get(name, 0.0) + seconds
        m = Means(
            steps=steps,
            step=sum(t.step_seconds for _, t in self.beats) / steps,
            data=sum(t.data_seconds for _, t in self.beats) / steps,
            collective=sum(t.collective_seconds for _, t in self.beats) / steps,
            other=sum(t.other_seconds for _, t in self.beats) / steps,
            sections={k: v / steps for k, v in sections.items()},
            collectives=all(t.collectives for _, t in self.beats),
        )
        if m.compute > 0 and (not self.best_compute or m.compute < self.best_compute):
            self.best_compute = m.compute
        return m


@dataclass
class Verdict:
    judged: bool
    rank: int = -1  # the straggler, -1: none
    section: str = ""
    note: str = ""

    @property
    def key(self) -> tuple[int, str]:
        return self.rank, self.section


def judge(means: dict[int, Means | None], world_size: int) -> Verdict:
    """The straggler among ranks ``means`` (rank -> its per-step means, None: no step times)."""
    if world_size < 2:
        return Verdict(True, note="one rank: no other rank to wait for")
    if len(means) < world_size:
        return Verdict(
            False, note=f"{len(means)} of {world_size} ranks running: stragglers are judged once all run"
        )
    untimed = sorted(r for r, m in means.items() if m is None)
    if len(untimed) == world_size:
        return Verdict(
            False,
            note="stragglers cannot be judged: no rank times its steps (drive the loop with ctx.steps)",
        )
    if untimed:
        listed = ", ".join(map(str, untimed[:8]))
        return Verdict(False, note=f"stragglers cannot be judged yet: no step times from rank {listed}")
    timed = {r: m for r, m in means.items() if m is not None}
    if not all(m.collectives for m in timed.values()):
        return Verdict(
            False,
            note="stragglers cannot be judged: the gradient collectives are not timed "
            "(wrap the model with ctx.ddp)",
        )
    step = statistics.median(m.step for m in timed.values())
    floor = max(MIN_EXCESS_SHARE * step, MIN_EXCESS_SECONDS)
    sections = sorted({name for m in timed.values() for name in m.sections})
    found: list[tuple[float, int, str]] = []
    for rank, m in timed.items():
        others = [o for r, o in timed.items() if r != rank]
        waits = statistics.median(o.collective for o in others)
        for part in ("compute", "data"):
            excess = _excess(m, others, part)
            if excess < floor or m.collective > waits - WAIT_SHARE * excess:
                continue  # not slow enough there, or it waits as long as the others
            # A marked section that holds most of a compute excess names it better.
            named = (
                max(sections, key=lambda name: _excess(m, others, name), default="")
                if part == "compute"
                else ""
            )
            if named and _excess(m, others, named) >= 0.5 * excess:
                part = named
            found.append((excess, rank, part))
    if not found:
        return Verdict(
            True, note=f"no straggler: the ranks spend about the same in each part of a {_ms(step)} step"
        )
    _, rank, part = max(found)
    m = timed[rank]
    others = [o for r, o in timed.items() if r != rank]
    theirs = statistics.median(o.part(part) for o in others)
    waits = statistics.median(o.collective for o in others)
    note = (
        f"rank {rank} is the straggler, slow in {part}: {_ms(m.part(part))} per step against {_ms(theirs)} "
        f"on the others; it waits {_ms(m.collective)} in collectives, the others {_ms(waits)}"
    )
    return Verdict(True, rank, part, note)


def _excess(m: Means, others: list[Means], part: str) -> float:
    """How much longer ``m`` spends in ``part`` than the others' median."""
    return m.part(part) - statistics.median(o.part(part) for o in others)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def scores(
    means: dict[int, Means | None], windows: dict[int, TimingWindow]
) -> dict[int, tuple[float, float]]:
    """Per rank: (relative, individual): its compute against the fastest rank's, and against
    its own best so far (1.0: the fastest, or its best)."""
    computes = {r: m.compute for r, m in means.items() if m is not None}
    fastest = min((c for c in computes.values() if c > 0), default=0.0)
    out = {}
    for r, c in computes.items():
        best = windows[r].best_compute if r in windows else 0.0
        out[r] = (c / fastest if fastest else 0.0, c / best if best else 0.0)
    return out

"""Which rank holds the others back, judged from where each rank's step time goes.

Under DDP every rank waits for the slowest in each gradient all-reduce, so steps/s are equal
everywhere and mark nothing. The split of each rank's step (:mod:`orch.runtime._timing`) does: the
straggler spends longer in some part of its own step (compute, the wait for data, a section
the user marked) than the others do, and it is the one that waits least in the collectives,
while the others wait for it. Each rank's heartbeats carry sums; this keeps the last
``WINDOW`` seconds of them per rank and judges on their per-step means.

The judgement is honest about what it cannot see: with no step times (a loop without
``ctx.steps``) or no timed collectives (a model not wrapped by ``ctx.ddp``) it says that
stragglers cannot be judged, and why, rather than "no straggler".
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, field

from orch.wire._proto import orchestrator_pb2 as pb

WINDOW = 3.0  # seconds of heartbeats a rank's per-step means cover ...
MIN_BEATS = 4  # ... or its last beats that carried steps, when its steps are longer than that
MAX_BEATS = 256  # beats kept per rank, however fast they come
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
    """The step times a rank sent over the last WINDOW seconds (at least its last MIN_BEATS
    beats, for steps longer than the window), and its best compute so far."""

    # (time, steps, step, data, collective, other, sections, collectives): copies, so that no
    # request is kept alive by its parts
    beats: deque[tuple[float, int, float, float, float, float, dict[str, float], bool]] = field(
        default_factory=lambda: deque(maxlen=MAX_BEATS)
    )
    best_compute: float = 0.0

    def add(self, now: float, t: pb.StepTiming) -> None:
        if t.steps > 0:
            self.beats.append(
                (now, t.steps, t.step_seconds, t.data_seconds, t.collective_seconds, t.other_seconds,
                 dict(t.sections), t.collectives)
            )  # fmt: skip
        self.trim(now)

    def trim(self, now: float) -> None:
        while len(self.beats) > MIN_BEATS and now - self.beats[0][0] > WINDOW:
            self.beats.popleft()

    def means(self) -> Means | None:
        steps = sum(b[1] for b in self.beats)
        if not steps:
            return None
        sections: dict[str, float] = {}
        for b in self.beats:
            for name, seconds in b[6].items():
                sections[name] = sections.get(name, 0.0) + seconds
        m = Means(
            steps=steps,
            step=sum(b[2] for b in self.beats) / steps,
            data=sum(b[3] for b in self.beats) / steps,
            collective=sum(b[4] for b in self.beats) / steps,
            other=sum(b[5] for b in self.beats) / steps,
            sections={k: v / steps for k, v in sections.items()},
            collectives=any(b[7] for b in self.beats),
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
    # Each part's values sorted once: the median of the others is read off without copying.
    ranked = {part: sorted(m.part(part) for m in timed.values()) for part in ("compute", "data", *sections)}
    waits = sorted(m.collective for m in timed.values())
    found: list[tuple[float, int, str]] = []
    for rank, m in timed.items():
        their_wait = _median_without(waits, m.collective)
        for part in ("compute", "data"):
            excess = m.part(part) - _median_without(ranked[part], m.part(part))
            if excess < floor or m.collective > their_wait - WAIT_SHARE * excess:
                continue  # not slow enough there, or it waits as long as the others
            if part == "compute" and sections:
                # A marked section that holds most of a compute excess names it better.
                named = max(sections, key=lambda n: m.part(n) - _median_without(ranked[n], m.part(n)))
                if m.part(named) - _median_without(ranked[named], m.part(named)) >= 0.5 * excess:
                    part = named
            found.append((excess, rank, part))
    if not found:
        return Verdict(
            True, note=f"no straggler: the ranks spend about the same in each part of a {_ms(step)} step"
        )
    _, rank, part = max(found)
    m = timed[rank]
    note = (
        f"rank {rank} is the straggler, slow in {part}: {_ms(m.part(part))} per step against "
        f"{_ms(_median_without(ranked[part], m.part(part)))} on the others; it waits {_ms(m.collective)} in "
        f"collectives, the others {_ms(_median_without(waits, m.collective))}"
    )
    return Verdict(True, rank, part, note)


def _median_without(ordered: list[float], value: float) -> float:
    """The median of sorted ``ordered`` with one occurrence of ``value`` taken out."""
    skip = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < skip else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


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

"""Which rank holds the others back, judged from where each rank's step time goes.

Under DDP every rank waits for the slowest in each gradient all-reduce, so steps/s are equal
everywhere and mark nothing. The split of each rank's step (:mod:`orch.runtime._timing`) does: the
straggler spends longer in some part of its own step (compute, the wait for data, a section
the user marked) than the others do, and it is the one that waits least in the collectives,
while the others wait for it. Each rank's heartbeats carry sums; this keeps the last
``WINDOW`` seconds of them per rank and judges on their per-step means.

Steps are marked by ``ctx.steps``, else by each batch ``ctx.data`` yields, else from one
``ctx.log`` step to the next (no data or compute split claimed then): the judgement says which.
It is honest about what it does not know. Before the ranks sent step times it is "not judged
yet: too few steps", and a run that ends then says so; it "cannot be judged" only for a reason
that stays: no timed collectives (a model not wrapped by ``ctx.ddp``), or timing turned off.
Never "no straggler" for want of a measurement.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from orch.wire.model import StepTiming

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
    sections: Mapping[str, float]
    collectives: bool
    timed_by: str = "ctx.steps"  # what marks its steps: ctx.steps, ctx.data or ctx.log

    @property
    def compute(self) -> float:
        return max(0.0, self.step - self.data - self.collective - self.other)

    def part(self, name: str) -> float:
        if name == "data":
            return self.data
        if name in ("compute", OWN_TIME):
            return self.compute
        return self.sections.get(name, 0.0)


# The part a loop timed by ctx.log alone is slow in: its step outside the collectives, which
# orch does not split into data and compute there.
OWN_TIME = "own time"
TIMED_BY = {
    "ctx.steps": "timed by ctx.steps",
    "ctx.data": "each batch of ctx.data timed as a step",
    "ctx.log": "timed from one ctx.log step to the next, not split into data and compute",
}
OFF = "off"  # a rank whose step timing is turned off (ORCH_STEP_TIMING=0)

Beat = tuple[float, int, float, float, float, float, dict[str, float], bool]


@dataclass
class TimingWindow:
    """The step times a rank sent over the last WINDOW seconds (at least its last MIN_BEATS
    beats, for steps longer than the window), and its best compute so far.

    The window keeps running sums, so its means cost the same however many beats it holds:
    the judgement reads a thousand ranks' in a few milliseconds. Sums are rebuilt from the
    beats now and then, so that adding and taking away floats never drifts."""

    # (time, steps, step, data, collective, other, sections, collectives): copies, so that no
    # request is kept alive by its parts
    beats: deque[Beat] = field(default_factory=deque)
    best_compute: float = 0.0
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # steps, step, data, collective, other
    _sections: dict[str, float] = field(default_factory=dict)
    _named: dict[str, int] = field(default_factory=dict)  # beats in the window that name each section
    _timed_collectives: int = 0  # beats in the window whose collectives were timed
    _removed: int = 0
    timed_by: str = ""  # what marks the rank's steps, as its last beat said ("off": not timed)

    def add(self, now: float, t: StepTiming) -> None:
        if t.timed_by or t.steps > 0:
            self.timed_by = t.timed_by or "ctx.steps"  # an older worker times ctx.steps only
        if t.steps > 0:
            beat = (now, t.steps, t.step_seconds, t.data_seconds, t.collective_seconds, t.other_seconds,
                    dict(t.sections), t.collectives)  # fmt: skip
            if len(self.beats) >= MAX_BEATS:
                self._remove(self.beats.popleft())
            self.beats.append(beat)
            sums = self._sums
            sums[0] += beat[1]
            sums[1] += beat[2]
            sums[2] += beat[3]
            sums[3] += beat[4]
            sums[4] += beat[5]
            for name, seconds in beat[6].items():
                self._sections[name] = self._sections.get(name, 0.0) + seconds
                self._named[name] = self._named.get(name, 0) + 1
            self._timed_collectives += beat[7]
        self.trim(now)

    def _remove(self, beat: Beat) -> None:
        sums = self._sums
        sums[0] -= beat[1]
        sums[1] -= beat[2]
        sums[2] -= beat[3]
        sums[3] -= beat[4]
        sums[4] -= beat[5]
        for name, seconds in beat[6].items():
            if self._named.get(name, 0) <= 1:
                self._sections.pop(name, None)  # no beat left names it
                self._named.pop(name, None)
            else:
                self._sections[name] -= seconds
                self._named[name] -= 1
        self._timed_collectives -= beat[7]
        self._removed += 1
        if self._removed >= MAX_BEATS:
            self._rebuild()

    def _rebuild(self) -> None:
        self._removed = 0
        self._sums = [
            float(sum(b[1] for b in self.beats)),
            sum(b[2] for b in self.beats),
            sum(b[3] for b in self.beats),
            sum(b[4] for b in self.beats),
            sum(b[5] for b in self.beats),
        ]
        self._sections, self._named = {}, {}
        for b in self.beats:
            for name, seconds in b[6].items():
                self._sections[name] = self._sections.get(name, 0.0) + seconds
                self._named[name] = self._named.get(name, 0) + 1
        self._timed_collectives = sum(b[7] for b in self.beats)

    def trim(self, now: float) -> None:
        while len(self.beats) > MIN_BEATS and now - self.beats[0][0] > WINDOW:
            self._remove(self.beats.popleft())

    def means(self) -> Means | None:
        steps = round(self._sums[0])
        if steps <= 0 or not self.beats:
            return None
        _, step, data, collective, other = self._sums
        m = Means(
            steps=steps,
            step=step / steps,
            data=data / steps,
            collective=collective / steps,
            other=other / steps,
            sections=_PerStep(self._sections, steps),
            collectives=self._timed_collectives > 0,
            timed_by=self.timed_by or "ctx.steps",
        )
        if m.compute > 0 and (not self.best_compute or m.compute < self.best_compute):
            self.best_compute = m.compute
        return m


class _PerStep(Mapping[str, float]):
    """A rank's section sums read as per-step means, divided only for the names asked for:
    the judgement reads the sections of the few ranks it suspects, not every rank's."""

    def __init__(self, sums: dict[str, float], steps: int) -> None:
        # The window's own sums, not a copy: a judgement reads them at once, under the run's lock.
        self._sums, self._steps = sums, steps

    def __getitem__(self, name: str) -> float:
        return self._sums[name] / self._steps

    def __iter__(self) -> Iterator[str]:
        return iter(self._sums)

    def __len__(self) -> int:
        return len(self._sums)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


# What a run that ended before it could be judged says: it ran too short to say anything of its
# stragglers (a rank failing at step 10, a cell that only builds a model, 64 fast steps). Its
# record keeps the note (``result.json``, ``run.state()``, ``orch show``); the views, which show
# a note only when it says something, leave it out (:func:`too_short`).
ENDED_TOO_SHORT = "not judged: the run ended"


def too_short(note: str) -> bool:
    """``note`` only says the run ended before its stragglers could be judged."""
    return note.startswith(ENDED_TOO_SHORT)


@dataclass
class Verdict:
    judged: bool
    rank: int = -1  # the straggler, -1: none
    section: str = ""
    note: str = ""
    # Not judged *yet* (too few steps, ranks still starting): what to say instead once the run
    # ended without a judgement. Empty: the note holds whenever (a judgement, or a real reason).
    ended: str = ""

    @property
    def key(self) -> tuple[int, str]:
        return self.rank, self.section

    def shown(self, run_ended: bool) -> str:
        """The note to show: a run that ended before it could be judged says so."""
        return self.ended if run_ended and self.ended else self.note


def _ranks(ranks: list[int]) -> str:
    listed = ", ".join(map(str, ranks[:8]))
    return f"rank {listed}" + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def judge(
    means: dict[int, Means | None],
    world_size: int,
    *,
    off: Collection[int] = (),
    unmarked: Collection[int] = (),
) -> Verdict:
    """The straggler among ranks ``means`` (rank -> its per-step means, None: no step times
    yet); ``off``: the ranks that said they do not time their steps (ORCH_STEP_TIMING=0);
    ``unmarked``: the ranks found to mark no steps while others do (they call none of
    ctx.steps, ctx.data and ctx.log)."""
    if world_size < 2:
        return Verdict(True, note="one rank: no other rank to wait for")
    if len(means) < world_size:
        return Verdict(
            False,
            note=f"not judged yet: {len(means)} of {world_size} ranks running (stragglers are judged "
            "once all run)",
            ended=f"{ENDED_TOO_SHORT} with {len(means)} of {world_size} ranks running",
        )
    if off:
        return Verdict(
            False,
            note=f"stragglers cannot be judged: step timing is off (ORCH_STEP_TIMING=0) on "
            f"{_ranks(sorted(off))}",
        )
    untimed = sorted(r for r, m in means.items() if m is None)
    if len(untimed) == world_size:
        return Verdict(
            False,
            note="not judged yet: too few steps (no rank has sent step times yet)",
            ended=f"{ENDED_TOO_SHORT} after too few steps (no rank had sent step times)",
        )
    if untimed and all(r in unmarked for r in untimed):
        return Verdict(
            False,
            note=f"stragglers cannot be judged: {_ranks(untimed)} has marked no step while the others "
            "have (a loop that calls ctx.log on some ranks only, or none of ctx.steps, ctx.data and "
            "ctx.log: call ctx.log on every rank, or drive the loop with ctx.steps or ctx.data)",
        )
    if untimed:
        return Verdict(
            False,
            note=f"not judged yet: too few steps (no step times yet from {_ranks(untimed)})",
            ended=f"{ENDED_TOO_SHORT} after too few steps (no step times from {_ranks(untimed)})",
        )
    timed = {r: m for r, m in means.items() if m is not None}
    if not all(m.collectives for m in timed.values()):
        return Verdict(
            False,
            note="stragglers cannot be judged: the gradient collectives are not timed "
            "(wrap the model with ctx.ddp, or give Lightning's Trainer orch's OrchCallback)",
        )
    how = _timed_by(timed)
    # The medians of the others, for every rank at once (numpy): O(ranks), a few ms at a
    # thousand. Sections are read only for a rank found slow in compute, and only its own (at
    # most MAX_SECTIONS): the judgement's cost does not grow with the names the ranks mark.
    ranks = list(timed)
    table = np.array([(m.step, m.data, m.collective, m.other) for m in timed.values()], dtype=np.float64)
    step_t, data_t, wait_t, other_t = table.T
    compute_t = np.maximum(0.0, step_t - data_t - wait_t - other_t)
    step = float(np.median(step_t))
    floor = max(MIN_EXCESS_SHARE * step, MIN_EXCESS_SECONDS)
    their_wait = _medians_without(wait_t)
    found: list[tuple[float, int, str]] = []
    others_of: dict[str, npt.NDArray[np.float64]] = {}
    for part, values in (("compute", compute_t), ("data", data_t)):
        others = others_of[part] = _medians_without(values)
        excess = values - others
        slow = np.nonzero((excess >= floor) & (wait_t <= their_wait - WAIT_SHARE * excess))[0]
        for i in slow.tolist():  # few: the ranks slow there that the others wait for
            named = part
            m = timed[ranks[i]]
            if part == "compute" and m.sections:
                # A marked section that holds most of a compute excess names it better.
                best_name, best_excess = "", -math.inf
                for name in m.sections:
                    theirs = sorted(o.sections.get(name, 0.0) for o in timed.values())
                    over = m.sections[name] - _median_without(theirs, m.sections[name])
                    if over > best_excess:
                        best_name, best_excess = name, over
                if best_excess >= 0.5 * float(excess[i]):
                    named = best_name
            found.append((float(excess[i]), ranks[i], named))
    if not found:
        return Verdict(
            True,
            note=f"no straggler: the ranks spend about the same in each part of a {_ms(step)} step ({how})",
        )
    _, rank, part = max(found)  # the largest excess: the rank the others wait for longest
    i = ranks.index(rank)
    m = timed[rank]
    if part in others_of:
        theirs_ms = float(others_of[part][i])
    else:
        theirs_ms = _median_without(sorted(o.sections.get(part, 0.0) for o in timed.values()), m.part(part))
    if part == "compute" and m.timed_by == "ctx.log":
        part = OWN_TIME  # a step timed by ctx.log alone is not split: all of it outside the collectives
    note = (
        f"rank {rank} is the straggler, slow in {part}: {_ms(m.part(part))} per step against "
        f"{_ms(theirs_ms)} on the others; it waits {_ms(m.collective)} in "
        f"collectives, the others {_ms(float(their_wait[i]))} ({how})"
    )
    return Verdict(True, rank, part, note)


def _timed_by(timed: Mapping[int, Means]) -> str:
    """How the ranks' steps were timed, in words (the ranks of one run time theirs alike)."""
    kinds = sorted({m.timed_by for m in timed.values()})
    return "; ".join(TIMED_BY.get(k, f"timed by {k}") for k in kinds)


def _medians_without(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """For each value, the median of the others (the array with that one value taken out)."""
    ordered = np.sort(values)
    n = len(ordered) - 1  # how many the others are
    skip = np.searchsorted(ordered, values, side="left")

    def at(k: int) -> npt.NDArray[np.float64]:
        return ordered[np.where(k < skip, k, k + 1)]  # the k-th of the others

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2


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

"""Early stopping for a sweep, decided once for every rank of a trial: :class:`ASHA`,
:class:`SHA`, :class:`MedianStop`.

A pruner is fed, by the sweep's scheduler in the launching process, a trial's metric at the
steps it asks for (:meth:`Pruner.next_step`): the mean over the trial's ranks of the value
each logged at that step. It answers whether the trial stops there. A pruned trial is
stopped through its master, which tells every rank the same thing: ``ctx.steps`` ends on all
of them at the same step (it shares the stop with an all-reduce), a loop without it ends at
the master's ``stop_at_step``, and the run ends PRUNED.

Steps are the steps ``ctx.log`` is given (0, 1, 2, ...), as Optuna counts the steps of
``trial.report``: :class:`ASHA` decides as ``optuna.pruners.SuccessiveHalvingPruner`` does
when both are fed the same values (tests/experiments/test_pruning.py holds the two side by side).
A pruner's history (the values at each rung) is JSON (:meth:`Pruner.state`), kept in the
sweep's folder, so that a sweep run again goes on with the same rungs.

A synchronous pruner (:class:`SHA`) answers "wait" (None) at a rung until every trial still in
the sweep has a value there (:meth:`Pruner.settle`); its trials wait at the rung, or give their
slot up meanwhile and run again if they go on (orch/experiments/scheduler.py says how).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Literal

from orch.errors import ConfigError


class Pruner:
    """What the scheduler asks of a pruner; ``metric`` and ``mode`` default to the sweep's."""

    metric: str | None = None
    mode: Literal["min", "max"] | None = None
    synchronous = False  # True: report() may answer None, and settle() decides a rung at once

    def bind(self, metric: str, mode: Literal["min", "max"]) -> None:
        """Take the sweep's metric and mode where none was given."""
        self.metric = self.metric or metric
        self.mode = self.mode or mode

    def next_step(self, trial: int, reached: int) -> int | None:
        """The next step at which trial ``trial`` (at step ``reached``) is judged; None: no more."""
        raise NotImplementedError

    def report(self, trial: int, step: int, value: float) -> bool | None:
        """Trial ``trial``'s metric at ``step``; True: prune it; None (a synchronous pruner's):
        wait for :meth:`decided`."""
        raise NotImplementedError

    def settle(self, alive: set[int], size: int) -> None:
        """Decide what can be decided now: ``alive`` are the trials still in the sweep (queued,
        running or waiting at a rung), ``size`` the sweep's trials in all (some maybe not drawn yet)."""

    def decided(self, trial: int, step: int) -> bool | None:
        """The decision on ``trial`` at ``step``, once :meth:`settle` took it: True: pruned."""
        return None

    def rungs(self) -> list[int]:
        """The steps where trials are judged (for the panel's marks); [] when every step is one."""
        return []

    def state(self) -> dict[str, Any]:
        """The pruner's history as JSON."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back a history :meth:`state` wrote (a rerun of the sweep)."""


def _check_mode(what: str, mode: Any) -> None:
    if mode not in (None, "min", "max"):
        raise ConfigError(f"{what}: mode must be 'min' or 'max', got {mode!r}")


def _check_halving(what: str, grace: Any, reduction: Any, max_steps: Any) -> None:
    if type(grace) is not int or grace < 1:
        raise ConfigError(f"{what}: grace must be an integer >= 1 (the first rung's step), got {grace!r}")
    if type(reduction) is not int or reduction < 2:
        raise ConfigError(f"{what}: reduction must be an integer >= 2, got {reduction!r}")
    if max_steps is not None and (type(max_steps) is not int or max_steps < 1):
        raise ConfigError(f"{what}: max_steps must be None or an integer >= 1, got {max_steps!r}")


def _halving_rungs(grace: int, reduction: int, max_steps: int | None) -> list[int]:
    """Steps ``grace * reduction**k`` short of the last step (a trial there is done anyway)."""
    out, rung = [], 0
    limit = (max_steps - 1) if max_steps is not None else 10**6
    while grace * reduction**rung < limit and rung < 64:
        out.append(grace * reduction**rung)
        rung += 1
    return out


class _Halving(Pruner):
    """Successive halving's options, checked, and its rungs: steps ``grace * reduction**k``
    short of ``max_steps``; ``values[k]`` holds each trial's value at rung ``k``."""

    name = ""  # as users write it: orch.ASHA, orch.SHA

    def __init__(
        self,
        metric: str | None = None,
        mode: Literal["min", "max"] | None = None,
        grace: int = 1,
        reduction: int = 3,
        max_steps: int | None = None,
    ) -> None:
        _check_mode(self.name, mode)
        _check_halving(self.name, grace, reduction, max_steps)
        self.metric, self.mode = metric, mode
        self.grace, self.reduction, self.max_steps = grace, reduction, max_steps
        self.values: list[dict[int, float]] = []  # rung -> trial -> its value there, in arrival order

    def __repr__(self) -> str:
        return (
            f"{self.name}(metric={self.metric!r}, mode={self.mode!r}, grace={self.grace}, "
            f"reduction={self.reduction}, max_steps={self.max_steps})"
        )

    def rungs(self) -> list[int]:
        return _halving_rungs(self.grace, self.reduction, self.max_steps)


class ASHA(_Halving):
    """Asynchronous successive halving: at rung ``k`` (step ``grace * reduction**k``) a trial
    goes on only while its value is in the best ``1/reduction`` of the values trials had at that
    rung so far; the first trials at a rung go on when they are the best there yet.

    ``ASHA(metric="loss", mode="min", grace=3, reduction=3, max_steps=81)``: rungs at steps 3,
    9 and 27. ``max_steps``: no rung at or past the last step (a trial there is done anyway).
    """

    name = "orch.ASHA"

    def _rung_step(self, rung: int) -> int:
        return int(self.grace * self.reduction**rung)

    def _completed(self, trial: int) -> int:
        rung = 0
        while rung < len(self.values) and trial in self.values[rung]:
            rung += 1
        return rung

    def next_step(self, trial: int, reached: int) -> int | None:
        step = self._rung_step(self._completed(trial))
        if self.max_steps is not None and step >= self.max_steps - 1:
            return None
        return step

    def report(self, trial: int, step: int, value: float) -> bool:
        rung = self._completed(trial)
        while True:
            if step < self._rung_step(rung):
                return False
            if math.isnan(value):
                return True
            while len(self.values) <= rung:
                self.values.append({})
            competing = [v for t, v in self.values[rung].items() if t != trial]
            competing.append(value)
            self.values[rung][trial] = value
            at = max(0, len(competing) // self.reduction - 1)
            competing.sort()
            promoted = value >= competing[-(at + 1)] if self.mode == "max" else value <= competing[at]
            if not promoted:
                return True
            rung += 1

    def state(self) -> dict[str, Any]:
        return {"rungs": [{str(t): v for t, v in rung.items()} for rung in self.values]}

    def restore(self, state: dict[str, Any]) -> None:
        rungs = state.get("rungs", [])
        self.values = [{int(t): float(v) for t, v in rung.items()} for rung in rungs]


class SHA(_Halving):
    """Synchronous successive halving (Jamieson & Talwalkar 2016): every trial of the sweep runs
    to rung 0 (step ``grace``); once all of them have a value there, the best ``1/reduction``
    (at least one) go on to rung 1 (step ``grace * reduction``) and the others end PRUNED there;
    and so on until ``max_steps``. Its cost is known before it starts and does not depend on the
    order the configs come in: with 27 configs, grace 3, reduction 3 and 81 steps, at most
    27*4 + 9*10 + 3*28 + 1*81 steps (steps 0 to 3 are 4; each rung's survivors run again from
    step 0, or from their newest checkpoint when they save them: then 27*4 + 9*6 + 3*18 + 53),
    where :class:`ASHA` spends more on a grid written in order.

    A trial at a rung waits there for the rung's decision while nothing is queued for its slot;
    otherwise (or past a few seconds) it gives the slot up, and if it goes on it is started
    again. ``orch.sweep`` knows how many trials there are: a list's length, or ``trials=N``.
    """

    synchronous = True
    name = "orch.SHA"

    def __init__(
        self,
        metric: str | None = None,
        mode: Literal["min", "max"] | None = None,
        grace: int = 1,
        reduction: int = 3,
        max_steps: int | None = None,
    ) -> None:
        super().__init__(metric, mode, grace, reduction, max_steps)
        self.kept: list[list[int]] = []  # rung -> the trials that went on from it (decided rungs)

    def next_step(self, trial: int, reached: int) -> int | None:
        """The first undecided rung's step, for a trial that went on from every decided one."""
        if any(trial not in kept for kept in self.kept):
            return None
        rungs = self.rungs()
        return rungs[len(self.kept)] if len(self.kept) < len(rungs) else None

    def report(self, trial: int, step: int, value: float) -> bool | None:
        rungs = self.rungs()
        if step not in rungs:
            return False
        rung = rungs.index(step)
        if rung < len(self.kept):  # decided already (a sweep run again)
            return trial not in self.kept[rung]
        while len(self.values) <= rung:
            self.values.append({})
        self.values[rung][trial] = value
        return True if math.isnan(value) else None

    def settle(self, alive: set[int], size: int) -> None:
        while len(self.kept) < len(self.rungs()):
            rung = len(self.kept)
            entrants = set(range(size)) if rung == 0 else set(self.kept[rung - 1])
            here = self.values[rung] if rung < len(self.values) else {}
            if not here or any(t not in here for t in entrants & alive):
                return  # a trial still on its way to this rung
            sign = -1.0 if self.mode == "max" else 1.0
            ranked = sorted(
                (t for t, v in here.items() if t in alive and not math.isnan(v)),
                key=lambda t: (sign * here[t], t),
            )
            self.kept.append(ranked[: max(1, len(here) // self.reduction)])

    def decided(self, trial: int, step: int) -> bool | None:
        rungs = self.rungs()
        if step not in rungs or rungs.index(step) >= len(self.kept):
            return None
        return trial not in self.kept[rungs.index(step)]

    def state(self) -> dict[str, Any]:
        return {
            "rungs": [{str(t): v for t, v in rung.items()} for rung in self.values],
            "kept": [list(k) for k in self.kept],
        }

    def restore(self, state: dict[str, Any]) -> None:
        rungs = state.get("rungs", [])
        self.values = [{int(t): float(v) for t, v in rung.items()} for rung in rungs]
        self.kept = [[int(t) for t in k] for k in state.get("kept", [])]


class MedianStop(Pruner):
    """The median stopping rule: from step ``grace`` on, every ``interval`` steps, a trial whose
    best value so far is worse than the median of the other trials' values at the same step stops,
    once at least ``min_trials`` other trials reported that step."""

    def __init__(
        self,
        metric: str | None = None,
        mode: Literal["min", "max"] | None = None,
        grace: int = 0,
        interval: int = 1,
        min_trials: int = 3,
    ) -> None:
        _check_mode("orch.MedianStop", mode)
        for name, value, least in (
            ("grace", grace, 0),
            ("interval", interval, 1),
            ("min_trials", min_trials, 1),
        ):
            if type(value) is not int or value < least:
                raise ConfigError(f"orch.MedianStop: {name} must be an integer >= {least}, got {value!r}")
        self.metric, self.mode = metric, mode
        self.grace, self.interval, self.min_trials = grace, interval, min_trials
        self.values: dict[int, dict[int, float]] = {}  # trial -> step -> value

    def __repr__(self) -> str:
        return (
            f"orch.MedianStop(metric={self.metric!r}, mode={self.mode!r}, grace={self.grace}, "
            f"interval={self.interval}, min_trials={self.min_trials})"
        )

    def next_step(self, trial: int, reached: int) -> int | None:
        done = self.values.get(trial, {})
        step = max(self.grace, (max(done) + 1) if done else 0)
        return step + (-(step - self.grace)) % self.interval

    def report(self, trial: int, step: int, value: float) -> bool:
        mine = self.values.setdefault(trial, {})
        mine[step] = value
        if math.isnan(value):
            return True
        others = [
            v[step] for t, v in self.values.items() if t != trial and step in v and not math.isnan(v[step])
        ]
        if len(others) < self.min_trials:
            return False
        seen = [v for v in mine.values() if not math.isnan(v)]
        best = max(seen) if self.mode == "max" else min(seen)
        median = statistics.median(others)
        return best < median if self.mode == "max" else best > median

    def state(self) -> dict[str, Any]:
        return {"values": {str(t): {str(s): v for s, v in steps.items()} for t, steps in self.values.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.values = {
            int(t): {int(s): float(v) for s, v in steps.items()}
            for t, steps in state.get("values", {}).items()
        }


def parse_prune(text: str) -> Pruner:
    """A pruner from the command line: ``asha:grace=3,reduction=3``, ``sha:grace=3`` or ``median:grace=5``."""
    kind, _, rest = text.partition(":")
    kinds: dict[str, type[Pruner]] = {"asha": ASHA, "sha": SHA, "median": MedianStop}
    cls = kinds.get(kind.strip().lower())
    if cls is None:
        raise ConfigError(
            f"--prune {text!r}: the kind must be asha, sha or median, like asha:grace=3,reduction=3"
        )
    options: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ConfigError(f"--prune {text!r}: {part!r} must be name=value, like grace=3")
        key = key.strip()
        if key in ("metric", "mode"):
            options[key] = value.strip()
            continue
        try:
            options[key] = int(value)
        except ValueError:
            raise ConfigError(f"--prune {text!r}: {key} must be an integer, got {value!r}") from None
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(f"--prune {text!r}: {e}") from None

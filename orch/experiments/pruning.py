"""Early stopping for a sweep, decided once for every rank of a trial: :class:`ASHA`, :class:`MedianStop`.

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

    def bind(self, metric: str, mode: Literal["min", "max"]) -> None:
        """Take the sweep's metric and mode where none was given."""
        self.metric = self.metric or metric
        self.mode = self.mode or mode

    def next_step(self, trial: int, reached: int) -> int | None:
        """The next step at which trial ``trial`` (at step ``reached``) is judged; None: no more."""
        raise NotImplementedError

    def report(self, trial: int, step: int, value: float) -> bool:
        """Trial ``trial``'s metric at ``step``; True: prune it."""
        raise NotImplementedError

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


class ASHA(Pruner):
    """Asynchronous successive halving: at rung ``k`` (step ``grace * reduction**k``) a trial
    goes on only while its value is in the best ``1/reduction`` of the values trials had at that
    rung so far; the first trials at a rung go on when they are the best there yet.

    ``ASHA(metric="loss", mode="min", grace=3, reduction=3, max_steps=81)``: rungs at steps 3,
    9 and 27. ``max_steps``: no rung at or past the last step (a trial there is done anyway).
    """

    def __init__(
        self,
        metric: str | None = None,
        mode: Literal["min", "max"] | None = None,
        grace: int = 1,
        reduction: int = 3,
        max_steps: int | None = None,
    ) -> None:
        _check_mode("orch.ASHA", mode)
        if type(grace) is not int or grace < 1:
            raise ConfigError(
                f"orch.ASHA: grace must be an integer >= 1 (the first rung's step), got {grace!r}"
            )
        if type(reduction) is not int or reduction < 2:
            raise ConfigError(f"orch.ASHA: reduction must be an integer >= 2, got {reduction!r}")
        if max_steps is not None and (type(max_steps) is not int or max_steps < 1):
            raise ConfigError(f"orch.ASHA: max_steps must be None or an integer >= 1, got {max_steps!r}")
        self.metric, self.mode = metric, mode
        self.grace, self.reduction, self.max_steps = grace, reduction, max_steps
        self.values: list[dict[int, float]] = []  # rung -> trial -> its value there, in arrival order

    def __repr__(self) -> str:
        return (
            f"orch.ASHA(metric={self.metric!r}, mode={self.mode!r}, grace={self.grace}, "
            f"reduction={self.reduction}, max_steps={self.max_steps})"
        )

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

    def rungs(self) -> list[int]:
        out, rung = [], 0
        limit = (self.max_steps - 1) if self.max_steps is not None else 10**6
        while self._rung_step(rung) < limit and rung < 64:
            out.append(self._rung_step(rung))
            rung += 1
        return out

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
    """A pruner from the command line: ``asha:grace=3,reduction=3`` or ``median:grace=5``."""
    kind, _, rest = text.partition(":")
    kinds: dict[str, type[Pruner]] = {"asha": ASHA, "median": MedianStop}
    cls = kinds.get(kind.strip().lower())
    if cls is None:
        raise ConfigError(f"--prune {text!r}: the kind must be asha or median, like asha:grace=3,reduction=3")
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

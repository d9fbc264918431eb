"""What a sweep searches: a list of configs, or a dict of dimensions, and how configs are drawn.

``orch.sweep(train, space, trials=N, search=...)`` takes, as ``space``:

- a list of configs (``orch.grid(...)`` makes one): every config runs, in order;
- a dict whose values are dimensions, :func:`uniform`, :func:`loguniform`, :func:`randint`,
  :func:`choice`, or fixed values (any other value: every config has it as it is).

A dict is searched by a :class:`Search`: :class:`RandomSearch` (``search="random"``,
seeded, so the same cell draws the same configs again) or an Optuna sampler through
ask/tell (:mod:`orch.experiments.study`). Every config is drawn once, here in the launching
process, and reaches every rank of its trial as ``ctx.config``: the ranks of one trial cannot
get different values.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orch.errors import ConfigError


class Dimension:
    """One searched value of a config."""

    def sample(self, rng: random.Random) -> Any:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """The dimension as JSON (what the sweep's folder records)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Uniform(Dimension):
    low: float
    high: float

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)

    def describe(self) -> dict[str, Any]:
        return {"uniform": [self.low, self.high]}


@dataclass(frozen=True)
class LogUniform(Dimension):
    low: float
    high: float

    def sample(self, rng: random.Random) -> float:
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))

    def describe(self) -> dict[str, Any]:
        return {"loguniform": [self.low, self.high]}


@dataclass(frozen=True)
class RandInt(Dimension):
    low: int
    high: int  # inclusive

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def describe(self) -> dict[str, Any]:
        return {"randint": [self.low, self.high]}


@dataclass(frozen=True)
class Choice(Dimension):
    options: tuple[Any, ...]

    def sample(self, rng: random.Random) -> Any:
        return self.options[rng.randrange(len(self.options))]

    def describe(self) -> dict[str, Any]:
        return {"choice": list(self.options)}


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} needs finite real numbers, got {value!r:.60}")
    return float(value)


def uniform(low: float, high: float) -> Uniform:
    """A real number drawn evenly from ``[low, high]``."""
    lo, hi = _real("orch.uniform(low, high)", low), _real("orch.uniform(low, high)", high)
    if not lo < hi:
        raise ConfigError(f"orch.uniform(low, high) needs low < high, got {low!r}, {high!r}")
    return Uniform(lo, hi)


def loguniform(low: float, high: float) -> LogUniform:
    """A real number whose logarithm is drawn evenly: ``loguniform(1e-4, 1e-1)`` for a learning rate."""
    lo, hi = _real("orch.loguniform(low, high)", low), _real("orch.loguniform(low, high)", high)
    if not 0 < lo < hi:
        raise ConfigError(f"orch.loguniform(low, high) needs 0 < low < high, got {low!r}, {high!r}")
    return LogUniform(lo, hi)


def randint(low: int, high: int) -> RandInt:
    """An integer from ``low`` to ``high``, both included."""
    if type(low) is not int or type(high) is not int or not low <= high:
        raise ConfigError(f"orch.randint(low, high) needs integers with low <= high, got {low!r}, {high!r}")
    return RandInt(low, high)


def choice(options: Sequence[Any]) -> Choice:
    """One of ``options``: ``choice([32, 64, 128])``."""
    if isinstance(options, (str, bytes, dict)) or not isinstance(options, Sequence) or not options:
        raise ConfigError(f"orch.choice(options) needs a non-empty list, got {options!r:.60}")
    return Choice(tuple(options))


def dimensions(space: dict[str, Any]) -> dict[str, Dimension]:
    """The searched dimensions of a dict space (the other values are fixed)."""
    return {k: v for k, v in space.items() if isinstance(v, Dimension)}


def fixed(space: dict[str, Any]) -> dict[str, Any]:
    """The values every config of a dict space has as they are."""
    return {k: v for k, v in space.items() if not isinstance(v, Dimension)}


def check_space(space: Any, trials: int | None) -> None:
    """Refuse what is neither a list of configs nor a dict space, before anything starts."""
    if isinstance(space, dict):
        for key in space:
            if not isinstance(key, str):
                raise ConfigError(f"a search space's keys are config names (strings), got {key!r:.60}")
        if not dimensions(space):
            raise ConfigError(
                "a dict space needs at least one dimension, for example {'lr': orch.loguniform(1e-4, 1e-1)}; "
                "for one fixed config pass [config]"
            )
        if trials is None:
            raise ConfigError("a dict space needs trials=N: how many configs to draw from it")
    if trials is not None and (type(trials) is not int or trials < 1):
        raise ConfigError(f"trials must be an integer >= 1 (configs to run), got {trials!r}")


class Search:
    """Draws the configs of a dict space: one at a time (``next``), told how each ended (``tell``)."""

    name = "search"

    def next(self, index: int) -> dict[str, Any]:
        raise NotImplementedError

    def tell(self, index: int, value: float | None, state: str) -> None:
        """Trial ``index`` ended in ``state`` with ``value`` (its metric; None: none)."""


class RandomSearch(Search):
    """``search="random"``: each config drawn from the space with a seeded generator.

    Config ``i`` depends only on the seed and ``i``, so running the same sweep cell again
    draws the same configs (and reuses the runs that ended).
    """

    name = "random"

    def __init__(self, space: dict[str, Any], seed: int = 0) -> None:
        self.space = space
        self.seed = seed

    def next(self, index: int) -> dict[str, Any]:
        rng = random.Random(f"orch-random-search:{self.seed}:{index}")
        return {k: (v.sample(rng) if isinstance(v, Dimension) else v) for k, v in self.space.items()}


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the given values: ``grid(lr=[0.1, 0.01], batch=[32, 64])`` is 4 configs."""
    if not axes:
        raise ConfigError("grid() needs at least one axis, for example grid(lr=[0.1, 0.01])")
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
            raise ConfigError(
                f"grid axis {name!r} must be a non-empty list of values, got {values!r:.60}: "
                f"write {name}=[...]"
            )
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes.values())]


def check_arguments(configs: Sequence[dict[str, Any]], parallel: int, max_failures: int | None) -> None:
    """Refuse, before anything starts, what is not a list of configs or a count."""
    if isinstance(configs, dict) or not isinstance(configs, Sequence) or not configs:
        raise ConfigError(
            "configs must be a non-empty list of dicts, or orch.grid(lr=[...], ...), "
            f"got {type(configs).__name__} {configs!r:.60}"
        )
    for i, c in enumerate(configs):
        if not isinstance(c, dict):
            raise ConfigError(
                f"configs[{i}] must be a dict (it reaches the function as ctx.config), got {c!r:.60}"
            )
    if type(parallel) is not int or parallel < 1:
        raise ConfigError(f"parallel must be an integer >= 1 (runs at once), got {parallel!r}")
    if max_failures is not None and (type(max_failures) is not int or max_failures < 0):
        raise ConfigError(f"max_failures must be None (no limit) or an integer >= 0, got {max_failures!r}")

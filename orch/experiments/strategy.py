"""How a sweep searches and prunes, made from what ``orch.sweep`` was given and checked: the
Optuna study (when an Optuna sampler or pruner drives it), the search that draws its configs
from a dict space, and its pruner, restored from the sweep's record when it runs again."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from orch.errors import ConfigError
from orch.experiments.pruning import ASHA, SHA, Pruner
from orch.experiments.space import RandomSearch, Search
from orch.experiments.study import OptunaPruner, OptunaSearch, OptunaStudy, is_optuna
from orch.record.writes import private_dir


def study_of(
    search: Any,
    prune: Any,
    searched: bool,
    folder: Path,
    name: str,
    mode: Literal["min", "max"],
    record: dict[str, Any],
) -> OptunaStudy | None:
    """The sweep's Optuna study, in its folder, when an Optuna sampler or pruner drives it."""
    if not (is_optuna(search, "samplers") or is_optuna(prune, "pruners")):
        return None
    if not searched and is_optuna(search, "samplers"):
        raise ConfigError("an Optuna sampler draws configs from a dict space; a list runs as it is")
    private_dir(folder)
    numbers = {
        int(t["index"]): int(t["number"]) for t in record.get("trials", []) if t.get("number") is not None
    }
    return OptunaStudy(
        folder,
        name,
        mode,
        sampler=search if is_optuna(search, "samplers") else None,
        pruner=prune if is_optuna(prune, "pruners") else None,
        numbers=numbers,
    )


def search_of(space: Any, search: Any, seed: int, study: OptunaStudy | None) -> Search:
    """What draws a dict space's configs: a seeded random search, or an Optuna sampler's."""
    if search in (None, "random"):
        return RandomSearch(space, seed)
    if is_optuna(search, "samplers"):
        assert study is not None
        return OptunaSearch(space, study)
    raise ConfigError(
        "search must be 'random' or an Optuna sampler (optuna.samplers.TPESampler(seed=0)), "
        f"got {search!r:.60}"
    )


def pruner_of(
    prune: Any,
    study: OptunaStudy | None,
    metric: str,
    mode: Literal["min", "max"],
    steps: Any,
    record: dict[str, Any],
) -> Pruner | None:
    """The sweep's pruner, bound to its metric, sized to a run's ``steps`` (ASHA, SHA) and
    restored from the sweep's ``record`` of an earlier execution."""
    if prune is None:
        return None
    if isinstance(prune, Pruner):
        pruner = prune
    elif is_optuna(prune, "pruners"):
        assert study is not None
        pruner = OptunaPruner(study)
    else:
        raise ConfigError(
            "prune must be orch.ASHA(...), orch.SHA(...), orch.MedianStop(...) or an Optuna pruner, "
            f"got {prune!r:.60}"
        )
    pruner.bind(metric, mode)
    halving = pruner if isinstance(pruner, (ASHA, SHA)) else None
    if halving is not None and halving.max_steps is None and type(steps) is int and steps > 0:
        halving.max_steps = steps
    if record.get("pruner"):
        pruner.restore(record["pruner"])
    return pruner

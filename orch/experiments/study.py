"""A sweep driven by Optuna: its samplers through ask/tell, its pruners, its study on disk.

``orch.sweep(train, space, trials=N, search=optuna.samplers.TPESampler(seed=0))`` asks the
sampler for each config when a slot frees (so it learns from the trials that ended), and
``prune=`` takes any ``optuna.pruners`` pruner. The study is an SQLite file in the sweep's
folder (``sweep.folder``: ``<run_root>/.sweeps/<name>/study.db``, in a shared run root
``<run_root>/.orch-<uid>/sweeps/<name>/study.db``; study name the sweep's name): while the
sweep runs or after, ``optuna.load_study(study_name=name, storage=sweep.storage)`` and
``optuna-dashboard sqlite:///...`` open it, and running the same sweep cell again continues
it (a trial the kernel's death left RUNNING goes on as the same Optuna trial).

Optuna is optional (``pip install "orch[optuna]"``); it is imported only when a sweep is
given one of its samplers or pruners. Only the scheduler's thread talks to the study once
the sweep started.
"""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path
from typing import Any, Literal

from orch.errors import ConfigError
from orch.experiments.pruning import Pruner
from orch.experiments.space import Choice, Dimension, LogUniform, RandInt, Search, Uniform, fixed
from orch.record.writes import own_file


def _optuna() -> Any:
    try:
        return importlib.import_module("optuna")
    except ImportError as e:  # pragma: no cover - optuna is in the dev tools
        raise ConfigError(f"this sweep needs optuna ({e}): pip install 'orch[optuna]'") from None


def is_optuna(obj: Any, kind: Literal["samplers", "pruners"]) -> bool:
    """Whether ``obj`` is one of Optuna's samplers or pruners (without importing Optuna for others)."""
    module = type(obj).__module__ or ""
    if not module.startswith("optuna"):
        return False
    base = getattr(getattr(_optuna(), kind), "BaseSampler" if kind == "samplers" else "BasePruner")
    return isinstance(obj, base)


def storage_url(folder: Path) -> str:
    """The study's SQLite URL: ``study.db`` in the sweep's own folder (checked, never resolved
    through a link), a regular file of this user's where it is there already."""
    return f"sqlite:///{own_file(Path(os.path.abspath(folder)) / 'study.db')}"


class OptunaStudy:
    """The sweep's Optuna study: one Optuna trial per trial of the sweep (``number`` by index)."""

    def __init__(
        self,
        folder: Path,
        name: str,
        mode: Literal["min", "max"],
        sampler: Any = None,
        pruner: Any = None,
        numbers: dict[int, int] | None = None,
    ) -> None:
        optuna = _optuna()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = storage_url(folder)
        self.study = optuna.create_study(
            study_name=name,
            storage=self.storage,
            sampler=sampler,
            pruner=pruner if pruner is not None else optuna.pruners.NopPruner(),
            direction="maximize" if mode == "max" else "minimize",
            load_if_exists=True,
        )
        self.numbers: dict[int, int] = dict(numbers or {})  # the sweep's trial index -> Optuna's number
        self._trials: dict[int, Any] = {}

    def trial(self, index: int) -> Any:
        """The Optuna trial of the sweep's trial ``index`` (asked for now, or the one of an earlier run)."""
        found = self._trials.get(index)
        if found is not None:
            return found
        optuna = _optuna()
        number = self.numbers.get(index)
        if number is None:
            found = self.study.ask()
            self.numbers[index] = found.number
        else:
            frozen = self.study.get_trials(deepcopy=False)[number]
            found = optuna.trial.Trial(self.study, frozen._trial_id)
        self._trials[index] = found
        return found

    def finished(self, index: int) -> bool:
        """Whether Optuna already holds how trial ``index`` ended (an earlier run told it)."""
        number = self.numbers.get(index)
        if number is None:
            return False
        state = self.study.get_trials(deepcopy=False)[number].state
        return bool(state.is_finished())

    def report(self, index: int, step: int, value: float) -> bool:
        """Report the metric at ``step``; True when the study's pruner prunes the trial."""
        trial = self.trial(index)
        trial.report(value, step)
        return bool(trial.should_prune())

    def tell(self, index: int, value: float | None, state: str) -> None:
        """Tell Optuna how trial ``index`` ended: SUCCEEDED (its value), PRUNED, or FAILED. A
        stopped trial stays RUNNING: the next run of the sweep resumes it."""
        if index not in self.numbers or self.finished(index):
            return
        optuna = _optuna()
        trial = self.trial(index)
        if state == "SUCCEEDED" and value is not None and math.isfinite(value):
            self.study.tell(trial, value)
        elif state == "PRUNED":
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif state in ("FAILED", "SUCCEEDED"):
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)


def _suggest(trial: Any, name: str, dim: Dimension) -> Any:
    if isinstance(dim, Uniform):
        return trial.suggest_float(name, dim.low, dim.high)
    if isinstance(dim, LogUniform):
        return trial.suggest_float(name, dim.low, dim.high, log=True)
    if isinstance(dim, RandInt):
        return trial.suggest_int(name, dim.low, dim.high)
    if isinstance(dim, Choice):
        if all(isinstance(o, (bool, int, float, str)) or o is None for o in dim.options):
            return trial.suggest_categorical(name, list(dim.options))
        at = trial.suggest_categorical(f"{name}#", list(range(len(dim.options))))
        return dim.options[at]
    raise ConfigError(f"no Optuna distribution for {dim!r}")  # pragma: no cover


class OptunaSearch(Search):
    """``search=<an Optuna sampler>``: each config asked of the study when its trial starts."""

    name = "optuna"

    def __init__(self, space: dict[str, Any], study: OptunaStudy) -> None:
        self.space = space
        self.study = study

    def next(self, index: int) -> dict[str, Any]:
        trial = self.study.trial(index)
        config = dict(fixed(self.space))
        for name, dim in self.space.items():
            if isinstance(dim, Dimension):
                config[name] = _suggest(trial, name, dim)
        return {k: config[k] for k in self.space}

    def tell(self, index: int, value: float | None, state: str) -> None:
        self.study.tell(index, value, state)


class OptunaPruner(Pruner):
    """``prune=<an Optuna pruner>``: the trial's metric reported to its Optuna trial every step,
    and the study's pruner asked (``trial.should_prune()``)."""

    def __init__(self, study: OptunaStudy) -> None:
        self.study = study
        self.reported: dict[int, int] = {}

    def next_step(self, trial: int, reached: int) -> int | None:
        done = self.reported.get(trial)
        return reached if done is None or reached > done else None

    def report(self, trial: int, step: int, value: float) -> bool:
        self.reported[trial] = step
        return self.study.report(trial, step, value)

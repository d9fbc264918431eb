"""Many runs of one training function: ``orch.sweep(train, orch.grid(lr=[...]))``.

A :class:`Sweep` runs each config as a run of its own (``runs/<id>/`` as ever, its
``run.json`` naming the sweep and the config's key), ``parallel`` at a time on the warm
forkserver, never more ranks at once than the machine fits. A scheduler thread starts
runs as slots free up, records how each ended (a failed one with its root cause) and
stops starting new ones once ``max_failures`` runs failed. Running the same sweep cell
again reuses the runs that already succeeded under the sweep's name (the same function,
code, world size and config, matched by the config's key) and starts only the others.

This module holds what a notebook calls: :func:`sweep` and the :class:`Sweep` it returns,
and the sweeps of this process (closed at exit). The parts live beside it:

- :mod:`orch.experiments.sweep_plan`: :class:`SweepPlan`, the arguments checked before any
  process starts, and how a config becomes a launch;
- :mod:`orch.experiments.space`: :func:`grid` and the search spaces;
- :mod:`orch.experiments.strategy`: the search, the pruner and the Optuna study;
- :mod:`orch.experiments.trial`: :class:`Trial`, one config and the run that ran it;
- :mod:`orch.experiments.reuse`: a config's key, and which earlier runs stand in for it;
- :mod:`orch.experiments.scheduler`: the thread that starts the runs, stops and closes them;
- :mod:`orch.experiments.results`: :class:`SweepResults`, the best config, the dashboard's rows;
- :mod:`orch.experiments.metrics`: a metric over ranks, and which way is better.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import random
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from typing_extensions import Unpack

from orch._viewable import panel_class
from orch.errors import ConfigError
from orch.experiments.results import SweepResults, best_trial, dashboard_rows
from orch.experiments.reuse import (
    config_key,
    read_record,
    reuse_earlier,
    set_aside,
    write_record,
)
from orch.experiments.scheduler import Scheduler
from orch.experiments.space import (
    RandomSearch,
)
from orch.experiments.strategy import pruner_of, search_of, study_of
from orch.experiments.sweep_plan import SweepPlan
from orch.experiments.trial import Trial
from orch.launchers.exiting import begin_exit
from orch.launchers.front import RunOptions, options_doc
from orch.launchers.kernel_wait import block_until
from orch.launchers.loaded import load_run
from orch.launchers.run import Run, register_exit_hook
from orch.launchers.spec import LaunchSpec
from orch.record.mlflow_export import export_mlflow
from orch.record.tensorboard import export_runs
from orch.runtime.target import TrainFn
from orch.wire.states import RunState

log = logging.getLogger(__name__)


class Sweep:
    """Configs of one function run as separate runs. Use :func:`orch.sweep` to make one."""

    def __init__(self, plan: SweepPlan, *, reuse: bool = True) -> None:
        self.plan = plan
        self.name, self.metric, self.mode = plan.name, plan.metric, plan.mode
        self.world_size, self.size, self.shuffled = plan.world_size, plan.size, plan.shuffled
        self.run_root, self.folder = plan.run_root, plan.folder
        self.reuse = reuse
        self.trials: list[Trial] = []
        self.specs: list[LaunchSpec] = []
        record = read_record(self.folder) if reuse else {}
        if record.get("signature") != plan.signature and (self.folder / "sweep.json").exists():
            # Another search under this name (other code, space, search or pruner), or reuse=False:
            # its folder (its study) is kept aside, and this one starts afresh.
            aside = set_aside(self.folder)
            log.warning("sweep %s: its earlier search differs (or reuse=False): kept as %s", self.name, aside)
            record = {}
        self._record = record
        configs, search, prune, seed = plan.configs, plan.search, plan.prune, plan.seed
        self._optuna = study_of(search, prune, plan.searched, self.folder, self.name, self.mode, record)
        # the Optuna study, when a sampler or pruner of Optuna drives the sweep, and its storage URL
        self.study: Any = self._optuna.study if self._optuna is not None else None
        self.storage: str | None = self._optuna.storage if self._optuna is not None else None
        self.search = search_of(configs, search, seed, self._optuna) if plan.searched else None
        self.pruner = pruner_of(
            prune, self._optuna, self.metric, self.mode, plan.steps, record if reuse else {}
        )
        self.order: list[int] = []  # the configs' indices in the order they start (a list's)
        if not isinstance(configs, dict):
            for config in list(configs)[: self.size]:
                self._add(dict(config))
            self.order = list(range(len(self.trials)))
            if self.shuffled:
                random.Random(f"orch.sweep order:{seed}").shuffle(self.order)
                shown = ", ".join(map(str, self.order[:12])) + (", ..." if len(self.order) > 12 else "")
                why = "the pruner compares each trial with those before it, so " if prune is not None else ""
                log.warning(
                    "sweep %s: %sthe %d configs run in a random order (seed=%d; order='given' keeps the "
                    "list's): %s",
                    self.name, why, len(self.order), seed, shown,
                )  # fmt: skip
        elif isinstance(self.search, RandomSearch):
            for i in range(self.size):  # drawn now: the same seed draws the same configs again
                self._add(self.search.next(i))
        else:  # asked as slots free; the ones an earlier run of the sweep asked come back first
            for rec in sorted(self._record.get("trials", []), key=lambda t: int(t["index"])):
                if int(rec["index"]) == len(self.trials) and len(self.trials) < self.size:
                    self._add(dict(rec["config"]))
        self._scheduler = Scheduler(
            self.name,
            self.trials,
            self.specs,
            plan.at_once,
            plan.max_failures,
            pruner=self.pruner,
            more=None if self.search is None or isinstance(self.search, RandomSearch) else self._more,
            order=self.order or None,
            on_ended=self._trial_ended,
            on_turn=self._write_record,
            size=self.size,
        )
        self._dirty, self._reports = True, 0
        self._panel: Any = None
        self.started = time.time()

    def _add(self, config: dict[str, Any]) -> Trial:
        """One more trial of ``config`` (checked as a launch is), queued."""
        i = len(self.trials)
        plan = self.plan
        spec = plan.spec(config)
        spec.threads = plan.threads  # the cores shared among the ranks that run at once
        if self.search is None:
            key = config_key(plan.fn_name, spec.config, self.world_size, plan.code)
            if any(t.key == key for t in self.trials):
                raise ConfigError(f"configs[{i}] repeats an earlier config of the sweep: {spec.config!r:.80}")
        else:  # a drawn config may come twice: the trial's place tells it apart
            key = config_key(plan.fn_name, {"trial": i, "config": spec.config}, self.world_size, plan.code)
        spec.sweep, spec.config_key, spec.name = self.name, key, f"{self.name}[{i}]"
        trial = Trial(index=i, config=spec.config, key=key)
        if self._optuna is not None:
            trial.number = self._optuna.numbers.get(i)
        self.specs.append(spec)
        self.trials.append(trial)
        return trial

    def _more(self) -> bool:
        """The scheduler wants another trial: ask the search (False when the sweep has its ``trials``)."""
        if len(self.trials) >= self.size or self.search is None:
            return False
        trial = self._add(self.search.next(len(self.trials)))
        if self._optuna is not None:
            trial.number = self._optuna.numbers.get(trial.index)
        self._dirty = True
        return True

    def _trial_ended(self, trial: Trial) -> None:
        """Tell the search how a trial ended (its metric's final mean over ranks)."""
        self._dirty = True
        value = None
        if trial.state == RunState.SUCCEEDED.value:
            value = trial.summary({self.metric: self.mode})["final"].get(self.metric)
        if self.search is not None:
            self.search.tell(trial.index, value, trial.state)
        elif self._optuna is not None:
            self._optuna.tell(trial.index, value, trial.state)

    def _write_record(self) -> None:
        """The sweep's folder: how each trial stands and the pruner's rungs (see :func:`read_record`)."""
        reports = sum(len(t.reported) for t in self.trials)
        if not self._dirty and reports == self._reports:
            return
        self._dirty, self._reports = False, reports
        write_record(
            self.folder,
            {
                "name": self.name,
                "signature": self.plan.signature,
                "metric": self.metric,
                "mode": self.mode,
                "trials": [
                    {
                        "index": t.index,
                        "config": t.config,
                        "key": t.key,
                        "state": t.state,
                        "run_id": t.run_id,
                        "number": t.number if self._optuna is None else self._optuna.numbers.get(t.index),
                        "pruned_at": t.pruned_at,
                    }
                    for t in self.trials
                ],
                "order": self.order,
                "pruner": self.pruner.state() if self.pruner is not None else {},
                "rungs": self.pruner.rungs() if self.pruner is not None else [],
            },
        )

    @property
    def parallel(self) -> int:
        """How many runs go at once (what was asked, or fewer: what the machine fits)."""
        return self._scheduler.parallel

    @parallel.setter
    def parallel(self, value: int) -> None:
        self._scheduler.parallel = value

    @property
    def max_failures(self) -> int | None:
        """After this many failed runs the sweep starts no more (None: no limit)."""
        return self._scheduler.max_failures

    @max_failures.setter
    def max_failures(self, value: int | None) -> None:
        self._scheduler.max_failures = value

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Sweep:
        if self.reuse:
            reuse_earlier(self.trials, self.run_root, self.name)
            earlier = {int(t["index"]): t for t in self._record.get("trials", [])}
            for trial in self.trials:
                rec = earlier.get(trial.index)
                if trial.reused and rec is not None and rec.get("key") == trial.key:
                    trial.pruned_at = rec.get("pruned_at")
            reused = sum(t.reused for t in self.trials)
            resumed = sum(t.resume_from is not None for t in self.trials)
            if reused or resumed:
                log.warning(
                    "sweep %s: %d of %d configs already ended (succeeded or pruned) with this code and "
                    "world size under %s: reusing those runs (reuse=False runs them again); %d resume "
                    "from the checkpoint of their unfinished run",
                    self.name, reused, len(self.trials), self.run_root, resumed,
                )  # fmt: skip
        _track(self)
        self._scheduler.start()
        return self

    @property
    def done(self) -> bool:
        return self._scheduler.done

    def wait(self, timeout: float | None = None) -> SweepResults:
        """Block until every config ran (or was cancelled); return :meth:`results`.

        A failed config does not raise: it is a row of the results, with its root cause.
        """
        block_until(  # the panel's Stop is handled meanwhile
            self._scheduler.finished,
            timeout,
            interval=0.5,
            interrupted=lambda: (
                f"wait() was interrupted; sweep {self.name} is still running ({self._progress()}): "
                "sweep.stop() (or the panel's Stop) ends its runs gracefully, sweep.close() ends them now"
            ),
            timed_out=lambda: f"sweep {self.name} still running after {timeout}s: {self._progress()}",
        )
        if self._panel is not None:
            self._panel.refresh()
        return self.results()

    def stop(self, run: int | str | Run | None = None, reason: str = "stopped by the user") -> None:
        """Stop one run (its index in the configs, its run id, or the Run) or, with no
        argument, all of them and start no more; returns at once."""
        self._scheduler.stop(run, reason)

    def close(self) -> None:
        """End every run of the sweep now and start no more."""
        self._scheduler.close()
        if self._panel is not None:
            self._panel.close()

    def __enter__(self) -> Sweep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what it found ------------------------------------------------------------------
    def results(self, modes: dict[str, str] | None = None) -> SweepResults:
        """A row per config: config, state, steps, final and best value of each logged scalar
        (its mean over ranks; the final value is NaN or inf if the run ended so, and
        ``nonfinite`` says from which step, with the last finite value), duration (wall time
        from its launch to its record, start-up included: a run's own elapsed time counts from
        its training's start) and ``pool_start``, the part of it spent starting the workers'
        pool (the first launch of a process). Best is the greatest value for a metric named
        like an accuracy or a score (:func:`default_mode`), else the least; ``modes`` overrides
        it: ``results(modes={"margin": "max"})``."""
        trials = self._scheduler.snapshot()
        return SweepResults([t.summary(modes) for t in trials], self.name)

    def best(
        self,
        metric: str | None = None,
        mode: Literal["min", "max"] | None = None,
        scope: Literal["last", "all"] = "last",
    ) -> Trial:
        """The succeeded config whose ``metric`` (mean over ranks; the sweep's ``metric`` by
        default) is best: by its last value (``scope="last"``) or by its best value over the run
        (``scope="all"``). Best is the least, or the greatest for a metric named like an accuracy
        or a score (:func:`default_mode`); ``mode`` says which. Pruned trials never are, nor is a
        config whose metric ended NaN or inf."""
        if metric is None:
            metric, mode = self.metric, mode or self.mode
        return best_trial(self.trials, self.name, metric, mode, scope)

    def rows(self, metric: str = "loss") -> list[dict[str, Any]]:
        """What the terminal dashboard shows of each config: its state, step, last and best values."""
        return dashboard_rows(self.results(), metric)

    def _progress(self) -> str:
        counts: dict[str, int] = {}
        for t in self.trials:
            counts[t.state] = counts.get(t.state, 0) + 1
        return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))

    # -- the notebook -------------------------------------------------------------------
    def panel(self, **options: Any) -> Any:
        """The sweep's live panel: a curve per run (mean over ranks, min-max band), a row per run."""
        if self._panel is None or options:
            self._panel = panel_class("sweep")(self, **options)
        return self._panel

    def _ipython_display_(self) -> None:
        self.panel()._ipython_display_()  # an output its record replaces when the sweep ends

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.panel()._repr_mimebundle_(**kwargs)

    def to_tensorboard(self, logdir: str | Path) -> Path:
        """Every ended run of the sweep as TensorBoard event files, a subdirectory per run."""
        return export_runs(
            [(f"{t.index}-{t.run_id}", t.run_dir) for t in self.trials if t.run_dir is not None and t.done],
            logdir,
            load=load_run,
        )

    def to_mlflow(self, tracking_uri: str | None = None, experiment: str | None = None) -> list[str]:
        """Every ended run of the sweep as one MLflow run each (named ``<sweep>[<index>]``) in
        ``experiment`` (default: the sweep's name) at ``tracking_uri``; returns their MLflow run
        ids. Written here, once per run, never by the ranks; exporting again replaces them."""
        return export_mlflow(
            [(f"{self.name}[{t.index}]", t.run_dir) for t in self.trials if t.run_dir is not None and t.done],
            tracking_uri=tracking_uri,
            experiment=self.name if experiment is None else experiment,
            load=load_run,
        )

    def __repr__(self) -> str:
        return f"<orch.Sweep {self.name} {len(self.trials)} configs: {self._progress()}>"


_SWEEPS: weakref.WeakSet[Sweep] = weakref.WeakSet()
_atexit_registered = False


def _track(sweep: Sweep) -> None:
    """At exit, a live sweep stops starting runs before the runs are torn down (hooks run last
    registered first, so the runs' hook goes in first)."""
    global _atexit_registered
    _SWEEPS.add(sweep)
    if not _atexit_registered:
        register_exit_hook()
        atexit.register(_close_at_exit)
        _atexit_registered = True


def _close_at_exit() -> None:
    """The exit hook: the sweeps' runs still live end because their launcher exits."""
    begin_exit()
    close_all_sweeps()


def live_sweeps() -> list[Sweep]:
    return [s for s in list(_SWEEPS) if not s.done]


def close_all_sweeps() -> int:
    closed = 0
    for sweep in list(_SWEEPS):
        if not sweep.done:
            closed += 1
        with contextlib.suppress(Exception):
            sweep.close()
    return closed


def sweep(
    train: TrainFn | str | None,
    configs: Sequence[dict[str, Any]] | dict[str, Any],
    world_size: int = 2,
    parallel: int = 1,
    max_failures: int | None = None,
    run_root: str = "runs",
    name: str | None = None,
    *,
    reuse: bool = True,
    trials: int | None = None,
    search: Any = None,
    metric: str = "loss",
    mode: Literal["min", "max"] | None = None,
    prune: Any = None,
    seed: int = 0,
    order: Literal["given", "random"] | None = None,
    **options: Unpack[RunOptions],
) -> Sweep:
    """Run ``train`` once per config, each as a run of ``world_size`` ranks; return the
    :class:`Sweep` at once.

    ``configs`` is a list of dicts (each reaches the function as ``ctx.config``) or
    ``orch.grid(lr=[...], batch=[...])``. ``parallel`` runs go at once, never more ranks
    than the machine fits. A failed config is recorded with its root cause and the others
    go on; once ``max_failures`` runs failed no more start. Running the same sweep again
    (the same ``name``, by default the function's name) starts only the configs that did
    not succeed before with the same code and world size (``reuse=False`` runs them all).
    Watch it with ``sweep.panel()``; ``wait()``, ``results()``, ``best(metric)``, ``stop()``.

    ``configs`` may instead be a search space, a dict of dimensions (:func:`uniform`,
    :func:`loguniform`, :func:`randint`, :func:`choice`) and fixed values, with ``trials=N``
    configs drawn from it: ``search="random"`` (the default, seeded by ``seed``) or an
    Optuna sampler (``optuna.samplers.TPESampler(seed=0)``, through ask/tell; the study is
    ``sweep.study``, stored in ``study.db`` in ``sweep.folder``: ``<run_root>/.sweeps/<name>``,
    in a shared run root ``<run_root>/.orch-<uid>/sweeps/<name>``). ``metric`` and
    ``mode`` say what the search and the pruner optimize (the mean over ranks of a logged
    scalar). ``prune=orch.ASHA(grace=3, reduction=3)``, ``orch.SHA(...)``, ``orch.MedianStop()`` or any Optuna
    pruner stops the trials that fall behind, every rank at the same step: they end PRUNED.
    A sweep run again keeps its succeeded and pruned trials, resumes each unfinished one from
    its newest checkpoint, and goes on with the same search history and rungs.

    ``order``: a list of configs runs in the list's order (``"given"``), or in a random order
    seeded by ``seed`` (``"random"``; ``sweep.order`` and the sweep's record say which). The
    default is random with a pruner that compares each trial with those before it (ASHA,
    MedianStop, Optuna's), and given without one or with ``orch.SHA``, which decides each rung on
    all the trials at once. Indices (``stop(i)``, the results' rows) stay the list's.

    ``train`` may be a torchrun script (``"train.py"``, with ``args=[...]``) or ``module=``
    (see :func:`orch.launch`): each config reaches it as arguments after ``args``,
    ``--key=value``, and as JSON in ``$ORCH_CONFIG``.
    """
    plan = SweepPlan(
        train,
        configs,
        world_size=world_size,
        parallel=parallel,
        max_failures=max_failures,
        run_root=run_root,
        name=name,
        options=options,
        trials=trials,
        search=search,
        metric=metric,
        mode=mode,
        prune=prune,
        seed=seed,
        order=order,
    )
    return Sweep(plan, reuse=reuse).start()


sweep.__doc__ = (sweep.__doc__ or "").rstrip() + options_doc(RunOptions)

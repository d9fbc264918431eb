"""Many runs of one training function: ``orch.sweep(train, orch.grid(lr=[...]))``.

A :class:`Sweep` runs each config as a run of its own (``runs/<id>/`` as ever, its
``run.json`` naming the sweep and the config's key), ``parallel`` at a time on the warm
forkserver, never more ranks at once than the machine fits. A scheduler thread starts
runs as slots free up, records how each ended (a failed one with its root cause) and
stops starting new ones once ``max_failures`` runs failed. Running the same sweep cell
again reuses the runs that already succeeded under the sweep's name (the same function,
code, world size and config, matched by the config's key) and starts only the others.

This module holds what a notebook calls: :func:`grid`, :func:`sweep` and the
:class:`Sweep` it returns, and the sweeps of this process (closed at exit). The parts live
beside it, and the names others import from here stay importable from here:

- :mod:`orch.experiments.trial`: :class:`Trial`, one config and the run that ran it;
- :mod:`orch.experiments.reuse`: a config's key, and which earlier runs stand in for it;
- :mod:`orch.experiments.scheduler`: the thread that starts the runs, stops and closes them;
- :mod:`orch.experiments.results`: :class:`SweepResults`, the best config, the dashboard's rows;
- :mod:`orch.experiments.metrics`: a metric over ranks, and which way is better.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orch._viewable import panel_class
from orch.errors import ConfigError
from orch.experiments.metrics import GREATER_IS_BETTER, default_mode, summarize
from orch.experiments.results import SweepResults, best_trial, dashboard_rows
from orch.experiments.reuse import code_hash, config_key, reuse_earlier
from orch.experiments.scheduler import Scheduler
from orch.experiments.trial import CANCELLED, QUEUED, History, Trial
from orch.launchers._exiting import begin_exit
from orch.launchers.clicks import Waiting
from orch.launchers.loaded import load_run
from orch.launchers.run import Run, register_exit_hook
from orch.launchers.spec import MAX_WORKERS_PER_CORE, LaunchSpec
from orch.record.mlflow_export import export_mlflow
from orch.record.tensorboard import export_runs
from orch.runtime._target import TrainFn

__all__ = [
    "CANCELLED",
    "GREATER_IS_BETTER",
    "QUEUED",
    "History",
    "Sweep",
    "SweepResults",
    "Trial",
    "close_all_sweeps",
    "code_hash",
    "config_key",
    "default_mode",
    "grid",
    "live_sweeps",
    "summarize",
    "sweep",
]

log = logging.getLogger(__name__)


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


@dataclass
class _Options:
    """Launch options every run of the sweep shares."""

    steps: int | None = None
    heartbeat_timeout: float = 30.0
    max_restarts: int = 0
    threads: int | None = None


def _check_arguments(configs: Sequence[dict[str, Any]], parallel: int, max_failures: int | None) -> None:
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


class Sweep:
    """Configs of one function run as separate runs. Use :func:`orch.sweep` to make one."""

    def __init__(
        self,
        train: TrainFn | str | None,
        configs: Sequence[dict[str, Any]],
        *,
        world_size: int = 2,
        parallel: int = 1,
        max_failures: int | None = None,
        run_root: str = "runs",
        name: str | None = None,
        options: _Options | None = None,
        reuse: bool = True,
    ) -> None:
        opts = options or _Options()
        _check_arguments(configs, parallel, max_failures)
        fit = MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)
        # Each run's spec is checked now, before any process starts: a bad config fails the cell.
        self.specs = [
            LaunchSpec(
                fn=train,
                world_size=world_size,
                config=dict(c),
                steps=opts.steps,
                run_root=run_root,
                heartbeat_timeout=opts.heartbeat_timeout,
                max_restarts=opts.max_restarts,
                threads=opts.threads,
            )
            for c in configs
        ]
        fn_name = self.specs[0].fn_name
        code = code_hash(train, fn_name, self.specs[0].workdir)
        self.name = name or fn_name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        self.run_root = Path(run_root)
        self.world_size = world_size
        at_once = max(1, min(parallel, fit // world_size))
        if at_once < parallel:
            log.warning(
                "sweep %s: %d runs of %d ranks at once do not fit this machine (%d ranks at most): "
                "running %d at a time",
                self.name, parallel, world_size, fit, at_once,
            )  # fmt: skip
        self.reuse = reuse
        for spec in self.specs:  # the cores shared among the ranks that run at once
            spec.threads = opts.threads or max(1, (os.cpu_count() or 1) // (world_size * at_once))
        self.trials: list[Trial] = []
        keys: set[str] = set()
        for i, spec in enumerate(self.specs):
            key = config_key(fn_name, spec.config, world_size, code)
            if key in keys:
                raise ConfigError(f"configs[{i}] repeats an earlier config of the sweep: {spec.config!r:.80}")
            keys.add(key)
            spec.sweep, spec.config_key, spec.name = self.name, key, f"{self.name}[{i}]"
            self.trials.append(Trial(index=i, config=spec.config, key=key))
        self._scheduler = Scheduler(self.name, self.trials, self.specs, at_once, max_failures)
        self._panel: Any = None
        self.started = time.time()

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
            reused = sum(t.reused for t in self.trials)
            if reused:
                log.warning(
                    "sweep %s: %d of %d configs already succeeded with this code and world size "
                    "under %s: reusing those runs (reuse=False runs them again)",
                    self.name, reused, len(self.trials), self.run_root,
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
        try:
            with Waiting() as waiting:  # the panel's Stop is handled meanwhile
                finished = waiting.until(self._scheduler.finished, timeout)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(
                f"wait() was interrupted; sweep {self.name} is still running ({self._progress()}): "
                "sweep.stop() (or the panel's Stop) ends its runs gracefully, sweep.close() ends them now"
            ) from None
        if not finished:
            raise TimeoutError(f"sweep {self.name} still running after {timeout}s: {self._progress()}")
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
        metric: str = "loss",
        mode: Literal["min", "max"] | None = None,
        scope: Literal["last", "all"] = "last",
    ) -> Trial:
        """The succeeded config whose ``metric`` (mean over ranks) is best: by its last value
        (``scope="last"``) or by its best value over the run (``scope="all"``). Best is the
        least, or the greatest for a metric named like an accuracy or a score
        (:func:`default_mode`); ``mode`` says which. A config whose metric ended NaN or inf
        is never the best."""
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
    configs: Sequence[dict[str, Any]],
    world_size: int = 2,
    parallel: int = 1,
    max_failures: int | None = None,
    run_root: str = "runs",
    name: str | None = None,
    *,
    steps: int | None = None,
    heartbeat_timeout: float = 30.0,
    max_restarts: int = 0,
    threads: int | None = None,
    reuse: bool = True,
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
    """
    options = _Options(
        steps=steps, heartbeat_timeout=heartbeat_timeout, max_restarts=max_restarts, threads=threads
    )
    return Sweep(
        train,
        configs,
        world_size=world_size,
        parallel=parallel,
        max_failures=max_failures,
        run_root=run_root,
        name=name,
        options=options,
        reuse=reuse,
    ).start()

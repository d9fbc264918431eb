"""Many runs of one training function: ``orch.sweep(train, orch.grid(lr=[...]))``.

A :class:`Sweep` runs each config as a run of its own (``runs/<id>/`` as ever, its
``run.json`` naming the sweep and the config's key), ``parallel`` at a time on the warm
forkserver, never more ranks at once than the machine fits. A scheduler thread starts
runs as slots free up, records how each ended (a failed one with its root cause) and
stops starting new ones once ``max_failures`` runs failed. Running the same sweep cell
again reuses the runs that already succeeded under the sweep's name (the same function,
code, world size and config, matched by the config's key) and starts only the others.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import html
import itertools
import json
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from orch._version import __version__
from orch._viewable import panel_class
from orch.errors import ConfigError, OrchError
from orch.launchers.loaded import LoadedRun, load_run
from orch.launchers.run import MAX_WORKERS_PER_CORE, LaunchSpec, Run, register_exit_hook
from orch.record.rundir import read_json
from orch.record.tensorboard import export_runs
from orch.runtime._target import TrainFn, resolve_fn
from orch.wire.client import StateMirror
from orch.wire.states import RunState

log = logging.getLogger(__name__)

History = dict[str, dict[int, dict[str, list[float]]]]

# A trial's own states, beside the run states its run goes through.
QUEUED = "QUEUED"  # not started yet
CANCELLED = "CANCELLED"  # never started: the sweep was stopped, or max_failures was reached


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


# Metrics that grow as a model gets better; any other metric is best at its least.
GREATER_IS_BETTER = ("acc", "accuracy", "auc", "f1", "precision", "recall", "score", "reward", "iou", "bleu")


def default_mode(metric: str) -> Literal["min", "max"]:
    """``"max"`` for a metric named like an accuracy or a score (``val_acc``, ``f1``), else ``"min"``."""
    words = metric.lower().replace("-", "_").replace("/", "_").split("_")
    return "max" if any(w in GREATER_IS_BETTER for w in words) else "min"


def _same_numbers(value: Any) -> Any:
    """``1`` and ``1.0`` are one config value (a JSON config cannot tell them apart reliably)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _same_numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_same_numbers(v) for v in value]
    return value


def code_hash(fn: Any, fn_name: str, workdir: str) -> str:
    """What the function's code is, as far as it can be read: its source, else its pickle.

    A config that succeeded with other code (a bug fixed in the cell since) is not reused.
    """
    import inspect

    if fn is None:
        return f"orch {__version__}"
    try:
        target = resolve_fn(fn, workdir) if isinstance(fn, str) else fn
        text = inspect.getsource(target)
    except (OSError, TypeError, OrchError):
        import cloudpickle

        try:
            text = cloudpickle.dumps(fn).hex()
        except Exception:  # it was checked to pickle already; a name is the last resort
            text = fn_name
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_key(fn_name: str, config: dict[str, Any], world_size: int = 0, code: str = "") -> str:
    """What identifies a run of a sweep: its function (name and code), world size and config."""
    text = json.dumps(
        {"fn": fn_name, "code": code, "world_size": world_size, "config": _same_numbers(config)},
        sort_keys=True,
        allow_nan=False,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def summarize(by_rank: dict[int, dict[str, list[float]]]) -> tuple[Any, Any, Any, Any]:
    """A metric over ranks, step by step: ``(steps, mean, min, max)`` as numpy arrays.

    A step counts every rank that logged it; NaN and inf points are left out of the mean.
    """
    empty = np.empty(0)
    if not by_rank:
        return empty.astype(np.int64), empty, empty, empty
    steps = np.concatenate([np.asarray(s["step"], dtype=np.int64) for s in by_rank.values()])
    values = np.concatenate([np.asarray(s["value"], dtype=np.float64) for s in by_rank.values()])
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    if len(steps) == 0:
        return empty.astype(np.int64), empty, empty, empty
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    unique, start = np.unique(steps, return_index=True)
    mean = np.add.reduceat(values, start) / np.diff(np.append(start, len(values)))
    return unique, mean, np.minimum.reduceat(values, start), np.maximum.reduceat(values, start)


@dataclass
class Trial:
    """One config of a sweep and the run that ran it (``run`` here, or ``run_dir`` on disk)."""

    index: int
    config: dict[str, Any]
    key: str
    state: str = QUEUED
    run: Run | None = None
    run_dir: Path | None = None
    reused: bool = False  # it succeeded in an earlier execution of the same sweep
    ended: bool = False  # its run ended and its record is written (or it never ran and never will)
    failure: str = ""
    error: str = ""  # the root cause's traceback
    started: float = 0.0  # unix seconds
    duration: float = 0.0
    _loaded: LoadedRun | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        if self.run is not None:
            return self.run.run_id
        return self.run_dir.name if self.run_dir is not None else ""

    @property
    def done(self) -> bool:
        return self.ended

    def load(self) -> LoadedRun:
        """The trial's run read back from its run dir."""
        if self.run_dir is None:
            raise OrchError(f"config {self.index} of the sweep has not started: it has no run dir yet")
        if self._loaded is None or not self.done:
            self._loaded = load_run(self.run_dir)
        return self._loaded

    def source(self) -> Run | LoadedRun | None:
        """What to watch: the live run, else the run on disk, else nothing yet."""
        if self.run is not None:
            return self.run
        return self.load() if self.run_dir is not None else None

    def mirror(self) -> StateMirror | None:
        src = self.source()
        return src.state() if src is not None else None

    def history(self) -> History:
        src = self.source()
        return src.history() if src is not None else {}

    def summary(self, modes: dict[str, str] | None = None) -> dict[str, Any]:
        """The row of :meth:`Sweep.results` for this trial."""
        mirror = self.mirror()
        row: dict[str, Any] = {
            "index": self.index,
            "run_id": self.run_id,
            "config": dict(self.config),
            "state": self.state,
            "reused": self.reused,
            "steps": min((r.step for r in mirror.ranks), default=0) if mirror else 0,
            "total": mirror.total_steps if mirror else 0,
            "duration": round(self.duration or (mirror.elapsed if mirror else 0.0), 3),
            "failure": self.failure,
            "final": {},
            "best": {},
        }
        for metric, by_rank in self.history().items():
            _, mean, _, _ = summarize(by_rank)
            if len(mean) == 0:
                continue
            mode = (modes or {}).get(metric) or default_mode(metric)
            row["final"][metric] = float(mean[-1])
            row["best"][metric] = float(mean.max() if mode == "max" else mean.min())
        return row


class SweepResults:
    """:meth:`Sweep.results`: a row per config; an HTML table in a notebook."""

    def __init__(self, rows: list[dict[str, Any]], name: str) -> None:
        self.rows = rows
        self.name = name

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def metrics(self) -> list[str]:
        return sorted({m for row in self.rows for m in row["final"]})

    def sorted(self, metric: str = "loss", mode: Literal["min", "max"] = "min") -> SweepResults:
        """The rows by the final value of ``metric``, best first; rows without it last."""
        sign = -1.0 if mode == "max" else 1.0

        def key(row: dict[str, Any]) -> tuple[bool, float]:
            value = row["final"].get(metric)
            return (value is None or not math.isfinite(value), sign * value if value is not None else 0.0)

        return SweepResults(sorted(self.rows, key=key), self.name)

    def table(self) -> tuple[list[str], list[list[str]]]:
        """Column names and the rows as text: config values, then state, steps, time, metrics."""
        keys = sorted({k for row in self.rows for k in row["config"]})
        metrics = self.metrics()
        head = ["#", *keys, "state", "step", "wall time"]
        for m in metrics:
            head += [f"{m} final", f"{m} best"]
        failures = any(row["failure"] for row in self.rows)
        if failures:
            head.append("failure")
        body = []
        for row in self.rows:
            steps = f"{row['steps']}/{row['total']}" if row["total"] else str(row["steps"])
            state = row["state"] + (" (earlier)" if row["reused"] else "")
            cells = [str(row["index"]), *(_fmt(row["config"].get(k, "")) for k in keys), state, steps]
            cells.append(f"{row['duration']:.1f}s")
            for m in metrics:
                cells += [_fmt(row["final"].get(m, "")), _fmt(row["best"].get(m, ""))]
            if failures:
                text = " ".join(row["failure"].split())
                cells.append(text if len(text) <= 160 else text[:157] + "...")
            body.append(cells)
        return head, body

    def _repr_html_(self) -> str:
        head, body = self.table()
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        trs = "".join(
            f'<tr class="orch-trial" data-state="{html.escape(row["state"])}">'
            + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
            + "</tr>"
            for row, cells in zip(self.rows, body, strict=True)
        )
        return (
            f'<table class="orch-sweep-results"><caption>sweep {html.escape(self.name)}</caption>'
            f"<thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"
        )

    def __repr__(self) -> str:
        head, body = self.table()
        widths = [max(len(c) for c in col) for col in zip(head, *body, strict=True)]
        lines = ["  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) for cells in [head, *body]]
        return "\n".join([f"sweep {self.name}", *lines])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@dataclass
class _Options:
    """Launch options every run of the sweep shares."""

    steps: int | None = None
    heartbeat_timeout: float = 30.0
    max_restarts: int = 0
    threads: int | None = None


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
            raise ConfigError(
                f"max_failures must be None (no limit) or an integer >= 0, got {max_failures!r}"
            )
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
        self.parallel = max(1, min(parallel, fit // world_size))
        if self.parallel < parallel:
            log.warning(
                "sweep %s: %d runs of %d ranks at once do not fit this machine (%d ranks at most): "
                "running %d at a time",
                self.name, parallel, world_size, fit, self.parallel,
            )  # fmt: skip
        self.max_failures = max_failures
        self.reuse = reuse
        for spec in self.specs:  # the cores shared among the ranks that run at once
            spec.threads = opts.threads or max(1, (os.cpu_count() or 1) // (world_size * self.parallel))
        self.trials: list[Trial] = []
        keys: set[str] = set()
        for i, spec in enumerate(self.specs):
            key = config_key(fn_name, spec.config, world_size, code)
            if key in keys:
                raise ConfigError(f"configs[{i}] repeats an earlier config of the sweep: {spec.config!r:.80}")
            keys.add(key)
            spec.sweep, spec.config_key, spec.name = self.name, key, f"{self.name}[{i}]"
            self.trials.append(Trial(index=i, config=spec.config, key=key))
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._panel: Any = None
        self._thread: threading.Thread | None = None
        self.started = time.time()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Sweep:
        if self.reuse:
            self._reuse_earlier()
            reused = sum(t.reused for t in self.trials)
            if reused:
                log.warning(
                    "sweep %s: %d of %d configs already succeeded with this code and world size "
                    "under %s: reusing those runs (reuse=False runs them again)",
                    self.name, reused, len(self.trials), self.run_root,
                )  # fmt: skip
        _track(self)
        self._thread = threading.Thread(target=self._schedule, name=f"orch-sweep-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _reuse_earlier(self) -> None:
        """Configs that already succeeded under this sweep's name are not run again."""
        by_key = {t.key: t for t in self.trials}
        if not self.run_root.is_dir():
            return
        for run_dir in sorted(self.run_root.iterdir()):
            meta_path, result_path = run_dir / "run.json", run_dir / "result.json"
            if not result_path.is_file() or not meta_path.is_file():
                continue
            try:
                meta, result = read_json(meta_path), read_json(result_path)
            except OrchError:
                continue  # a damaged record is not a success to build on: the config runs again
            trial = by_key.get(str(meta.get("config_key", "")))
            if meta.get("sweep") != self.name or trial is None or result.get("state") != "SUCCEEDED":
                continue
            try:
                trial._loaded = load_run(run_dir)  # a record that does not load is run again
            except OrchError as e:
                log.warning(
                    "sweep %s: %s does not load (%s): config %d runs again",
                    self.name,
                    run_dir,
                    e,
                    trial.index,
                )
                continue
            trial.state, trial.reused, trial.run_dir = RunState.SUCCEEDED.value, True, run_dir
            trial.ended = True
            started = meta.get("started")
            trial.started = float(started) if isinstance(started, (int, float)) else 0.0
            # Launch to record, as for the runs this sweep starts.
            trial.duration = max(0.0, result_path.stat().st_mtime - trial.started) if trial.started else 0.0

    def _schedule(self) -> None:
        """Take turns until every config ended: collect the runs that ended, start the next."""
        try:
            while True:
                with self._lock:
                    self._collect()
                    if not self._stopping.is_set():
                        self._start_next()
                    if all(t.done for t in self.trials):
                        break
                self._wake.wait(0.1)
                self._wake.clear()
        except Exception as e:  # a bug here must not leave the sweep looking busy forever
            log.exception("sweep %s: the scheduler failed", self.name)
            with self._lock:
                self._cancel_queued(f"the sweep's scheduler failed: {e}")
                for trial in self._running():
                    with contextlib.suppress(Exception):
                        self._ended(trial)
        finally:
            self._done.set()

    def _running(self) -> list[Trial]:
        return [t for t in self.trials if t.run is not None and not t.done]

    def _failures(self) -> int:
        return sum(t.state == RunState.FAILED.value for t in self.trials)

    def _start_next(self) -> None:
        failures = self._failures()
        if self.max_failures is not None and failures >= max(1, self.max_failures):
            self._cancel_queued(
                f"the sweep started no more runs after {failures} failure{'s' if failures > 1 else ''} "
                f"(max_failures={self.max_failures})"
            )
            return
        for trial in self.trials:
            if len(self._running()) >= self.parallel:
                return
            if trial.state != QUEUED:
                continue
            spec = self.specs[trial.index]
            run = Run(spec)
            trial.run, trial.run_dir, trial.state, trial.started = (
                run,
                run.run_dir,
                RunState.PENDING.value,
                time.time(),
            )
            try:
                run.start()
            except Exception as e:  # recorded with the config; the others go on
                self._ended(trial, error=str(e))

    def _collect(self) -> None:
        """Fold the runs' states into their trials; close the runs that ended."""
        for trial in self.trials:
            run = trial.run
            if run is None or trial.done:
                continue
            if run.done:
                self._ended(trial)
            else:
                trial.state = run.coordinator.state.value

    def _ended(self, trial: Trial, error: str = "") -> None:
        run = trial.run
        assert run is not None
        with contextlib.suppress(Exception):
            run.close()  # the master's port and its server threads go; the record stays on disk
        coord = run.coordinator
        trial.state, trial.ended = coord.state.value, True
        trial.duration = time.time() - trial.started
        if coord.state is RunState.FAILED:
            cause = coord.root_cause
            trial.failure = error or coord.failure
            trial.error = cause.error if cause else ""
            log.warning(
                "sweep %s: config %d %s failed: %s", self.name, trial.index, trial.config, trial.failure
            )

    def _cancel_queued(self, why: str) -> None:
        for t in self.trials:
            if t.state == QUEUED:
                t.state, t.failure, t.ended = CANCELLED, why, True

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> SweepResults:
        """Block until every config ran (or was cancelled); return :meth:`results`.

        A failed config does not raise: it is a row of the results, with its root cause.
        """
        try:
            finished = self._done.wait(timeout)
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
        with self._lock:
            if run is None:
                self._stopping.set()
                self._cancel_queued("the sweep was stopped")
                targets = self._running()
            else:
                targets = [self._find(run)]
            for trial in targets:
                if trial.state == QUEUED:
                    trial.state, trial.failure, trial.ended = CANCELLED, reason, True
                elif trial.run is not None and not trial.done:
                    trial.run.stop(reason)
        self._wake.set()

    def _find(self, which: int | str | Run) -> Trial:
        for t in self.trials:
            if which is t.run or which == t.index or (isinstance(which, str) and which and which == t.run_id):
                return t
        raise ConfigError(
            f"no run {which!r} in sweep {self.name}: pass the index of its config (0 to "
            f"{len(self.trials) - 1}), its run id, or the Run"
        )

    def close(self) -> None:
        """End every run of the sweep now and start no more."""
        self._stopping.set()
        with self._lock:
            self._cancel_queued("the sweep was closed")
            for trial in self._running():
                self._ended(trial)
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(60.0)
        self._done.set()
        if self._panel is not None:
            self._panel.close()

    def __enter__(self) -> Sweep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what it found ------------------------------------------------------------------
    def results(self, modes: dict[str, str] | None = None) -> SweepResults:
        """A row per config: config, state, steps, final and best value of each logged scalar
        (its mean over ranks), duration (wall time from its launch to its record, start-up
        included: a run's own elapsed time counts from its training's start). Best is the
        greatest value for a metric named like an accuracy or a score (:func:`default_mode`),
        else the least; ``modes`` overrides it: ``results(modes={"margin": "max"})``."""
        with self._lock:
            trials = list(self.trials)
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
        (:func:`default_mode`); ``mode`` says which."""
        mode = mode or default_mode(metric)
        if mode not in ("min", "max") or scope not in ("last", "all"):
            raise ConfigError(
                f"best(): mode must be 'min' or 'max' and scope 'last' or 'all', got {mode!r}, {scope!r}"
            )
        candidates = []
        for trial in self.trials:
            if trial.state != RunState.SUCCEEDED.value:
                continue
            row = trial.summary({metric: mode})
            value = row["final" if scope == "last" else "best"].get(metric)
            if value is not None and math.isfinite(value):
                candidates.append((value if mode == "min" else -value, trial.index, trial))
        if not candidates:
            logged = sorted({m for t in self.trials for m in t.history()})
            raise OrchError(
                f"no succeeded run of sweep {self.name} logged {metric!r}"
                + (f" (metrics logged: {', '.join(logged)})" if logged else "")
            )
        return min(candidates, key=lambda c: (c[0], c[1]))[2]

    def rows(self, metric: str = "loss") -> list[dict[str, Any]]:
        """What the terminal dashboard shows of each config: its state, step, last and best values."""
        out = []
        for row in self.results():
            out.append(
                {
                    "index": row["index"],
                    "run_id": row["run_id"],
                    "config": row["config"],
                    "state": row["state"],
                    "step": row["steps"],
                    "total": row["total"],
                    "last": row["final"],
                    "best": row["best"],
                    "failure": row["failure"],
                    "best_run": False,
                }
            )
        finals = [
            (r["last"][metric] if default_mode(metric) == "min" else -r["last"][metric], r["index"])
            for r in out
            if r["state"] == RunState.SUCCEEDED.value and math.isfinite(r["last"].get(metric, math.nan))
        ]
        if finals:
            out[min(finals)[1]]["best_run"] = True
        return out

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
        atexit.register(close_all_sweeps)
        _atexit_registered = True


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

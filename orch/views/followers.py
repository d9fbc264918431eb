"""What a comparison follows: each run as a curve of a metric (the mean over its ranks, with
the least and greatest rank's value at each step), and where each run is read from: its
master in memory (a run of this process), over gRPC (an attached one), or its run dir."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from orch._text import config_text
from orch.errors import ConfigError, OrchError
from orch.experiments.sweep import Sweep
from orch.experiments.trial import PAUSED, Trial
from orch.launchers.attached import open_run
from orch.launchers.loaded import load_run
from orch.record.rundir import read_json
from orch.wire.client import NonFinite, SeriesBuffer, StateMirror

XAxis = Literal["step", "time"]


@dataclass
class Curve:
    """One run's metric over its ranks: x (step, or seconds since its first point), mean, band."""

    x: npt.NDArray[Any]
    mean: npt.NDArray[np.float64]
    lo: npt.NDArray[np.float64]
    hi: npt.NDArray[np.float64]
    nonfinite: list[NonFinite] = field(default_factory=list)  # where a rank's value went NaN or inf


def curve(mirror: StateMirror, metric: str, x: XAxis = "step") -> Curve:
    """The mean of ``metric`` over the ranks at each step, with its min and max; NaN/inf points
    are left out of the curve and kept in ``nonfinite`` (the step each rank's went first)."""
    bufs: list[SeriesBuffer] = [b for (_, name), b in mirror.series.items() if name == metric]
    if not bufs:
        empty = np.empty(0)
        return Curve(empty, empty, empty, empty)
    bad = mirror.nonfinite(metric)
    steps = np.concatenate([b.steps for b in bufs])
    values = np.concatenate([b.values for b in bufs])
    times = np.concatenate([b.times for b in bufs])
    keep = np.isfinite(values)
    steps, values, times = steps[keep], values[keep], times[keep]
    if len(steps) == 0:
        empty = np.empty(0)
        return Curve(empty, empty, empty, empty, bad)
    order = np.argsort(steps, kind="stable")
    steps, values, times = steps[order], values[order], times[order]
    unique, start = np.unique(steps, return_index=True)
    counts = np.diff(np.append(start, len(values)))
    mean = np.add.reduceat(values, start) / counts
    lo, hi = np.minimum.reduceat(values, start), np.maximum.reduceat(values, start)
    if x == "step":
        return Curve(unique, mean, lo, hi, bad)
    # Wall time: when the step's last rank logged it, from the run's first point of any metric.
    with np.errstate(all="ignore"):
        first = min((np.nanmin(b.times) for b in mirror.series.values() if len(b)), default=np.nan)
    when = np.maximum.reduceat(np.where(np.isfinite(times), times, -np.inf), start) - first
    ok = np.isfinite(when)
    return Curve(when[ok], mean[ok], lo[ok], hi[ok])  # no NaN steps on a time axis


class Follower(Protocol):
    @property
    def label(self) -> str: ...

    @property
    def ended(self) -> bool:
        """Nothing more will change: the last poll read the run's final state."""

    def poll(self) -> StateMirror: ...


class Mirrored:
    """A run of this process, a run attached over gRPC, or one on disk: its state, kept current."""

    def __init__(self, source: Any, label: str) -> None:
        self.source = source
        self.label = label
        self._mirror = StateMirror()
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    def poll(self) -> StateMirror:
        if self._ended:
            return self._mirror
        coordinator = getattr(self.source, "coordinator", None)
        if coordinator is not None:  # orch.Run: its master is in this process, read without RPC
            # A failed rank's last points may come after the run's state is final; none come
            # after its record is written (``done``), so that is when following ends.
            recorded = bool(self.source.done)
            while True:
                reply = coordinator.snapshot(self._mirror.cursor)
                self._mirror.apply(reply)
                if not reply.more:
                    break
            self._ended = recorded
        else:  # an AttachedRun polls its master; a LoadedRun is what it read
            self._mirror = self.source.state()
            self._ended = self._mirror.state.done
        return self._mirror


class TrialFollower:
    """A config of a sweep: nothing until its run starts, then that run, then its record."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        self._inner: Mirrored | None = None
        self._queued = StateMirror()

    @property
    def ended(self) -> bool:
        if not self.trial.done:
            return False
        if self._inner is None:  # never started (cancelled), or not polled since it ended
            return self.trial.run_dir is None
        return self._inner.ended

    @property
    def label(self) -> str:
        return f"#{self.trial.index} {config_text(self.trial.config)}"

    def poll(self) -> StateMirror:
        source = self.trial.run if self.trial.run is not None else None
        if source is None and self.trial.run_dir is not None and self.trial.done:
            if self._inner is None:
                self._inner = Mirrored(self.trial.load(), self.label)
            return self._inner.poll()
        if source is None and self.trial.state == PAUSED and self.trial.run_dir is not None:
            # paused at a rung (orch.SHA): its run's record, until it runs again or ends
            if self._inner is None or getattr(self._inner.source, "run_dir", None) != self.trial.run_dir:
                self._inner = Mirrored(load_run(self.trial.run_dir), self.label)
            return self._inner.poll()
        if source is None:
            return self._queued
        if self._inner is None or self._inner.source is not source:
            self._inner = Mirrored(source, self.label)
        return self._inner.poll()


def followers(runs: Any, run_root: str = "runs") -> list[Follower]:
    """What ``orch.compare`` takes, as things to follow: runs, run ids or dirs, a sweep."""
    if isinstance(runs, Sweep):
        return [TrialFollower(t) for t in runs.trials]
    if isinstance(runs, (str, Path)) or not isinstance(runs, Iterable):
        runs = [runs]
    out: list[Follower] = []
    for item in runs:
        if isinstance(item, Sweep):
            out.extend(TrialFollower(t) for t in item.trials)
        elif isinstance(item, Trial):
            out.append(TrialFollower(item))
        elif isinstance(item, (str, Path)):
            source = open_run(item, run_root)
            out.append(Mirrored(source, config_label(source)))
        elif callable(getattr(item, "state", None)) and hasattr(item, "run_id"):
            out.append(Mirrored(item, config_label(item)))
        else:
            raise ConfigError(
                f"compare() takes runs (orch.Run, an attached or loaded run), run ids, run dirs or "
                f"a sweep; got {type(item).__name__} {item!r:.60}"
            )
    if not out:
        raise ConfigError("compare() needs at least one run")
    labels = [f.label for f in out]
    for f in out:  # runs of one config are told apart by their ids
        if isinstance(f, Mirrored) and (not f.label or labels.count(f.label) > 1):
            run_id = str(f.source.run_id)
            f.label = f"{f.label} ({run_id})" if f.label else run_id
    return out


def config_label(source: Any) -> str:
    """What a legend calls a run: its config (``lr=0.01, bs=32``), from its launch spec or its
    ``run.json``; without one, the name it was launched with (a gang's call: "gang ab12 call 2:
    train"); "" for a run with neither."""
    spec = getattr(source, "spec", None)
    config, name = getattr(spec, "config", None), getattr(spec, "name", None)
    if config is None:
        meta = getattr(source, "meta", None)
        run_dir = getattr(source, "run_dir", None)
        if meta is None and run_dir is not None:
            with contextlib.suppress(OrchError):
                meta = read_json(Path(run_dir) / "run.json")
        config = meta.get("config") if isinstance(meta, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
    if isinstance(config, dict) and config:
        return config_text(config)
    return name if isinstance(name, str) else ""

"""TensorBoard event files from run directories, for ``tensorboard --logdir``.

:func:`export_runs` writes, for each run it is given, every point of every rank (read
from ``metrics.pb``, with its step and the wall time it was logged at), the run's config
as hyperparameters, and each metric's final value::

    logdir/
      <run name>/             the run: its hparams (config, fn, world_size), status and
                              final/<metric>, the mean over ranks at the last step
        rank0/                rank 0's scalars, a tag per metric: loss, acc, ...
        rank1/                rank 1's, the same tags

A folder per rank, not a tag per rank (``loss/rank0``): TensorBoard draws a chart per tag
and a line per run (folder) in it, so the same tag in ``rank0/`` and ``rank1/`` overlays
the ranks in one chart, one colour each, and the run filter picks ranks ("rank1") or runs.
The final values in the run's own folder are what the HPARAMS tab shows beside each run's
config, the figure :meth:`orch.Sweep.results` calls ``final``.

The event files are written by ``torch.utils.tensorboard`` (values as doubles) and the
hyperparameters by TensorBoard's hparams plugin; both need ``pip install "orch[tensorboard]"``.
The files end in ``.orch``: exporting a run again replaces them, and no others.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orch.errors import ConfigError
from orch.record._replay import Replaced, SeriesKey
from orch.record.metrics_log import MetricsDamage, read_metrics
from orch.record.writes import OwnDir, own_dir
from orch.wire.states import RunState

if TYPE_CHECKING:
    from tensorboard.compat.proto.summary_pb2 import Summary  # type: ignore[import-untyped]

SUFFIX = ".orch"  # the end of every event file written here
INSTALL = 'TensorBoard export needs the tensorboard package: pip install "orch[tensorboard]"'
HParam = bool | float | int | str


class Exportable(Protocol):
    """What the export reads of a run: a :class:`~orch.record.rundir.RunRecord` is one."""

    meta: dict[str, Any]

    @property
    def run_dir(self) -> Path: ...

    def state(self) -> Any: ...


def export_runs(
    runs: Iterable[tuple[str, Exportable | str | os.PathLike[str]]],
    logdir: str | os.PathLike[str],
    load: Callable[[Path], Exportable] | None = None,
) -> Path:
    """Write each ``(name, run)`` (a loaded run, or its run dir read by ``load``) as
    ``logdir/<name>/``; returns ``logdir``. A run dir is loaded when its turn comes, so one
    run is in memory at a time.

    Every run's hparams list the hyperparameters and final metrics of all the runs given, so
    export a sweep's runs in one call: TensorBoard's HPARAMS tab takes its columns from one
    of them. A run exported before under the same name is replaced.
    """
    _require()
    root = Path(logdir)
    todo = list(runs)
    names: set[str] = set()
    for name, _ in todo:
        _check_name(name, root)
        if name in names:
            raise ConfigError(f"two runs are named {name!r}: give each run its own name")
        names.add(name)
    sessions = []
    for name, run in todo:  # one run in memory at a time: only its summary is kept
        if isinstance(run, (str, os.PathLike)):
            if load is None:
                raise TypeError(f"run {name!r} is a path: pass load=orch.load_run to read it")
            run = load(Path(run))
        loaded = run
        sessions.append(_export_points(loaded, name, root / name))
    experiment = _experiment(sessions)
    for session in sessions:
        _write_session(session, experiment)
    return root


@dataclass
class _Session:
    """What the run's own folder gets, once the points are written."""

    name: str
    folder: Path
    hparams: dict[str, HParam]
    state: RunState
    start: float
    end: float
    finals: dict[str, tuple[int, float, float]] = field(default_factory=dict)  # step, value, time


def _export_points(run: Exportable, name: str, folder: Path) -> _Session:
    """Every point that stayed in the log into ``folder/rank<N>/``; the run's summary."""
    from torch.utils.tensorboard import SummaryWriter

    run_folder = own_dir(folder)
    _clear(run_folder)
    meta = run.meta
    started = meta.get("started")
    start = float(started) if isinstance(started, int | float) and not isinstance(started, bool) else 0.0
    last: dict[SeriesKey, tuple[int, float, float]] = {}  # each series' last finite point
    clock: dict[int, float] = {}  # each rank's last wall time, for points logged without one
    writers: dict[int, SummaryWriter] = {}
    ranks: list[OwnDir] = []  # each rank's folder, open while its writer writes
    try:
        for rank, points in kept_points(run.run_dir / "metrics.pb"):
            writer = writers.get(rank)
            if writer is None:
                # Through the folders' descriptors: TensorBoard opens its files by path.
                ranks.append(run_folder.sub(f"rank{rank}"))
                _clear(ranks[-1])
                writer = writers[rank] = SummaryWriter(
                    ranks[-1].proc_path(), max_queue=1000, filename_suffix=SUFFIX
                )
            for step, metric, value, when in points:
                when = clock[rank] = clock.get(rank, start) if when is None else when
                writer.add_scalar(metric, value, step, walltime=when, new_style=True, double_precision=True)
                held = last.get((rank, metric))
                if math.isfinite(value) and (held is None or step >= held[0]):
                    last[(rank, metric)] = (step, value, when)
    finally:
        for writer in writers.values():
            writer.close()
        for f in (*ranks, run_folder):
            f.close()
    state = run.state()
    times = [t for _, _, t in last.values()]
    if not start:
        start = min(times, default=0.0) or time.time()
    end = start + state.elapsed if state.elapsed else max(times, default=start)
    hparams: dict[str, HParam] = {"fn": str(meta.get("fn", "")), "world_size": state.world_size}
    config = meta.get("config")
    for key, setting in flatten_config("", config if isinstance(config, dict) else {}):
        hparams[f"config.{key}" if key in ("fn", "world_size") else key] = setting
    return _Session(name, folder, hparams, state.state, start, end, _finals(last))


def kept_points(metrics: Path) -> Iterator[tuple[int, list[tuple[int, str, float, float | None]]]]:
    """Each intact record's points that no restart replaced, as (rank, [(step, metric, value, time)]).

    The same rule as ``LoadedRun.to_csv``: a restarted attempt's replayed steps replace the
    older attempt's, so no step is written twice. Within a record the points go by step, as a
    live writer would have written them.
    """
    replaced = Replaced(metrics)
    for position, record in enumerate(read_metrics(metrics, MetricsDamage())):
        points: list[tuple[int, str, float, float | None]] = []
        for s in record.series:
            limit = replaced.limit((record.rank, s.name), position)
            times: Iterable[float | None] = s.times if len(s.times) == len(s.steps) else [None] * len(s.steps)
            points.extend(
                (step, s.name, value, when)
                for step, value, when in zip(s.steps, s.values, times, strict=True)
                if limit is None or step < limit
            )
        if points:
            points.sort(key=lambda p: p[0])
            yield record.rank, points


def _finals(last: dict[SeriesKey, tuple[int, float, float]]) -> dict[str, tuple[int, float, float]]:
    """Each metric's mean over the ranks that logged its last step (as a sweep's ``summarize``)."""
    by_metric: dict[str, list[tuple[int, float, float]]] = {}
    for (_, metric), point in sorted(last.items()):
        by_metric.setdefault(metric, []).append(point)
    out = {}
    for metric, points in by_metric.items():
        top = max(step for step, _, _ in points)
        at_top = [(value, when) for step, value, when in points if step == top]
        out[metric] = (top, sum(v for v, _ in at_top) / len(at_top), max(t for _, t in at_top))
    return out


def flatten_config(prefix: str, value: Any) -> Iterator[tuple[str, HParam]]:
    """A config as hparams: nested keys joined by dots; lists and None as their JSON text."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from flatten_config(f"{prefix}.{key}" if prefix else str(key), inner)
    elif isinstance(value, bool | int | float | str):
        yield prefix, value
    else:
        yield prefix, json.dumps(value, sort_keys=True, default=repr)


# TensorBoard's statuses: unknown, success, failure, running. A stopped run is no failure, and
# calling it a success would hide that it did not finish: unknown.
_STATUS = {
    RunState.SUCCEEDED: "STATUS_SUCCESS",
    RunState.FAILED: "STATUS_FAILURE",
    RunState.STOPPED: "STATUS_UNKNOWN",
    RunState.PRUNED: "STATUS_UNKNOWN",
}


def _experiment(sessions: list[_Session]) -> Any:
    """The HPARAMS tab's columns: every run's hyperparameters and final metrics.

    TensorBoard reads them from one run's experiment summary, whichever it finds first, so
    each run of the batch gets the same one. Types, domains and ``differs`` (which the tab
    shows first) are derived from the values as TensorBoard derives them when there is none.
    """
    from tensorboard.plugins.hparams import api_pb2  # type: ignore[import-untyped]

    values: dict[str, list[HParam]] = {}
    for session in sessions:
        for key, value in session.hparams.items():
            values.setdefault(key, []).append(value)
    infos = []
    for name, seen in values.items():
        distinct = set(seen)
        info = api_pb2.HParamInfo(name=name, differs=len(distinct) > 1)
        if all(isinstance(v, bool) for v in seen):
            info.type = api_pb2.DATA_TYPE_BOOL
            info.domain_discrete.extend(sorted(distinct))
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in seen):
            info.type = api_pb2.DATA_TYPE_FLOAT64
            info.domain_interval.min_value = min(float(v) for v in seen)
            info.domain_interval.max_value = max(float(v) for v in seen)
        else:
            info.type = api_pb2.DATA_TYPE_STRING
            info.domain_discrete.extend(sorted({str(v) for v in seen}))
        infos.append(info)
    metrics = [
        api_pb2.MetricInfo(name=api_pb2.MetricName(tag=f"final/{m}"), description=f"{m}: mean over ranks")
        for m in sorted({m for s in sessions for m in s.finals})
    ]
    created = min((s.start for s in sessions), default=time.time())
    return api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics, time_created_secs=created)


def _write_session(session: _Session, experiment: Any) -> None:
    """The run's folder: the experiment (the columns), its hparams, final values and status."""
    from tensorboard.plugins.hparams import (
        api_pb2,
        metadata,
        plugin_data_pb2,
        summary_v2,
    )
    from torch.utils.tensorboard.summary import scalar
    from torch.utils.tensorboard.writer import FileWriter

    columns = plugin_data_pb2.HParamsPluginData(experiment=experiment)
    end = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.Status.Value(_STATUS.get(session.state, "STATUS_RUNNING")),
        end_time_secs=session.end,
    )
    folder = own_dir(session.folder)
    writer = FileWriter(folder.proc_path(), filename_suffix=SUFFIX)
    try:
        writer.add_summary(_summary(metadata, metadata.EXPERIMENT_TAG, columns), 0, session.start)
        # The run's name as its trial id: runs of equal configs stay rows of their own.
        started = summary_v2.hparams_pb(session.hparams, trial_id=session.name, start_time_secs=session.start)
        writer.add_summary(started, 0, session.start)
        for metric, (step, value, when) in session.finals.items():
            final: Summary = scalar(  # type: ignore[no-untyped-call]
                f"final/{metric}", value, new_style=True, double_precision=True
            )
            writer.add_summary(final, step, when)
        ended = plugin_data_pb2.HParamsPluginData(session_end_info=end)
        writer.add_summary(_summary(metadata, metadata.SESSION_END_INFO_TAG, ended), 0, session.end)
    finally:
        writer.close()
        folder.close()


def _summary(metadata: Any, tag: str, data: Any) -> Summary:
    """A summary holding hparams plugin data, as ``summary_v2`` makes them (it has no public maker)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    out = Summary()
    out.value.add(tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)
    return out


def _clear(folder: OwnDir) -> None:
    """Remove the event files an earlier export of this run wrote in ``folder`` (theirs only:
    regular files by their names)."""
    for name in folder.names():
        if name.startswith("events.out.tfevents.") and name.endswith(SUFFIX) and folder.is_file(name):
            folder.remove(name)


def _check_name(name: object, root: Path) -> None:
    bad = not isinstance(name, str) or name in ("", ".", "..") or "\0" in name
    if bad or any(sep in str(name) for sep in (os.sep, os.altsep or os.sep, "/")):
        raise ConfigError(
            f"run name {name!r} cannot be a folder inside {root}: pass a name without '/', not '.' or '..'"
        )


def _require() -> None:
    try:
        import tensorboard.plugins.hparams.summary_v2  # type: ignore[import-untyped]  # noqa: F401
        import torch.utils.tensorboard  # noqa: F401
    except ImportError as e:
        raise ConfigError(INSTALL) from e

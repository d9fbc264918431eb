"""Reading and writing a run directory ``runs/<run-id>/``.

What a run leaves there: ``run.json`` (what was launched), ``metrics.pb`` and
``events.jsonl`` (appended while it runs, see :mod:`orch.record.store`), ``logs/`` (each
worker's stdout and stderr), ``errors/`` (a failed worker's traceback),
``checkpoints/`` and, once it ended, ``result.json`` (the final state of every rank).
:class:`RunRecord` reads it back, for a finished run or one whose master crashed
(:func:`orch.load_run` returns it as a run).
"""

from __future__ import annotations

import bisect
import csv
import io
import logging
import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from itertools import repeat
from pathlib import Path
from typing import Any, TypeVar

from orch.errors import ConfigError, OrchError
from orch.record._replay import Replaced, SeriesKey
from orch.record.metrics_log import Attempts, MetricsDamage, read_metrics
from orch.record.owned import check_own_dir, read_own
from orch.record.source import RunSource
from orch.record.store import json_object, read_events
from orch.record.tensorboard import export_runs
from orch.record.writes import OwnDir, export_file, private_dir, write_json
from orch.wire.client import NonFinite, SeriesBuffer, Snapshots, StateMirror
from orch.wire.model import STATUS_FIELDS, JobView, MetricBatch, RunStatus
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

log = logging.getLogger(__name__)

DEFAULT_MAX_POINTS = 1_000_000
_E = TypeVar("_E", bound=Enum)


def write_result(coordinator: Snapshots, run_dir: Path, folder: OwnDir | None = None) -> Path:
    """Write ``result.json``: the final state of the run and of every rank (atomically), in
    ``folder`` (the run dir held open since it was made) where there is one."""
    mirror = StateMirror.of(coordinator)
    record: dict[str, Any] = mirror.as_dict()
    record["events"] = [
        {"time": t, "kind": kind, "rank": rank, "message": msg} for t, kind, rank, msg in mirror.events
    ]
    if folder is not None and folder.fd >= 0:
        folder.put_json("result.json", record)
        return run_dir / "result.json"
    private_dir(run_dir)
    path = run_dir / "result.json"
    write_json(path, record)
    return path


class RunRecord(RunSource):
    """A run's directory, read: ``history()``, ``state()``, ``to_csv()``, ``to_tensorboard()``.

    :class:`orch.LoadedRun` (:mod:`orch.launchers.loaded`) is this record as a run, with the
    run contract (``wait()``, ``panel()`` ...).

    At most ``max_points`` points (over every rank and metric; ``None``: no limit) are
    held in memory: past the budget, each series keeps one point in every ``stride``
    (a power of two), so a log of any size loads in bounded memory; ``to_csv()`` still
    exports every point, straight from the log. Damage in ``metrics.pb`` is skipped and
    described in ``damage``; damage in the JSON files is an :class:`~orch.errors.OrchError`.
    """

    def __init__(self, path: str | Path, *, max_points: int | None = DEFAULT_MAX_POINTS) -> None:
        self._run_dir = Path(path)
        check_own_dir(self._run_dir)  # another user's folder in a shared run root is not read
        if not (self.run_dir / "run.json").exists() and not (self.run_dir / "metrics.pb").exists():
            raise ConfigError(f"{self.run_dir} is not an orch run directory (no run.json or metrics.pb)")
        if max_points is not None and (
            isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1
        ):
            raise ConfigError(f"max_points must be a positive number of points, or None; got {max_points!r}")
        self.max_points = max_points
        self.meta: dict[str, Any] = read_json(self.run_dir / "run.json")
        self.result: dict[str, Any] = read_json(self.run_dir / "result.json")
        self.events = read_events(self.run_dir / "events.jsonl")
        self._mirror = self._build(self._read_points())

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    def _read_points(self) -> _Sampler:
        """One pass over ``metrics.pb``, within the budget; says what it skipped or thinned."""
        sampler = _Sampler(self.max_points)
        found = MetricsDamage()
        for record in read_metrics(self.run_dir / "metrics.pb", found):
            sampler.add(record)
        self.stride = sampler.stride  # 1: every point was kept
        self.points_read = sampler.read  # in the log's intact records, replaced ones included
        self.skipped_regions = found.regions  # damaged stretches of metrics.pb skipped
        self.skipped_bytes = found.skipped_bytes
        self.torn_tail = found.torn_tail is not None  # normal after a crash: not counted as damage
        self.damage = found.notes("metrics.pb")  # one line per thing skipped, torn tail included
        found.warn(self.run_dir / "metrics.pb")
        if self.stride > 1:
            log.warning(
                "%s: %d points are more than max_points=%d: kept 1 point in %d of each series (%d); "
                "to_csv() still exports them all",
                self.run_dir,
                sampler.read,
                self.max_points,
                self.stride,
                sampler.kept,
            )
        return sampler

    def _build(self, sampler: _Sampler) -> StateMirror:
        result = _Fields(self.result, self.run_dir / "result.json")
        meta = _Fields(self.meta, self.run_dir / "run.json")
        launched_id, launched_size = meta.text("run_id"), meta.integer("world_size")
        m = StateMirror()
        m.run_id = result.text("run_id") or launched_id or self.run_dir.name
        m.world_size = result.integer("world_size") or launched_size
        if self.result:
            m.take(_status(result, m.status()))
            m.ranks = [
                RankView.from_fields(r, r.choice("state", RankState, RankState.REGISTERED))
                for r in result.objects("ranks")
            ]
            m.registered = len(m.ranks)
        else:
            m.state = RunState.FAILED
            m.failure = "the run did not finish: its master stopped without writing result.json"
        for key in sorted(sampler.series):
            kept = sampler.series.pop(key)  # one series at a time: the arrays go as their copy comes
            buf = m.series[key] = SeriesBuffer()
            buf.extend(kept.steps, kept.values, kept.times)
        m.events = [(e["time"], e["kind"], e["rank"], e["message"]) for e in self.events]
        m.fill_mean_rates()  # a record from before orch wrote each rank's mean rate
        self._take_nonfinite(m)
        return m

    def _take_nonfinite(self, m: StateMirror) -> None:
        """Where each series went NaN or inf, as the master saw every point: a down-sampled
        load may have left that point out (``nonfinite`` in result.json; older records lack it)."""
        for d in read_nonfinite(self.result, self.run_dir / "result.json"):
            buf = m.series.get((d.rank, d.metric))
            if buf is not None:
                buf.first_bad = (d.step, d.value)
                if d.last_finite is not None:
                    buf.last_finite = (d.last_finite_step, d.last_finite)

    @property
    def run_id(self) -> str:
        return self._mirror.run_id

    def state(self) -> StateMirror:
        return self._mirror  # connect() is None: nothing to poll, the panel draws this once

    def final_state(self) -> StateMirror:
        return self._mirror

    def history(self) -> dict[str, dict[int, dict[str, list[float]]]]:
        """The points held: every one, or one in ``stride`` past ``max_points``."""
        return self._mirror.history()

    def log_files(self) -> dict[str, Path]:
        return {p.stem: p for p in sorted((self.run_dir / "logs").glob("*.log"))}

    def stop(self, reason: str = "") -> RunState:
        return self._mirror.state

    def to_csv(self, path: str | Path) -> Path:
        """Every point as ``rank,metric,step,value`` rows, in the order they were logged.

        Read from ``metrics.pb``, not from memory, so that a run loaded down-sampled still
        exports every point: a first pass finds where restarts replaced points, the second
        writes the points that stayed, so memory stays small whatever the log's size.
        """
        metrics = self.run_dir / "metrics.pb"
        replaced = Replaced(metrics)
        out = Path(path)
        with export_file(out) as raw, io.TextIOWrapper(raw, newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["rank", "metric", "step", "value"])
            for position, record in enumerate(read_metrics(metrics, MetricsDamage())):
                for s in record.series:
                    rows: Iterable[tuple[int, str, int, str]] = zip(
                        repeat(record.rank), repeat(s.name), s.steps, map(repr, s.values)
                    )
                    limit = replaced.limit((record.rank, s.name), position)
                    if limit is not None:
                        rows = (row for row in rows if row[2] < limit)
                    writer.writerows(rows)
        return out

    def to_tensorboard(self, logdir: str | Path) -> Path:
        """Every point as TensorBoard event files in ``logdir/<run id>/``, a folder per rank, with
        the config as hparams; returns that folder. See :mod:`orch.record.tensorboard`."""
        return export_runs([(self.run_id, self)], logdir) / self.run_id

    def __repr__(self) -> str:
        notes = []
        if self.stride > 1:
            notes.append(
                f"down-sampled: 1 point in {self.stride} of {self.points_read} (max_points={self.max_points})"
            )
        if self.skipped_regions:
            notes.append(
                f"metrics.pb damaged: skipped {self.skipped_regions} region(s), {self.skipped_bytes} bytes"
            )
        if self.torn_tail:
            notes.append("metrics.pb: an incomplete last record ignored")
        tail = "".join(f"; {n}" for n in notes)
        return f"<orch.LoadedRun {self.run_id} {self._mirror.state.value} from {self.run_dir}{tail}>"


class _Thinned(Attempts):
    """One series, one point in ``stride`` kept: the points of absolute index 0, stride, 2*stride..."""

    __slots__ = ("seen", "steps", "times", "values")

    def __init__(self) -> None:
        super().__init__()
        self.steps = array("q")
        self.values = array("d")
        self.times = array("d")  # NaN for points logged without one
        self.seen = 0  # points of the series so far, kept or not

    def add(
        self, steps: Sequence[int], values: Sequence[float], times: Sequence[float], attempt: int, stride: int
    ) -> int:
        """Take a batch; returns how many more points are kept than before."""
        before = len(self.steps)
        if self.rewinds(steps, attempt):
            cut = bisect.bisect_left(self.steps, steps[0])
            del self.steps[cut:], self.values[cut:], self.times[cut:]
            self.seen = cut * stride  # the first replayed point takes the place of the first one cut
        first = -self.seen % stride
        self.steps.extend(steps[first::stride])
        self.values.extend(values[first::stride])
        if len(times) == len(steps):
            self.times.extend(times[first::stride])
        else:
            self.times.extend(repeat(math.nan, len(self.steps) - len(self.times)))
        self.seen += len(steps)
        return len(self.steps) - before

    def halve(self) -> None:
        del self.steps[1::2], self.values[1::2], self.times[1::2]


class _Sampler:
    """Reads a run's series in one pass within a points budget, one point in ``stride`` kept.

    Whenever the points kept pass the budget, the stride doubles and every series drops
    every other point it kept, so memory stays near the budget whatever the log's size.
    Each series keeps at least its first point.
    """

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.stride = 1
        self.kept = 0
        self.read = 0
        self.series: dict[SeriesKey, _Thinned] = {}

    def add(self, record: MetricBatch) -> None:
        for s in record.series:
            target = self.series.get((record.rank, s.name))
            if target is None:
                target = self.series[(record.rank, s.name)] = _Thinned()
            self.kept += target.add(s.steps, s.values, s.times, record.attempt, self.stride)
            self.read += len(s.steps)
            if self.budget is not None and self.kept > self.budget:
                self._thin(self.budget)

    def _thin(self, budget: int) -> None:
        while self.kept > budget and any(len(t.steps) > 1 for t in self.series.values()):
            self.stride *= 2
            for target in self.series.values():
                target.halve()
            self.kept = sum(len(t.steps) for t in self.series.values())


class _Fields:
    """Typed reads from a JSON object of a run dir; a wrong field is an OrchError naming the file."""

    def __init__(self, value: dict[str, Any], where: str | Path) -> None:
        self.value = value
        self.where = str(where)

    def text(self, key: str, default: str = "") -> str:
        v = self.value.get(key, default)
        if not isinstance(v, str):
            raise self._wrong(key, v, "a string")
        return v

    def integer(self, key: str, default: int | None = 0) -> int:
        """An integer; required when the default is None."""
        v = self.value.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self._wrong(key, v, "an integer")
        return v

    def number(self, key: str, default: float = 0.0) -> float:
        """A float; also a string such as "nan" or "inf", as JSON has no such numbers."""
        v = self.value.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise self._wrong(key, v, "a number")
        try:
            return float(v)
        except ValueError as e:
            raise self._wrong(key, v, "a number") from e

    def flag(self, key: str, default: bool = False) -> bool:
        v = self.value.get(key, default)
        if not isinstance(v, bool):
            raise self._wrong(key, v, "true or false")
        return v

    def numbers(self, key: str) -> dict[str, float]:
        """An object of names to numbers (empty when absent)."""
        v = self.value.get(key, {})
        if not isinstance(v, dict) or not all(
            isinstance(n, str) and isinstance(x, int | float) and not isinstance(x, bool)
            for n, x in v.items()
        ):
            raise self._wrong(key, v, "an object of names to numbers")
        return {n: float(x) for n, x in v.items()}

    def choice(self, key: str, kind: type[_E], default: _E | None = None) -> _E:
        """A member of ``kind`` by value; required when there is no default."""
        if key not in self.value and default is not None:
            return default
        v = self.value.get(key)
        try:
            return kind(v)
        except (ValueError, TypeError) as e:
            names = ", ".join(str(m.value) for m in kind)
            raise self._wrong(key, v, f"one of {names}") from e

    def object(self, key: str) -> _Fields | None:
        """A JSON object (None when absent: older records lack it)."""
        v = self.value.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self._wrong(key, v, "a JSON object")
        return _Fields(v, f"{self.where}, {key}")

    def objects(self, key: str) -> list[_Fields]:
        v = self.value.get(key, [])
        if not isinstance(v, list):
            raise self._wrong(key, v, "a list")
        out = []
        for i, item in enumerate(v):
            if not isinstance(item, dict):
                raise OrchError(f"{self.where}: {key}[{i}] should be a JSON object, not {_kind(item)}")
            out.append(_Fields(item, f"{self.where}, {key}[{i}]"))
        return out

    def _wrong(self, key: str, value: Any, want: str) -> OrchError:
        if key not in self.value:
            return OrchError(f"{self.where}: {key!r} is missing")
        return OrchError(f"{self.where}: {key!r} should be {want}, not {_kind(value)}")


def _status(result: _Fields, status: RunStatus) -> RunStatus:
    """``status`` with every field of :class:`RunStatus` that ``result.json`` holds, each read
    where the model places it (an older record lacks some: they keep ``status``'s); its state
    is required."""
    for f in STATUS_FIELDS:
        group, _, key = f.metadata["json"].rpartition(".")
        fields = result.object(group) if group else result
        if fields is None or (key not in fields.value and f.name != "state"):
            continue
        setattr(status, f.name, _READS[f.type](fields, key))
    return status.settled()


def _job(fields: _Fields, key: str) -> JobView | None:
    job = fields.object(key)
    if job is None:
        return None
    names = ("scheduler", "job_id", "state", "reason", "nodes")
    return JobView(*(job.text(n) for n in names))


# How each type of RunStatus field is read (the annotations, as text).
_READS: dict[Any, Callable[[_Fields, str], Any]] = {
    "str": _Fields.text,
    "int": _Fields.integer,
    "float": _Fields.number,
    "bool": _Fields.flag,
    "RunState": lambda fields, key: fields.choice(key, RunState),
    "JobView | None": _job,
}


def _kind(value: Any) -> str:
    """A short description of a JSON value for an error message."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def read_nonfinite(result: dict[str, Any], where: Path) -> list[NonFinite]:
    """A record's metrics that went NaN or inf (``nonfinite`` of result.json; older records have none)."""
    found = result.get("nonfinite", [])
    try:
        if not isinstance(found, list):
            raise TypeError(f"a list, not {type(found).__name__}")
        return [NonFinite.from_dict(d) for d in found]
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise OrchError(f"{where}: 'nonfinite' should list the metrics that went NaN or inf ({e})") from e


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of the run dir; ``{}`` when it is missing. Only a regular file this
    user owns, of at most MAX_JSON_BYTES, is read (:mod:`orch.record.owned`)."""
    try:
        data = read_own(path)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise OrchError(f"cannot read {path}: {e}") from e
    return json_object(data, str(path), "the file is damaged: move it aside to load the run without it")

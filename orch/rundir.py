"""Reading and writing a run directory ``runs/<run-id>/``.

What a run leaves there: ``run.json`` (what was launched), ``metrics.pb`` and
``events.jsonl`` (appended while it runs, see :mod:`orch.store`), ``logs/`` (each
worker's stdout and stderr), ``errors/`` (a failed worker's traceback),
``checkpoints/`` and, once it ended, ``result.json`` (the final state of every rank).
:func:`load_run` reads it back, for a finished run or one whose master crashed.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ._viewable import Viewable
from .client import RankView, SeriesBuffer, StateMirror
from .coordinator import Coordinator, RankState, RunState, _Series
from .errors import ConfigError
from .store import read_events, read_metrics, write_json_atomic


def write_result(coordinator: Coordinator, run_dir: Path) -> Path:
    """Write ``result.json``: the final state of the run and of every rank (atomically)."""
    mirror = StateMirror.of(coordinator)
    record: dict[str, Any] = mirror.as_dict()
    record["events"] = [
        {"time": t, "kind": kind, "rank": rank, "message": msg} for t, kind, rank, msg in mirror.events
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "result.json"
    write_json_atomic(path, record)
    return path


class LoadedRun(Viewable):
    """A run read back from its directory: ``history()``, ``state()``, ``panel()``, ``to_csv()``."""

    def __init__(self, path: str | Path) -> None:
        self.run_dir = Path(path)
        if not (self.run_dir / "run.json").exists() and not (self.run_dir / "metrics.pb").exists():
            raise ConfigError(f"{self.run_dir} is not an orch run directory (no run.json or metrics.pb)")
        self.meta: dict[str, Any] = _read_json(self.run_dir / "run.json")
        self.result: dict[str, Any] = _read_json(self.run_dir / "result.json")
        self.events = read_events(self.run_dir / "events.jsonl")
        self._mirror = self._build()

    def _build(self) -> StateMirror:
        series: dict[tuple[int, str], _Series] = {}
        for record in read_metrics(self.run_dir / "metrics.pb"):
            for s in record.series:
                target = series.get((record.rank, s.name))
                if target is None:
                    target = series[(record.rank, s.name)] = _Series()
                target.add(s.steps, s.values, s.times or [0.0] * len(s.steps), record.attempt)
        m = StateMirror()
        m.run_id = self.result.get("run_id") or self.meta.get("run_id", self.run_dir.name)
        m.world_size = int(self.result.get("world_size") or self.meta.get("world_size", 0))
        if self.result:
            m.state = RunState(self.result["state"])
            m.failure = self.result.get("failure", "")
            m.elapsed = float(self.result.get("elapsed", 0.0))
            m.root_cause_rank = int(self.result.get("root_cause_rank", -1))
            m.root_cause_error = self.result.get("root_cause_error", "")
            m.attempt = int(self.result.get("attempt", 1))
            m.max_attempts = int(self.result.get("max_attempts", 1))
            m.total_steps = int(self.result.get("total_steps", 0))
            m.ranks = [_rank_view(r) for r in self.result.get("ranks", [])]
            m.registered = len(m.ranks)
        else:
            m.state = RunState.FAILED
            m.failure = "the run did not finish: its master stopped without writing result.json"
        for key, kept in sorted(series.items()):
            buf = SeriesBuffer()
            buf.extend(kept.steps, kept.values)
            m.series[key] = buf
        m.events = [(e["time"], e["kind"], e["rank"], e["message"]) for e in self.events]
        return m

    @property
    def run_id(self) -> str:
        return self._mirror.run_id

    @property
    def address(self) -> str:
        return ""

    def state(self) -> StateMirror:
        return self._mirror

    def connect(self) -> None:
        return None  # nothing to poll: the panel draws the state read from disk

    def final_state(self) -> StateMirror:
        return self._mirror

    def history(self) -> dict[str, dict[int, dict[str, list[float]]]]:
        return self._mirror.history()

    def log_files(self) -> dict[str, Path]:
        return {p.stem: p for p in sorted((self.run_dir / "logs").glob("*.log"))}

    def stop(self, reason: str = "") -> RunState:
        return self._mirror.state

    def to_csv(self, path: str | Path) -> Path:
        """Every point as ``rank,metric,step,value`` rows."""
        out = Path(path)
        with open(out, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["rank", "metric", "step", "value"])
            for (rank, name), buf in sorted(self._mirror.series.items()):
                for step, value in zip(buf.steps.tolist(), buf.values.tolist(), strict=True):
                    writer.writerow([rank, name, step, repr(value)])
        return out

    def __repr__(self) -> str:
        return f"<orch.LoadedRun {self.run_id} {self._mirror.state.value} from {self.run_dir}>"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _rank_view(r: dict[str, Any]) -> RankView:
    loss = r.get("loss", float("nan"))
    return RankView(
        rank=int(r["rank"]),
        worker_id=r.get("worker_id", ""),
        host=r.get("host", ""),
        pid=int(r.get("pid", 0)),
        state=RankState(r.get("state", "REGISTERED")),
        step=int(r.get("step", 0)),
        total_steps=int(r.get("total_steps", 0)),
        steps_per_sec=0.0,
        heartbeat_age=-1.0,
        loss=float(loss),
        param_checksum=r.get("param_checksum", ""),
        error=r.get("error", ""),
        exit_code=int(r.get("exit_code", 0)),
        address=r.get("address", ""),
        has_loss=bool(r.get("has_loss", False)),
    )


def load_run(path: str | Path) -> LoadedRun:
    """Read a run back from ``runs/<run-id>/``, whether it finished or its master crashed."""
    return LoadedRun(path)

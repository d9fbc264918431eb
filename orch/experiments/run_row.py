"""One run dir read as a row of the run catalog: :class:`RunRow`, :func:`read_row`.

A row is read from ``run.json`` (what was launched) and, once the run ended, ``result.json``
(how it ended, with each rank's last loss); ``metrics.pb`` is never read, so a row stays
cheap however long the run was. A run of this process is read from its live
:class:`~orch.launchers.run.Run` instead; a run without ``result.json`` that is not live here
is RUNNING, CRASHED or UNKNOWN by whether its launching process can be found, and a run dir
whose JSON cannot be read as orch wrote it is DAMAGED. The row's cells (what the tables show
of it, one a column of :data:`COLUMNS`) are here too, as the row's own text.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orch._text import nonfinite_words, number_text, value_text
from orch.errors import OrchError
from orch.launchers.loaded import LoadedRun, load_run
from orch.launchers.run import Run
from orch.record.rundir import _Fields, read_json, read_nonfinite
from orch.runtime.owner import process_alive
from orch.wire.client import NonFinite
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

CRASHED = "CRASHED"  # its launching process is gone, and it left no result.json
DAMAGED = "DAMAGED"  # run.json or result.json cannot be read as orch wrote it
UNKNOWN = "UNKNOWN"  # no result.json, and its launching process cannot be checked from here
STATES = (*(s.value for s in RunState), CRASHED, DAMAGED, UNKNOWN)


COLUMNS = ("id", "name", "function", "state", "attempts", "started", "duration", "loss", "config", "note")


@dataclass
class RunRow:
    """One run of the table. ``run`` is the live :class:`~orch.Run` when it runs in this process."""

    run_id: str
    path: Path
    state: str
    note: str = ""  # why it failed, or is DAMAGED, CRASHED or UNKNOWN
    name: str = ""
    sweep: str = ""
    transfer: bool = False  # a gang's pull or push: a run of orch's own, not listed
    config_key: str = ""
    fn: str = ""
    origin: str = ""  # where the function came from: a notebook and cell, a script (else: fn)
    config: dict[str, Any] = field(default_factory=dict)
    world_size: int = 0
    seed: int | None = None  # the launch's seed= (rank r seeded with seed + r); None: from the OS
    attempts: int = 0
    max_attempts: int = 0
    started: float | None = None  # time.time() at launch
    duration: float | None = None  # seconds from launch to its record (or to now, while it runs)
    final_loss: float | None = None  # mean over the ranks of each one's last loss
    nonfinite: list[NonFinite] = field(default_factory=list)  # metrics that went NaN or inf, by step
    pid: int | None = None  # of the process that launched it
    host: str = ""
    master: str = ""
    ranks: list[RankView] = field(default_factory=list)  # from result.json, or the live master
    root_cause_rank: int = -1
    root_cause_error: str = ""
    stragglers: str = ""  # the straggler judgement as the run ended, in words
    progress: str = ""  # a stall it ended in (how long, which ranks) and how the stop went, in words
    stacks: str = ""  # the stalled ranks' grouped stacks, the odd one out named (empty: no stall)
    run: Run | None = field(default=None, repr=False)

    @property
    def live_here(self) -> bool:
        return self.run is not None

    @property
    def label(self) -> str:
        """Its name, else its sweep's name."""
        return self.name or self.sweep

    def load(self, **options: Any) -> LoadedRun:
        """The whole run read back: ``orch.load_run(row.path)``."""
        return load_run(self.path, **options)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (a NaN loss becomes its text, as JSON has no number for it)."""
        loss: float | str | None = self.final_loss
        if self.final_loss is not None and not math.isfinite(self.final_loss):
            loss = str(self.final_loss)
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "state": self.state,
            "note": self.note,
            "name": self.name,
            "sweep": self.sweep,
            "config_key": self.config_key,
            "fn": self.fn,
            "origin": self.origin or self.fn,
            "config": self.config,
            "world_size": self.world_size,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "started": self.started,
            "duration": None if self.duration is None else round(self.duration, 3),
            "final_loss": loss,
            "nonfinite": [d.as_dict() for d in self.nonfinite],
            "live_here": self.live_here,
            "pid": self.pid,
            "host": self.host,
        }

    def cells(self) -> list[str]:
        """The row as the text and HTML tables show it, one string a column (see ``COLUMNS``)."""
        return [
            self.run_id,
            self.label,
            self.origin or self.fn,
            self.state + (" (live here)" if self.live_here else ""),
            f"{self.attempts}/{self.max_attempts}" if self.max_attempts > 1 else str(self.attempts or ""),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started)) if self.started else "",
            format_seconds(self.duration),
            self.loss_text(),
            _config_text(self.config),
            self.note,
        ]

    def loss_text(self) -> str:
        """The final loss; one that went NaN or inf says from which step, and its last finite
        value, in the words of the live rows: ``inf from step 45 (last finite 6.433e+35 at step 44)``."""
        if self.final_loss is None:
            return ""
        text = number_text(self.final_loss)
        bad = next((d for d in self.nonfinite if d.metric == "loss"), None)
        if bad is None:
            return text
        words = nonfinite_words(bad.value, bad.step, bad.last_finite, bad.last_finite_step, bad.stays)
        # the value it became, as the live rows say it (a loss that went inf reads nan later)
        return words if bad.stays else f"{text} ({words})"

    def __repr__(self) -> str:
        return f"<orch run {self.run_id} {self.state}{' live here' if self.live_here else ''} at {self.path}>"


def read_row(path: str | Path, live: Run | None = None) -> RunRow:
    """One run dir as a row of the table; ``live``: its Run, when it runs in this process."""
    path = Path(path)
    row = RunRow(run_id=path.name, path=path, state=UNKNOWN)
    damage = []
    try:
        _read_meta(row, read_json(path / "run.json"), path / "run.json")
    except OrchError as e:
        damage.append(str(e))
    if live is not None:
        _read_live(row, live)
    result_path = path / "result.json"
    try:
        result = read_json(result_path)
        if not result and live is None and not damage:
            _check_launcher(row)
            if row.state == CRASHED:  # it may have written its record just before it exited
                result = read_json(result_path)
        if result and live is None:
            _read_result(row, result, result_path)
    except OrchError as e:
        damage.append(str(e))
    if damage:
        row.state, row.note, row.run = DAMAGED, "; ".join(damage), None
    return row


def _read_meta(row: RunRow, meta: dict[str, Any], where: Path) -> None:
    f = _Fields(meta, where)
    row.run_id = f.text("run_id") or row.run_id
    row.world_size = f.integer("world_size")
    row.seed = f.integer("seed") if "seed" in meta else None
    row.fn, row.host, row.master = f.text("fn"), f.text("host"), f.text("master")
    row.origin = f.text("origin")
    row.name, row.sweep, row.config_key = f.text("name"), f.text("sweep"), f.text("config_key")
    row.transfer = meta.get("transfer") is True
    config = meta.get("config", {})
    if not isinstance(config, dict):
        raise OrchError(f"{where}: 'config' should be a JSON object, not {type(config).__name__}")
    row.config = config
    row.started = f.number("started") if "started" in meta else None
    row.pid = f.integer("pid") if "pid" in meta else None


def _read_result(row: RunRow, result: dict[str, Any], where: Path) -> None:
    """How the run ended; checked field by field as :func:`orch.load_run` checks it."""
    f = _Fields(result, where)
    f.text("run_id")
    f.number("elapsed")
    f.integer("total_steps")
    state = f.choice("state", RunState)
    row.world_size = f.integer("world_size") or row.world_size
    row.attempts, row.max_attempts = f.integer("attempt", 1), f.integer("max_attempts", 1)
    row.root_cause_rank, row.root_cause_error = f.integer("root_cause_rank", -1), f.text("root_cause_error")
    row.ranks = [
        RankView.from_fields(r, r.choice("state", RankState, RankState.REGISTERED))
        for r in f.objects("ranks")
    ]
    row.state, row.note = state.value, f.text("failure")
    stragglers = f.object("stragglers")
    row.stragglers = stragglers.text("note") if stragglers is not None else ""
    progress = f.object("progress")
    if progress is not None:
        row.progress = progress.text("note")
        row.stacks = progress.text("stacks") if progress.number("stalled_for") > 0 else ""
    row.final_loss = _mean_loss(row.ranks)
    row.nonfinite = read_nonfinite(result, where)
    if row.started is not None:
        with contextlib.suppress(OSError):
            row.duration = max(0.0, where.stat().st_mtime - row.started)  # launch to record
    if row.duration is None:
        row.duration = f.number("elapsed")


def _read_live(row: RunRow, run: Run) -> None:
    """A run of this process, from its master (no RPC, no points)."""
    spec = run.spec
    row.run_id, row.run, row.world_size, row.fn, row.config = (
        run.run_id,
        run,
        spec.world_size,
        spec.fn_name,
        spec.config,
    )
    row.origin = run.origin
    row.name, row.sweep, row.config_key = spec.name or "", spec.sweep or "", spec.config_key or ""
    reply = run.coordinator.snapshot(skip_series=True)
    row.state = run.coordinator.state.value
    row.attempts, row.max_attempts = reply.attempt, reply.max_attempts
    row.ranks = [RankView.from_pb(r) for r in reply.ranks]
    row.note = reply.failure
    row.root_cause_rank, row.root_cause_error = reply.root_cause_rank, reply.root_cause_error
    row.final_loss = _mean_loss(row.ranks)
    row.duration = time.time() - row.started if row.started else None


def _check_launcher(row: RunRow) -> None:
    """No result.json and not live here: ask whether the process that launched it still runs."""
    row.attempts = _attempts_logged(row.path, row.run_id)
    if row.pid is None:
        row.note = "run.json names no launching process (an `orch master` run?)" + (
            f": `orch status --master {row.master}` asks its master" if row.master else ""
        )
    elif row.host and row.host != socket.gethostname():
        row.note = f"launched on host {row.host}: its process can only be checked there"
    elif row.pid != os.getpid() and process_alive(row.pid, began_by=row.started):
        row.state = RunState.RUNNING.value
        row.note = f"its launching process (pid {row.pid}) runs"
        row.duration = time.time() - row.started if row.started else None
    else:
        row.state = CRASHED
        if row.pid == os.getpid():
            row.note = (
                "ended without a record: this process launched it, no longer runs it, "
                "and it left no result.json"
            )
        else:
            row.note = (
                f"launcher exited (pid {row.pid}) without a record: the process that launched the "
                "run ended before it wrote result.json (killed, or the machine went down)"
            )
        row.duration = _last_write(row.path) - row.started if row.started else None


def _attempts_logged(path: Path, run_id: str) -> int:
    """The last attempt that left a worker log (0: no worker started)."""
    pattern = re.compile(rf"{re.escape(run_id)}(?:-a(\d+))?-w\d+\.log")
    found = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(path / "logs"):
            m = pattern.fullmatch(entry.name)
            if m:
                found = max(found, int(m.group(1) or 1))
    return found


def _mean_loss(ranks: list[RankView]) -> float | None:
    losses = [r.loss for r in ranks if r.has_loss]
    return sum(losses) / len(losses) if losses else None


def _last_write(path: Path) -> float:
    """When the run dir was last written to: its last sign of life."""
    return max(mtime(path / name) for name in ("run.json", "metrics.pb", "events.jsonl"))


def mtime(path: Path) -> float:
    """When ``path`` was last modified (0 for a file that is not there)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _config_text(config: dict[str, Any]) -> str:
    """A config as the table's cell: JSON, its numbers as every view writes them (``lr=0.4457``,
    not a sweep's drawn ``lr=0.4457453393648168``)."""
    return " ".join(f"{k}={_json_text(v)}" for k, v in config.items())


def _json_text(value: Any) -> str:
    if isinstance(value, float):
        return value_text(value)
    if isinstance(value, list):
        return "[" + ", ".join(_json_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_json_text(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"

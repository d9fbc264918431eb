"""The run catalog: every run dir under a run root, as one table (``orch.runs()``, ``orch runs``).

A row is read from ``run.json`` (what was launched) and, once the run ended, ``result.json``
(how it ended, with each rank's last loss); ``metrics.pb`` is never read, so the table stays
cheap however long the runs were. A run without ``result.json`` is asked about where it is:

- a run of this process is read from its live :class:`~orch.launchers.run.Run` (marked *live here*);
- a run whose launching process (``run.json``'s ``pid`` on its ``host``) is alive is RUNNING;
- one whose launching process is gone is CRASHED: it ended without writing its record;
- one launched on another host, or by a process run.json does not name (``orch master``), is
  UNKNOWN from here.

A run dir whose JSON is half-written or hand-edited (:func:`orch.load_run` would refuse it) is
DAMAGED, its row saying why; it never hides the other rows.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from orch._text import printable
from orch.errors import ConfigError, OrchError
from orch.experiments.sweep import close_all_sweeps
from orch.launchers.loaded import LoadedRun, load_run
from orch.launchers.run import Run, close_all_runs, live_runs
from orch.record.rundir import _Fields, read_json
from orch.runtime._owner import process_alive
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState, describe_exit

CRASHED = "CRASHED"  # its launching process is gone, and it left no result.json
DAMAGED = "DAMAGED"  # run.json or result.json cannot be read as orch wrote it
UNKNOWN = "UNKNOWN"  # no result.json, and its launching process cannot be checked from here
STATES = (*(s.value for s in RunState), CRASHED, DAMAGED, UNKNOWN)

_RUN_FILES = ("run.json", "result.json", "metrics.pb")


@dataclass
class RunRow:
    """One run of the table. ``run`` is the live :class:`~orch.Run` when it runs in this process."""

    run_id: str
    path: Path
    state: str
    note: str = ""  # why it failed, or is DAMAGED, CRASHED or UNKNOWN
    name: str = ""
    sweep: str = ""
    config_key: str = ""
    fn: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    world_size: int = 0
    attempts: int = 0
    max_attempts: int = 0
    started: float | None = None  # time.time() at launch
    duration: float | None = None  # seconds from launch to its record (or to now, while it runs)
    final_loss: float | None = None  # mean over the ranks of each one's last loss
    pid: int | None = None  # of the process that launched it
    host: str = ""
    master: str = ""
    ranks: list[RankView] = field(default_factory=list)  # from result.json, or the live master
    root_cause_rank: int = -1
    root_cause_error: str = ""
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
            "config": self.config,
            "world_size": self.world_size,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "started": self.started,
            "duration": None if self.duration is None else round(self.duration, 3),
            "final_loss": loss,
            "live_here": self.live_here,
            "pid": self.pid,
            "host": self.host,
        }

    def cells(self) -> list[str]:
        """The row as the text and HTML tables show it, one string a column (see ``COLUMNS``)."""
        return [
            self.run_id,
            self.label,
            self.fn,
            self.state + (" (live here)" if self.live_here else ""),
            f"{self.attempts}/{self.max_attempts}" if self.max_attempts > 1 else str(self.attempts or ""),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started)) if self.started else "",
            format_seconds(self.duration),
            "" if self.final_loss is None else f"{self.final_loss:.4g}",
            _config_text(self.config),
            self.note,
        ]

    def __repr__(self) -> str:
        return f"<orch run {self.run_id} {self.state}{' live here' if self.live_here else ''} at {self.path}>"


COLUMNS = ("id", "name", "function", "state", "attempts", "started", "duration", "loss", "config", "note")


class RunTable(Sequence[RunRow]):
    """Runs, newest first: iterate, index (``table[0]``, ``table["<run id>"]``), ``filter(...)``."""

    def __init__(self, rows: Iterable[RunRow], run_root: Path) -> None:
        self.rows = list(rows)
        self.run_root = run_root

    @overload
    def __getitem__(self, key: int | str) -> RunRow: ...
    @overload
    def __getitem__(self, key: slice) -> RunTable: ...
    def __getitem__(self, key: int | str | slice) -> RunRow | RunTable:
        if isinstance(key, slice):
            return RunTable(self.rows[key], self.run_root)
        if isinstance(key, str):
            found = [r for r in self.rows if r.run_id.startswith(key)]
            if len(found) == 1 or (found and found[0].run_id == key):
                return found[0]
            raise KeyError(
                f"{len(found)} runs under {self.run_root} start with {key!r}"
                if found
                else f"no run {key!r} under {self.run_root}"
            )
        return self.rows[key]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[RunRow]:
        return iter(self.rows)

    def filter(
        self,
        *,
        state: str | Iterable[str] | None = None,
        sweep: str | None = None,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        **config_values: Any,
    ) -> RunTable:
        """The rows in ``state`` (one or several), of ``sweep``, called ``name``, whose config
        holds every value given: ``filter(state="FAILED", lr=0.1)``. ``config={...}`` names
        config keys that clash with these arguments."""
        wanted = {**(config or {}), **config_values}
        states = None if state is None else {state} if isinstance(state, str) else set(state)
        for s in states or ():
            if s not in STATES:
                raise ConfigError(f"state={s!r} is no run state: pass one of {', '.join(STATES)}")
        rows = [
            r
            for r in self.rows
            if (states is None or r.state in states)
            and (sweep is None or r.sweep == sweep)
            and (name is None or r.name == name)
            and all(k in r.config and _same(r.config[k], v) for k, v in wanted.items())
        ]
        return RunTable(rows, self.run_root)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.rows]

    def __repr__(self) -> str:
        if not self.rows:
            return f"no runs under {self.run_root}/"
        table = [list(COLUMNS)] + [[_clip(printable(c, one_line=True), 48) for c in r.cells()] for r in self]
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
        return "\n".join([f"{len(self.rows)} runs under {self.run_root}/", *lines])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in COLUMNS)
        body = []
        for r in self:
            cells = [html.escape(printable(c, one_line=True)) for c in r.cells()]
            cells[3] = f'<span style="color:{_COLOURS.get(r.state, "inherit")}">{html.escape(r.state)}</span>'
            if r.live_here:
                cells[3] += ' <b title="runs in this kernel: row.run is the Run">● live here</b>'
            short = html.escape(_clip(printable(r.note, one_line=True), 60))
            cells[-1] = f'<span title="{cells[-1]}">{short}</span>'
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        caption = f"{len(self.rows)} runs under {html.escape(str(self.run_root))}/"
        return (
            f'<table class="orch-runs"><caption style="text-align:left">{caption}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        )


_COLOURS = {
    "SUCCEEDED": "green",
    "FAILED": "red",
    CRASHED: "red",
    DAMAGED: "darkorange",
    "STOPPED": "darkorange",
    "RUNNING": "royalblue",
}


def runs(run_root: str | Path = "runs") -> RunTable:
    """Every run under ``run_root``, newest first, read from its ``run.json`` and ``result.json``."""
    root = Path(run_root)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"run_root {root} is a file, not the folder of the run dirs")
    here = {_key(r.run_dir): r for r in live_runs()}
    rows: list[tuple[float, RunRow]] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            path = Path(entry.path)
            if entry.is_dir() and any((path / f).exists() for f in _RUN_FILES):
                row = read_row(path, here.get(_key(path)))
                rows.append((row.started or _mtime(path), row))
    rows.sort(key=lambda pair: pair[0], reverse=True)
    return RunTable((row for _, row in rows), root)


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
    row.fn, row.host, row.master = f.text("fn"), f.text("host"), f.text("master")
    row.name, row.sweep, row.config_key = f.text("name"), f.text("sweep"), f.text("config_key")
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
    row.final_loss = _mean_loss(row.ranks)
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
        who = "this process" if row.pid == os.getpid() else f"pid {row.pid}"
        row.note = (
            f"ended without a record: its launching process ({who}) no longer runs it, "
            "and it left no result.json"
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
    return max(_mtime(path / name) for name in ("run.json", "metrics.pb", "events.jsonl"))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _key(path: Path) -> str:
    return os.path.realpath(path)


def _same(a: Any, b: Any) -> bool:
    """Equal, and True is not 1."""
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


def _config_text(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in config.items())


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{max(0, round(seconds))} s ago"
    if seconds < 5400:
        return f"{round(seconds / 60)} min ago"
    return f"{seconds / 3600:.1f} h ago"


# -- runs of this process ----------------------------------------------------------------------
def close_all() -> int:
    """End every run still live in this process (as ``run.close()``), and every sweep's, which
    then starts no more; returns how many runs there were."""
    count = len(live_runs())
    close_all_sweeps()  # first: a sweep would start its next config in the place of a closed one
    close_all_runs()
    return count


def live_notice() -> str | None:
    """One line naming the runs of this process still live (None when there is none)."""
    live = live_runs()
    if not live:
        return None
    now = time.time()
    described = []
    for run in live:
        started = None
        with contextlib.suppress(OrchError, ValueError, TypeError):
            value = read_json(run.run_dir / "run.json").get("started")
            started = float(value) if isinstance(value, int | float) else None
        when = f"launched {_ago(now - started)}" if started else "launching"
        label = f" {printable(run.spec.name, one_line=True)!r}" if run.spec.name else ""
        described.append((f"{run.run_id}{label}", when, run.coordinator.state.value))
    if len(described) == 1:
        what, when, state = described[0]
        return (
            f"orch: run {what} ({when}) is still {state} in this kernel; "
            "run.stop() or orch.close_all() ends it"
        )
    listed = ", ".join(f"{what} ({state}, {when})" for what, when, state in described)
    return (
        f"orch: {len(described)} runs are still live in this kernel: {listed}; "
        "run.stop() on each, or orch.close_all(), ends them"
    )


# -- one run: where it is, its logs, its summary --------------------------------------------------
def find_run(run: str | Path, run_root: str | Path = "runs") -> Path:
    """The run dir ``run`` names: a run dir, a run id under ``run_root``, or a unique start of one."""
    path, root, text = Path(run), Path(run_root), str(run)
    if path.is_dir() and any((path / f).exists() for f in _RUN_FILES):
        return path
    if text and "/" not in text and os.sep not in text and text not in (".", ".."):
        if (root / text).is_dir():
            return root / text
        with contextlib.suppress(OSError):
            matches = sorted(e.name for e in os.scandir(root) if e.is_dir() and e.name.startswith(text))
            if len(matches) == 1:
                return root / matches[0]
            if matches:
                raise ConfigError(
                    f"{text!r} starts {len(matches)} run ids under {root}/ ({', '.join(matches[:5])}"
                    f"{', ...' if len(matches) > 5 else ''}): pass more of the id"
                )
    if path.is_dir():
        raise ConfigError(f"{path} is not an orch run dir (it has no {', '.join(_RUN_FILES)})")
    newest = [r.run_id for r in runs(root)[:5]]
    if not newest:
        raise ConfigError(f"no run {text!r}: {root}/ holds no runs (pass --run-root, or a run dir's path)")
    raise ConfigError(
        f"no run {text!r} under {root}/; the newest there: {', '.join(newest)} (`orch runs` lists them all)"
    )


def worker_of(path: Path, rank: int) -> str | None:
    """The worker that was ``rank`` in the run's last attempt, from its record or its event log."""
    with contextlib.suppress(OrchError):
        for r in read_json(path / "result.json").get("ranks", []):
            if isinstance(r, dict) and r.get("rank") == rank and isinstance(r.get("worker_id"), str):
                return str(r["worker_id"])
    found = None
    with contextlib.suppress(OSError), open(path / "events.jsonl", "rb") as f:
        for line in f:  # tolerant: a torn or damaged line is skipped, the last registration wins
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if (
                    isinstance(event, dict)
                    and event.get("kind") == "registered"
                    and event.get("rank") == rank
                ):
                    m = re.fullmatch(r"(.+?) on .* pid \d+", str(event.get("message", "")))
                    found = m.group(1) if m else found
    return found


def rank_log(path: Path, rank: int) -> Path | None:
    """``logs/<worker>.log`` of ``rank`` in the run's last attempt; None before it registered."""
    worker = worker_of(path, rank)
    if worker is None or "/" in worker or "\0" in worker or worker in (".", ".."):
        return None
    return path / "logs" / f"{worker}.log"


def describe(row: RunRow) -> str:
    """A run in full, for a terminal: what ran, how it ended, each rank, the root cause."""
    lines = [f"run {row.run_id}  {row.state}" + (" (live here)" if row.live_here else "")]
    has_cause = row.root_cause_rank >= 0 or bool(row.root_cause_error)
    if row.note and not has_cause:
        lines.append(f"  {row.note}")
    facts = [
        ("name", row.name),
        ("sweep", f"{row.sweep} (config key {row.config_key})" if row.config_key else row.sweep),
        ("path", str(row.path)),
        ("function", row.fn),
        ("config", json.dumps(row.config)),
        ("world size", str(row.world_size or "")),
        ("launched", _launched(row)),
        ("attempts", f"{row.attempts} of {row.max_attempts}" if row.max_attempts else str(row.attempts)),
        ("duration", format_seconds(row.duration)),
        (
            "final loss",
            "" if row.final_loss is None else f"{row.final_loss:.6g} (mean of the ranks' last loss)",
        ),
    ]
    lines += [f"  {k:<11}{v}" for k, v in facts if v]
    if row.ranks:
        table = [["rank", "worker", "host", "state", "step", "loss", "exit"]]
        for r in row.ranks:
            exit_text = describe_exit(r.exit_code) if r.state.done and r.exit_code else ""
            cells = [str(r.rank), r.worker_id, r.host, r.state.value, str(r.step), r.loss_text(), exit_text]
            table.append(cells)
        widths = [max(len(printable(t[i], one_line=True)) for t in table) for i in range(len(table[0]))]
        for t in table:
            cells = [printable(c, one_line=True).ljust(w) for c, w in zip(t, widths, strict=True)]
            lines.append("  " + "  ".join(cells).rstrip())
    elif row.state == RunState.RUNNING.value and row.master:
        lines.append(f"  ranks: `orch status --master {row.master}` shows them while the run goes")
    if has_cause:
        lines.append(f"root cause (rank {row.root_cause_rank}): {row.note}")
        lines.append(row.root_cause_error.rstrip())
    elif row.state in (CRASHED, UNKNOWN, DAMAGED):
        lines += _error_files(row.path)
    logs = sorted(p.name for p in (row.path / "logs").glob("*.log"))
    if logs:
        lines.append(f"logs: {len(logs)} in {row.path / 'logs'}; `orch logs {row.run_id} --rank N` shows one")
    return printable("\n".join(lines))


def _launched(row: RunRow) -> str:
    parts = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started)) if row.started else ""]
    if row.host or row.pid:
        parts.append(f"on {row.host or '?'} (pid {row.pid})" if row.pid else f"on {row.host}")
    if row.master:
        parts.append(f"master {row.master}")
    return " ".join(p for p in parts if p)


def _error_files(path: Path) -> list[str]:
    """The tracebacks failed workers left in ``errors/`` (a run without a record has no root cause)."""
    lines = []
    for file in sorted((path / "errors").glob("*.json")):
        try:
            value = read_json(file)
        except OrchError as e:
            lines.append(str(e))
            continue
        lines.append(f"errors/{file.name}: rank {value.get('rank', '?')} left this traceback:")
        lines.append(str(value.get("traceback", "")).rstrip())
    return lines

"""One run for ``orch show`` and ``orch logs``: where it is, its ranks' logs, its description.

:func:`find_run` turns what a user typed (a run dir, a run id, the start of one) into the
run dir, or says what is there instead; :func:`rank_log` finds the log of a rank of the
run's last attempt (:func:`worker_of` names the worker that was that rank); :func:`describe`
writes a row of the catalog in full for a terminal, with each rank and the root cause, or,
for a run that left no record, the tracebacks its failed workers left.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

from orch._text import printable, rate_text
from orch.errors import OrchError
from orch.experiments.run_row import CRASHED, DAMAGED, UNKNOWN, RunRow, format_seconds
from orch.record.names import no_run, run_dir_named
from orch.record.owned import check_own_dir, open_own, read_line
from orch.record.rundir import read_json
from orch.record.store import MAX_EVENT_LINE_BYTES
from orch.wire.states import RunState, describe_exit


def find_run(run: str | Path, run_root: str | Path = "runs") -> Path:
    """The run dir ``run`` names: a run dir, a run id under ``run_root``, or a unique start of one
    (:func:`orch.record.names.run_dir_named`). A folder another user owns is refused, naming
    its owner (:mod:`orch.record.owned`)."""
    found = run_dir_named(run, run_root)
    if found is None:
        raise no_run(str(run), run_root)
    check_own_dir(found)
    return found


def worker_of(path: Path, rank: int) -> str | None:
    """The worker that was ``rank`` in the run's last attempt, from its record or its event log."""
    with contextlib.suppress(OrchError):
        for r in read_json(path / "result.json").get("ranks", []):
            if isinstance(r, dict) and r.get("rank") == rank and isinstance(r.get("worker_id"), str):
                return str(r["worker_id"])
    found = None
    with contextlib.suppress(OSError, OrchError), open_own(path / "events.jsonl") as f:
        while line := read_line(f, MAX_EVENT_LINE_BYTES)[0]:
            # Tolerant: a torn, damaged or cut line is skipped, the last registration wins.
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
        ("function", row.origin or row.fn),
        ("config", json.dumps(row.config)),
        ("world size", str(row.world_size or "")),
        (
            "seed",
            "each rank's own, from the OS"
            if row.seed is None
            else f"{row.seed} (rank r seeded with {row.seed} + r)",
        ),
        ("launched", _launched(row)),
        ("attempts", f"{row.attempts} of {row.max_attempts}" if row.max_attempts else str(row.attempts)),
        ("duration", format_seconds(row.duration)),
        (
            "final loss",
            "" if row.final_loss is None else f"{row.loss_text()} (mean of the ranks' last loss)",
        ),
        *(("not finite", f"rank {d.rank}: {d.text()}") for d in row.nonfinite),
        ("stragglers", row.stragglers),
        ("progress", row.progress),
    ]
    lines += [f"  {k:<11}{v}" for k, v in facts if v]
    if row.ranks:
        table = [["rank", "worker", "host", "state", "step", "loss", "steps/s", "exit"]]
        for r in row.ranks:
            exit_text = describe_exit(r.exit_code) if r.state.done and r.exit_code else ""
            rate = rate_text(r.steps_per_sec) + (" mean" if r.state.done and r.steps_per_sec else "")
            cells = [str(r.rank), r.worker_id, r.host, r.state.value, str(r.step), r.loss_text(), rate]
            cells.append(exit_text)
            table.append(cells)
        widths = [max(len(printable(t[i], one_line=True)) for t in table) for i in range(len(table[0]))]
        for t in table:
            cells = [printable(c, one_line=True).ljust(w) for c, w in zip(t, widths, strict=True)]
            lines.append("  " + "  ".join(cells).rstrip())
    elif row.state == RunState.RUNNING.value and row.master:
        lines.append(f"  ranks: `orch status {row.run_id}` shows them while the run goes")
    if row.stacks and row.stacks not in row.root_cause_error:  # the stall's evidence, kept
        lines += ["stacks (when the ranks stood still):", row.stacks.rstrip()]
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

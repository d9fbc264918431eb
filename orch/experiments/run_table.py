"""The run catalog's table: :func:`runs` lists a run root, :class:`RunTable` shows the rows.

:func:`runs` reads every run dir under a run root (:func:`~orch.experiments.run_row.read_row`,
a run live in this process from its :class:`~orch.launchers.run.Run`), newest first.
:class:`RunTable` is what ``orch.runs()`` returns and ``orch runs`` prints: it indexes rows by
position or run id, filters them by state, sweep, name and config values, and draws them
as text for a terminal and as an HTML table for a notebook.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

from orch._text import escape_html, printable
from orch.errors import ConfigError
from orch.experiments.run_row import COLUMNS, CRASHED, DAMAGED, STATES, RunRow, read_row
from orch.launchers.run import live_runs
from orch.record.names import is_run_dir, started
from orch.record.owned import is_own_dir


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
            cells = [escape_html(printable(c, one_line=True)) for c in r.cells()]
            cells[3] = f'<span style="color:{_COLOURS.get(r.state, "inherit")}">{escape_html(r.state)}</span>'
            if r.live_here:
                cells[3] += ' <b title="runs in this kernel: row.run is the Run">● live here</b>'
            short = escape_html(_clip(printable(r.note, one_line=True), 60))
            cells[-1] = f'<span title="{cells[-1]}">{short}</span>'
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        caption = f"{len(self.rows)} runs under {escape_html(str(self.run_root))}/"
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
    "PRUNED": "mediumpurple",
    "RUNNING": "royalblue",
}


def runs(run_root: str | Path = "runs") -> RunTable:
    """Every run under ``run_root``, newest first, read from its ``run.json`` and ``result.json``."""
    root = Path(run_root)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"run_root {root} is a file, not the folder of the run dirs")
    here = {_key(r.run_dir): r for r in live_runs()}
    rows: list[tuple[float, str, RunRow]] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            path = Path(entry.path)
            # Only this user's run dirs: anyone who can write to a shared run root could plant one.
            if is_own_dir(path) and is_run_dir(path):
                row = read_row(path, here.get(_key(path)))
                if row.transfer:
                    continue  # a gang's pull or push moved objects: no run of the user's
                rows.append((row.started or started(path), path.name, row))
    rows.sort(key=lambda t: t[:2], reverse=True)  # as orch.record.names.no_run lists them
    return RunTable((row for *_, row in rows), root)


def _key(path: Path) -> str:
    return os.path.realpath(path)


def _same(a: Any, b: Any) -> bool:
    """Equal, and True is not 1."""
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."

"""The terminal dashboards: one run's ranks (``orch run``, ``orch master``, ``orch status``),
and a sweep's runs.

Each view has a pure renderer of plain text (:func:`render`, :func:`render_sweep_plain`) and
one of a ``rich`` renderable (:func:`run_table`, :func:`sweep_table`); both are tested
without a terminal. :class:`Dashboard` polls a master and :class:`SweepDashboard` a
caller's ``rows()``: on a terminal they redraw the rich view in place (``rich.live.Live``),
to a file or a pipe they print a plain line now and then, with no escape codes.

What a worker or a remote host says (host names, errors, tracebacks) goes through
:func:`printable` and into a ``rich.text.Text``, never through rich markup: it is shown,
never obeyed, whether it holds a terminal escape or a ``[bold red]`` tag.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.control import Control
from rich.live import Live
from rich.live_render import LiveRender
from rich.progress_bar import ProgressBar
from rich.segment import ControlType, Segment
from rich.table import Table
from rich.text import Text

from orch._text import printable
from orch.errors import MasterUnavailable
from orch.wire.client import MasterClient, StateMirror
from orch.wire.ranks import RankView

TRACEBACK_LINES = 8  # of the root cause's traceback, the live view shows the last lines

# The colour of a state, run or rank, by its name (a sweep's rows name theirs as strings).
STATE_STYLES = {
    "PENDING": "dim",
    "REGISTERED": "dim",
    "SKIPPED": "dim",
    "RUNNING": "bold cyan",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "LOST": "bold red",
    "RESTARTING": "bold yellow",
    "STOPPING": "bold yellow",
    "STOPPED": "bold yellow",
}

def _fmt_age(age: float) -> str:
    return "-" if age < 0 else f"{age:.1f}s"


def _bar(done: int, total: int, width: int = 30) -> str:
    if total <= 0:
        return f"step {done}"
    frac = min(1.0, done / total)
    fill = round(frac * width)
    return f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total} ({frac:.0%})"


def stragglers(mirror: StateMirror) -> set[int]:
    """The rank the master judged to hold the others back (see orch.master.control.stragglers)."""
    return {mirror.straggler_rank} if mirror.straggler_rank >= 0 else set()


# Each rank's step, split (ms per step over the last seconds), and its compute against the
# fastest rank's: "data/compute/wait/other x1.00".
SPLIT_HEADER = "ms data/comp/wait/oth  rel"
SPLIT_WIDTH = len(SPLIT_HEADER)
PARTS = (("data", "blue"), ("compute", "yellow"), ("wait", "bright_black"), ("other", "magenta"))


def split_text(r: RankView) -> str:
    """``2/33/5/1 x1.25``: a rank's step split in ms, and its relative score ("-": not timed)."""
    if not r.timed:
        return "-"
    parts = "/".join(f"{v:.0f}" for v in (r.data_ms, r.compute_ms, r.collective_ms, r.other_ms))
    return f"{parts} x{r.relative_score:.2f}"


def split_bar(r: RankView, width: int = 8, scale_ms: float = 0.0) -> Text:
    """A rank's step as a stacked bar of ``width`` cells (data, compute, wait, other), scaled
    to ``scale_ms`` (the longest step shown), then its text."""
    if not r.timed:
        return Text("-")
    values = (r.data_ms, r.compute_ms, r.collective_ms, r.other_ms)
    total = max(scale_ms, sum(values)) or 1.0
    bar = Text()
    for (_, style), v in zip(PARTS, values, strict=True):
        bar.append("█" * round(width * v / total), style=style)
    return bar + Text(" " + split_text(r))


# -- one run: plain text ----------------------------------------------------------------------
def render(mirror: StateMirror, *, address: str = "") -> str:
    """The run as plain text, no escape codes: for files, pipes and ``orch status``."""
    done, total = mirror.progress()
    lines = [
        f"orch run {printable(mirror.run_id, one_line=True) or '?'}  {mirror.state.value:<9}  "
        f"{mirror.registered}/{mirror.world_size} ranks  elapsed {mirror.elapsed:6.1f}s"
        + (f"  attempt {mirror.attempt}/{mirror.max_attempts}" if mirror.max_attempts > 1 else "")
        + (f"  master {printable(address, one_line=True)}" if address else "")
        + (f"  rendezvous {printable(str(mirror.rendezvous), one_line=True)}" if mirror.rendezvous else ""),
        *([printable(mirror.job.describe(), one_line=True)] if mirror.job is not None else []),
        _bar(done, total),
        "",
        f"{'rank':>4}  {'state':<10} {'step':>7} {'loss':>10} {'steps/s':>8} {'heartbeat':>9}  "
        f"{SPLIT_HEADER:<{SPLIT_WIDTH}}  host/pid",
    ]
    slow = stragglers(mirror)
    for r in mirror.ranks:
        marks = []
        if r.rank in slow:
            marks.append(f"straggler: {printable(mirror.straggler_section, one_line=True)}")
        if r.diverged:
            marks.append("NaN/inf loss")
        if r.dropped_points:
            marks.append(f"{r.dropped_points} points dropped")
        host = printable(r.host, one_line=True)  # what the worker says its host is called
        lines.append(
            f"{r.rank:>4}  {r.state.value:<10} {r.step:>7} {r.loss_text():>10} "
            f"{r.steps_per_sec:>8.1f} {_fmt_age(r.heartbeat_age):>9}  "
            f"{split_text(r):<{SPLIT_WIDTH}}  {host}/{r.pid}"
            + (f"  <- {', '.join(marks)}" if marks else "")
        )
    if mirror.straggler_note:
        lines += ["", f"stragglers: {printable(mirror.straggler_note, one_line=True)}"]
    if mirror.failure:
        lines += ["", f"FAILED: {printable(mirror.failure)}"]
    return "\n".join(lines)


def summary(mirror: StateMirror) -> str:
    lines = [f"run {printable(mirror.run_id, one_line=True)} {mirror.state.value} in {mirror.elapsed:.1f}s"]
    for r in mirror.ranks:
        lines.append(
            f"  rank {r.rank}: {r.state.value}, step {r.step}, loss {r.loss_text()}"
            + (f", params {printable(r.param_checksum, one_line=True)[:12]}" if r.param_checksum else "")
        )
    if mirror.failure:
        lines.append(f"root cause: {printable(mirror.failure)}")
        if mirror.root_cause_error:
            lines.append(printable(mirror.root_cause_error).rstrip())
    return "\n".join(lines)


# -- one run: rich ----------------------------------------------------------------------------
def _state(name: str) -> Text:
    return Text(name, style=STATE_STYLES.get(name, ""))


def _bar_of(done: int, total: int, state: str, width: int) -> ProgressBar:
    """A progress bar in its run's colour (named colours: a 16-colour terminal shows them too)."""
    colour = {"FAILED": "red", "STOPPED": "yellow", "STOPPING": "yellow", "RESTARTING": "yellow"}
    return ProgressBar(
        total=total,
        completed=min(done, total),
        width=width,
        complete_style=colour.get(state, "cyan"),
        finished_style=colour.get(state, "green"),
    )


def _progress(done: int, total: int, state: str) -> RenderableType:
    if total <= 0:
        return Text(f"step {done}")
    bar = _bar_of(done, total, state, 40)
    grid = Table.grid(padding=(0, 1))
    grid.add_row(bar, Text(f"{done}/{total} ({min(1.0, done / total):.0%})"))
    return grid


def _marks(items: Iterable[tuple[str, str]]) -> Text:
    return Text(", ").join(Text(text, style=style) for text, style in items)


def run_table(mirror: StateMirror, *, address: str = "") -> RenderableType:
    """The run as a rich renderable: its state in colour, attempt, master, progress bar, and a
    row per rank (state, step, loss, steps/s, heartbeat age, host/pid, marks); the root cause
    and the end of its traceback when it failed."""
    m = mirror
    head = Text.assemble(
        ("orch run ", "bold"),
        (printable(m.run_id, one_line=True) or "?", "bold"),
        "  ",
        _state(m.state.value),
        f"  attempt {m.attempt}/{m.max_attempts}  {m.registered}/{m.world_size} ranks"
        f"  elapsed {m.elapsed:.1f}s",
    )
    where = []  # on a line of its own: the first stays short enough for an 80-column terminal
    if address:
        where.append(f"master {printable(address, one_line=True)}")
    if m.rendezvous:
        where.append(f"rendezvous {printable(m.rendezvous, one_line=True)}")
    if m.job is not None:  # the scheduler's job: its queue state while it waits, then its nodes
        where.append(printable(m.job.describe(), one_line=True))
    if where:
        head.append("\n" + "  ".join(where))

    # No header style, and only the right padding: the header reads "rank  state ..." as
    # plain text, which is what a test of the terminal (and a reader of a log of it) finds.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="", padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column("rank", justify="right")
    table.add_column("state")
    table.add_column("step", justify="right")
    table.add_column("loss", justify="right")
    table.add_column("steps/s", justify="right")
    table.add_column("heartbeat", justify="right")
    table.add_column("d/c/w/o ms", no_wrap=True, overflow="ellipsis")
    table.add_column("host/pid", no_wrap=True, overflow="ellipsis")
    table.add_column("marks", no_wrap=True, overflow="ellipsis")
    slow = stragglers(m)
    longest = max((r.step_ms for r in m.ranks if r.timed), default=0.0)
    for r in m.ranks:
        marks = []
        if m.failure and r.rank == m.root_cause_rank:
            marks.append(("root cause", "bold red"))
        if r.rank in slow:
            marks.append((f"straggler: {printable(m.straggler_section, one_line=True)}", "bold yellow"))
        if r.diverged:
            marks.append(("NaN/inf loss", "bold red"))
        if r.dropped_points:
            marks.append((f"{r.dropped_points} points dropped", "yellow"))
        table.add_row(
            Text(str(r.rank)),
            _state(r.state.value),
            Text(str(r.step)),
            Text(r.loss_text(), style="red" if r.diverged else ""),
            Text(f"{r.steps_per_sec:.1f}"),
            Text(_fmt_age(r.heartbeat_age)),
            split_bar(r, scale_ms=longest),
            Text(f"{printable(r.host, one_line=True)}/{r.pid}"),  # what the worker says its host is
            _marks(marks),
        )
    parts: list[RenderableType] = [head, _progress(*m.progress(), m.state.value), table]
    if m.straggler_note:
        style = "yellow" if m.straggler_rank >= 0 else ("" if m.stragglers_judged else "dim")
        parts.append(
            Text.assemble(("stragglers: ", "bold"), (printable(m.straggler_note, one_line=True), style))
        )
    if m.failure:
        parts.append(Text.assemble(("root cause: ", "bold red"), printable(m.failure)))
        if m.root_cause_error:
            tail = printable(m.root_cause_error).rstrip().splitlines()[-TRACEBACK_LINES:]
            parts.append(Text("\n".join(tail), style="dim"))
    return Group(*parts)


def show(mirror: StateMirror, *, address: str = "", out: TextIO | None = None) -> None:
    """Print the run once (``orch status``): the rich view on a terminal, else :func:`render`."""
    out = out or sys.stdout
    if _is_terminal(out):
        Console(file=out, force_terminal=True).print(run_table(mirror, address=address))
    else:
        out.write(render(mirror, address=address) + "\n")
        out.flush()


# -- a sweep ----------------------------------------------------------------------------------
def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _config_text(config: dict[str, Any]) -> str:
    return printable(", ".join(f"{k}={v!r}" for k, v in config.items()), one_line=True)


def _step_text(row: dict[str, Any]) -> str:
    step, total = int(row.get("step", 0)), int(row.get("total", 0))
    return f"{step}/{total}" if total > 0 else str(step)


def _counts(rows: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row.get("state", ""))] = counts.get(str(row.get("state", "")), 0) + 1
    return ", ".join(f"{n} {printable(s, one_line=True)}" for s, n in sorted(counts.items()))


def render_sweep_plain(rows: list[dict[str, Any]], metric: str = "loss") -> str:
    """The sweep as plain text, no escape codes: a line per run, the best one marked."""
    name = printable(metric, one_line=True)
    lines = [
        f"sweep: {len(rows)} runs: {_counts(rows)}",
        f"{'#':>3}  {'state':<10} {'step':>11} {'last ' + name:>12} {'best ' + name:>12}  "
        f"{'run':<12}  config",
    ]
    for row in rows:
        state = printable(str(row.get("state", "")), one_line=True)
        line = (
            f"{row.get('index', 0):>3}  {state:<10} {_step_text(row):>11} "
            f"{_num(row.get('last', {}).get(metric)):>12} {_num(row.get('best', {}).get(metric)):>12}  "
            f"{printable(str(row.get('run_id', '')), one_line=True) or '-':<12}  "
            f"{_config_text(row.get('config', {}))}"
        )
        if row.get("best_run"):
            line += "  <- best"
        if row.get("failure"):
            line += f"  {state}: {printable(str(row['failure']), one_line=True)}"
        lines.append(line)
    return "\n".join(lines)


def sweep_table(rows: list[dict[str, Any]], metric: str = "loss") -> RenderableType:
    """The sweep as a rich renderable: a row per run, its state in colour, a progress bar, the
    metric's last and best values; the best run bold and marked, a failure in red."""
    name = printable(metric, one_line=True)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="", padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("state")
    table.add_column("progress", no_wrap=True)
    table.add_column("step", justify="right")
    table.add_column(Text(f"last {name}"), justify="right")
    table.add_column(Text(f"best {name}"), justify="right")
    table.add_column("run", no_wrap=True)
    table.add_column("config", overflow="fold")
    table.add_column("", no_wrap=True, overflow="ellipsis")
    for row in rows:
        state = printable(str(row.get("state", "")), one_line=True)
        total = int(row.get("total", 0))
        bar = _bar_of(int(row.get("step", 0)), total, state, 12) if total > 0 else Text("")
        note = Text("")
        if row.get("best_run"):
            note = Text("★ best", style="bold green")
        if row.get("failure"):
            note = Text(printable(str(row["failure"]), one_line=True), style="red")
        table.add_row(
            Text(str(row.get("index", 0))),
            _state(state),
            bar,
            Text(_step_text(row)),
            Text(_num(row.get("last", {}).get(metric))),
            Text(_num(row.get("best", {}).get(metric))),
            Text(printable(str(row.get("run_id", "")), one_line=True) or "-"),
            Text(_config_text(row.get("config", {}))),
            note,
            style="bold" if row.get("best_run") else None,
        )
    head = Text.assemble(("sweep", "bold"), f"  {len(rows)} runs: {_counts(rows)}")
    return Group(head, table)


# -- drawing on a terminal ----------------------------------------------------------------------
def _is_terminal(out: TextIO) -> bool:
    """A terminal that can move its cursor (TERM=dumb cannot): there the views are redrawn."""
    return bool(getattr(out, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"


def _same_file(a: Any, b: Any) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (AttributeError, OSError, ValueError):
        return False


class _FrameTop(LiveRender):
    """rich's live render, returning to the top of the last frame in one sequence: up to its
    first line (CSI F), then erase to the end of the screen (CSI J), which also clears what a
    longer previous frame left below."""

    def position_cursor(self) -> Control:
        height = self.last_render_height
        control = Control()
        if height:
            up = f"\x1b[{height - 1}F" if height > 1 else "\r"
            control.segment = Segment(up + "\x1b[J", None, [(ControlType.CURSOR_UP, height - 1)])
        return control


class _Screen:
    """Where a dashboard draws: a ``rich.live.Live`` on a terminal, started on the first frame."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = _is_terminal(out)
        self._live: Live | None = None

    def frame(self, view: RenderableType) -> None:
        if self._live is None:
            console = Console(file=self.out, force_terminal=True, force_interactive=True)
            # Only the streams that reach this terminal print above the live view; a stderr sent
            # to a file stays in that file.
            live = Live(
                view,
                console=console,
                auto_refresh=False,
                redirect_stdout=_same_file(sys.stdout, self.out),
                redirect_stderr=_same_file(sys.stderr, self.out),
            )
            live._live_render = _FrameTop(view, vertical_overflow=live.vertical_overflow)
            live.start(refresh=True)
            self._live = live
        else:
            self._live.update(view, refresh=True)

    def close(self) -> None:
        """Leave the last frame on the screen, the cursor below it and shown again."""
        if self._live is not None:
            self._live.stop()
            self._live = None


class Dashboard:
    """Polls ``client`` every ``interval`` seconds and draws the run until it ends: redrawn in
    place on a terminal, a plain line every ``plain_every`` seconds elsewhere."""

    def __init__(
        self,
        client: MasterClient,
        *,
        out: TextIO | None = None,
        interval: float = 0.5,
        plain_every: float = 5.0,
    ) -> None:
        self.client = client
        self.out = out or sys.stdout
        self.interval = interval
        self.plain_every = plain_every
        self.mirror = StateMirror()
        self._last_plain = -math.inf
        self._screen = _Screen(self.out)
        self._tty = self._screen.tty
        self._job = ""  # the scheduler job's state last written (plain lines)

    def poll(self) -> StateMirror:
        return self.mirror.poll(self.client, skip_series=True)  # the table needs no points

    def draw(self) -> None:
        if self._tty:
            self._screen.frame(run_table(self.mirror, address=self.client.address))
            return
        job = self.mirror.job.describe() if self.mirror.job is not None else ""
        if job != self._job:  # a line each time the job's state changes: queued, running, over
            self._job = job
            self.out.write(printable(job, one_line=True) + "\n")
        now = time.monotonic()
        if now - self._last_plain < self.plain_every and not self.mirror.state.done:
            return
        self._last_plain = now
        done, total = self.mirror.progress()
        losses = " ".join(r.loss_text() for r in self.mirror.ranks)
        self.out.write(
            f"[{self.mirror.elapsed:6.1f}s] {self.mirror.state.value} step {done}"
            f"{'/' + str(total) if total else ''} loss per rank: {losses}\n"
        )
        self.out.flush()

    def close(self) -> None:
        """End the live view (``run`` does): the last frame stays, the cursor is shown."""
        self._screen.close()

    def run(self, stop: threading.Event | None = None) -> StateMirror:
        """Draw until the run is over (or ``stop`` is set); return the final state."""
        failures = 0
        try:
            while True:
                try:
                    self.poll()
                    failures = 0
                except MasterUnavailable:
                    failures += 1
                    if failures > 10:
                        raise
                self.draw()
                if self.mirror.state.done or (stop is not None and stop.is_set()):
                    return self.mirror
                time.sleep(self.interval)
        finally:
            self.close()


class SweepDashboard:
    """Draws ``rows()`` (a row per run of a sweep, as :func:`sweep_table` takes them) every
    ``interval`` seconds until ``done()`` returns True: redrawn in place on a terminal; a
    line of counts every ``plain_every`` seconds elsewhere, and the plain table at the end."""

    def __init__(
        self,
        rows: Callable[[], list[dict[str, Any]]],
        done: Callable[[], bool],
        *,
        metric: str = "loss",
        out: TextIO | None = None,
        interval: float = 0.5,
        plain_every: float = 5.0,
    ) -> None:
        self.rows = rows
        self.done = done
        self.metric = metric
        self.out = out or sys.stdout
        self.interval = interval
        self.plain_every = plain_every
        self._screen = _Screen(self.out)
        self._started = time.monotonic()
        self._last_plain = -math.inf

    def draw(self, rows: list[dict[str, Any]], *, final: bool = False) -> None:
        if self._screen.tty:
            self._screen.frame(sweep_table(rows, self.metric))
            return
        now = time.monotonic()
        if final:
            self.out.write(render_sweep_plain(rows, self.metric) + "\n")
        elif now - self._last_plain >= self.plain_every:
            self._last_plain = now
            best = [r for r in rows if r.get("best_run")]
            note = ""
            if best:
                value = _num(best[0].get("last", {}).get(self.metric))
                note = f"; best #{best[0].get('index', 0)} {printable(self.metric, one_line=True)} {value}"
            self.out.write(f"[{now - self._started:6.1f}s] sweep: {_counts(rows)}{note}\n")
        self.out.flush()

    def close(self) -> None:
        self._screen.close()

    def run(self, stop: threading.Event | None = None) -> list[dict[str, Any]]:
        """Draw until ``done()`` (or ``stop`` is set); return the last rows drawn."""
        try:
            while True:
                finished = self.done() or (stop is not None and stop.is_set())
                rows = self.rows()  # read after done(): the rows of a finished sweep are final
                self.draw(rows, final=finished)
                if finished:
                    return rows
                time.sleep(self.interval)
        finally:
            self.close()

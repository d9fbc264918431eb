"""What the terminal dashboards show, as plain text and as ``rich`` renderables, with no terminal.

One run (``orch run``, ``orch master``, ``orch status``): :func:`render` is its plain text,
for files, pipes and logs, :func:`run_table` its rich view, :func:`summary` the few lines
a run ends with. A sweep: :func:`render_sweep_plain` and :func:`sweep_table`. They are pure
functions of a :class:`~orch.wire.client.StateMirror` or a sweep's rows, tested without a
terminal; :mod:`orch.views.dashboard` draws them live, and the notebook panel shares
:func:`summary`. The rank table's rows and their marks are decided in
:mod:`orch.views.rank_rows`, the same for the notebook's table: here they are only drawn.

What a worker or a remote host says (host names, errors, tracebacks) goes through
:func:`printable` and into a ``rich.text.Text``, never through rich markup: it is shown,
never obeyed, whether it holds a terminal escape or a ``[bold red]`` tag.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from orch._text import number_text, printable, size_text, value_text
from orch.experiments.results import nonfinite_text
from orch.master.control.stragglers import too_short
from orch.views.rank_rows import MarkKind, nonfinite_marks, rank_table
from orch.wire.client import StateMirror
from orch.wire.ranks import RankView

TRACEBACK_LINES = 8  # of the root cause's traceback, the live view shows the last lines
STACK_LINES = 24  # of a stalled run's grouped stacks, the live view shows the first lines

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
    "PRUNED": "dim magenta",
}


def _bar(done: int, total: int, width: int = 30) -> str:
    if total <= 0:
        return f"step {done}"
    frac = min(1.0, done / total)
    fill = round(frac * width)
    return f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total} ({frac:.0%})"


def straggler_note(mirror: StateMirror) -> str:
    """The straggler judgement as the views show it: none for a run that ended too short to be
    judged, which has nothing to say (its record and ``orch show`` keep the note)."""
    note = mirror.straggler_note
    return "" if mirror.state.done and too_short(note) else note


# Each rank's step, split (ms per step over the last seconds), and its compute against the
# fastest rank's: "data/compute/wait/other x1.00". A section of ctx.section's is drawn out of
# compute in a colour of its own; the part the straggler is slow in, in red.
SPLIT_HEADER = "ms data/comp/wait/oth  rel"
SPLIT_WIDTH = len(SPLIT_HEADER)
PARTS = (("data", "blue"), ("compute", "yellow"), ("wait", "bright_black"), ("other", "magenta"))
SECTION_STYLES = ("green", "bright_red", "bright_magenta", "cyan", "bright_green", "bright_blue")
SLOW_STYLE = "bold red"


def section_styles(mirror: StateMirror) -> dict[str, str]:
    """A colour for each section a rank marked, the same on every row and in the legend."""
    names = sorted({name for r in mirror.ranks if r.timed for name in r.section_ms})
    return {name: SECTION_STYLES[i % len(SECTION_STYLES)] for i, name in enumerate(names)}


def split_text(r: RankView) -> str:
    """``2/33/5/1 x1.25``: a rank's step split in ms, and its relative score ("-": not timed).
    A step timed by ctx.log alone has no data part (``-/33/5/1``: not split); its sections
    follow, as parts of compute (``augment 20``)."""
    if not r.timed:
        return "-"
    data = "-" if r.timed_by == "ctx.log" else f"{r.data_ms:.0f}"
    parts = "/".join([data, *(f"{v:.0f}" for v in (r.compute_ms, r.collective_ms, r.other_ms))])
    marked = "".join(f" {printable(n, one_line=True)} {ms:.0f}" for n, ms in sorted(r.section_ms.items()))
    return f"{parts} x{r.relative_score:.2f}{marked}"


def split_bar(
    r: RankView, width: int = 8, scale_ms: float = 0.0, sections: dict[str, str] | None = None
) -> Text:
    """A rank's step as a stacked bar of ``width`` cells (data, its sections, the rest of
    compute, wait, other), scaled to ``scale_ms`` (the longest step shown), the part the
    straggler is slow in red; then its text."""
    if not r.timed:
        return Text("-")
    styles = dict(PARTS)
    own = "own time" if r.timed_by == "ctx.log" else "compute"
    colors = sections or {}
    marked = [(n, colors.get(n, SECTION_STYLES[0]), ms) for n, ms in sorted(r.section_ms.items())]
    rest = max(0.0, r.compute_ms - sum(ms for _, _, ms in marked))
    parts = [("data", styles["data"], r.data_ms), *marked, (own, styles["compute"], rest)]
    parts += [("wait", styles["wait"], r.collective_ms), ("other", styles["other"], r.other_ms)]
    total = max(scale_ms, sum(v for _, _, v in parts)) or 1.0
    bar = Text()
    for name, style, v in parts:
        bar.append("█" * round(width * v / total), style=SLOW_STYLE if name == r.slow_in else style)
    return bar + Text(" " + split_text(r))


def sections_legend(sections: dict[str, str]) -> Text:
    """The sections' colours, under the rank table: ``sections: ██ augment``."""
    legend = Text()
    legend.append("sections (parts of compute):", style="dim")
    for name, style in sections.items():
        legend.append(" ")
        legend.append("██", style=style)
        legend.append(" " + printable(name, one_line=True))
    return legend


MEMORY_WIDTH = len("999 MB 100%")


# -- one run: plain text ----------------------------------------------------------------------
def startup_text(m: StateMirror) -> str:
    """What the run does before its first step: "3/4 registered" (how long: the run's one clock,
    its elapsed time, counts from the launch)."""
    return printable(m.startup_note, one_line=True)


def render(mirror: StateMirror, *, address: str = "") -> str:
    """The run as plain text, no escape codes: for files, pipes and ``orch status``."""
    done, total = mirror.progress()
    table = rank_table(mirror, max_rows=None)  # a file or a pipe keeps every rank
    rate_w = max([8, *(len(row.rate) for row in table.rows)])  # "0.0412 mean" is wider than 8
    lines = [
        f"orch run {printable(mirror.run_id, one_line=True) or '?'}  {mirror.state.value:<9}  "
        f"{mirror.registered}/{mirror.world_size} ranks  elapsed {mirror.elapsed:6.1f}s"
        + (f"  attempt {mirror.attempt}/{mirror.max_attempts}" if mirror.max_attempts > 1 else "")
        + (f"  master {printable(address, one_line=True)}" if address else "")
        + (f"  rendezvous {printable(str(mirror.rendezvous), one_line=True)}" if mirror.rendezvous else ""),
        *([printable(mirror.job.describe(), one_line=True)] if mirror.job is not None else []),
        _bar(done, total),
        "",
        f"{'rank':>4}  {'state':<10} {'step':>7} {'loss':>10} {'steps/s':>{rate_w}} {'heartbeat':>9}  "
        f"{'memory cpu':<{MEMORY_WIDTH}}  {SPLIT_HEADER:<{SPLIT_WIDTH}}  host/pid",
    ]
    for row in table.rows:
        r = row.view
        lines.append(
            f"{row.rank:>4}  {row.state.value:<10} {row.step:>7} {row.loss:>10} "
            f"{row.rate:>{rate_w}} {row.heartbeat:>9}  "
            f"{row.memory:<{MEMORY_WIDTH}}  {split_text(r):<{SPLIT_WIDTH}}  {row.host}/{row.pid}"
            + (f"  <- {', '.join(mark.text for mark in row.marks)}" if row.marks else "")
        )
    if mirror.startup_note:
        lines += ["", f"starting: {startup_text(mirror)}"]
    if note := straggler_note(mirror):
        lines += ["", f"stragglers: {printable(note, one_line=True)}"]
    if mirror.progress_note:
        lines += ["", f"progress: {printable(mirror.progress_note, one_line=True)}"]
    if mirror.stalled_for > 0 and mirror.stacks:
        lines += ["", "stacks:", printable(mirror.stacks).rstrip()]
    if mirror.failure:
        lines += ["", f"FAILED: {printable(mirror.failure)}"]
    return "\n".join(lines)


def summary(mirror: StateMirror) -> str:
    lines = [f"run {printable(mirror.run_id, one_line=True)} {mirror.state.value} in {mirror.elapsed:.1f}s"]
    bad = nonfinite_marks(mirror)
    for r in mirror.ranks:
        lines.append(
            f"  rank {r.rank}: {r.state.value}, step {r.step}, loss {r.loss_text()}"
            + (f", params {printable(r.param_checksum, one_line=True)[:12]}" if r.param_checksum else "")
            + (f" ({bad[r.rank]})" if r.rank in bad else "")
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
    colour["PRUNED"] = "magenta"
    return ProgressBar(
        total=total,
        completed=min(done, total),
        width=width,
        complete_style=colour.get(state, "cyan"),
        finished_style=colour.get(state, "green"),
    )


def _progress(done: int, total: int, state: str) -> RenderableType:
    if total <= 0:  # no known total: a count (and a spinner while it runs), never a bar
        if state in ("RUNNING", "STOPPING"):
            return Spinner("dots", text=Text(f"step {done}"), style="cyan")
        return Text(f"step {done}")
    bar = _bar_of(done, total, state, 40)
    grid = Table.grid(padding=(0, 1))
    grid.add_row(bar, Text(f"{done}/{total} ({min(1.0, done / total):.0%})"))
    return grid


# How each mark on a rank's row looks (see orch.views.rank_rows: which rank has which).
MARK_STYLES = {
    MarkKind.ROOT_CAUSE: "bold red",
    MarkKind.STRAGGLER: "bold yellow",
    MarkKind.NONFINITE: "bold red",
    MarkKind.DROPPED: "yellow",
    MarkKind.ODD: "bold red",
    MarkKind.STILL: "bold yellow",
    MarkKind.MEMORY: "bold yellow",
    MarkKind.NOTE: "bold yellow",
    MarkKind.STOPPED_BY: "dim",
}


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
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        header_style="",
        padding=(0, 1, 0, 0),
        pad_edge=False,
        expand=True,
    )
    table.add_column("rank", justify="right")
    table.add_column("state")
    table.add_column("step", justify="right")
    table.add_column("loss", justify="right")
    table.add_column("steps/s", justify="right")
    table.add_column("heartbeat", justify="right")
    table.add_column("mem", justify="right", no_wrap=True, overflow="ellipsis")  # narrow: 80 columns
    table.add_column("d/c/w/o ms", no_wrap=True, overflow="ellipsis")
    table.add_column("host/pid", no_wrap=True, overflow="ellipsis")
    table.add_column("marks", no_wrap=True, overflow="ellipsis", ratio=1)
    rows = rank_table(m)
    longest = max((r.step_ms for r in m.ranks if r.timed), default=0.0)
    sections = section_styles(m)
    for row in rows.rows:
        r = row.view
        mem = size_text(r.rss_bytes).replace(" ", "") if r.rss_bytes else "-"  # narrow: 80 columns
        table.add_row(
            Text(str(row.rank)),
            _state(row.state.value),
            Text(str(row.step)),
            Text(row.loss, style="red" if row.diverged else ""),
            Text(row.rate),
            Text(row.heartbeat),
            Text(mem, style="yellow" if row.mark(MarkKind.MEMORY) else ""),
            split_bar(r, scale_ms=longest, sections=sections),
            Text(f"{row.host}/{row.pid}"),  # what the worker says its host is
            Text(", ").join(Text(mark.text, style=MARK_STYLES[mark.kind]) for mark in row.marks),
        )
    parts: list[RenderableType] = [head, _progress(*m.progress(), m.state.value), table]
    if rows.more:  # past MAX_TABLE_ROWS ranks: the rows with a mark first, a line counts the rest
        parts.append(Text(rows.more, style="dim"))
    if sections:
        parts.append(sections_legend(sections))
    if m.startup_note:
        parts.append(Text.assemble(("starting: ", "bold"), (startup_text(m), "")))
    if note := straggler_note(m):
        style = "yellow" if m.straggler_rank >= 0 else ("" if m.stragglers_judged else "dim")
        parts.append(Text.assemble(("stragglers: ", "bold"), (printable(note, one_line=True), style)))
    if m.progress_note:
        style = "bold red" if m.stalled_for > 0 else "yellow"
        parts.append(
            Text.assemble(("progress: ", "bold"), (printable(m.progress_note, one_line=True), style))
        )
    if m.stalled_for > 0 and m.stacks:
        lines = printable(m.stacks).rstrip().splitlines()
        shown = lines[:STACK_LINES] + (
            [f"... ({len(lines) - STACK_LINES} more lines: orch stacks)"] if len(lines) > STACK_LINES else []
        )
        parts.append(Text("\n".join(shown)))
    if m.failure:
        parts.append(Text.assemble(("root cause: ", "bold red"), printable(m.failure)))
        if m.root_cause_error:
            tail = printable(m.root_cause_error).rstrip().splitlines()[-TRACEBACK_LINES:]
            parts.append(Text("\n".join(tail), style="dim"))
    return Group(*parts)


# -- a sweep ----------------------------------------------------------------------------------
def _config_text(config: dict[str, Any]) -> str:
    # a string quoted, as the config was written; a number as every view writes it (lr=0.4457)
    shown = ", ".join(
        f"{k}={v!r}" if isinstance(v, str) else f"{k}={value_text(v)}" for k, v in config.items()
    )
    return printable(shown, one_line=True)


def _step_text(row: dict[str, Any]) -> str:
    step, total = int(row.get("step", 0)), int(row.get("total", 0))
    return f"{step}/{total}" if total > 0 else str(step)


def state_counts(rows: list[dict[str, Any]]) -> str:
    """How many of a sweep's runs are in each state: ``2 RUNNING, 1 SUCCEEDED``."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row.get("state", ""))] = counts.get(str(row.get("state", "")), 0) + 1
    return ", ".join(f"{n} {printable(s, one_line=True)}" for s, n in sorted(counts.items()))


def render_sweep_plain(rows: list[dict[str, Any]], metric: str = "loss") -> str:
    """The sweep as plain text, no escape codes: a line per run, the best one marked."""
    name = printable(metric, one_line=True)
    lines = [
        f"sweep: {len(rows)} runs: {state_counts(rows)}",
        f"{'#':>3}  {'state':<10} {'step':>11} {'last ' + name:>12} {'best ' + name:>12}  "
        f"{'run':<12}  config",
    ]
    for row in rows:
        state = printable(str(row.get("state", "")), one_line=True)
        line = (
            f"{row.get('index', 0):>3}  {state:<10} {_step_text(row):>11} "
            f"{number_text(row.get('last', {}).get(metric)):>12} "
            f"{number_text(row.get('best', {}).get(metric)):>12}  "
            f"{printable(str(row.get('run_id', '')), one_line=True) or '-':<12}  "
            f"{_config_text(row.get('config', {}))}"
        )
        if row.get("best_run"):
            line += "  <- best"
        bad = row.get("nonfinite", {}).get(metric)
        if bad:
            line += f"  {name} {nonfinite_text(bad)}"
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
        bad = row.get("nonfinite", {}).get(metric)
        if bad:
            note = Text(f"{name} {nonfinite_text(bad)}", style="bold red")
        if row.get("failure"):
            note = Text(printable(str(row["failure"]), one_line=True), style="red")
        table.add_row(
            Text(str(row.get("index", 0))),
            _state(state),
            bar,
            Text(_step_text(row)),
            Text(number_text(row.get("last", {}).get(metric))),
            Text(number_text(row.get("best", {}).get(metric))),
            Text(printable(str(row.get("run_id", "")), one_line=True) or "-"),
            Text(_config_text(row.get("config", {}))),
            note,
            style="bold" if row.get("best_run") else None,
        )
    head = Text.assemble(("sweep", "bold"), f"  {len(rows)} runs: {state_counts(rows)}")
    return Group(head, table)

"""A run as HTML for the notebook: its header, the rank table and the root cause of a failure.

The live panel sets these strings into its ``HTML`` widgets every redraw, and the static
record a saved notebook keeps is built from the same strings: one builder for both, so the
record shows what the live panel showed. They are pure functions of a
:class:`~orch.wire.client.StateMirror`. Everything a worker says (host names, errors,
tracebacks) is escaped. :data:`STATE_COLORS` is the colour of a run state in every notebook
view (the comparison and the sweep panel too).
"""

from __future__ import annotations

from orch._text import escape_html
from orch.views.rank_rows import Mark, MarkKind, RankRow, nonfinite_marks, rank_table
from orch.views.rendering import straggler_note
from orch.wire.client import StateMirror
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

# The colour of a run's state, in every notebook view.
STATE_COLORS = {
    RunState.PENDING: "#777",
    RunState.RUNNING: "#1f6feb",
    RunState.SUCCEEDED: "#1a7f37",
    RunState.FAILED: "#cf222e",
    RunState.STOPPED: "#9a6700",
    RunState.RESTARTING: "#9a6700",
    RunState.STOPPING: "#bc4c00",
    RunState.PRUNED: "#8250df",
}

# The parts of a step, as the rank table's stacked bar draws them; a section marked with
# ctx.section is a part of its own (drawn out of compute), in a colour of SECTION_COLORS.
SPLIT_COLORS = (
    ("data", "#54aeff"),
    ("compute", "#d4a72c"),
    ("collective wait", "#afb8c1"),
    ("other", "#a475f9"),
)
SECTION_COLORS = ("#2da44e", "#fb8f44", "#bf3989", "#1b7c83", "#8c959f", "#6639ba", "#e16f24", "#57ab5a")
SPLIT_WIDTH_PX = 60
OWN_TITLE = "its own time per step: the step less its wait for the other ranks in the collectives"
WALL_TITLE = (
    "the step's wall time, from one step's start to the next (under DDP every rank steps "
    "together, so it is about the same on every rank)"
)
SLOW_PART = "outline:2px solid #cf222e;outline-offset:-1px"  # the straggler's part of its bar


def section_colors(m: StateMirror) -> dict[str, str]:
    """A colour for each section a rank marked, the same on every rank's bar and the legend."""
    names = sorted({name for r in m.ranks if r.timed for name in r.section_ms})
    return {name: SECTION_COLORS[i % len(SECTION_COLORS)] for i, name in enumerate(names)}


def split_parts(r: RankView, sections: dict[str, str]) -> list[tuple[str, str, float]]:
    """A rank's step as (part, colour, ms) in the bar's order: data, its sections, the rest of
    compute, collective wait, other. A step timed by ctx.log alone is not split into data and
    compute: its part is "own time" there."""
    colors = dict(SPLIT_COLORS)
    marked = [(name, sections.get(name, SECTION_COLORS[0]), ms) for name, ms in sorted(r.section_ms.items())]
    rest = max(0.0, r.compute_ms - sum(ms for _, _, ms in marked))
    parts = [] if r.timed_by == "ctx.log" else [("data", colors["data"], r.data_ms)]
    parts += marked
    parts.append(("own time" if r.timed_by == "ctx.log" else "compute", colors["compute"], rest))
    parts.append(("collective wait", colors["collective wait"], r.collective_ms))
    parts.append(("other", colors["other"], r.other_ms))
    return parts


def _split_html(r: RankView, longest_ms: float, sections: dict[str, str]) -> str:
    """A rank's step as a stacked bar (data, sections, compute, collective wait, other), its
    length the step's against the longest shown, the part the straggler is slow in outlined;
    then, on the same line, its own time and the step's wall time (their tooltips say what each is)."""
    if not r.timed:
        return "-"
    parts = split_parts(r, sections)
    scale = SPLIT_WIDTH_PX / (max(longest_ms, sum(v for _, _, v in parts)) or 1.0)
    cells = []
    for name, color, v in parts:
        slow = r.slow_in == name
        cells.append(
            f'<span class="orch-part{" orch-slow-part" if slow else ""}" data-part="{escape_html(name)}" '
            f'title="{escape_html(name)}: {v:.1f} ms{" (the straggler is slow here)" if slow else ""}" '
            f'style="display:inline-block;height:.9em;width:{max(0.0, v * scale):.1f}px;background:{color}'
            f'{";" + SLOW_PART if slow else ""}"></span>'
        )
    return (
        f'<span class="orch-split" style="display:inline-block;width:{SPLIT_WIDTH_PX}px;text-align:left;'
        f'white-space:nowrap;vertical-align:middle">{"".join(cells)}</span> '
        f'<span class="orch-own" title="{OWN_TITLE}">own {r.own_ms:.1f}</span> / '
        f'<span class="orch-wall" title="{WALL_TITLE}">{r.step_ms:.1f} ms</span>'
    )


def _scores_html(r: RankView) -> str:
    """Compute against the fastest rank's and against the rank's own best, in words:
    ``3.86x fastest, 1.00x own best`` (also the step time's tooltip: see :data:`NARROW`)."""
    if not r.timed:
        return "-"
    return (
        f'<span title="its compute time per step against the fastest rank\'s">'
        f"{r.relative_score:.2f}x fastest</span>, "
        f'<span title="its compute time per step against its own best">'
        f"{r.individual_score:.2f}x own best</span>"
    )


def _scores_title(r: RankView) -> str:
    if not r.timed:
        return ""
    return (
        f"its compute time per step: {r.relative_score:.2f}x the fastest rank's, "
        f"{r.individual_score:.2f}x its own best"
    )


# Narrow outputs (a notebook beside JupyterLab's file browser at 1,100 px: 668 px) drop the
# columns whose words are also a tooltip (host/pid on the rank, the heartbeat on the state,
# the compute scores on the step time), so that no column and no mark is cut off. Container
# queries measure the output the table is drawn in, not the window.
NARROW = (
    "@container orch-table (max-width: 960px) {.orch-ranks .orch-wide {display: none}} "
    "@container orch-table (max-width: 800px) {.orch-ranks .orch-roomy {display: none}}"
)


def header_html(m: StateMirror, *, live: bool = True, address: str = "", last_error: str = "") -> str:
    """The run's id, state, elapsed time, ranks and attempts (live: its master, the last error)."""
    color = STATE_COLORS[m.state]
    note = f" &middot; attempt {m.attempt}/{m.max_attempts}" if m.max_attempts > 1 or not live else ""
    if live:
        note = f" &middot; master {escape_html(address)}{note}"
        if last_error:
            note += f" &middot; <i>{escape_html(last_error)}</i>"
    else:
        done, total = m.progress()
        note += f" &middot; step {done}/{total}" if total else f" &middot; step {done}"
    if m.stalled_for > 0:
        note = (
            f' &middot; <span class="orch-stalled" style="color:#cf222e;font-weight:bold">'
            f"not progressing for {m.stalled_for:.0f}s</span>{note}"
        )
    if m.job is not None:  # the scheduler's job: its queue state while it waits, then its nodes
        note += f' &middot; <span class="orch-job">{escape_html(m.job.describe())}</span>'
    return (
        f'<div class="orch-header"><b>orch run {escape_html(m.run_id)}</b> &middot; '
        f'<span class="orch-state" data-state="{m.state.value}" style="color:{color};'
        f'font-weight:bold">{m.state.value}</span> &middot; '
        f'<span class="orch-elapsed">{m.elapsed:.1f}s</span> &middot; '
        f"{m.registered}/{m.world_size} ranks{note}{_startup_html(m)}</div>"
    )


def _startup_html(m: StateMirror) -> str:
    """What the run does before its first step (the header's clock counts from the launch)."""
    if not m.startup_note:
        return ""
    return f'<div class="orch-startup" style="color:#57606a">{escape_html(m.startup_note)}</div>'


def said_nothing(m: StateMirror) -> bool:
    """The run ended and its ranks have nothing for a table but their state: no step, loss,
    rate, step time or mark (a cell that only builds a model, a script that failed at import)."""
    return (
        m.state.done
        and m.straggler_rank < 0
        and not nonfinite_marks(m)
        and not any(
            r.step or r.has_loss or r.steps_per_sec or r.timed or r.dropped_points or r.memory_note or r.note
            for r in m.ranks
        )
    )


def ranks_line_html(m: StateMirror) -> str:
    """The ranks of a run whose table would be empty, in a line: ``2 ranks, both SUCCEEDED``,
    ``FAILED: rank 1; STOPPED: rank 0``."""
    if not m.ranks:
        return '<div class="orch-ranks-line" style="color:#57606a">no rank registered</div>'
    by_state: dict[str, list[int]] = {}
    for r in m.ranks:
        by_state.setdefault(r.state.value, []).append(r.rank)
    if len(by_state) == 1:
        (state, ranks), n = next(iter(by_state.items())), len(m.ranks)
        every = "both" if n == 2 else "all"
        text = f"rank {ranks[0]}: {state}" if n == 1 else f"{n:,} ranks, {every} {state}"
    else:
        failed = (RankState.FAILED.value, RankState.LOST.value)
        order = sorted(by_state.items(), key=lambda kv: (kv[0] not in failed, kv[1][0]))
        text = "; ".join(f"{state}: {_rank_list(ranks)}" for state, ranks in order)
    return f'<div class="orch-ranks-line" style="color:#57606a">{escape_html(text)}</div>'


def _rank_list(ranks: list[int]) -> str:
    listed = ", ".join(map(str, ranks[:8]))
    more = f" and {len(ranks) - 8:,} more" if len(ranks) > 8 else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}{more}"


# How each mark on a rank's row looks (see orch.views.rank_rows: which rank has which): its
# class, its style and what its tooltip says of it.
BOLD_RED, BOLD_AMBER = "color:#cf222e;font-weight:bold", "color:#9a6700;font-weight:bold"
MARK_LOOKS = {
    MarkKind.ROOT_CAUSE: ("orch-root-cause", BOLD_RED, "its failure ended the run (the root cause below)"),
    MarkKind.STRAGGLER: ("orch-slow", BOLD_AMBER, ""),  # its tooltip: the straggler note
    MarkKind.NONFINITE: ("orch-nan", BOLD_RED, "a logged value is NaN or infinite"),
    MarkKind.DROPPED: ("orch-dropped", "", ""),
    MarkKind.ODD: (
        "orch-odd",
        BOLD_RED,
        "its stack differs from the one the other ranks share: they wait on it (the stacks below)",
    ),
    MarkKind.STILL: (
        "orch-still",
        BOLD_AMBER,
        "its step has not advanced; its heartbeats only show its process lives",
    ),
    MarkKind.MEMORY: ("orch-memory", BOLD_AMBER, ""),
    MarkKind.NOTE: ("orch-note", BOLD_AMBER, ""),
    MarkKind.STOPPED_BY: ("orch-stopped-by", "", ""),
}


def _mark_html(mark: Mark) -> str:
    kind, style, title = MARK_LOOKS[mark.kind]
    title = mark.detail or title
    return (
        f'<span class="{kind}"'
        + (f' title="{escape_html(title)}"' if title else "")
        + (f' style="{style}"' if style else "")
        + f">{escape_html(mark.text)}</span>"
    )


def _row_html(row: RankRow, longest: float, sections: dict[str, str]) -> str:
    r = row.view
    color = "#cf222e" if row.state in (RankState.FAILED, RankState.LOST) else "inherit"
    where = escape_html(f"{r.host or '?'}, pid {r.pid}" + (f", {r.worker_id}" if r.worker_id else ""))
    beat = "no heartbeat yet" if r.heartbeat_age < 0 else f"last heartbeat {r.heartbeat_age:.1f}s ago"
    return (
        f'<tr class="orch-rank" data-rank="{row.rank}" style="color:{color}">'
        f'<td class="orch-where" title="{where}">{row.rank}</td><td title="{beat}">{row.state.value}</td>'
        f"<td>{row.step}</td><td>{row.loss}</td>"
        f'<td>{row.rate}</td><td class="orch-wide">{row.heartbeat}</td>'
        f'<td class="orch-mem">{escape_html(row.memory)}</td>'
        f'<td class="orch-step-time" title="{escape_html(_scores_title(r))}">'
        f"{_split_html(r, longest, sections)}</td>"
        f'<td class="orch-roomy">{_scores_html(r)}</td>'
        f'<td class="orch-wide">{escape_html(row.host)}/{row.pid}</td>'
        f'<td class="orch-marks">{" ".join(_mark_html(mark) for mark in row.marks)}</td></tr>'
    )


def table_html(m: StateMirror) -> str:
    """A row per rank (state, step, loss, rate, heartbeat, step split, scores, host, marks),
    the split's legend and the straggler note. In a narrow output the heartbeat, the scores
    and host/pid leave the table for tooltips (on the state, the step time and the rank).
    Past :data:`~orch.views.rank_rows.MAX_TABLE_ROWS` ranks, the ranks with a mark come first
    and a row counts the rest (the rows and their marks: :func:`~orch.views.rank_rows.rank_table`).
    A run that ended with nothing in its table but the ranks' states has their states in a
    line instead (:func:`said_nothing`)."""
    if said_nothing(m):
        return ranks_line_html(m)
    longest = max((r.step_ms for r in m.ranks if r.timed), default=0.0)
    sections = section_colors(m)
    table = rank_table(m)
    rows = [_row_html(row, longest, sections) for row in table.rows]
    if table.more:
        rows.append(f'<tr class="orch-more-ranks"><td colspan="11">{escape_html(table.more)}</td></tr>')
    head = "".join(
        f"<th{f' class={kind!r}' if kind else ''}>{h}</th>"
        for h, kind in (
            ("rank", ""),
            ("state", ""),
            ("step", ""),
            ("loss", ""),
            ("steps/s", ""),
            ("heartbeat", "orch-wide"),
            ("memory cpu", ""),
            ("step time", ""),
            ("compute time vs", "orch-roomy"),
            ("host/pid", "orch-wide"),
            ("", ""),
        )
    )
    # The legend names the parts the bars draw: a section's colour, and "own time" for a step
    # timed by ctx.log, whose bar has no data part.
    drawn = {name: color for r in m.ranks if r.timed for name, color, _ in split_parts(r, sections)}
    order = ["data", *sections, "compute", "own time", "collective wait", "other"]
    entries = [(name, drawn[name]) for name in order if name in drawn] or list(SPLIT_COLORS)
    labels = {"own time": "own time (timed by ctx.log: not split into data and compute)"}
    legend = "".join(
        f'<span class="orch-key" data-part="{escape_html(name)}">'
        f'<span style="display:inline-block;width:.8em;height:.8em;background:{c};margin:0 .2em 0 .8em">'
        f"</span>{escape_html(labels.get(name, name))}</span>"
        for name, c in entries
    )
    note = ""
    if said := straggler_note(m):
        style = "color:#9a6700;font-weight:bold" if m.straggler_rank >= 0 else "color:#57606a"
        note = f'<div class="orch-stragglers" style="{style}">{escape_html(said)}</div>'
    return (
        "<style>.orch-ranks td, .orch-ranks th {padding: 0 .3em; white-space: nowrap} "
        ".orch-ranks th {white-space: nowrap} "
        f".orch-ranks td.orch-marks {{white-space: normal; text-align: left}} {NARROW}</style>"
        '<div class="orch-table" style="container: orch-table / inline-size">'
        '<table class="orch-ranks" style="border-collapse:collapse;text-align:right">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        f'<div class="orch-legend" style="font-size:85%;color:#57606a">step time:{legend}</div>{note}'
    )


def progress_html(m: StateMirror, asked: str = "") -> str:
    """Whether the ranks progress: the note while they stand still (or how a late stop ended),
    and the ranks' grouped stacks, shown unasked while the run is not progressing; ``asked``
    is the text of stacks the user asked for (the panel's Stacks button)."""
    parts = []
    if m.state is RunState.STOPPING and not m.progress_note:
        parts.append(
            '<div class="orch-stopping" style="color:#9a6700">stopping: a <code>ctx.steps</code> loop, '
            "or <code>ctx.data</code> over a DataLoader with a DistributedSampler, ends after its "
            "current step; a loop that only calls <code>ctx.log</code> ends about 2 s of steps later, "
            "at the step the master named</div>"
        )
    if m.progress_note:
        color = "#cf222e" if m.stalled_for > 0 else "#9a6700"
        parts.append(
            f'<div class="orch-progress" style="color:{color};font-weight:bold">'
            f"{escape_html(m.progress_note)}</div>"
        )
    stacks = asked or (m.stacks if m.stalled_for > 0 else "")
    if stacks:
        parts.append(
            '<pre class="orch-stacks" style="font-size:85%;max-height:24em;overflow:auto;'
            f'border-left:3px solid #cf222e;padding-left:.6em">{escape_html(stacks)}</pre>'
        )
    return "".join(parts)


def failure_html(m: StateMirror) -> str:
    """A failed run's root cause and its traceback (nothing for a run that did not fail)."""
    if m.state is not RunState.FAILED:
        return ""
    tb = f"<pre>{escape_html(m.root_cause_error)}</pre>" if m.root_cause_error else ""
    return (
        f'<div class="orch-failure" style="color:#cf222e"><b>Root cause:</b> '
        f"{escape_html(m.failure)}{tb}</div>"
    )

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
from orch.views.rendering import dropped_text, memory_text, still, stragglers
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

# The parts of a step, as the rank table's stacked bar draws them.
SPLIT_COLORS = (
    ("data", "#54aeff"),
    ("compute", "#d4a72c"),
    ("collective wait", "#afb8c1"),
    ("other", "#a475f9"),
)
SPLIT_WIDTH_PX = 90


def _split_html(r: RankView, longest_ms: float) -> str:
    """A rank's step as a stacked bar (data, compute, collective wait, other), its length the
    step's against the longest shown, with the milliseconds on hover and beside it."""
    if not r.timed:
        return "-"
    values = (r.data_ms, r.compute_ms, r.collective_ms, r.other_ms)
    scale = SPLIT_WIDTH_PX / (max(longest_ms, sum(values)) or 1.0)
    cells = "".join(
        f'<span class="orch-part" data-part="{name}" title="{name}: {v:.1f} ms" style="display:inline-block;'
        f'height:.9em;width:{max(0.0, v * scale):.1f}px;background:{color}"></span>'
        for (name, color), v in zip(SPLIT_COLORS, values, strict=True)
    )
    return (
        f'<span class="orch-split" style="display:inline-block;width:{SPLIT_WIDTH_PX}px;text-align:left;'
        f'white-space:nowrap">{cells}</span> {r.step_ms:.1f} ms'
    )


def _scores_html(r: RankView) -> str:
    """Compute against the fastest rank's and against the rank's own best."""
    if not r.timed:
        return "-"
    return (
        f'<span title="compute against the fastest rank\'s">x{r.relative_score:.2f}</span> / '
        f'<span title="compute against its own best">x{r.individual_score:.2f}</span>'
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
        f"{m.registered}/{m.world_size} ranks{note}</div>"
    )


def table_html(m: StateMirror) -> str:
    """A row per rank (state, step, loss, rate, heartbeat, step split, scores, host, marks),
    the split's legend and the straggler note."""
    slow = stragglers(m)
    longest = max((r.step_ms for r in m.ranks if r.timed), default=0.0)
    rows = []
    for r in m.ranks:
        marks = []
        if r.rank in slow:
            section = escape_html(m.straggler_section)
            marks.append(
                f'<span class="orch-slow" title="{escape_html(m.straggler_note)}" '
                f'style="color:#9a6700;font-weight:bold">straggler: {section}</span>'
            )
        if r.diverged:
            marks.append('<span class="orch-nan" title="the loss is not finite">NaN/inf loss</span>')
        if r.dropped_points:
            marks.append(f'<span class="orch-dropped">{escape_html(dropped_text(r))}</span>')
        if still(m, r):
            marks.append(
                '<span class="orch-still" style="color:#cf222e;font-weight:bold" title="its step has '
                'not advanced; its heartbeats only show its process lives">'
                f"no step for {r.progress_age:.0f}s</span>"
            )
        if r.memory_note:
            marks.append(
                '<span class="orch-memory" style="color:#9a6700;font-weight:bold">'
                f"{escape_html(r.memory_note)}</span>"
            )
        color = "#cf222e" if r.state in (RankState.FAILED, RankState.LOST) else "inherit"
        age = "-" if r.heartbeat_age < 0 else f"{r.heartbeat_age:.1f}s"
        rows.append(
            f'<tr class="orch-rank" data-rank="{r.rank}" style="color:{color}">'
            f"<td>{r.rank}</td><td>{r.state.value}</td><td>{r.step}</td><td>{r.loss_text()}</td>"
            f"<td>{r.steps_per_sec:.1f}</td><td>{age}</td>"
            f'<td class="orch-mem">{escape_html(memory_text(r))}</td><td>{_split_html(r, longest)}</td>'
            f"<td>{_scores_html(r)}</td>"
            f'<td>{escape_html(r.host)}/{r.pid}</td><td class="orch-marks">{" ".join(marks)}</td></tr>'
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "rank",
            "state",
            "step",
            "loss",
            "steps/s",
            "heartbeat",
            "memory cpu",
            "step time",
            "vs best",
            "host/pid",
            "",
        )
    )
    legend = "".join(
        f'<span style="display:inline-block;width:.8em;height:.8em;background:{c};margin:0 .2em 0 .8em">'
        f"</span>{name}"
        for name, c in SPLIT_COLORS
    )
    note = ""
    if m.straggler_note:
        style = "color:#9a6700;font-weight:bold" if m.straggler_rank >= 0 else "color:#57606a"
        note = f'<div class="orch-stragglers" style="{style}">{escape_html(m.straggler_note)}</div>'
    return (
        "<style>.orch-ranks td, .orch-ranks th {padding: 0 .6em; white-space: nowrap} "
        ".orch-ranks td.orch-marks {white-space: normal; text-align: left}</style>"
        '<table class="orch-ranks" style="border-collapse:collapse;text-align:right">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f'<div class="orch-legend" style="font-size:85%;color:#57606a">step time:{legend}</div>{note}'
    )


def progress_html(m: StateMirror, asked: str = "") -> str:
    """Whether the ranks progress: the note while they stand still (or how a late stop ended),
    and the ranks' grouped stacks, shown unasked while the run is not progressing; ``asked``
    is the text of stacks the user asked for (the panel's Stacks button)."""
    parts = []
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

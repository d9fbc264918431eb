"""The live panel of a sweep: a curve per run, a row per run, Stop, and each run's own panel.

The plot is :class:`~orch.views.comparison.RunsView`'s: each run's metric as its mean over ranks
with a min-max band, in the run's colour, the best succeeded run drawn bold. With a pruner, the
pruned runs are drawn faded and cut at the rung they were judged at (an x), the rungs are dotted
verticals, and the best value any run reached so far a dashed level. Trials a search draws as
it goes (an Optuna sampler) join the plot and the table as they start. Below it a
row per config (its values, state, progress, last and best value of the metric), in
config order or sorted by the metric; the best run is marked, and a click on a row's
button opens that run's per-rank panel under the table.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from orch._text import config_text, escape_html, number_text, value_text
from orch.experiments.metrics import default_mode
from orch.experiments.trial import CANCELLED
from orch.views.comparison import RunsView, _swatch
from orch.views.followers import Curve, TrialFollower, curve
from orch.views.panel import own_metric
from orch.views.run_html import STATE_COLORS
from orch.views.waiting import answer_while_waiting
from orch.wire.client import StateMirror
from orch.wire.states import RunState

if TYPE_CHECKING:
    from orch.experiments.sweep import Sweep
    from orch.experiments.trial import Trial

# The widest a cell of the table gets (in ``ch``); a failure or a NaN note under a row wraps
# anywhere, a path included, instead of passing the output's edge.
CELL_CH = 14
WRAP = "white-space:normal;overflow-wrap:anywhere"

# The record's results table in a narrow output (a notebook beside JupyterLab's file browser at
# 1,100 px: 668 px): narrower padding, its cells wrapped between words, and the last column (the
# failure, when a config failed) anywhere, a path included, so that no column passes the edge.
RESULTS_FIT = (
    "<style>.orch-sweep-results {max-width: 100%} .orch-sweep-results td, .orch-sweep-results th "
    "{padding: .3em .4em}</style>"
)
FAILURE_FIT = "<style>.orch-sweep-results td:last-child {overflow-wrap: anywhere}</style>"

SORTS = [("config order", ""), ("metric, least first", "min"), ("metric, greatest first", "max")]


class SweepPanel(RunsView):
    """The view of one sweep. Display it (``sweep.panel()`` as the last value of a cell)."""

    def __init__(self, sweep: Sweep, **options: Any) -> None:
        self.sweep = sweep
        self.opened: int | None = None  # the config whose per-rank panel is shown
        super().__init__([TrialFollower(t) for t in sweep.trials], **options)

    def _layout(self) -> None:
        self.progress = widgets.IntProgress(
            value=0, min=0, max=len(self.sweep.trials), description="runs", layout=widgets.Layout(width="60%")
        )
        self.progress_label = widgets.Label()
        self.sort = widgets.Dropdown(options=SORTS, value="", description="sort")
        self.sort.observe(lambda _c: self._redraw_now(), names="value")
        answer_while_waiting(self.sort)
        self.stop_button = widgets.Button(
            description="Stop all",
            button_style="warning",
            icon="stop",
            tooltip="stop every run; start no more",
        )
        self.stop_button.on_click(self._on_stop)
        answer_while_waiting(self.stop_button)
        self.table_head = widgets.HTML()
        self.table_head.add_class("orch-trial-head")
        self.rows: list[tuple[widgets.Button, widgets.HTML]] = []
        for trial in self.sweep.trials:
            self._add_row(trial)
        self.table = widgets.VBox()
        self.detail = widgets.VBox()
        self.widget.children = [
            self.header,
            widgets.HBox([self.progress, self.progress_label]),
            widgets.HBox([self.metric, self.x_axis, self.log_scale]),
            widgets.HBox([self.sort, self.stop_button]),
            self.plot,
            self.table_head,
            self.table,
            self.detail,
        ]
        self.widget.add_class("orch-sweep-panel")

    def _add_row(self, trial: Trial) -> None:
        button = widgets.Button(
            description=f"#{trial.index}",
            tooltip="open this run's per-rank panel",
            layout=widgets.Layout(width="52px"),
        )
        button.on_click(lambda _b, i=trial.index: self.open(i))
        answer_while_waiting(button)
        cells = widgets.HTML()
        cells.add_class("orch-trial-row")
        self.rows.append((button, cells))

    def _grow(self) -> None:
        """The trials a search drew since the last poll: a follower, a mirror and a row each."""
        trials = list(self.sweep.trials)
        for trial in trials[len(self.runs) :]:
            self.runs.append(TrialFollower(trial))
            self.mirrors.append(StateMirror())
            self._add_row(trial)
        self.progress.max = max(len(trials), self.sweep.size)

    # -- actions ----------------------------------------------------------------------------
    def _on_stop(self, _button: Any) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping…"
        try:
            self.sweep.stop(reason="Stop pressed in the sweep panel")
        except Exception as e:  # say so on the button; the runs keep their own state
            self.stop_button.description = f"Stop failed: {e}"[:60]

    def open(self, index: int) -> None:
        """Show config ``index``'s per-rank panel under the table (a row's button does this)."""
        trial = self.sweep.trials[index]
        source = trial.source()
        if source is None:
            self.detail.children = [widgets.HTML(f"<i>run #{index} has not started yet</i>")]
            return
        self.opened = index
        title = widgets.HTML(
            f'<b class="orch-opened" data-index="{index}">run #{index}</b> '
            f"{escape_html(config_text(trial.config))}"
        )
        self.detail.children = [title, source.panel().widget]

    # -- drawing ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        # The sweep's own end too: the record must not say "running" for the gap between its
        # last run's end and the scheduler's.
        return super().done and self.sweep.done

    def marked(self) -> int | None:
        """The succeeded run whose metric ended best (least; greatest for an accuracy or a score)."""
        metric = self.metric.value or "loss"
        sign = -1.0 if default_mode(metric) == "max" else 1.0
        best: tuple[float, int] | None = None
        for i, m in enumerate(self.mirrors):
            if m.state is not RunState.SUCCEEDED or _ends_nonfinite(m, metric):
                continue
            c = curve(m, metric)
            if len(c.mean) and math.isfinite(c.mean[-1]) and (best is None or sign * c.mean[-1] < best[0]):
                best = (sign * float(c.mean[-1]), i)
        return best[1] if best else None

    def curves(self) -> list[tuple[str, int, Curve, bool]]:
        """The runs' curves, a pruned run's cut at the step it was judged at."""
        out = super().curves()
        metric = self.metric.value or "loss"
        for i, trial in enumerate(self.sweep.trials[: len(out)]):
            if trial.state == RunState.PRUNED.value and trial.pruned_at is not None:
                label, color, c, marked = out[i]
                steps = curve(self.mirrors[i], metric).x
                n = int((steps <= trial.pruned_at).sum())
                out[i] = (label, color, Curve(c.x[:n], c.mean[:n], c.lo[:n], c.hi[:n]), marked)
        return out

    def _decorations(self) -> dict[str, Any]:
        pruner = self.sweep.pruner
        if pruner is None:
            return {}
        metric = self.metric.value or "loss"
        trials = self.sweep.trials[: len(self.mirrors)]
        faded = frozenset(i for i, t in enumerate(trials) if t.state == RunState.PRUNED.value)
        best: float | None = None
        if metric == pruner.metric:
            sign = -1.0 if self.sweep.mode == "max" else 1.0
            values = [sign * v for t in self.sweep.trials for v in t.reported.values() if math.isfinite(v)]
            values += [
                sign * float(mean[-1])
                for m in self.mirrors
                if m.state is RunState.SUCCEEDED and len(mean := curve(m, metric).mean)
            ]
            best = sign * min(values) if values else None
        return {"faded": faded, "rungs": pruner.rungs(), "best_so_far": best}

    def _header_html(self) -> str:
        trials = self.sweep.trials
        failed = sum(t.state == RunState.FAILED.value for t in trials)
        pruned = sum(t.state == RunState.PRUNED.value for t in trials)
        running = sum(not t.done and t.run is not None for t in trials)
        state = "done" if self.sweep.done else "running"
        note = f" &middot; <i>{escape_html(self.last_error)}</i>" if self.last_error else ""
        pruner = self.sweep.pruner
        pruning = f" &middot; {pruned} pruned ({escape_html(repr(pruner))})" if pruner is not None else ""
        return (
            f'<div class="orch-header"><b>orch sweep {escape_html(self.sweep.name)}</b> &middot; '
            f'<span class="orch-sweep-state" data-state="{state}">{state}</span> &middot; '
            f"{max(len(trials), self.sweep.size)} configs &middot; {running} in progress &middot; "
            f"{failed} failed{pruning}{note}</div>"
        )

    def _record_html(self) -> str:
        """The ended sweep as a saved notebook keeps it: header, curves, the results table."""
        metric = self.metric.value or "loss"
        best = self.marked()
        note = ""
        if best is not None:
            trial = self.sweep.trials[best]
            note = (
                f'<div class="orch-best">best by final {escape_html(metric)}: #{best} '
                f"{escape_html(config_text(trial.config))} (run {escape_html(trial.run_id)})</div>"
            )
        results = self.sweep.results()
        fit = RESULTS_FIT + (FAILURE_FIT if any(row["failure"] for row in results) else "")
        return super()._record_html() + note + fit + results._repr_html_()

    def _draw_parts(self) -> None:
        trials = self.sweep.trials
        ended = sum(t.done for t in trials)
        failed = sum(t.state == RunState.FAILED.value for t in trials)
        self.header.value = self._header_html()
        self.progress.value = ended
        self.progress.bar_style = "danger" if failed else ("success" if self.sweep.done else "info")
        self.progress_label.value = f"{ended}/{max(len(trials), self.sweep.size)} runs ended"
        if self.sweep.done:
            self.stop_button.disabled = True
            self.stop_button.description = "Done"
            self.stop_button.button_style = ""
        self._draw_rows()

    def _draw_rows(self) -> None:
        metric = self.metric.value or "loss"
        best = self.marked()
        keys = sorted({k for t in self.sweep.trials for k in t.config})
        head = [*(f"{k}" for k in keys), "state", "step", f"{metric} last", f"{metric} best", ""]
        order = list(range(len(self.mirrors)))  # the trials drawn: a search may have drawn one since
        finals: dict[int, float] = {}
        texts: list[list[str]] = []  # each row's cells as shown, before their markup
        for i, m in enumerate(self.mirrors):
            c = curve(m, metric)
            ends_bad = next((d for d in m.nonfinite(metric) if d.stays), None)
            last = "-"
            if ends_bad is not None:
                last = number_text(ends_bad.final)  # it ended NaN or inf, whatever came before
            elif len(c.mean):
                finals[i] = float(c.mean[-1])
                last = number_text(c.mean[-1]) + _behind(m, int(c.x[-1]))
            trial: Trial = self.sweep.trials[i]
            done, total = m.progress()
            if trial.pruned_at is not None:
                done = trial.pruned_at  # judged and stopped at its rung, as its curve is cut there
            step = f"{done}/{total}" if total else str(done)
            texts.append(
                [
                    *(value_text(trial.config.get(k, "")) for k in keys),
                    _state_text(trial),
                    step,
                    last,
                    number_text(_best_of(c.mean, metric)) if len(c.mean) else "-",
                    "★ best" if i == best else "",
                ]
            )
        # One width per column, from what it holds (header and every row), so that the live
        # rows line up under the header whatever their values; a long value ends in "…".
        widths = [
            min(CELL_CH, max(len(h), *(len(t[j]) for t in texts))) if texts else len(h)
            for j, h in enumerate(head)
        ]
        self.table_head.value = _cells(head, widths, header=True)
        for i, (m, cells) in enumerate(zip(self.mirrors, texts, strict=True)):
            trial = self.sweep.trials[i]
            shown = [escape_html(v) for v in cells]
            shown[len(keys)] = _state_html(trial)
            if i == best:
                shown[-1] = '<b class="orch-best" style="color:#1a7f37">&#9733; best</b>'
            button, html_cells = self.rows[i]
            button.style.button_color = _swatch(i)
            html_cells.value = _cells(shown, widths, titles=cells)
            bad = m.nonfinite(metric)
            if bad:
                first = bad[0]
                html_cells.value += (
                    f'<div class="orch-trial-nonfinite" data-step="{first.step}" '
                    f'style="color:#cf222e;font-size:85%;font-weight:bold;{WRAP}">'
                    f"rank {first.rank}: {escape_html(first.text())}</div>"
                )
            if trial.failure and trial.state != RunState.SUCCEEDED.value:
                html_cells.value += (
                    f'<div class="orch-trial-failure" style="color:#cf222e;font-size:85%;{WRAP}">'
                    f"{escape_html(trial.failure)[:300]}</div>"
                )
        if self.sort.value:
            sign = -1.0 if self.sort.value == "max" else 1.0
            ended_badly = (RunState.FAILED.value, CANCELLED)
            failed = {i for i, t in enumerate(self.sweep.trials) if t.state in ended_badly}
            # Finite values first (best first), then NaN, inf or none, then failed configs.
            order.sort(key=lambda i: (i in failed, i not in finals, sign * finals.get(i, 0.0), i))
        children = tuple(widgets.HBox([self.rows[i][0], self.rows[i][1]]) for i in order)
        if [c.children for c in self.table.children] != [c.children for c in children]:
            self.table.children = children


def _ends_nonfinite(m: StateMirror, metric: str) -> bool:
    """A rank's ``metric`` went NaN or inf and never came back."""
    return any(d.stays for d in m.nonfinite(metric))


def _best_of(values: Any, metric: str) -> float:
    return float(values.max() if default_mode(metric) == "max" else values.min())


def _behind(m: StateMirror, step: int) -> str:
    """`` (step 0)`` after a metric's last value logged before the run's last step (an accuracy
    evaluated every 50 steps of a config pruned at step 10); "" when it is the run's last."""
    last = max((int(b.steps[-1]) for (_, name), b in m.series.items() if len(b) and not own_metric(name)),
               default=step)  # fmt: skip
    return f" (step {step})" if step < last else ""


def _state_text(trial: Trial) -> str:
    """``PRUNED at 10`` (its rung), ``SUCCEEDED (earlier)``: a row's state, as the results say it."""
    at = f" at {trial.pruned_at}" if trial.pruned_at is not None else ""
    return trial.state + at + (" (earlier)" if trial.reused else "")


def _state_html(trial: Trial) -> str:
    try:
        color = STATE_COLORS[RunState(trial.state)]
    except ValueError:  # QUEUED, CANCELLED: the sweep's own
        color = "#777"
    text = escape_html(_state_text(trial))
    return f'<span class="orch-trial-state" style="color:{color}">{text}</span>'


def _cells(
    values: list[str], widths: list[int], *, header: bool = False, titles: list[str] | None = None
) -> str:
    """One row as cells of fixed widths (``ch`` units), so rows line up under the header:
    ``values`` are HTML; a value longer than its cell ends in "…", whole in its tooltip (``titles``)."""
    spans = []
    for i, (v, w) in enumerate(zip(values, widths, strict=True)):
        text = f"<b>{escape_html(v)}</b>" if header else v
        title = f' title="{escape_html(titles[i])}"' if titles and titles[i] else ""
        spans.append(
            f'<span class="orch-cell"{title} style="display:inline-block;width:{w}ch;padding-right:1ch;'
            f'overflow:hidden;text-overflow:ellipsis;vertical-align:top">{text}</span>'
        )
    pad = '<span style="display:inline-block;width:56px"></span>' if header else ""
    row = "".join(spans)
    return f'<div class="orch-cells" style="white-space:nowrap;font-family:monospace">{pad}{row}</div>'

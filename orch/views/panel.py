"""The live notebook panel: per-rank loss curves, a rank table, progress, Stop, log tails.

:class:`Panel` holds the widgets and the poller. A background thread polls the master over
gRPC with the incremental ``GetState`` (only new points cross the wire), folds the reply
into a :class:`~orch.wire.client.StateMirror`, and updates widget traits inside
``hold_sync()``. Trait updates from a thread reach the browser while the kernel is busy (a
cell blocked in ``run.wait()``), under ipykernel 7 too; the thread never calls
``display()``. Polling stops when the run is over; the final state stays drawn. What the
widgets show is built elsewhere: the curves by :class:`~orch.views.rank_plot.RankPlot` (a
PNG in an ``Image`` widget, swapped in place, no flicker), the header, rank table and root
cause by :mod:`orch.views.run_html`; a click on Stop while a cell waits is routed by
:mod:`orch.views.waiting` (:func:`~orch.views.waiting.wait_for`).

When the run ends, the panel's output becomes a static record of its final state (the
curves as a PNG, the run's header, the rank table and, for a failed run, the root cause
with its traceback) through :class:`orch.views._static.Record`, whose docstring says why: a saved
notebook then shows the result without a kernel (JupyterLab, nbconvert, GitHub). While the
run runs, the output is the live widget; ``display(panel.widget)`` shows it again after.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Any

import ipywidgets as widgets

from orch._text import escape_html
from orch.errors import MasterUnavailable
from orch.record.source import RunSource
from orch.record.store import tail
from orch.views._pollers import track
from orch.views._static import IMAGE, Record
from orch.views.rank_plot import RankPlot
from orch.views.rendering import summary
from orch.views.run_html import failure_html, header_html, progress_html, table_html
from orch.views.waiting import answer_while_waiting
from orch.wire.client import MasterClient, StateMirror
from orch.wire.limits import OWN_METRICS
from orch.wire.ranks import loss_name
from orch.wire.stacks import stacks_of
from orch.wire.states import RunState

log = logging.getLogger(__name__)

FINISH_WAIT = 15.0  # seconds a panel keeps polling a run that ended until its source is done
NO_POINTS = '<div class="orch-no-points" style="color:#57606a;margin:.4em 0">no points were logged</div>'
# A rank's output in the record: long lines wrap (anywhere: a path) instead of widening the output.
OUTPUT_STYLE = "white-space:pre-wrap;overflow-wrap:anywhere;max-height:24em;overflow-y:auto;font-size:85%"
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"  # the progress of a run with no known total: a count, turning


# A widget is drawn with a margin on each side (ipywidgets' --jp-widgets-margin): one that is
# "100%" wide, or an image as wide as it may get, passes its box by that margin, and the panel
# scrolls sideways (at 1,100 px, under every live panel). The full width is the box's less them.
FULL_WIDTH = "calc(100% - 2 * var(--jp-widgets-margin, 2px))"


def full_width() -> widgets.Layout:
    """A header's layout: as wide as the panel, no wider."""
    return widgets.Layout(width=FULL_WIDTH)


def plot_layout(width_px: int) -> widgets.Layout:
    """A plot's layout: ``width_px`` wide, less in a narrower output, never past its edge."""
    return widgets.Layout(width=f"{width_px}px", max_width=FULL_WIDTH)


def choose(view: Any, dropdown: widgets.Dropdown, options: list[Any], value: Any) -> None:
    """New choices for one of ``view``'s dropdowns, keeping ``value`` chosen. New options pick
    their first as the value for a moment: no choice of the user's, so ``view._choosing`` tells
    its observers not to redraw for it."""
    view._choosing = True
    try:
        dropdown.options = options
        dropdown.value = value
    finally:
        view._choosing = False


def own_metric(name: str) -> bool:
    """``name`` is one of the metrics orch records itself (``rank/memory``), not the code's."""
    return name.startswith(OWN_METRICS)


def metric_choices(names: list[str]) -> list[str]:
    """A metric list's options: the code's metrics by name, then orch's own (``rank/memory``),
    never first. With none of the code's, ``loss`` comes first, the metric a panel waits for:
    chosen, it says that no points were logged."""
    user = sorted(n for n in names if not own_metric(n))
    return [*(user or ["loss"]), *sorted(n for n in names if own_metric(n))]


def default_metric(names: list[str]) -> str:
    """The metric a panel shows first: the loss if one is logged (``train/loss``, ``train_loss``
    where the code names it so), else the code's first; never one of orch's own (``loss``,
    which no point is drawn for, while the code logged none)."""
    user = [n for n in names if not own_metric(n)]
    shown = loss_name(set(user))
    return shown if shown in user or not user else sorted(user)[0]


class Panel:
    """The live view of one run. Display it (it is the last value of a cell, or ``display(panel)``)."""

    def __init__(
        self,
        source: RunSource,
        *,
        interval: float = 0.5,
        width_px: int = 720,
        height_px: int = 320,
        log_lines: int = 20,
        client: MasterClient | None = None,
    ) -> None:
        self.source = source
        self.interval = interval
        self.log_lines = log_lines
        # A run read back from disk has no master: its final state is drawn once.
        self.client = client or source.connect()
        self.mirror = StateMirror()
        self.polls = 0
        self.redraws = 0
        self.redraws_header = 0  # turns the spinner of a run with no known total
        self.last_error = ""
        self._plot = RankPlot(width_px, height_px)
        self._drawn: tuple[int, bool] = (-1, False)  # the points and whether the run ended, as drawn
        self._closed = threading.Event()
        # The poller thread, refresh() and the controls' callbacks (on a kernel subshell's thread,
        # or the main shell's) share one mirror and one drawing.
        self._tick_lock = threading.RLock()
        self._build(width_px)
        self.record = Record(
            self.widget, text=f"orch run panel (master {source.address}): live until the run ends"
        )
        # The first state is drawn before the panel is shown: a run that already ended (or
        # ends before the thread gets going) is never shown blank.
        self._tick()
        self._thread = threading.Thread(target=self._loop, name="orch-panel", daemon=True)
        track(self)
        self._thread.start()

    # -- widgets --------------------------------------------------------------------------
    def _build(self, width_px: int) -> None:
        self.header = widgets.HTML(layout=full_width())
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description="progress", layout=widgets.Layout(width="60%")
        )
        self.progress_label = widgets.Label()
        self.metric = widgets.Dropdown(options=["loss"], value="loss", description="metric")
        self.log_scale = widgets.Checkbox(value=False, description="log scale", indent=False)
        self.stop_button = widgets.Button(
            description="Stop",
            button_style="warning",
            icon="stop",
            tooltip="finish the current step on every rank and stop",
        )
        self.stop_button.on_click(self._on_stop)
        answer_while_waiting(self.stop_button)
        self.plot = widgets.Image(format="png", layout=plot_layout(width_px))
        self.no_points = widgets.HTML()  # in the plot's place, once a run ended with nothing to plot
        self.table = widgets.HTML()
        self.stacks_button = widgets.Button(
            description="Stacks",
            icon="list",
            tooltip="ask every rank where its training thread is now (its Python stack)",
        )
        self.stacks_button.on_click(self._on_stacks)
        answer_while_waiting(self.stacks_button)
        self.asked_stacks = ""  # the grouped stacks the Stacks button brought, shown until the run ends
        # The record keeps the last lines of the shown rank's output (a %%orch cell prints them itself)
        self.output_in_record = True
        self.progress_box = widgets.HTML()
        self.failure = widgets.HTML()
        self.log_rank = widgets.Dropdown(options=[], description="rank")
        self.log_tail = widgets.HTML()
        logs = widgets.VBox([self.log_rank, self.log_tail])
        self.logs = widgets.Accordion(children=[logs], titles=("worker logs",), selected_index=None)
        self._choosing = False  # the panel itself sets a dropdown's choices: no redraw for that
        self._metric_chosen = False  # the user picked the metric: the panel never picks another
        self._log_rank_chosen = False  # the user picked the rank whose log shows: else rank 0's
        self.metric.observe(self._on_metric, names="value")
        self.log_rank.observe(self._on_log_rank, names="value")
        self.log_scale.observe(lambda _change: None if self._choosing else self._redraw_now(), names="value")
        for control in (self.metric, self.log_scale, self.log_rank):
            answer_while_waiting(control)  # a change made while a cell waits is drawn at once
        self.widget = widgets.VBox(
            [
                self.header,
                widgets.HBox([self.progress, self.progress_label]),
                widgets.HBox([self.metric, self.log_scale, self.stop_button, self.stacks_button]),
                self.plot,
                self.no_points,
                self.table,
                self.progress_box,
                self.failure,
                self.logs,
            ]
        )
        self.widget.add_class("orch-panel")

    def _ipython_display_(self) -> None:
        self.record._ipython_display_()  # an output that the run's final record replaces

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.record._repr_mimebundle_(**kwargs)

    # -- polling --------------------------------------------------------------------------
    def _loop(self) -> None:
        ended_at: float | None = None
        while not self.mirror.state.done or not self._finished(ended_at):
            if self._closed.wait(self.interval):
                break
            finished = self._finished(ended_at)  # read before the poll, which then sees all of it
            self._tick()
            if self.mirror.state.done:
                ended_at = ended_at or time.monotonic()
                if finished:
                    break
        self.stop_button.disabled = True

    def _finished(self, ended_at: float | None) -> bool:
        """The run's source is done too: a run that ended may still be finishing (its Slurm job's
        last state, its record), which the final drawing shows; at most FINISH_WAIT seconds."""
        if ended_at is not None and time.monotonic() - ended_at > FINISH_WAIT:
            return True
        return bool(getattr(self.source, "done", True))

    def refresh(self) -> None:
        """Poll and redraw now, from the calling thread (``run.wait()`` does it as the run ends,
        so the cell that waited shows the final state before it returns)."""
        self._tick()

    def _tick(self) -> None:
        """One poll of the master (or the run's final state once it is gone), one redraw."""
        with self._tick_lock:  # the poller thread and refresh() share one mirror and cursor
            self._tick_locked()

    def _tick_locked(self) -> None:
        try:
            if self.client is None:
                raise MasterUnavailable("no master to poll")
            self.mirror.poll(self.client)
            self.polls += 1
            self.last_error = ""
        except MasterUnavailable as e:
            final = self.source.final_state()
            if final is not None:  # the run ended and its master is gone: draw its last state
                self.mirror = final
            else:
                self.last_error = str(e)
        try:
            self._redraw()
        except Exception:  # a drawing bug must not kill the poller; show it instead
            self.last_error = traceback.format_exc()
            log.exception("orch panel: redraw failed")

    def close(self) -> None:
        """Stop polling (the widgets keep their last state)."""
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        if self.client is not None:
            self.client.close()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until polling stopped because the run is over."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _on_stop(self, _button: Any) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping…"
        try:
            self.source.stop("Stop pressed in the panel")
        except Exception as e:  # the master may be gone already; say so on the button
            self.stop_button.description = f"Stop failed: {e}"[:60]

    def _on_stacks(self, _button: Any) -> None:
        """Ask the ranks for their stacks, off the kernel's thread (the ranks take a beat to answer)."""
        client = self.client
        if client is None:
            return
        self.stacks_button.disabled = True
        self.stacks_button.description = "Asking…"

        def ask() -> None:
            try:
                self.asked_stacks = stacks_of(client.stacks()).grouped or "no rank is running"
            except Exception as e:  # the master may be gone; say so where the stacks would be
                self.asked_stacks = f"could not get the stacks: {e}"
            self.stacks_button.description = "Stacks"
            self.stacks_button.disabled = self.mirror.state.done
            self.refresh()

        threading.Thread(target=ask, name="orch-panel-stacks", daemon=True).start()

    def _on_log_rank(self, _change: Any) -> None:
        if not self._choosing:
            self._log_rank_chosen = True
            self._redraw_now()

    def _on_metric(self, _change: Any) -> None:
        if not self._choosing:
            self._metric_chosen = True
            self._redraw_now()

    def _redraw_now(self) -> None:
        """A control changed: draw what it asks for now, not at the next poll."""
        with self._tick_lock:
            self._redraw(force=True)

    # -- drawing --------------------------------------------------------------------------
    def _redraw(self, force: bool = False) -> None:
        m = self.mirror
        names = m.metric_names()
        options = metric_choices(names)
        points = sum(len(b) for b in m.series.values())
        with self.widget.hold_sync():
            if list(self.metric.options) != options:
                # The panel's own pick follows the code's names as they come (orch's rank/memory
                # comes before the code's first loss, and is never picked); the user's stays.
                kept = self._metric_chosen and self.metric.value in options
                choose(self, self.metric, options, self.metric.value if kept else default_metric(names))
            self._draw_header(m)
            self.table.value = table_html(m)
            self.progress_box.value = progress_html(m, self.asked_stacks)
            self.failure.value = failure_html(m)
            # Redrawn for new points, and once as the run ends (a plot without points then says so).
            if force or (points, m.state.done) != self._drawn:
                metric, log_scale = self.metric.value or "loss", self.log_scale.value
                self.plot.value = self._plot.draw(m, metric, log_scale)
                # What the picture shows, for the page (an Image widget takes no tooltip)
                shown = ("orch-plot", f"orch-metric-{metric}", "orch-log" if log_scale else "orch-linear")
                self.plot._dom_classes = shown
                self._drawn = (points, m.state.done)
                self.redraws += 1
            # A plot only when there is something to plot: a run that ended without a point of
            # the metric says so in a line, not with empty axes.
            empty = self._nothing_to_plot(m)
            self.plot.layout.display = "none" if empty else None
            self.no_points.value = NO_POINTS if empty else ""
            self._draw_logs(m)
            if m.state.done:
                self.stop_button.disabled = self.stacks_button.disabled = True
                self.stop_button.description = m.state.value.capitalize()
                self.stop_button.button_style = ""  # nothing left to warn of
        if m.state.done:
            # Every redraw of an ended run sends the record again: run.wait()'s refresh() then
            # sends it from the waiting cell, the one whose messages nbclient records.
            self._publish(m)

    def _nothing_to_plot(self, m: StateMirror) -> bool:
        """The run ended without a point of the metric shown."""
        metric = self.metric.value or "loss"
        return m.state.done and not any(len(b) for (_, name), b in m.series.items() if name == metric)

    def _publish(self, m: StateMirror) -> None:
        """The final state, as the notebook keeps it: header, curves (or that there are none),
        rank table, root cause, and the last lines of the shown rank's output."""
        empty = self._nothing_to_plot(m)
        output_html, output_text = self._output_tail(m)
        page = (
            header_html(m, live=False)
            + (NO_POINTS if empty else IMAGE)
            + table_html(m)
            + progress_html(m)
            + failure_html(m)
            + output_html
        )
        metric = self.metric.value or "loss"
        png = None if empty else self._plot.png()
        text = summary(m) + output_text
        self.record.publish(png, page, text, alt=f"{metric} per rank, run {m.run_id}")

    def _output_tail(self, m: StateMirror) -> tuple[str, str]:
        """The last lines of a rank's output (the rank the log tail shows, rank 0 unless the
        user picked another), as the record's HTML and text: what a script printed stays in
        the executed notebook, as ``!torchrun train.py`` would leave it in the cell."""
        if not self.output_in_record:
            return "", ""
        files = self.source.log_files()
        by_rank = {r.rank: files[r.worker_id] for r in m.ranks if r.worker_id in files}
        if not by_rank:
            return "", ""
        rank = self.log_rank.value if self.log_rank.value in by_rank else min(by_rank)
        lines = tail(by_rank[rank], self.log_lines)
        if not lines.strip():
            return "", ""
        title = f"rank {rank}: the last {len(lines.splitlines())} lines of its output ({by_rank[rank].name})"
        html = (
            f'<div class="orch-output" data-rank="{rank}">'
            f'<div style="color:#57606a">{escape_html(title)}</div>'
            f'<pre style="{OUTPUT_STYLE}">{escape_html(lines)}</pre></div>'
        )
        return html, f"\n{title}:\n{lines}"

    def _draw_header(self, m: StateMirror) -> None:
        self.header.value = header_html(m, address=self.source.address, last_error=self.last_error)
        done, total = m.progress()
        if not total:
            # No known total (a loop without ctx.steps(n) or ctx.total_steps): a count, turning
            # while the run goes, as tqdm does without a total; never a bar that reads full.
            self.progress.layout.visibility = "hidden"
            self.progress.max, self.progress.value = 1, 0
            live = m.state in (RunState.RUNNING, RunState.STOPPING)
            spin = f"{SPINNER[self.redraws_header % len(SPINNER)]} " if live else ""
            self.redraws_header += 1
            self.progress_label.value = f"{spin}step {done} (total unknown)"
            return
        self.progress.layout.visibility = "visible"
        self.progress.max = total
        self.progress.value = min(done, total)
        self.progress.bar_style = {
            "SUCCEEDED": "success", "FAILED": "danger", "STOPPED": "warning", "PRUNED": "warning"
        }.get(m.state.value, "info")  # fmt: skip
        self.progress_label.value = f"step {done}/{total} ({done / total:.0%})"

    def _draw_logs(self, m: StateMirror) -> None:
        files = self.source.log_files()
        by_rank = {r.rank: files[r.worker_id] for r in m.ranks if r.worker_id in files}
        options = [(f"rank {rank}", rank) for rank in sorted(by_rank)]
        if options and list(self.log_rank.options) != options:
            # The rank whose log is shown below: the user's pick, else the lowest (rank 0 once
            # it registered, even when rank 1 registered first)
            mine = self._log_rank_chosen and self.log_rank.value in by_rank
            choose(self, self.log_rank, options, self.log_rank.value if mine else min(by_rank))
        if not by_rank:
            self.log_tail.value = "<i>worker logs stay on the workers' hosts</i>" if m.ranks else ""
            return
        if self.logs.selected_index is None and not m.state.done:
            return  # collapsed: do not read files nobody looks at
        rank = self.log_rank.value if self.log_rank.value in by_rank else min(by_rank)
        lines = tail(by_rank[rank], self.log_lines)
        self.log_tail.value = f'<pre style="{OUTPUT_STYLE}">{escape_html(lines)}</pre>'

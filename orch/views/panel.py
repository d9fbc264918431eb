"""The live notebook panel: per-rank loss curves, a rank table, progress, Stop, log tails.

A background thread polls the master over gRPC with the incremental ``GetState`` (only
new points cross the wire), folds the reply into a :class:`~orch.wire.client.StateMirror`,
and updates widget traits inside ``hold_sync()``. Trait updates from a thread reach the
browser while the kernel is busy (a cell blocked in ``run.wait()``), under ipykernel 7
too; the thread never calls ``display()``. The plot is drawn with matplotlib into a PNG
held by an ``Image`` widget: the same figure and line artists are reused every tick, each
series downsampled to the plot's pixel width, so a redraw costs the same at 1k or 1M
points and swaps one image in place (no flicker). Polling stops when the run is over; the
final state stays drawn.

When the run ends, the panel's output becomes a static record of its final state (the
curves as a PNG, the run's header, the rank table and, for a failed run, the root cause
with its traceback) through :class:`orch.views._static.Record`, whose docstring says why: a saved
notebook then shows the result without a kernel (JupyterLab, nbconvert, GitHub). While the
run runs, the output is the live widget; ``display(panel.widget)`` shows it again after.
"""

from __future__ import annotations

import html
import io
import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import numpy as np
import numpy.typing as npt

from orch.errors import MasterUnavailable
from orch.launchers.contract import PanelSource
from orch.record.store import tail
from orch.views._static import IMAGE, Record
from orch.views.dashboard import stragglers, summary
from orch.wire.client import MasterClient, StateMirror
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

log = logging.getLogger(__name__)

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


FINISH_WAIT = 15.0  # seconds a panel keeps polling a run that ended until its source is done

STATE_COLORS = {
    RunState.PENDING: "#777",
    RunState.RUNNING: "#1f6feb",
    RunState.SUCCEEDED: "#1a7f37",
    RunState.FAILED: "#cf222e",
    RunState.STOPPED: "#9a6700",
    RunState.RESTARTING: "#9a6700",
    RunState.STOPPING: "#bc4c00",
}


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


def default_metric(names: list[str]) -> str:
    """The metric a panel shows first: the loss if one is logged."""
    return "loss" if "loss" in names else names[0]


def downsample(x: npt.NDArray[Any], y: npt.NDArray[np.float64], width: int) -> tuple[Any, Any]:
    """At most ``2 * width`` points that keep each pixel column's min and max (spikes stay)."""
    n = len(x)
    if n <= 2 * width:
        return x, y
    k = n // width
    m = n // k
    xs = x[: m * k].reshape(m, k)
    ys = y[: m * k].reshape(m, k)
    finite = np.where(np.isfinite(ys), ys, np.nan)
    with np.errstate(all="ignore"):
        lo = np.nanargmin(np.where(np.isnan(finite), np.inf, finite), axis=1)
        hi = np.nanargmax(np.where(np.isnan(finite), -np.inf, finite), axis=1)
    rows = np.arange(m)
    first = np.minimum(lo, hi)
    second = np.maximum(lo, hi)
    idx_x = np.stack([xs[rows, first], xs[rows, second]], axis=1).ravel()
    idx_y = np.stack([ys[rows, first], ys[rows, second]], axis=1).ravel()
    # keep the tail that did not fill a whole bucket, so the newest point is always drawn
    return np.concatenate([idx_x, x[m * k :]]), np.concatenate([idx_y, y[m * k :]])


class _Plot:
    """One matplotlib figure reused for every redraw; renders to PNG bytes."""

    def __init__(self, width_px: int, height_px: int) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.width_px = width_px
        dpi = 100
        self.fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
        FigureCanvasAgg(self.fig)
        self.ax = self.fig.add_subplot(1, 1, 1)
        self.ax.set_xlabel("step")
        self.ax.grid(True, alpha=0.3)
        self.fig.subplots_adjust(left=0.1, right=0.98, top=0.92, bottom=0.15)
        self.lines: dict[int, Any] = {}
        self.metric = ""
        self.log_scale = False

    def draw(self, mirror: StateMirror, metric: str, log_scale: bool) -> bytes:
        ax = self.ax
        if metric != self.metric:
            for line in self.lines.values():
                line.remove()
            self.lines.clear()
            self.metric = metric
        title = metric or "waiting for the first points"
        if ax.get_title() != title:
            ax.set_title(title, fontsize=10)
            ax.set_ylabel(metric)
        ranks_before = len(self.lines)
        for (rank, name), buf in sorted(mirror.series.items()):
            if name != metric:
                continue
            # min and max of every other pixel column: about one point per pixel, spikes kept
            x, y = downsample(buf.steps, buf.values, self.width_px // 2)
            line = self.lines.get(rank)
            if line is None:
                (line,) = ax.plot(x, y, lw=1.2, color=f"C{rank % 10}", label=f"rank {rank}")
                self.lines[rank] = line
            else:
                line.set_data(x, y)
        if len(self.lines) != ranks_before:  # a new legend only when a rank's line appears
            ax.legend(handles=[self.lines[r] for r in sorted(self.lines)], loc="upper right", fontsize=8)
        if log_scale != self.log_scale:
            ax.set_yscale("log" if log_scale else "linear")
            self.log_scale = log_scale
        ax.relim()
        ax.autoscale_view()
        # Speed over size: the PNG only crosses a local socket to the browser.
        return self.png(compress_level=1)

    def png(self, compress_level: int = 6) -> bytes:
        """The figure as last drawn (the record kept in a notebook is compressed harder)."""
        out = io.BytesIO()
        self.fig.savefig(out, format="png", pil_kwargs={"compress_level": compress_level})
        return out.getvalue()


class Panel:
    """The live view of one run. Display it (it is the last value of a cell, or ``display(panel)``)."""

    def __init__(
        self,
        source: PanelSource,
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
        self.last_error = ""
        self._plot = _Plot(width_px, height_px)
        self._drawn_points = -1
        self._closed = threading.Event()
        self._tick_lock = threading.Lock()
        self._build(width_px)
        self.record = Record(
            self.widget, text=f"orch run panel (master {source.address}): live until the run ends"
        )
        # The first state is drawn before the panel is shown: a run that already ended (or
        # ends before the thread gets going) is never shown blank.
        self._tick()
        self._thread = threading.Thread(target=self._loop, name="orch-panel", daemon=True)
        self._thread.start()

    # -- widgets --------------------------------------------------------------------------
    def _build(self, width_px: int) -> None:
        self.header = widgets.HTML(layout=widgets.Layout(width="100%"))
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
        _route_clicks_to_their_subshell(self.stop_button)
        self.plot = widgets.Image(format="png", layout=widgets.Layout(width=f"{width_px}px"))
        self.table = widgets.HTML()
        self.failure = widgets.HTML()
        self.log_rank = widgets.Dropdown(options=[], description="rank")
        self.log_tail = widgets.HTML()
        logs = widgets.VBox([self.log_rank, self.log_tail])
        self.logs = widgets.Accordion(children=[logs], titles=("worker logs",), selected_index=None)
        self._choosing = False  # the panel itself sets a dropdown's choices: no redraw for that
        for w in (self.metric, self.log_scale, self.log_rank):
            w.observe(lambda _change: None if self._choosing else self._redraw(force=True), names="value")
        self.widget = widgets.VBox(
            [
                self.header,
                widgets.HBox([self.progress, self.progress_label]),
                widgets.HBox([self.metric, self.log_scale, self.stop_button]),
                self.plot,
                self.table,
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

    # -- drawing --------------------------------------------------------------------------
    def _redraw(self, force: bool = False) -> None:
        m = self.mirror
        names = m.metric_names()
        points = sum(len(b) for b in m.series.values())
        with self.widget.hold_sync():
            if names and list(self.metric.options) != names:
                current = self.metric.value if self.metric.value in names else default_metric(names)
                choose(self, self.metric, names, current)
            self._draw_header(m)
            self.table.value = self._table_html(m)
            self.failure.value = self._failure_html(m)
            if force or points != self._drawn_points:
                self.plot.value = self._plot.draw(m, self.metric.value or "loss", self.log_scale.value)
                self._drawn_points = points
                self.redraws += 1
            self._draw_logs(m)
            if m.state.done:
                self.stop_button.disabled = True
                self.stop_button.description = m.state.value.capitalize()
                self.stop_button.button_style = ""  # nothing left to warn of
        if m.state.done:
            # Every redraw of an ended run sends the record again: run.wait()'s refresh() then
            # sends it from the waiting cell, the one whose messages nbclient records.
            self._publish(m)

    def _publish(self, m: StateMirror) -> None:
        """The final state, as the notebook keeps it: header, curves, rank table, root cause."""
        page = self._header_html(m, live=False) + IMAGE + self._table_html(m) + self._failure_html(m)
        metric = self.metric.value or "loss"
        self.record.publish(self._plot.png(), page, summary(m), alt=f"{metric} per rank, run {m.run_id}")

    def _header_html(self, m: StateMirror, *, live: bool = True) -> str:
        """The run's id, state, elapsed time, ranks and attempts (live: its master, the last error)."""
        color = STATE_COLORS[m.state]
        note = f" &middot; attempt {m.attempt}/{m.max_attempts}" if m.max_attempts > 1 or not live else ""
        if live:
            note = f" &middot; master {html.escape(self.source.address)}{note}"
            if self.last_error:
                note += f" &middot; <i>{html.escape(self.last_error)}</i>"
        else:
            done, total = m.progress()
            note += f" &middot; step {done}/{total}" if total else f" &middot; step {done}"
        if m.job is not None:  # the scheduler's job: its queue state while it waits, then its nodes
            note += f' &middot; <span class="orch-job">{html.escape(m.job.describe())}</span>'
        return (
            f'<div class="orch-header"><b>orch run {html.escape(m.run_id)}</b> &middot; '
            f'<span class="orch-state" data-state="{m.state.value}" style="color:{color};'
            f'font-weight:bold">{m.state.value}</span> &middot; '
            f'<span class="orch-elapsed">{m.elapsed:.1f}s</span> &middot; '
            f"{m.registered}/{m.world_size} ranks{note}</div>"
        )

    def _draw_header(self, m: StateMirror) -> None:
        self.header.value = self._header_html(m)
        done, total = m.progress()
        self.progress.max = max(1, total)
        self.progress.value = min(done, self.progress.max)
        self.progress.bar_style = {"SUCCEEDED": "success", "FAILED": "danger", "STOPPED": "warning"}.get(
            m.state.value, "info"
        )
        self.progress_label.value = f"step {done}/{total} ({done / total:.0%})" if total else f"step {done}"

    @staticmethod
    def _table_html(m: StateMirror) -> str:
        slow = stragglers(m)
        longest = max((r.step_ms for r in m.ranks if r.timed), default=0.0)
        rows = []
        for r in m.ranks:
            marks = []
            if r.rank in slow:
                section = html.escape(m.straggler_section)
                marks.append(
                    f'<span class="orch-slow" title="{html.escape(m.straggler_note)}" '
                    f'style="color:#9a6700;font-weight:bold">straggler: {section}</span>'
                )
            if r.diverged:
                marks.append('<span class="orch-nan" title="the loss is not finite">NaN/inf loss</span>')
            if r.dropped_points:
                marks.append(
                    f'<span class="orch-dropped" title="ctx.log\'s queue was full while the master '
                    f'could not be reached">{r.dropped_points} points dropped</span>'
                )
            color = "#cf222e" if r.state in (RankState.FAILED, RankState.LOST) else "inherit"
            age = "-" if r.heartbeat_age < 0 else f"{r.heartbeat_age:.1f}s"
            rows.append(
                f'<tr class="orch-rank" data-rank="{r.rank}" style="color:{color}">'
                f"<td>{r.rank}</td><td>{r.state.value}</td><td>{r.step}</td><td>{r.loss_text()}</td>"
                f"<td>{r.steps_per_sec:.1f}</td><td>{age}</td><td>{_split_html(r, longest)}</td>"
                f"<td>{_scores_html(r)}</td>"
                f'<td>{html.escape(r.host)}/{r.pid}</td><td class="orch-marks">{" ".join(marks)}</td></tr>'
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
            note = f'<div class="orch-stragglers" style="{style}">{html.escape(m.straggler_note)}</div>'
        return (
            "<style>.orch-ranks td, .orch-ranks th {padding: 0 .6em; white-space: nowrap} "
            ".orch-ranks td.orch-marks {white-space: normal; text-align: left}</style>"
            '<table class="orch-ranks" style="border-collapse:collapse;text-align:right">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            f'<div class="orch-legend" style="font-size:85%;color:#57606a">step time:{legend}</div>{note}'
        )

    @staticmethod
    def _failure_html(m: StateMirror) -> str:
        if m.state is not RunState.FAILED:
            return ""
        tb = f"<pre>{html.escape(m.root_cause_error)}</pre>" if m.root_cause_error else ""
        return (
            f'<div class="orch-failure" style="color:#cf222e"><b>Root cause:</b> '
            f"{html.escape(m.failure)}{tb}</div>"
        )

    def _draw_logs(self, m: StateMirror) -> None:
        files = self.source.log_files()
        by_rank = {r.rank: files[r.worker_id] for r in m.ranks if r.worker_id in files}
        options = [(f"rank {rank}", rank) for rank in sorted(by_rank)]
        if options and list(self.log_rank.options) != options:
            shown = self.log_rank.value if self.log_rank.value in by_rank else min(by_rank)
            choose(self, self.log_rank, options, shown)  # the rank whose log is shown below
        if not by_rank:
            self.log_tail.value = "<i>worker logs stay on the workers' hosts</i>" if m.ranks else ""
            return
        if self.logs.selected_index is None and not m.state.done:
            return  # collapsed: do not read files nobody looks at
        rank = self.log_rank.value if self.log_rank.value in by_rank else min(by_rank)
        self.log_tail.value = f"<pre>{html.escape(tail(by_rank[rank], self.log_lines))}</pre>"


def _route_clicks_to_their_subshell(button: widgets.Button) -> None:
    """Let a click on ``button`` be handled while a cell blocks (``run.wait()``).

    JupyterLab sends widget messages on a kernel subshell (ipykernel 7 runs each in its own
    thread), but ipykernel routes a comm's messages back to the shell the comm last wrote
    from, which for the panel is the main one, blocked in ``wait()``. Clicks are plain
    events, not replies to anything: they go where the frontend sent them. Where the kernel
    has no such routing (no subshells), nothing changes.
    """
    comm = getattr(button, "comm", None)
    route = getattr(comm, "_reply_subshell_for", None)
    if comm is None or route is None:
        return

    def where(data: Any, default: Any) -> Any:
        if isinstance(data, dict) and data.get("method") == "custom":
            return default
        return route(data, default)

    comm._reply_subshell_for = where


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes (used by tests and notebooks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()

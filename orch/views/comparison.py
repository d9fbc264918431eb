"""Runs side by side: ``orch.compare([run_a, "runs/<id>", sweep], metric="loss")``.

Each run is drawn as one curve, the mean of a metric over its ranks, with a band from the
least to the greatest rank's value at each step, in the run's own colour; curves line up
by step or by wall time since the run's first point. Live runs are followed as they go
(a run of this process is read from its master in memory, an attached one over gRPC, a
run on disk once); polling stops when every run has ended. :class:`RunsView` is the part
the sweep panel shares.
"""

from __future__ import annotations

import io
import logging
import re
import threading
import traceback
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np

from orch._text import escape_html, nonfinite_words, number_text
from orch.errors import ConfigError, OrchError
from orch.experiments.metrics import default_mode
from orch.views._pollers import track
from orch.views._static import IMAGE, Record
from orch.views.followers import (
    Curve,
    Follower,
    XAxis,
    curve,
    followers,
)
from orch.views.panel import choose, default_metric, full_width, metric_choices, plot_layout
from orch.views.rank_plot import (
    YRange,
    downsample,
    log_ticks,
    mark_clipped,
    mark_nonfinite,
    marker_of,
    one_step_wide,
    plain_axes,
    robust_range,
    say_empty,
    show_ticks,
)
from orch.views.run_html import STATE_COLORS
from orch.views.waiting import answer_while_waiting
from orch.wire.client import StateMirror

log = logging.getLogger(__name__)


def _best_of(values: Any, metric: str) -> float:
    return float(values.max() if default_mode(metric) == "max" else values.min())


class _RunsPlot:
    """One matplotlib figure, redrawn with a curve and a band per run."""

    def __init__(self, width_px: int, height_px: int) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.width_px = width_px
        self.fig = Figure(figsize=(width_px / 100, height_px / 100), dpi=100)
        self.canvas = FigureCanvasAgg(self.fig)
        self.ax = self.fig.add_subplot(1, 1, 1)
        self.fig.subplots_adjust(left=0.1, right=0.98, top=0.92, bottom=0.15)
        self.y_range: YRange | None = None  # the limits of the last drawing

    def draw(
        self,
        curves: list[tuple[str, int, Curve, bool]],
        metric: str,
        x: XAxis,
        log_scale: bool,
        done: bool = False,
        *,
        faded: frozenset[int] = frozenset(),
        rungs: Sequence[int] = (),
        best_so_far: float | None = None,
        boundaries: Sequence[tuple[float, str]] = (),
    ) -> bytes:
        """``curves``: (label, colour index, curve, marked) per run; a marked run is drawn bold.
        ``done``: every run ended (a plot without points then says none were logged).
        A sweep's pruned runs (their places in ``curves``: ``faded``) are drawn faded, ending in
        an x; its pruner's ``rungs`` (steps) are dotted verticals, ``best_so_far`` a dotted level.
        ``boundaries``: (x, words) where one part of a continuing curve ends and the next begins
        (a gang's calls): a dashed vertical, its words at the top. A label that starts with "_"
        stays out of the legend."""
        ax = self.ax
        ax.clear()
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("step" if x == "step" else "seconds since the run's first point")
        ax.set_ylabel(metric)
        drawn: list[tuple[Any, Any]] = []
        colors: list[str] = []
        nan_marks: list[tuple[float, str, str]] = []
        shown: list[tuple[int, str, str, Curve, bool]] = []
        for i, (label, color_index, c, marked) in enumerate(curves):
            color = f"C{color_index % 10}"
            if x == "step" and c.nonfinite:
                first = c.nonfinite[0]
                words = nonfinite_words(first.value, first.step, None, -1, first.stays)  # as its row says
                nan_marks.append((first.step, words, color))
            if len(c.x) == 0:
                continue
            drawn.append(downsample(c.x, c.mean, self.width_px // 2))
            colors.append(color)
            shown.append((i, label, color, c, marked))
        # The range first, from the runs that converge: a diverged run is drawn along the edge
        # it passed (clipped there), its most extreme value marked once.
        # The parts of one continuing curve (``boundaries``: a gang's calls) are one curve to the
        # range: a first call's higher losses are its start, not a diverged run to clip away.
        ranged = drawn
        if boundaries and len(drawn) > 1:
            ranged = [(np.concatenate([px for px, _ in drawn]), np.concatenate([m for _, m in drawn]))]
        self.y_range = robust_range(ranged, log_scale) if drawn else None
        lo, hi = (self.y_range.lo, self.y_range.hi) if self.y_range is not None else (-np.inf, np.inf)
        for (i, label, color, c, marked), (px, mean) in zip(shown, drawn, strict=True):
            alpha = 0.35 if i in faded else 1.0
            with np.errstate(invalid="ignore"):
                ax.plot(
                    px,
                    np.clip(mean, lo, hi),
                    color=color,
                    lw=2.4 if marked else 1.3,
                    alpha=alpha,
                    marker=marker_of(len(px)),
                    ms=5,
                    label=label + (" (best)" if marked else " (pruned)" if i in faded else ""),
                )
                if i in faded:
                    end = np.clip(c.mean[-1:], lo, hi)
                    ax.plot(c.x[-1:], end, marker="x", color=color, alpha=0.8, ms=6, lw=0)
                if len(c.x) <= 4 * self.width_px and np.any(c.hi > c.lo):
                    band = np.clip(c.lo, lo, hi), np.clip(c.hi, lo, hi)
                    ax.fill_between(c.x, *band, color=color, alpha=0.18 * alpha, lw=0)
        if drawn and x == "step":
            for step in rungs:
                ax.axvline(step, color="#888", lw=0.8, ls=":", zorder=0)
        if drawn:
            for at, words in boundaries:
                ax.axvline(at, color="#57606a", lw=0.9, ls="--", zorder=0)
                ax.annotate(
                    words,
                    (at, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, -3),
                    textcoords="offset points",
                    va="top",
                    fontsize=7,
                    color="#57606a",
                )
        if drawn and best_so_far is not None:
            ax.axhline(
                best_so_far, color="#1a7f37", lw=0.9, ls="--", label=f"best so far {number_text(best_so_far)}"
            )
        ax.set_title(metric, fontsize=10)
        if drawn:
            show_ticks(ax, True)
            ax.set_yscale("log" if log_scale else "linear")
            plain_axes(ax, steps=x == "step")
            if log_scale:
                log_ticks(ax)
            one_step_wide(ax, [px for px, _ in drawn])
            marks = mark_clipped(ax, self.y_range, colors) if self.y_range is not None else []
            mark_nonfinite(ax, nan_marks)
            self._legend([m for m in marks if hasattr(m, "get_text")])
        else:
            self.y_range = None
            say_empty(ax, "no points were logged" if done else "waiting for the first points")
        with np.errstate(over="ignore", invalid="ignore"):  # matplotlib's ticks near 1e308
            return self.png(compress_level=1)  # speed over size: it only crosses a local socket

    def _legend(self, labels: list[Any]) -> None:
        """The legend where it hides the fewest points, and under the clipped runs' values at
        the top edge, never over them (a sweep of eight runs has a tall legend)."""
        ax = self.ax
        legend = ax.legend(loc="best", fontsize=7)
        renderer = self.canvas.get_renderer()  # type: ignore[no-untyped-call]
        boxes = [t.get_window_extent(renderer) for t in labels]
        if any(legend.get_window_extent(renderer).overlaps(b) for b in boxes):
            below = ax.transAxes.inverted().transform((0.0, min(b.y0 for b in boxes) - 3.0))[1]
            ax.legend(loc="upper right", bbox_to_anchor=(1.0, float(below)), fontsize=7)

    def png(self, compress_level: int = 6) -> bytes:
        """The figure as last drawn (the record a notebook keeps is compressed harder)."""
        out = io.BytesIO()
        self.fig.savefig(out, format="png", pil_kwargs={"compress_level": compress_level})
        return out.getvalue()


class RunsView:
    """Runs' curves on one plot, kept current by a polling thread until every run ended."""

    def __init__(
        self,
        runs: list[Follower],
        *,
        metric: str = "loss",
        x: XAxis = "step",
        interval: float = 0.5,
        width_px: int = 720,
        height_px: int = 340,
    ) -> None:
        if x not in ("step", "time"):
            raise ConfigError(f"x must be 'step' or 'time', got {x!r}")
        self.runs = runs
        self.interval = interval
        self.mirrors: list[StateMirror] = [StateMirror() for _ in runs]
        self.polls = 0
        self.redraws = 0
        self.last_error = ""
        self._plot = _RunsPlot(width_px, height_px)
        self._drawn: tuple[Any, ...] = ()
        self._closed = threading.Event()
        # The poller and the widgets' callbacks (on the kernel's thread) draw one figure.
        self._lock = threading.RLock()
        self.metric = widgets.Dropdown(options=[metric], value=metric, description="metric")
        self.x_axis = widgets.ToggleButtons(
            options=["step", "time"],
            value=x,
            tooltips=["line runs up by step", "by seconds since each began"],
        )
        self.x_axis.style.button_width = "60px"
        self.log_scale = widgets.Checkbox(value=False, description="log scale", indent=False)
        self.plot = widgets.Image(format="png", layout=plot_layout(width_px))
        self.header = widgets.HTML(layout=full_width())
        self._choosing = False
        self._wanted = metric  # the metric asked for; the user's pick in the dropdown wins over it
        self.metric.observe(self._on_metric, names="value")
        for w in (self.x_axis, self.log_scale):
            w.observe(lambda _c: None if self._choosing else self._redraw_now(), names="value")
        for control in (self.metric, self.x_axis, self.log_scale):
            answer_while_waiting(control)  # a change made while a cell waits is drawn at once
        self.widget = widgets.VBox()
        self._layout()
        # Live while a run goes; once every run ended, a static record that a saved notebook keeps.
        self.record = Record(self.widget, text=f"{type(self).__name__}: live until its runs end")
        self._tick()
        self._thread = threading.Thread(target=self._loop, name="orch-compare", daemon=True)
        track(self)
        self._thread.start()

    def _layout(self) -> None:
        self.widget.children = [
            self.header,
            widgets.HBox([self.metric, self.x_axis, self.log_scale]),
            self.plot,
        ]

    def _ipython_display_(self) -> None:
        self.record._ipython_display_()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.record._repr_mimebundle_(**kwargs)

    # -- polling ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return all(f.ended for f in self.runs)

    def _loop(self) -> None:
        while not self.done and not self._closed.wait(self.interval):
            self._tick()
        self._tick()  # the last state, drawn once every run ended

    def refresh(self) -> None:
        self._tick()

    def _grow(self) -> None:
        """Take in runs that came after the view was made (a subclass's: a sweep's new trials)."""

    def _tick(self) -> None:
        with self._lock:
            self._grow()
            errors = []
            for i, follower in enumerate(self.runs):
                try:  # one run that cannot be reached leaves the others followed
                    self.mirrors[i] = follower.poll()
                except (OrchError, OSError) as e:
                    errors.append(f"{follower.label}: {e}")
            self.polls += 1
            self.last_error = "; ".join(errors)
            try:
                self._redraw()
                if self.done:  # each time: wait()'s refresh sends it from the waiting cell
                    self.record.publish(self._plot.png(), self._record_html(), self._record_text())
            except Exception:  # a drawing bug must not kill the poller; show it instead
                self.last_error = traceback.format_exc()
                log.exception("orch: redraw of the runs view failed")

    def close(self) -> None:
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def wait_done(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- drawing ----------------------------------------------------------------------------
    def marked(self) -> int | None:
        """The run drawn bold (the sweep's best), if any."""
        return None

    def curves(self) -> list[tuple[str, int, Curve, bool]]:
        metric = self.metric.value or "loss"
        best = self.marked()
        return [
            (f.label, i, curve(m, metric, self.x_axis.value), i == best)
            for i, (f, m) in enumerate(zip(self.runs, self.mirrors, strict=True))
        ]

    def _on_metric(self, _change: Any) -> None:
        if not self._choosing:
            self._wanted = self.metric.value
            self._redraw_now()

    def _redraw_now(self) -> None:
        with self._lock:
            self._redraw(force=True)

    def _redraw(self, force: bool = False) -> None:
        names = sorted({name for m in self.mirrors for _, name in m.series})
        options = metric_choices(names)
        with self.widget.hold_sync():
            if names and list(self.metric.options) != options:
                # The metric asked for (or the user's pick) once it is there; else the code's
                # (orch's rank/memory comes before it, listed after the code's, never picked).
                wanted = self._wanted if self._wanted in names else default_metric(names)
                choose(self, self.metric, options, wanted)
            self._draw_parts()
            points = tuple(sum(len(b) for b in m.series.values()) for m in self.mirrors)
            key = (points, self.marked(), tuple(m.state for m in self.mirrors))
            if force or key != self._drawn:
                self.plot.value = self._plot.draw(
                    self.curves(),
                    self.metric.value or "loss",
                    self.x_axis.value,
                    self.log_scale.value,
                    done=self.done,
                    **self._decorations(),
                )
                self._drawn = key
                self.redraws += 1

    def _decorations(self) -> dict[str, Any]:
        """What a subclass adds to the plot (see :meth:`_RunsPlot.draw`): faded runs, rungs, a level."""
        return {}

    def _draw_parts(self) -> None:
        """The header and whatever a subclass shows beside the plot."""
        self.header.value = self._header_html()

    def _record_html(self) -> str:
        """The ended view as a saved notebook shows it (:data:`~orch.views._static.IMAGE`: the plot)."""
        return self._header_html() + IMAGE

    def _record_text(self) -> str:
        lines = [re.sub(r"<[^>]+>", "", self._header_html()).replace("&middot;", "-")]
        for f, m in zip(self.runs, self.mirrors, strict=True):
            c = curve(m, self.metric.value or "loss")
            last = _last_text(c)
            lines.append(f"{f.label}: {m.state.value}, step {m.progress()[0]}, {self.metric.value} {last}")
        return "\n".join(lines)

    def _header_html(self) -> str:
        states = [m.state for m in self.mirrors]
        live = sum(not s.done for s in states)
        note = f" &middot; <i>{escape_html(self.last_error)}</i>" if self.last_error else ""
        return f"<b>orch compare</b> &middot; {len(states)} runs, {live} live{note}"


class ComparePanel(RunsView):
    """:func:`compare`: the runs' curves and a legend table of their state and last value."""

    def _record_html(self) -> str:
        return super()._record_html() + str(self.legend.value)

    def _layout(self) -> None:
        self.legend = widgets.HTML()
        super()._layout()
        self.widget.children = (*self.widget.children, self.legend)
        self.widget.add_class("orch-compare")

    def _draw_parts(self) -> None:
        super()._draw_parts()
        metric = self.metric.value or "loss"
        rows = []
        for i, (f, m) in enumerate(zip(self.runs, self.mirrors, strict=True)):
            c = curve(m, metric)
            last = escape_html(_last_text(c))
            best = number_text(_best_of(c.mean, metric)) if len(c.mean) else "-"
            color = STATE_COLORS.get(m.state, "#777")
            run_id = escape_html(m.run_id)
            rows.append(
                f'<tr class="orch-compared" data-run="{run_id}">'
                f'<td><span style="color:{_swatch(i)}">&#9632;</span> {escape_html(f.label)}'
                f' <span style="color:#57606a;font-size:85%">{run_id}</span></td>'
                f'<td style="color:{color}">{m.state.value}</td><td>{m.progress()[0]}</td>'
                f"<td>{last}</td><td>{best}</td></tr>"
            )
        self.legend.value = (
            '<table class="orch-compare-runs" style="border-collapse:collapse">'
            f"<thead><tr><th>run</th><th>state</th><th>step</th><th>{escape_html(metric)} last</th>"
            f"<th>{escape_html(metric)} best</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )


def _last_text(c: Curve) -> str:
    """A curve's last value; NaN or inf, from the step it went so, with its last finite value."""
    ends_bad = next((d for d in c.nonfinite if d.stays), None)
    if ends_bad is not None:
        return ends_bad.text().removeprefix(f"{ends_bad.metric} ")
    return number_text(c.mean[-1]) if len(c.mean) else "-"


def _swatch(i: int) -> str:
    """The hex colour of matplotlib's ``C{i}``, for HTML beside the plot."""
    from matplotlib import colors, rcParams

    cycle = rcParams["axes.prop_cycle"].by_key()["color"]
    return str(colors.to_hex(cycle[i % len(cycle)]))


def compare(
    runs: Any, metric: str = "loss", x: XAxis = "step", *, run_root: str = "runs", interval: float = 0.5
) -> ComparePanel:
    """Overlay runs in one panel: each run's ``metric`` (mean over ranks, min-max band).

    ``runs`` is a list of runs (``orch.Run``, ``orch.attach(...)``, ``orch.load_run(...)``),
    run ids (under ``run_root``) or run dirs, or a sweep. Live runs are followed as they go.
    ``x="time"`` lines runs up by seconds since each run's first point instead of by step.
    """
    return ComparePanel(followers(runs, run_root), metric=metric, x=x, interval=interval)

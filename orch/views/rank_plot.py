"""The live panel's plot: a metric's curve per rank, drawn by matplotlib into PNG bytes.

One figure and one line artist per rank are kept and updated in place every redraw, and
each series is cut down by :func:`downsample` to about one point per pixel column (its min
and max, so spikes stay): a redraw costs the same at 1k or 1M points. The panel only swaps
the bytes into an ``Image`` widget; the comparison view shares :func:`downsample`.
matplotlib is imported when a plot is made, not with this module.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from orch._text import number_text
from orch.wire.client import StateMirror


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


# Robust y limits: the 5th to 95th percentile of every finite point of the curves that did not
# diverge, widened by ten times that span on each side; points past it are clipped and marked
# at the edge (TensorBoard's "ignore outliers in chart scaling"). A spike to 6e35 or inf leaves
# the others readable, and so does a run whose whole curve is at 1e7: a curve diverged when
# where it ended (the median size of its last half) is FAR times the typical curve's (the
# lower median of those), as two of eight lrs of a log-uniform search do. Percentiles of the
# points alone let such runs set the axis: two of eight curves are a quarter of the points.
QUANTILES = (0.05, 0.95)
WIDEN = 10.0
FAR = 1e3


@dataclass
class Clipped:
    """The most extreme point of one curve past one edge of the plot (``value`` may be inf)."""

    curve: int
    x: float
    value: float
    top: bool


@dataclass
class YRange:
    """The y limits a plot keeps, and the points past them (one per curve and edge)."""

    lo: float
    hi: float
    clipped: list[Clipped] = field(default_factory=list)


def robust_range(curves: Sequence[tuple[Any, Any]], log_scale: bool = False) -> YRange | None:
    """The y limits for ``curves`` (``(x, y)`` arrays each), holding the bulk of the points: one
    diverged curve (a spike of 6e35, inf) never sets the axis. None: no finite point to show."""
    ys = [np.asarray(y, dtype=np.float64) for _, y in curves]
    shown = [y[np.isfinite(y) & (y > 0)] if log_scale else y[np.isfinite(y)] for y in ys]
    away = diverged(shown)
    kept = [v for i, v in enumerate(shown) if i not in away]
    pooled = np.concatenate(kept) if kept else np.empty(0)
    if len(pooled) == 0:
        return None
    space = np.log10(pooled) if log_scale else pooled
    # Values near the float limit (a float64 loss diverging to 1e308) overflow the sums below:
    # each overflow ends at the largest finite value, never at inf, NaN or an empty range.
    with np.errstate(over="ignore", invalid="ignore"):
        q_lo, q_hi = np.quantile(space, QUANTILES)
        span = q_hi - q_lo
        keep = space[(space >= q_lo - WIDEN * span) & (space <= q_hi + WIDEN * span)]
    if len(keep) == 0:
        keep = space
    lo, hi = float(keep.min()), float(keep.max())
    pad = (hi * 0.05 - lo * 0.05) or (abs(hi) * 0.05 if hi else 0.05)  # a flat curve still gets a band
    biggest = float(np.finfo(np.float64).max) / 4  # matplotlib's ticks need hi - lo finite
    lo, hi = max(lo - pad, -biggest), min(hi + pad, biggest)
    if log_scale:
        top = 307.0  # matplotlib's log ticks overflow past it
        lo, hi = 10.0 ** min(lo, top - 1), 10.0 ** min(hi, top)
    found = []
    for i, ((x, _), y) in enumerate(zip(curves, ys, strict=True)):
        xs = np.asarray(x)
        with np.errstate(invalid="ignore"):
            above = y > hi  # +inf too; NaN is neither above nor below
            below = y < lo
        if above.any():
            j = int(np.argmax(np.where(above, y, -np.inf)))
            found.append(Clipped(i, float(xs[j]), float(y[j]), True))
        if below.any():
            j = int(np.argmin(np.where(below, y, np.inf)))
            found.append(Clipped(i, float(xs[j]), float(y[j]), False))
    return YRange(lo, hi, found)


def diverged(values: Sequence[npt.NDArray[np.float64]]) -> set[int]:
    """The curves (their finite values each) that ended :data:`FAR` times above the typical one."""
    levels: dict[int, float] = {}
    for i, v in enumerate(values):
        if len(v):
            with np.errstate(over="ignore"):
                levels[i] = float(np.median(np.abs(v[len(v) // 2 :])))
    if len(levels) < 2:
        return set()
    typical = float(np.sort(list(levels.values()))[(len(levels) - 1) // 2])
    if not typical > 0:  # a metric at 0: no scale to be far from
        return set()
    return {i for i, level in levels.items() if level > FAR * typical}


def keep_apart(ax: Any, labels: Sequence[tuple[Any, float]]) -> None:
    """Move each label (an annotation in offset points, and the way it moves: -1 down, 1 up)
    a line at a time until it overlaps none before it: two clipped runs' values at one edge,
    or two runs that went NaN near one step, each stay readable."""
    renderer = ax.figure.canvas.get_renderer()
    placed: list[Any] = []
    for label, way in labels:
        x, y = label.xyann
        for _ in range(len(labels)):
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(b) for b in placed):
                break
            y += way * 9  # a line of the labels' 7-point type, and a gap
            label.xyann = (x, y)
        placed.append(label.get_window_extent(renderer))


def mark_clipped(ax: Any, rng: YRange, colors: Sequence[str]) -> list[Any]:
    """Set ``ax``'s y limits to ``rng`` and mark each clipped point at the edge it passed: a
    triangle in its curve's colour and its value (``▲ 6.433e+35``), one per curve and edge, the
    labels kept apart (:func:`keep_apart`). Returns the artists."""
    ax.set_ylim(rng.lo, rng.hi)
    artists = []
    labels = []
    for c in sorted(rng.clipped, key=lambda c: (not c.top, c.x, c.curve)):
        edge = rng.hi if c.top else rng.lo
        color = colors[c.curve % len(colors)] if colors else "black"
        artists.append(
            ax.plot([c.x], [edge], marker="^" if c.top else "v", color=color, ms=7, clip_on=False, ls="")[0]
        )
        label = ax.annotate(
            number_text(c.value),
            (c.x, edge),
            xytext=(-5, -10 if c.top else 4),
            textcoords="offset points",
            ha="right",
            fontsize=7,
            color=color,
            annotation_clip=False,
        )
        artists.append(label)
        labels.append((label, -1.0 if c.top else 1.0))
    keep_apart(ax, labels)
    return artists


def mark_nonfinite(ax: Any, steps: Sequence[tuple[float, str, str]]) -> list[Any]:
    """A dotted vertical line where a curve's value became NaN or inf: ``(x, text, colour)``,
    its words at the foot of the line (a clipped spike's value is at the top), kept apart."""
    artists = []
    labels = []
    left, right = ax.get_xlim()
    for x, text, color in sorted(steps, key=lambda s: s[0]):
        artists.append(ax.axvline(x, color=color, ls=":", lw=1.0))
        late = x > (left + right) / 2  # its words to the left of the line, inside the plot
        label = ax.annotate(
            text,
            (x, 0.0),
            xycoords=("data", "axes fraction"),
            xytext=(-3 if late else 3, 4),
            textcoords="offset points",
            ha="right" if late else "left",
            fontsize=7,
            color=color,
        )
        artists.append(label)
        labels.append((label, 1.0))
    keep_apart(ax, labels)
    return artists


def log_ticks(ax: Any) -> None:
    """A log axis labelled in numbers as the tables write them (``336``, ``0.01``, ``1e-06``):
    matplotlib's ``3.36 x 10^2`` on the ticks between powers of ten is wider than the margin
    and was cut. The ticks between powers are labelled only when the axis spans less than two
    decades (a memory curve, a loss near its floor), where there are few powers to read."""
    from matplotlib.ticker import FuncFormatter

    def minor(value: float, _pos: int) -> str:
        low, high = ax.get_ylim()
        return f"{value:.3g}" if low > 0 and high / low < 100 else ""

    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:.3g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def show_ticks(ax: Any, shown: bool) -> None:
    ax.tick_params(left=shown, bottom=shown, labelleft=shown, labelbottom=shown)


def plain_axes(ax: Any, steps: bool = True) -> None:
    """Ticks a reader reads as they are: whole steps on a step axis (``steps``), and a linear
    y axis without matplotlib's offset (``+2.601e2`` over the ticks of a memory curve)."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    if steps:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    formatter = ax.yaxis.get_major_formatter()
    if isinstance(formatter, ScalarFormatter):
        formatter.set_useOffset(False)


def one_step_wide(ax: Any, xs: Sequence[Any]) -> None:
    """Curves whose points all sit at one step (a run with a single point) get an axis a step
    either side of it, not matplotlib's -0.04 to 0.04."""
    found = [np.asarray(x) for x in xs if len(x)]
    if not found:
        return
    lo = min(float(np.min(x)) for x in found)
    if lo == max(float(np.max(x)) for x in found):
        ax.set_xlim(lo - 1, lo + 1)


def marker_of(points: int) -> str:
    """A line of one point draws nothing: it is drawn as a point."""
    return "o" if points == 1 else "None"


def say_empty(ax: Any, text: str) -> Any:
    """No axes to read when there is nothing to draw: ``text`` in their place."""
    show_ticks(ax, False)
    return ax.text(
        0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=11, color="#57606a"
    )


# Past this many ranks the plot draws the ranks' spread (their mean and the band from the
# lowest to the highest, per pixel column), not a line per rank: 4,096 lines and a legend of
# 4,096 entries took the panel 20 s a redraw (holding the GIL of the notebook, and of the
# master beside it), and no eye reads them.
MAX_RANK_LINES = 16
SPREAD_COLOR = "C0"


def spread(
    curves: Sequence[tuple[npt.NDArray[Any], npt.NDArray[np.float64]]], columns: int
) -> tuple[npt.NDArray[np.float64], ...]:
    """The ranks' curves (``(steps, values)``, steps rising) summed up in ``columns`` equal
    spans of steps: each span's middle, and the mean, lowest and highest finite value of the
    ranks' points in it (spans without one left out)."""
    firsts = [x[0] for x, _ in curves if len(x)]
    if not firsts:
        empty = np.empty(0)
        return empty, empty, empty, empty
    x0 = float(min(firsts))
    x1 = float(max(x[-1] for x, _ in curves if len(x)))
    edges = np.linspace(x0, x1 if x1 > x0 else x0 + 1.0, columns + 1)
    total, count = np.zeros(columns), np.zeros(columns)
    low, high = np.full(columns, np.inf), np.full(columns, -np.inf)
    for x, y in curves:
        ok = np.isfinite(y)
        if not ok.all():
            x, y = x[ok], y[ok]
        if not len(x):
            continue
        # Steps rise: each span's points are a run of the array, cut where the edges fall.
        cuts = np.searchsorted(x, edges[1:-1], side="left")
        starts = np.concatenate(([0], cuts))
        filled = starts < np.concatenate((cuts, [len(x)]))
        at = starts[filled]
        total[filled] += np.add.reduceat(y, at)
        count[filled] += np.diff(np.concatenate((at, [len(x)])))
        low[filled] = np.minimum(low[filled], np.minimum.reduceat(y, at))
        high[filled] = np.maximum(high[filled], np.maximum.reduceat(y, at))
    seen = count > 0
    middle = (edges[:-1] + edges[1:]) / 2
    return middle[seen], total[seen] / count[seen], low[seen], high[seen]


class RankPlot:
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
        plain_axes(self.ax)
        self.fig.subplots_adjust(left=0.1, right=0.98, top=0.92, bottom=0.15)
        self.lines: dict[int, Any] = {}
        self.metric = ""
        self.log_scale = False
        self.marks: list[Any] = []  # clipped points, NaN steps, the empty plot's words: redrawn each time
        self.y_range: YRange | None = None  # the limits of the last drawing
        self.spread_of = 0  # ranks the spread stands for (0: a line per rank is drawn)
        self._mean: Any = None  # the spread's mean line, and its band (redrawn each time)
        self._band: Any = None
        self._band_edges: list[tuple[Any, Any]] = []

    def draw(self, mirror: StateMirror, metric: str, log_scale: bool) -> bytes:
        ax = self.ax
        if metric != self.metric:
            self._clear_curves()
            self.metric = metric
        title = metric or "no metric"
        if ax.get_title() != title:
            ax.set_title(title, fontsize=10)
            ax.set_ylabel(metric)
        curves = [(rank, buf) for (rank, name), buf in sorted(mirror.series.items()) if name == metric]
        if len(curves) > MAX_RANK_LINES:
            self._draw_spread([(buf.steps, buf.values) for _, buf in curves])
        else:
            self._draw_lines(curves)
        # A log axis needs a positive value to span: none before the first points (a curve may
        # be asked for on a log axis before any came), when the axis stays linear.
        log_scale = log_scale and bool(self.lines or self.spread_of)
        if log_scale != self.log_scale:
            ax.set_yscale("log" if log_scale else "linear")
            if log_scale:
                log_ticks(ax)
            else:
                plain_axes(ax, steps=False)
            self.log_scale = log_scale
        for artist in self.marks:
            artist.remove()
        self.marks = []
        with np.errstate(over="ignore", invalid="ignore"):  # matplotlib's margins of values near 1e308
            ax.relim()
            ax.autoscale_view()
        if self.spread_of:
            shown = [self._mean.get_data(), *self._band_edges]
            colors = [SPREAD_COLOR] * len(shown)
        else:
            ranks = sorted(self.lines)
            shown = [self.lines[r].get_data() for r in ranks]
            colors = [f"C{r % 10}" for r in ranks]
        one_step_wide(ax, [x for x, _ in shown])
        self.y_range = robust_range(shown, log_scale)
        if self.y_range is not None:
            self.marks += mark_clipped(ax, self.y_range, colors)
        self.marks += mark_nonfinite(ax, self._nonfinite_marks(mirror, metric))
        if self.lines or self.spread_of:
            show_ticks(ax, True)
        else:  # no empty axes of -0.04 to 0.04: say why there is no curve
            why = "no points were logged" if mirror.state.done else "waiting for the first points"
            self.marks.append(say_empty(ax, why))
        # Speed over size: the PNG only crosses a local socket to the browser.
        with np.errstate(over="ignore", invalid="ignore"):  # matplotlib's ticks near 1e308
            return self.png(compress_level=1)

    def _clear_curves(self) -> None:
        for line in self.lines.values():
            line.remove()
        self.lines.clear()
        for artist in (self._mean, self._band):
            if artist is not None:
                artist.remove()
        self._mean = self._band = None
        self.spread_of = 0

    def _draw_lines(self, curves: list[tuple[int, Any]]) -> None:
        """A line per rank, each kept and updated in place."""
        if self.spread_of:
            self._clear_curves()
        ax = self.ax
        ranks_before = len(self.lines)
        for rank, buf in curves:
            # min and max of every other pixel column: about one point per pixel, spikes kept
            x, y = downsample(buf.steps, buf.values, self.width_px // 2)
            line = self.lines.get(rank)
            if line is None:
                (line,) = ax.plot(x, y, lw=1.2, color=f"C{rank % 10}", label=f"rank {rank}", ms=5)
                self.lines[rank] = line
            else:
                line.set_data(x, y)
            line.set_marker(marker_of(len(x)))
        if len(self.lines) != ranks_before:  # a new legend only when a rank's line appears
            ax.legend(handles=[self.lines[r] for r in sorted(self.lines)], loc="upper right", fontsize=8)

    def _draw_spread(self, curves: list[tuple[Any, Any]]) -> None:
        """The ranks' mean, and the band from their lowest to their highest value, per column."""
        if self.lines:
            self._clear_curves()
        ax = self.ax
        x, mean, low, high = spread(curves, max(1, self.width_px // 4))
        self._band_edges = [(x, low), (x, high)]
        if self._band is not None:
            self._band.remove()
        self._band = ax.fill_between(x, low, high, color=SPREAD_COLOR, alpha=0.25, lw=0)
        if self._mean is None:
            (self._mean,) = ax.plot(x, mean, lw=1.4, color=SPREAD_COLOR, ms=5)
        else:
            self._mean.set_data(x, mean)
        self._mean.set_marker(marker_of(len(x)))
        if self.spread_of != len(curves):
            self.spread_of = len(curves)
            self._band.set_label(f"lowest to highest of {len(curves):,} ranks")
            self._mean.set_label(f"mean of {len(curves):,} ranks")
            ax.legend(handles=[self._mean, self._band], loc="upper right", fontsize=8)

    def _nonfinite_marks(self, mirror: StateMirror, metric: str) -> list[tuple[float, str, str]]:
        """Where a curve became NaN or inf: each rank's, or past :data:`MAX_RANK_LINES` ranks the
        first one's, with how many more ranks did."""
        found = mirror.nonfinite(metric)
        if not self.spread_of or len(found) <= 1:
            return [
                (d.step, f"rank {d.rank}: {number_text(d.value)} from step {d.step}", f"C{d.rank % 10}")
                for d in found
            ]
        first = found[0]
        others = len(found) - 1
        more = f" (and {others} more rank{'s' if others > 1 else ''})"
        return [
            (first.step, f"rank {first.rank}: {number_text(first.value)} from step {first.step}{more}", "C3")
        ]

    def png(self, compress_level: int = 6) -> bytes:
        """The figure as last drawn (the record kept in a notebook is compressed harder)."""
        out = io.BytesIO()
        self.fig.savefig(out, format="png", pil_kwargs={"compress_level": compress_level})
        return out.getvalue()

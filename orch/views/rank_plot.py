"""The live panel's plot: a metric's curve per rank, drawn by matplotlib into PNG bytes.

One figure and one line artist per rank are kept and updated in place every redraw, and
each series is cut down by :func:`downsample` to about one point per pixel column (its min
and max, so spikes stay): a redraw costs the same at 1k or 1M points. The panel only swaps
the bytes into an ``Image`` widget; the comparison view shares :func:`downsample`.
matplotlib is imported when a plot is made, not with this module.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import numpy.typing as npt

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

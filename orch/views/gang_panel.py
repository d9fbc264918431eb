"""A gang's calls as one training session: ``gang.panel()``.

A gang's calls build, train, change a learning rate and train again, each a run of its own that
counts its steps from 0. This panel draws them as the one session they are: each call's curve
(the mean of the metric over the ranks, with the band from the least to the greatest rank)
starts where the call before ended, on one step axis (the call's steps offset by the steps of
the calls before it), one colour throughout, with a dashed line and the call's name where each
call begins. Calls that logged nothing of the metric (a build, a learning-rate change) are
listed in the table below, not drawn; a pull or a push is neither (it moves objects: no run of
the user's). ``x="time"`` lines the calls up by seconds since each call's first point, each
starting where the one before ended. The panel follows the calls made while it is live, and
becomes a static record once every call so far ended.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from orch._text import escape_html, number_text
from orch.views.comparison import ComparePanel, _best_of, _last_text
from orch.views.followers import Curve, Mirrored, XAxis, curve
from orch.views.run_html import STATE_COLORS
from orch.wire.client import StateMirror


def call_label(run: Any) -> str:
    """``call 3: train``, from the call's name ``gang ab12 call 3: train``."""
    name = str(getattr(run.spec, "name", "") or run.run_id)
    return name.split(" ", 2)[2] if name.startswith("gang ") and name.count(" ") >= 2 else name


class GangPanel(ComparePanel):
    """The calls of ``gang`` so far, as one continuing curve (see the module docstring)."""

    def __init__(self, gang: Any, *, metric: str = "loss", x: XAxis = "step", interval: float = 0.5) -> None:
        self.gang = gang
        self.spans: list[tuple[float, float]] = []  # each call's place on the x axis: (start, end)
        super().__init__([], metric=metric, x=x, interval=interval)

    def _layout(self) -> None:
        super()._layout()
        self.widget.add_class("orch-gang")

    def _grow(self) -> None:
        """The calls made since the last poll (pulls and pushes aside)."""
        calls = [c for c in self.gang.calls if not getattr(c, "transfer", False)]
        for call in calls[len(self.runs) :]:
            self.runs.append(Mirrored(call, call_label(call)))
            self.mirrors.append(StateMirror())

    def segments(self) -> list[tuple[int, Curve]]:
        """Each call's curve with points, shifted to start where the calls before it ended; and
        :attr:`spans`, every call's place (a call that logged nothing spans its steps, if any)."""
        metric, x = self.metric.value or "loss", self.x_axis.value
        offset = 0.0
        found: list[tuple[int, Curve]] = []
        self.spans = []
        for i, m in enumerate(self.mirrors):
            c = curve(m, metric, x)
            if x == "step":
                span = float(max([r.step for r in m.ranks] + ([int(c.x.max()) + 1] if len(c.x) else [0])))
            else:
                span = float(c.x.max()) if len(c.x) else 0.0
            if len(c.x):
                shifted = [dataclasses.replace(d, step=d.step + int(offset)) for d in c.nonfinite]
                found.append((i, Curve(np.asarray(c.x) + offset, c.mean, c.lo, c.hi, shifted)))
            self.spans.append((offset, offset + span))
            offset += span
        return found

    def curves(self) -> list[tuple[str, int, Curve, bool]]:
        metric = self.metric.value or "loss"
        parts = self.segments()
        drawn = []
        for n, (i, c) in enumerate(parts):
            if n:  # from the call before's last point: one line across the boundary, no gap
                p = parts[n - 1][1]
                c = Curve(
                    np.concatenate([p.x[-1:], c.x]),
                    np.concatenate([p.mean[-1:], c.mean]),
                    np.concatenate([p.lo[-1:], c.lo]),
                    np.concatenate([p.hi[-1:], c.hi]),
                    c.nonfinite,
                )
            drawn.append((f"{metric}, mean over ranks" if n == 0 else f"_{self.runs[i].label}", 0, c, False))
        return drawn

    def _decorations(self) -> dict[str, Any]:
        metric = self.metric.value or "loss"
        marks, between = [], []
        for i, m in enumerate(self.mirrors):
            if not len(curve(m, metric).x) or i >= len(self.spans):
                between.append(
                    self.runs[i].label
                )  # a build, a learning rate: said where the next call begins
                continue
            marks.append((self.spans[i][0], "\n".join([*between, self.runs[i].label])))
            between = []
        return {"boundaries": marks}

    def _draw_parts(self) -> None:
        self.header.value = self._header_html()
        metric = self.metric.value or "loss"
        self.segments()
        rows = []
        for i, (f, m) in enumerate(zip(self.runs, self.mirrors, strict=True)):
            c = curve(m, metric)
            start, end = self.spans[i]
            steps = f"{int(start)}&ndash;{int(end) - 1}" if end > start else "-"
            if len(c.mean):
                last, best = escape_html(_last_text(c)), number_text(_best_of(c.mean, metric))
            else:
                last, best = f"<i>no {escape_html(metric)} logged</i>", ""
            color = STATE_COLORS.get(m.state, "#777")
            rows.append(
                f'<tr class="orch-gang-call" data-run="{escape_html(m.run_id)}">'
                f"<td>{escape_html(f.label)}"
                f' <span style="color:#57606a;font-size:85%">{escape_html(m.run_id)}</span></td>'
                f'<td style="color:{color}">{m.state.value}</td><td>{steps}</td>'
                f"<td>{last}</td><td>{best}</td></tr>"
            )
        self.legend.value = (
            '<table class="orch-gang-calls" style="border-collapse:collapse">'
            f"<thead><tr><th>call</th><th>state</th><th>steps</th><th>{escape_html(metric)} last</th>"
            f"<th>{escape_html(metric)} best</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )

    def _header_html(self) -> str:
        states = [m.state for m in self.mirrors]
        live = sum(not s.done for s in states)
        note = f" &middot; <i>{escape_html(self.last_error)}</i>" if self.last_error else ""
        return (
            f"<b>orch gang {escape_html(self.gang.gang_id)}</b> &middot; {len(states)} calls, {live} live"
            f" &middot; each call's steps go on from the call before{note}"
        )


def gang_panel(gang: Any, metric: str = "loss", x: XAxis = "step", *, interval: float = 0.5) -> GangPanel:
    """``gang.panel()``: the gang's calls as one session (see :class:`GangPanel`)."""
    return GangPanel(gang, metric=metric, x=x, interval=interval)

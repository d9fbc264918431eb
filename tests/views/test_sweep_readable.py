"""A log-uniform lr search in which two trials diverged, as the sweep panel draws it.

The panel reads made-up runs (a mirror each, ended): six whose loss converges, one that grows
to 2e35 and one that grows to 1e10 and then goes inf and NaN. Its y range comes from the six,
the two are marked at the top edge once each with labels that do not overlap, NaN and inf
read the same in its live rows and in its record, and every lr is written with 4 significant
digits: rows, legend, "best by" line, results. The real sweeps are in test_sweep_panel.py and
test_browser.py.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from orch.experiments.results import SweepResults
from orch.experiments.trial import Trial
from orch.views.comparison import _RunsPlot
from orch.views.rank_plot import Clipped, YRange, mark_clipped, mark_nonfinite
from orch.views.rendering import render_sweep_plain
from orch.views.sweep_panel import SweepPanel
from orch.wire.client import SeriesBuffer, StateMirror
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

STEPS = np.arange(20)
# Six lrs of loguniform(1e-3, 100) that converge (16 digits each, as a sampler draws them) and
# two that diverge: one to 2.167e+35 at its last step, one to 1.096e+10 a step before it goes
# inf, and NaN after.
CONVERGING = [0.001234567890123, 0.01234567890123, 0.0345678901234, 0.1234567890123, 0.2345678901234]
CONVERGING.append(0.4457453393648168)
LRS = [*CONVERGING, 23.45678901234567, 71.23456789012345]


def loss(lr: float) -> tuple[list[int], list[float]]:
    if lr == LRS[6]:
        return list(STEPS), list(5.0 * (2.167e35 / 5.0) ** (STEPS / 19.0))
    if lr == LRS[7]:  # finite to step 18, inf at 19, NaN at 20
        grown = list(5.0 * (1.096e10 / 5.0) ** (np.arange(19) / 18.0))
        return [*range(21)], [*grown, math.inf, math.nan]
    return list(STEPS), list(5.0 * np.exp(-lr * 10 * STEPS) + 0.1 * (1 - lr))  # the greatest lr ends best


def ended_mirror(steps: list[int], values: list[float], run_id: str) -> StateMirror:
    m = StateMirror(run_id=run_id, state=RunState.SUCCEEDED, world_size=1, registered=1)
    buf = m.series[(0, "loss")] = SeriesBuffer()
    buf.extend(steps, values, [100.0 + s for s in steps])
    rank = RankView(rank=0, state=RankState.SUCCEEDED, step=steps[-1], loss=values[-1], has_loss=True)
    m.ranks.append(rank)
    return m


def fake_sweep() -> Any:
    trials = []
    for i, lr in enumerate(LRS):
        mirror = ended_mirror(*loss(lr), f"r{i}")
        run = SimpleNamespace(
            run_id=f"r{i}", state=lambda m=mirror: m, history=lambda m=mirror: m.history(), done=True
        )
        trials.append(Trial(index=i, config={"lr": lr, "steps": 20}, key=str(i), state="SUCCEEDED", run=run))
        trials[-1].ended = True
    return SimpleNamespace(
        trials=trials,
        size=len(trials),
        name="lr",
        done=True,
        pruner=None,
        mode="min",
        results=lambda: SweepResults([t.summary() for t in trials], "lr"),
    )


@pytest.fixture
def panel(widget_messages: list[Any]) -> Any:
    p = SweepPanel(fake_sweep())
    assert p.wait_done(10)
    yield p
    p.close()


def test_the_plot_s_range_comes_from_the_converging_trials(panel: Any) -> None:
    y = panel._plot.y_range
    assert y is not None and 4 < y.hi < 10 and y.lo < 0.1, y  # the converging curves, 5 down to 0.055
    # Each diverged trial clipped at the top edge, marked once (not a mark per point).
    assert sorted((c.curve, c.top) for c in y.clipped) == [(6, True), (7, True)]
    assert [c.value for c in sorted(y.clipped, key=lambda c: c.curve)] == pytest.approx([2.167e35, 1.096e10])
    # Its line is drawn along that edge, not off the plot.
    lines = panel._plot.ax.get_lines()
    assert max(lines[6].get_ydata()) == pytest.approx(y.hi)


def test_the_clipped_values_labels_do_not_overlap(panel: Any) -> None:
    ax = panel._plot.ax
    renderer = panel._plot.fig.canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_text() in ("2.167e+35", "1.096e+10")]
    assert len(labels) == 2, [t.get_text() for t in ax.texts]
    first, second = (t.get_window_extent(renderer) for t in labels)
    assert not first.overlaps(second), (first, second)
    # Two runs clipped a step apart at one edge, and two that went NaN a step apart.
    plot = _RunsPlot(720, 340)
    plot.ax.plot([0, 20], [0, 1])
    rng = YRange(0.0, 1.0, [Clipped(0, 19.0, 2.167e35, True), Clipped(1, 18.0, 1.096e10, True)])
    marks = mark_clipped(plot.ax, rng, ["C0", "C1"])
    marks += mark_nonfinite(plot.ax, [(12.0, "nan from step 12", "C2"), (13.0, "inf from step 13", "C3")])
    renderer = plot.fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in marks if hasattr(t, "get_text")]
    assert len(boxes) == 4
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)


def test_nan_and_inf_read_the_same_live_and_in_the_record(panel: Any) -> None:
    live = re.sub(r"<[^>]+>", "", panel.rows[7][1].value.split('class="orch-trial-nonfinite"')[1])
    assert "rank 0: loss inf from step 19 (last finite 1.096e+10 at step 18)" in live, live
    record = panel._repr_mimebundle_()["text/html"]
    assert "<td>inf from step 19 (last finite 1.096e+10 at step 18)</td>" in record
    results = panel.sweep.results()
    assert "inf from step 19 (last finite 1.096e+10 at step 18)" in repr(results)
    assert "loss inf from step 19 (last finite 1.096e+10 at step 18)" in render_sweep_plain(
        [{"index": 7, "config": {}, "state": "SUCCEEDED", "nonfinite": results[7]["nonfinite"]}]
    )


def test_the_live_rows_write_lr_with_4_significant_digits(panel: Any) -> None:
    row = panel.rows[5][1].value
    assert ">0.4457<" in row and "0.4457453" not in row


def test_the_plot_s_legend_writes_lr_with_4_significant_digits(panel: Any) -> None:
    legend = [t.get_text() for t in panel._plot.ax.get_legend().get_texts()]
    assert "#5 lr=0.4457, steps=20 (best)" in legend and "#6 lr=23.46, steps=20" in legend, legend


def test_the_best_by_line_writes_lr_with_4_significant_digits(panel: Any) -> None:
    record = panel._repr_mimebundle_()["text/html"]
    assert "best by final loss: #5 lr=0.4457, steps=20 (run r5)" in record


def test_the_results_write_lr_with_4_significant_digits(panel: Any) -> None:
    record = panel._repr_mimebundle_()["text/html"]
    assert "<td>0.4457</td>" in record and "0.4457453" not in record  # the record's results table
    # numpy's floats too (np.logspace(...) as a grid: a float32 read 0.44574535); ints stay
    # ints, strings as written
    row = dict(panel.sweep.results()[0], config={"lr": np.float32(LRS[5]), "bs": 32, "opt": "adam"})
    head, body = SweepResults([row], "s").table()
    assert body[0][1:4] == ["32", "0.4457", "adam"], (head, body)
    assert "<td>0.4457</td>" in SweepResults([row], "s")._repr_html_()


def test_the_terminal_s_sweep_table_writes_lr_with_4_significant_digits() -> None:
    rows = [{"index": 5, "config": {"lr": LRS[5], "opt": "adam"}, "state": "SUCCEEDED"}]
    assert render_sweep_plain(rows).endswith("lr=0.4457, opt='adam'")


def test_the_rows_line_up_under_the_header(panel: Any) -> None:
    def widths(html: str) -> list[str]:
        return re.findall(r'<span class="orch-cell"[^>]*?style="display:inline-block;width:(\d+)ch', html)

    head = widths(panel.table_head.value)
    assert len(head) == 7
    for _, cells in panel.rows:
        assert widths(cells.value) == head


def test_a_loss_that_went_inf_reads_the_same_in_the_record_as_live() -> None:
    """A loss that went inf and then NaN (inf - inf) read "nan from step 10" in ``orch runs``
    while the live row said "inf from step 10": both say what it became, where."""
    from pathlib import Path

    from orch.experiments.run_row import RunRow
    from orch.wire.client import NonFinite

    bad = NonFinite(
        rank=0,
        metric="loss",
        step=10,
        value=math.inf,
        last_finite=6.4331e35,
        last_finite_step=9,
        final=math.nan,
    )
    row = RunRow(run_id="r", path=Path("."), state="FAILED", final_loss=math.nan, nonfinite=[bad])
    assert row.loss_text() == "inf from step 10 (last finite 6.433e+35 at step 9)"
    assert bad.text() == "loss " + row.loss_text()
    came_back = NonFinite(
        rank=0, metric="loss", step=4, value=math.nan, last_finite=0.5, last_finite_step=3, final=0.25
    )
    row = RunRow(run_id="r", path=Path("."), state="SUCCEEDED", final_loss=0.25, nonfinite=[came_back])
    assert row.loss_text() == "0.25 (nan at step 4)"

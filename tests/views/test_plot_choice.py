"""What the run panel plots, and what it leaves out, through its synced state and its record.

A plot only when there is something to plot: a run that ended without a point of the code's
says so in a line (orch's own ``rank/memory`` is never its pick, and sits after the code's
metrics in every metric list); one point draws as a point. A run that said nothing has no
empty table and no straggler note; its record keeps the last lines of rank 0's output.
No master and no process: the panel reads a run that ended, from a source made here.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orch.experiments.run_detail import describe
from orch.experiments.run_row import RunRow
from orch.master.control.stragglers import ENDED_TOO_SHORT, judge, too_short
from orch.views._static import WIDGET_VIEW
from orch.views.comparison import _RunsPlot
from orch.views.followers import Curve
from orch.views.panel import FULL_WIDTH, NO_POINTS, Panel, default_metric, metric_choices
from orch.views.rendering import render, run_table
from orch.views.run_html import table_html
from orch.wire.client import SeriesBuffer, StateMirror
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

pytestmark = pytest.mark.unit

MEMORY = "rank/memory"
TOO_SHORT_NOTE = f"{ENDED_TOO_SHORT} after too few steps (no rank had sent step times)"


class Ended:
    """A run that ended, as a panel's source: no master, its final state and its logs."""

    address = "(on disk)"
    done = True

    def __init__(self, mirror: StateMirror, logs: dict[str, Path] | None = None) -> None:
        self.mirror = mirror
        self.logs = logs or {}

    def connect(self) -> None:
        return None

    def final_state(self) -> StateMirror:
        return self.mirror

    def log_files(self) -> dict[str, Path]:
        return self.logs

    def stop(self, reason: str = "") -> RunState:
        return self.mirror.state


def ended_run(
    state: RunState,
    points: dict[str, dict[int, tuple[list[int], list[float]]]],
    *,
    ranks: tuple[RankState, ...] = (RankState.SUCCEEDED, RankState.SUCCEEDED),
    step: int = 0,
    note: str = TOO_SHORT_NOTE,
) -> StateMirror:
    m = StateMirror(run_id="r1", state=state, world_size=len(ranks), registered=len(ranks))
    m.straggler_note = note
    for metric, by_rank in points.items():
        for rank, (steps, values) in by_rank.items():
            buf = m.series[(rank, metric)] = SeriesBuffer()
            buf.extend(steps, values, [100.0 + s for s in steps])
    for rank, rank_state in enumerate(ranks):
        loss = points.get("loss", {}).get(rank)
        m.ranks.append(
            RankView(
                rank=rank,
                worker_id=f"r1-w{rank}",
                state=rank_state,
                step=step,
                loss=loss[1][-1] if loss else float("nan"),
                has_loss=loss is not None,
                rss_bytes=260_100_000,
                cpu_percent=98.0,
            )
        )
    return m


def panel_of(mirror: StateMirror, logs: dict[str, Path] | None = None) -> Panel:
    panel = Panel(Ended(mirror, logs), interval=0.05)
    assert panel.wait_done(10)
    return panel


def bundle_of(panel: Panel) -> dict[str, Any]:
    bundle = panel._repr_mimebundle_()
    assert panel.record.published and WIDGET_VIEW not in bundle, sorted(bundle)
    return bundle


def test_orch_s_own_metrics_come_after_the_code_s_and_are_never_the_first_choice() -> None:
    assert metric_choices([]) == ["loss"]
    assert metric_choices([MEMORY]) == ["loss", MEMORY]  # nothing of the code's: loss, waited for
    assert default_metric([MEMORY, "rank/cuda_memory"]) == "loss"
    names = ["accuracy", MEMORY, "train/loss", "rank/cuda_memory"]
    assert metric_choices(names) == ["accuracy", "train/loss", "rank/cuda_memory", MEMORY]
    assert default_metric(names) == "train/loss"
    assert default_metric(["accuracy", MEMORY, "lr"]) == "accuracy"  # the code's first, not rank/memory


def test_a_failed_run_that_logged_no_loss_says_no_points_were_logged_not_a_memory_plot() -> None:
    # Only orch's own memory points, one per rank at step 0 (260.1 MB): no curve of the code's.
    m = ended_run(
        RunState.FAILED,
        {MEMORY: {0: ([0], [260.1]), 1: ([0], [260.1])}},
        ranks=(RankState.STOPPED, RankState.FAILED),
    )
    m.failure, m.root_cause_error = "rank 1 failed: ImportError", "Traceback ...\nImportError: no module x"
    panel = panel_of(m)
    try:
        assert list(panel.metric.options) == ["loss", MEMORY] and panel.metric.value == "loss"
        assert panel.plot.layout.display == "none" and panel.no_points.value == NO_POINTS
        assert "no points were logged" in panel.no_points.value
        bundle = bundle_of(panel)
        page = bundle["text/html"]
        assert "image/png" not in bundle and "<img" not in page  # no empty axes in the record either
        assert "no points were logged" in page and "Root cause" in page and "ImportError" in page
        # nothing but the ranks' states to say: a line, not a table of dashes
        assert 'class="orch-ranks"' not in page and "FAILED: rank 1; STOPPED: rank 0" in page
        assert "not judged" not in page  # too short to judge: quiet
        # orch's memory is there to pick: then it is drawn, a point per rank with plain ticks
        panel.metric.value = MEMORY
        assert panel.plot.layout.display is None and panel.no_points.value == ""
        lo, hi = panel._plot.ax.get_xlim()
        assert (lo, hi) == (-1.0, 1.0), (lo, hi)  # a step either side, not -0.04 to 0.04
        assert all(line.get_marker() == "o" for line in panel._plot.lines.values())
        panel._plot.fig.canvas.draw()
        assert panel._plot.ax.yaxis.get_offset_text().get_text() == ""  # no "+2.601e2"
        assert "<img" in bundle_of(panel)["text/html"]  # the record is what the panel shows now
    finally:
        panel.close()


def test_one_point_draws_as_a_point() -> None:
    m = ended_run(RunState.SUCCEEDED, {"loss": {0: ([5], [2.3]), 1: ([5], [2.1])}}, step=6)
    panel = panel_of(m)
    try:
        assert panel.metric.value == "loss" and panel.plot.layout.display is None
        assert [line.get_marker() for line in panel._plot.lines.values()] == ["o", "o"]
        assert panel._plot.ax.get_xlim() == (4.0, 6.0)
        assert list(panel._plot.ax.texts) == []  # no "no points" words over the point
        bundle = bundle_of(panel)
        assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
        assert 'class="orch-ranks"' in bundle["text/html"]  # a step and a loss: the table
    finally:
        panel.close()
    # A second point: a line again, no markers.
    plot = panel._plot
    m.series[(0, "loss")].extend([6], [2.2], [106.0])
    plot.draw(m, "loss", False)
    assert [line.get_marker() for line in plot.lines.values()] == ["None", "o"]
    # The comparison draws a run of one point as a point too.
    runs = _RunsPlot(400, 200)
    one = Curve(np.array([3]), np.array([0.5]), np.array([0.5]), np.array([0.5]))
    runs.draw([("lr=0.1", 0, one, False)], "loss", "step", False, done=True)
    assert [line.get_marker() for line in runs.ax.lines] == ["o"] and runs.ax.get_xlim() == (2.0, 4.0)


def test_the_panel_s_pick_is_the_code_s_metric_and_orch_s_sit_after_it() -> None:
    points = {
        MEMORY: {0: ([0, 1, 2], [300.0, 301.0, 302.0])},
        "train/loss": {0: ([0, 1, 2], [2.0, 1.5, 1.0])},
        "accuracy": {0: ([2], [0.5])},
    }
    m = ended_run(RunState.SUCCEEDED, points, ranks=(RankState.SUCCEEDED,), step=3)
    panel = panel_of(m)
    try:
        assert list(panel.metric.options) == ["accuracy", "train/loss", MEMORY]
        assert panel.metric.value == "train/loss" and panel.plot.layout.display is None
    finally:
        panel.close()


def test_a_call_that_logged_nothing_has_no_plot_no_table_and_no_straggler_note() -> None:
    """A gang's setup cell (it builds a model): two ranks that succeeded at step 0."""
    m = ended_run(RunState.SUCCEEDED, {})
    panel = panel_of(m)
    try:
        page = bundle_of(panel)["text/html"]
        assert "<img" not in page and "no points were logged" in page
        assert 'class="orch-ranks"' not in page and "orch-legend" not in page
        assert "2 ranks, both SUCCEEDED" in page and "stragglers" not in page
    finally:
        panel.close()
    assert "rank 0: SUCCEEDED" in table_html(ended_run(RunState.SUCCEEDED, {}, ranks=(RankState.SUCCEEDED,)))
    assert "no rank registered" in table_html(ended_run(RunState.FAILED, {}, ranks=()))


def test_a_run_too_short_to_judge_shows_no_straggler_note_unless_asked() -> None:
    verdict = judge({0: None, 1: None}, 2)
    assert too_short(verdict.shown(run_ended=True)) and not too_short(verdict.shown(run_ended=False))
    assert not too_short("no straggler: the ranks spend about the same in each part of a 3.0 ms step")
    ended = ended_run(RunState.SUCCEEDED, {"loss": {0: ([0, 63], [2.0, 1.0])}}, step=64)
    assert "not judged" not in render(ended) and "stragglers:" not in render(ended)
    assert "not judged" not in table_html(ended)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(run_table(ended))
    assert "not judged" not in console.export_text()
    # A live run not judged yet says so; so does a real judgement, once the run ended.
    live = ended_run(RunState.RUNNING, {"loss": {0: ([0], [2.0])}}, note="not judged yet: too few steps")
    assert "not judged yet: too few steps" in render(live) and "not judged yet" in table_html(live)
    judged = ended_run(RunState.SUCCEEDED, {"loss": {0: ([0], [2.0])}}, note="no straggler: about the same")
    assert "stragglers: no straggler" in render(judged) and "no straggler" in table_html(judged)
    # Asked for: `orch show`, the record and run.state() keep the note.
    row = RunRow(run_id="r1", path=Path("/nonexistent/r1"), state="SUCCEEDED", stragglers=TOO_SHORT_NOTE)
    assert f"stragglers {TOO_SHORT_NOTE}" in describe(row)
    assert ended.straggler_note == TOO_SHORT_NOTE


def test_the_record_keeps_the_last_lines_of_rank_0_s_output(tmp_path: Path) -> None:
    logs = {}
    for rank in (0, 1):
        path = logs[f"r1-w{rank}"] = tmp_path / f"r1-w{rank}.log"
        path.write_text("".join(f"epoch {i} on rank {rank} <ok>\n" for i in range(30)))
    m = ended_run(RunState.SUCCEEDED, {"loss": {0: ([0, 1], [2.0, 1.0])}}, step=2)
    panel = panel_of(m, logs)
    try:
        bundle = bundle_of(panel)
        page, text = bundle["text/html"], bundle["text/plain"]
        assert "rank 0: the last 20 lines of its output (r1-w0.log)" in page
        assert "epoch 29 on rank 0 &lt;ok&gt;" in page and "epoch 10 on rank 0" in page
        assert "epoch 9 on rank 0" not in page and "on rank 1" not in page
        assert text.endswith("epoch 29 on rank 0 <ok>") and "rank 0: the last 20 lines" in text
        panel.output_in_record = False  # a %%orch cell prints rank 0's output itself
        panel.refresh()
        assert "orch-output" not in bundle_of(panel)["text/html"]
    finally:
        panel.close()


def test_no_widget_of_the_panel_is_wider_than_its_output() -> None:
    """A widget has a margin on each side: "100%" passed the output by it and the panel scrolled
    sideways at 1,100 px (the page itself: tests/views/test_browser.py, test_quiet_panels_at_1100_px)."""
    panel = panel_of(ended_run(RunState.SUCCEEDED, {"loss": {0: ([0, 1], [2.0, 1.0])}}))
    try:
        assert panel.header.layout.width == FULL_WIDTH and panel.plot.layout.max_width == FULL_WIDTH
        assert "var(--jp-widgets-margin" in FULL_WIDTH and panel.plot.layout.width == "720px"
    finally:
        panel.close()


def test_a_log_axis_asked_for_before_the_first_point_draws_and_takes_effect_with_them() -> None:
    """Log scale ticked while the panel waits for the first points (the metric list offers the
    code's loss before it logged one): the empty plot still draws, and the curves that come
    are on a log axis."""
    from orch.views.rank_plot import RankPlot

    plot = RankPlot(600, 300)
    waiting = ended_run(RunState.RUNNING, {})
    assert plot.draw(waiting, "loss", True).startswith(b"\x89PNG")
    assert plot.ax.get_yscale() == "linear"
    stepped = ended_run(RunState.RUNNING, {"loss": {0: ([0, 1, 2], [1.0, 0.1, 0.01])}})
    assert plot.draw(stepped, "loss", True).startswith(b"\x89PNG")
    assert plot.ax.get_yscale() == "log"

"""Numbers people can read, NaN and inf as facts, plots one diverged curve cannot flatten.

Unit tests of the pieces: the shared number formatter, where a series went NaN or inf, each
ended rank's mean rate, the robust y range and its marks, the sweep table's order and cells,
and the comparison's labels. The real sweep with a NaN config is in tests/experiments/test_sweep.py.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from orch._text import number_text, rate_text
from orch.experiments.metrics import last_value, nonfinite
from orch.experiments.results import SweepResults, nonfinite_text, wall_time_text
from orch.views.comparison import _RunsPlot
from orch.views.followers import Curve, Mirrored, config_label, followers
from orch.views.rank_plot import RankPlot, robust_range
from orch.views.rank_rows import rate_of
from orch.views.rendering import render, summary
from orch.views.run_html import table_html
from orch.wire.client import NonFinite, SeriesBuffer, StateMirror
from orch.wire.ranks import RankView
from orch.wire.states import RankState, RunState

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0678e-06, "1.068e-06"),  # not 0.0000
        (0.01234, "0.01234"),
        (123.44, "123.4"),
        (0.5, "0.5"),
        (6.4331e35, "6.433e+35"),
        (NAN, "nan"),
        (INF, "inf"),
        (-INF, "-inf"),
        (None, "-"),
    ],
)
def test_numbers_have_four_significant_digits(value: float | None, text: str) -> None:
    assert number_text(value) == text


def test_rates_have_three_significant_digits_and_none_is_a_dash() -> None:
    assert [rate_text(v) for v in (0.04123, 12.54, 2345.6, 0.0, NAN)] == ["0.0412", "12.5", "2346", "-", "-"]


def test_a_buffer_notes_where_it_first_went_nan_and_its_last_finite_point() -> None:
    buf = SeriesBuffer()
    buf.extend([0, 1, 2], [3.0, 2.0, 1.0])
    assert (buf.first_bad, buf.last_finite) == (None, (2, 1.0))
    buf.extend([3, 4], [6.4e35, NAN])  # the spike, then NaN: kept, not dropped
    buf.extend([5, 6], [NAN, INF])
    assert len(buf) == 7 and np.isnan(buf.values[4]) and buf.values[6] == INF
    assert buf.first_bad is not None and buf.first_bad[0] == 4 and math.isnan(buf.first_bad[1])
    assert buf.last_finite == (3, 6.4e35)


def mirror_with(
    points: dict[int, tuple[list[int], list[float]]], state: RunState = RunState.RUNNING
) -> StateMirror:
    m = StateMirror(run_id="r", state=state, world_size=len(points), registered=len(points))
    rank_state = RankState.SUCCEEDED if state.done else RankState.RUNNING
    for rank, (steps, values) in points.items():
        buf = m.series[(rank, "loss")] = SeriesBuffer()
        buf.extend(steps, values, [100.0 + 0.5 * s for s in steps])
        m.ranks.append(RankView(rank=rank, state=rank_state, step=steps[-1], loss=values[-1], has_loss=True))
    return m


def test_the_mirror_says_which_rank_went_nan_at_which_step_and_the_record_keeps_it() -> None:
    m = mirror_with({0: ([0, 1, 2, 3], [2.0, 1.0, 5e30, NAN]), 1: ([0, 1, 2, 3], [2.0, 1.0, 0.5, 0.4])})
    (bad,) = m.nonfinite("loss")
    assert (bad.rank, bad.step, bad.last_finite, bad.last_finite_step, bad.stays) == (0, 3, 5e30, 2, True)
    assert bad.text() == "loss nan from step 3 (last finite 5e+30 at step 2)"
    assert NonFinite.from_dict(bad.as_dict()).as_dict() == bad.as_dict()  # as result.json keeps it
    assert m.as_dict()["nonfinite"] == [bad.as_dict()]
    came_back = mirror_with({0: ([0, 1, 2], [1.0, INF, 0.5])}).nonfinite()[0]
    assert not came_back.stays and came_back.text() == "loss was inf at step 1"
    # The rank table and the terminal say it on the rank's row.
    rows = table_html(m).split('<tr class="orch-rank"')[1:]
    assert "loss nan from step 3 (last finite 5e+30 at step 2)" in rows[0] and "orch-nan" not in rows[1]
    assert "<- loss nan from step 3" in render(m).splitlines()[4]
    assert "rank 0: RUNNING, step 3, loss nan (loss nan from step 3" in summary(m)


def test_an_ended_rank_shows_its_mean_rate_not_zero() -> None:
    m = mirror_with({0: (list(range(11)), [1.0] * 11)}, RunState.SUCCEEDED)  # 10 steps in 5 s
    m.fill_mean_rates()
    assert m.ranks[0].steps_per_sec == pytest.approx(2.0)
    assert rate_of(m.ranks[0]) == "2 mean"
    assert "<td>2 mean</td>" in table_html(m)
    live = RankView(rank=0, state=RankState.RUNNING, steps_per_sec=12.34)
    assert rate_of(live) == "12.3"


def test_the_mean_rates_of_many_ended_ranks_read_each_series_once() -> None:
    """Every poll of a finished run fills the ended ranks' mean rates: at 1,024 ranks this once
    read every series once per rank (seconds per poll at 4,096 ranks)."""

    class Counted(dict[tuple[int, str], SeriesBuffer]):
        passes = 0

        def items(self) -> Any:
            Counted.passes += 1
            return super().items()

    m = StateMirror(state=RunState.SUCCEEDED)
    m.ranks = [RankView(rank=r, state=RankState.SUCCEEDED) for r in range(50)]
    m.series = Counted()
    for r in range(50):
        buf = m.series[(r, "loss")] = SeriesBuffer()
        buf.extend([0, 10 + r], [1.0, 0.5], [100.0, 105.0])
    m.fill_mean_rates()
    assert Counted.passes == 1
    assert [r.steps_per_sec for r in m.ranks[:2]] == [pytest.approx(2.0), pytest.approx(2.2)]


def test_the_plain_table_keeps_its_columns_with_an_ended_ranks_mean_rate() -> None:
    """``30.7 mean`` is wider than the steps/s column once was: every later column of the
    plain text table (``orch status``, a dashboard piped to a file) moved right on its row."""
    m = mirror_with({0: ([0, 1000], [1.0, 1.0]), 1: ([0, 3], [1.0, 1.0])}, RunState.SUCCEEDED)
    slow = m.series[(1, "loss")] = SeriesBuffer()
    slow.extend([0, 3], [1.0, 1.0], [100.0, 600.0])
    m.fill_mean_rates()  # 2 steps/s and 0.006 steps/s: "2 mean", "0.006 mean"
    assert rate_of(m.ranks[1]) == "0.006 mean"
    lines = render(m).splitlines()
    head = next(line for line in lines if line.startswith("rank  state"))
    rows = [line for line in lines if line.lstrip().startswith(("0  ", "1  "))]
    end = head.index("heartbeat") + len("heartbeat")
    assert len(rows) == 2 and all(row[end - 1] == "-" and row[end] == " " for row in rows), lines


def test_the_scores_say_what_they_compare_without_a_tooltip() -> None:
    m = mirror_with({0: ([0], [1.0])})
    r = m.ranks[0]
    r.timed, r.step_ms, r.compute_ms, r.relative_score, r.individual_score = True, 10.0, 8.0, 3.86, 1.0
    html = table_html(m)
    assert "3.86x fastest</span>, " in html and "1.00x own best" in html and "compute time vs" in html


# -- the robust range -----------------------------------------------------------------------------
def test_a_spike_does_not_set_the_axis_and_is_marked_at_the_edge() -> None:
    x = np.arange(100)
    calm = (x, 1.0 / (1 + x))
    spiked = (x, np.where(x == 50, 6.433e35, 0.5 + 0.001 * x))
    rng = robust_range([calm, spiked])
    assert rng is not None and 0.5 < rng.hi < 1.2 and rng.lo < 0.01
    assert [(c.curve, c.x, c.value, c.top) for c in rng.clipped] == [(1, 50.0, 6.433e35, True)]
    # inf is past the edge too; NaN is neither drawn nor clipped.
    with_inf = robust_range([calm, (x, np.where(x > 90, INF, np.where(x == 10, NAN, 0.3)))])
    assert with_inf is not None and with_inf.hi < 1.2 and with_inf.clipped[0].value == INF
    # Without outliers, nothing is clipped and every point is inside.
    plain = robust_range([calm])
    assert plain is not None and not plain.clipped and plain.lo < 1 / 100 and plain.hi > 1.0
    assert robust_range([(x[:3], np.array([NAN, NAN, NAN]))]) is None
    log = robust_range([calm, spiked], log_scale=True)
    assert log is not None and log.hi < 10 and log.lo > 0 and log.clipped[0].value == 6.433e35


def test_the_panel_plot_keeps_its_range_and_marks_the_spike_and_the_nan_step() -> None:
    steps = list(range(60))
    spiked = [1.0 / (1 + s) if s < 40 else (6.433e35 if s == 40 else NAN) for s in steps]
    m = mirror_with({0: (steps, [1.0 / (1 + s) for s in steps]), 1: (steps, spiked)})
    plot = RankPlot(600, 300)
    assert plot.draw(m, "loss", False)[:4] == b"\x89PNG"
    low, high = plot.ax.get_ylim()
    assert high < 2 and low < 0.05  # the spike did not flatten both curves onto the axis
    texts = [t.get_text() for t in plot.ax.texts]
    assert "6.433e+35" in texts  # its value, at the edge it passed
    assert "rank 1: nan from step 41" in texts  # where it went NaN
    assert plot.y_range is not None and plot.y_range.clipped[0].x == 40
    plot.draw(m, "loss", True)  # log scale: still a robust range
    assert plot.ax.get_ylim()[1] < 10


def test_a_narrow_log_axis_is_labelled_within_the_picture() -> None:
    """A process's memory on a log scale (328 to 336 MB): matplotlib labelled the ticks between
    powers of ten "3.36 x 10^2", wider than the margin, and the picture cut their first digit."""
    steps = list(range(20))
    m = mirror_with({0: (steps, [328 + 0.4 * s for s in steps])})
    plot = RankPlot(1000, 300)
    plot.draw(m, "loss", True)
    plot.fig.canvas.draw()
    labels = [t for t in plot.ax.get_yticklabels() + plot.ax.get_yticklabels(minor=True) if t.get_text()]
    assert len(labels) >= 3, [t.get_text() for t in labels]
    for label in labels:
        assert label.get_window_extent().x0 >= 0, (label.get_text(), label.get_window_extent())
        assert "times" not in label.get_text(), label.get_text()  # plain numbers, as the table writes


def test_a_float64_loss_diverging_to_the_float_limit_is_drawn_not_raised() -> None:
    """Values near 1.8e308 overflowed the range's sums: a ValueError (linear) or an
    OverflowError (log scale) in the panel's drawing, for the run that most needs its plot."""
    steps = list(range(40))
    near_max = [1.7e308 if s % 2 else -1.7e308 for s in steps]
    m = mirror_with({0: (steps, near_max), 1: (steps, [1e308] * 40)})
    plot = RankPlot(400, 200)
    for log_scale in (False, True):
        assert plot.draw(m, "loss", log_scale)[:4] == b"\x89PNG"
        low, high = plot.ax.get_ylim()
        assert math.isfinite(low) and math.isfinite(high) and low < high
    rng = robust_range([(np.arange(3), np.full(3, 1.79e308))], log_scale=True)
    assert rng is not None and math.isfinite(rng.hi) and rng.lo < rng.hi


def test_an_empty_run_says_no_points_were_logged_not_empty_axes() -> None:
    m = StateMirror(run_id="r", state=RunState.SUCCEEDED)
    plot = RankPlot(400, 200)
    plot.draw(m, "loss", False)
    assert [t.get_text() for t in plot.ax.texts] == ["no points were logged"]
    assert not plot.ax.yaxis.get_tick_params()["labelleft"]
    plot.draw(StateMirror(run_id="r", state=RunState.RUNNING), "loss", False)
    assert [t.get_text() for t in plot.ax.texts] == ["waiting for the first points"]
    runs = _RunsPlot(400, 200)
    runs.draw(
        [("lr=0.1", 0, Curve(np.empty(0), np.empty(0), np.empty(0), np.empty(0)), False)],
        "loss",
        "step",
        False,
        done=True,
    )
    assert [t.get_text() for t in runs.ax.texts] == ["no points were logged"]


def test_the_comparison_names_each_run_by_its_config_and_keeps_its_range() -> None:
    x = np.arange(50.0)
    calm = Curve(x, 1 / (1 + x), 1 / (1 + x), 1 / (1 + x))
    wild = Curve(x, np.where(x == 30, 6e35, 0.7), np.full(50, 0.7), np.full(50, 0.7))
    runs = _RunsPlot(500, 250)
    runs.draw([("lr=0.01, bs=32", 0, calm, True), ("lr=10, bs=32", 1, wild, False)], "loss", "step", False)
    legend = [t.get_text() for t in runs.ax.get_legend().get_texts()]
    assert legend == ["lr=0.01, bs=32 (best)", "lr=10, bs=32"]
    assert runs.ax.get_ylim()[1] < 2 and "6e+35" in [t.get_text() for t in runs.ax.texts]
    # A run's label is its config, from its launch spec (or its run.json); same configs get their id.
    run = SimpleNamespace(
        run_id="abc", spec=SimpleNamespace(config={"lr": 0.01, "bs": 32}), state=lambda: None
    )
    assert config_label(run) == "lr=0.01, bs=32"
    twin = SimpleNamespace(
        run_id="def", spec=SimpleNamespace(config={"lr": 0.01, "bs": 32}), state=lambda: None
    )
    bare = SimpleNamespace(run_id="ghi", spec=SimpleNamespace(config={}), state=lambda: None)
    labels = [f.label for f in followers([run, twin, bare])]
    assert labels == ["lr=0.01, bs=32 (abc)", "lr=0.01, bs=32 (def)", "ghi"]
    assert isinstance(followers([run])[0], Mirrored)
    # Without a config, the name it was launched with: a gang's calls read as calls.
    calls = [
        SimpleNamespace(run_id=f"c{n}", spec=SimpleNamespace(config={}, name=f"gang ab12 call {n}: {fn}"),
                        state=lambda: None)
        for n, fn in ((1, "build"), (2, "train"))
    ]  # fmt: skip
    assert [f.label for f in followers(calls)] == ["gang ab12 call 1: build", "gang ab12 call 2: train"]


def test_a_gang_s_calls_are_one_curve_to_the_range_not_a_diverged_run_and_a_converged_one() -> None:
    """The second call's losses are 1,000x below the first's: drawn as the parts of one curve
    (``boundaries``), the first call is its start, in the range, not clipped as a diverged run."""
    x = np.arange(40.0)
    first = 5 * np.exp(-x / 6)  # 5 down to ~0.007
    second = first[-1] * np.exp(-(x + 1) / 3)  # from there on down
    parts = [Curve(x, first, first, first), Curve(x + 40, second, second, second)]
    runs = _RunsPlot(720, 340)
    curves = [(label, 0, c, False) for label, c in zip(("loss", "_call 2"), parts, strict=True)]
    runs.draw(curves, "loss", "step", False, boundaries=[(0.0, "call 1"), (40.0, "call 2")])
    assert runs.y_range is not None and runs.y_range.clipped == [], runs.y_range
    assert runs.ax.get_ylim()[1] >= 5, runs.ax.get_ylim()
    # The same curves as two runs: the first is far above the typical one, clipped at the top.
    runs.draw(curves, "loss", "step", False)
    assert runs.y_range is not None and runs.ax.get_ylim()[1] < 1, runs.ax.get_ylim()


# -- the sweep's table ------------------------------------------------------------------------------
def row(
    index: int, state: str, loss: float | None, bad: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "index": index,
        "run_id": f"r{index}",
        "config": {"lr": index},
        "state": state,
        "reused": False,
        "steps": 20,
        "total": 20,
        "duration": extra.get("duration", 2.0),
        "pool_start": extra.get("pool_start", 0.0),
        "failure": "",
        "final": {} if loss is None else {"loss": loss},
        "best": {} if loss is None else {"loss": loss},
        "nonfinite": {} if bad is None else {"loss": bad},
    }


def test_nan_and_failed_configs_sort_last_either_way() -> None:
    bad = {
        "step": 45,
        "rank": 0,
        "value": NAN,
        "last_finite": 6.433e35,
        "last_finite_step": 44,
        "stays": True,
    }
    rows = [
        row(0, "FAILED", 0.01),  # the least loss, but it failed
        row(1, "SUCCEEDED", NAN, bad),
        row(2, "SUCCEEDED", 0.5),
        row(3, "SUCCEEDED", 0.2),
        row(4, "CANCELLED", None),
        row(5, "SUCCEEDED", None),
    ]
    results = SweepResults(rows, "s")
    assert [r["index"] for r in results.sorted("loss")] == [3, 2, 1, 5, 0, 4]
    assert [r["index"] for r in results.sorted("loss", "max")] == [2, 3, 1, 5, 0, 4]
    head, body = results.table()
    assert body[1][head.index("loss last")] == "nan from step 45 (last finite 6.433e+35 at step 44)"


def test_a_metric_that_came_back_says_when_it_was_not_finite() -> None:
    bad = {"step": 7, "rank": 1, "value": INF, "last_finite": 0.3, "last_finite_step": 9, "stays": False}
    assert nonfinite_text(bad, "0.3") == "0.3 (inf at step 7)"


def test_the_pool_start_is_shown_apart_from_the_runs_own_time() -> None:
    assert wall_time_text(16.9, 14.8) == "2.1s (+14.8s pool start)"
    assert wall_time_text(2.04, 0.0) == "2.0s"
    results = SweepResults([row(0, "SUCCEEDED", 0.1, duration=16.9, pool_start=14.8)], "s")
    head, body = results.table()
    assert body[0][head.index("wall time")] == "2.1s (+14.8s pool start)"


def test_final_values_keep_nan_and_say_where_it_began() -> None:
    by_rank = {
        0: {"step": [0, 1, 2, 3], "value": [1.0, 0.5, 9e34, NAN]},
        1: {"step": [0, 1, 2, 3], "value": [1.0, 0.5, 0.4, 0.3]},
    }
    assert math.isnan(last_value(by_rank) or 0.0)
    assert (
        last_value({0: {"step": [0, 1], "value": [2.0, 1.0]}, 1: {"step": [0, 1], "value": [4.0, 3.0]}})
        == 2.0
    )
    assert last_value({0: {"step": [], "value": []}}) is None
    found = nonfinite(by_rank)
    assert found is not None
    assert (
        found["step"],
        found["rank"],
        found["last_finite"],
        found["last_finite_step"],
        found["stays"],
    ) == (
        3,
        0,
        9e34,
        2,
        True,
    )
    assert nonfinite({1: by_rank[1]}) is None
    # A rank that came back does not hide another that stayed NaN: the mean ends NaN.
    mixed = {
        0: {"step": [0, 1, 2], "value": [1.0, INF, 0.5]},
        1: {"step": [0, 1, 2], "value": [1.0, 0.9, NAN]},
    }
    first = nonfinite(mixed)
    assert first is not None and (first["step"], first["rank"], first["stays"]) == (1, 0, True)


def test_past_sixteen_ranks_the_plot_draws_their_mean_and_band_not_a_line_each() -> None:
    """4,096 lines and a legend of 4,096 entries took the panel 20 s a redraw; the spread of
    the ranks reads at a glance and costs the same at 17 ranks or 4,096."""
    from orch.views.rank_plot import MAX_RANK_LINES

    steps = list(range(50))
    n = 4 * MAX_RANK_LINES
    # Rank r's loss is r + s / 100: the mean at each step is the middle rank's, the band
    # runs from rank 0's curve to rank n - 1's; rank 5 went NaN at step 30 (and rank 9 too).
    curves = {r: (steps, [r + s / 100 for s in steps]) for r in range(n)}
    curves[5] = (steps, [5 + s / 100 if s < 30 else NAN for s in steps])
    curves[9] = (steps, [9 + s / 100 if s < 31 else NAN for s in steps])
    plot = RankPlot(400, 200)
    assert plot.draw(mirror_with(curves), "loss", False)[:4] == b"\x89PNG"
    assert plot.spread_of == n and plot.lines == {}
    legend = [t.get_text() for t in plot.ax.get_legend().get_texts()]
    assert legend == [f"mean of {n} ranks", f"lowest to highest of {n} ranks"]
    x, mean = plot._mean.get_data()
    assert len(x) <= 100  # a column of the picture at most per point
    assert mean[0] == pytest.approx(np.mean([r for r in range(n)]), rel=1e-3)
    (_, lo), (_, hi) = plot._band_edges
    assert lo[0] == pytest.approx(0.0, abs=0.02) and hi[-1] == pytest.approx(n - 1 + 0.49, abs=0.02)
    texts = [t.get_text() for t in plot.ax.texts]
    assert "rank 5: nan from step 30 (and 1 more rank)" in texts
    # Back to a few ranks (another run in the same panel): a line each again.
    few = mirror_with({r: (steps, [float(r)] * 50) for r in range(3)})
    plot.draw(few, "loss", False)
    assert plot.spread_of == 0 and sorted(plot.lines) == [0, 1, 2]


def test_the_spread_of_curves_with_gaps_and_different_steps() -> None:
    from orch.views.rank_plot import spread

    a = (np.array([0, 1, 2, 3]), np.array([1.0, 2.0, NAN, 4.0]))
    b = (np.array([2, 3]), np.array([10.0, 20.0]))
    x, mean, low, high = spread([a, b], 2)  # spans [0, 1.5) and [1.5, 3]
    assert list(x) == [0.75, 2.25]
    assert list(mean) == [1.5, (4.0 + 10.0 + 20.0) / 3]  # the NaN left out
    assert list(low) == [1.0, 4.0] and list(high) == [2.0, 20.0]
    assert [len(v) for v in spread([], 4)] == [0, 0, 0, 0]

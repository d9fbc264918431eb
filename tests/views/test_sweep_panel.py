"""The sweep panel and orch.compare through their synced widget state, on real runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

import orch
from conftest import TESTS, images_sent, until
from orch.views.comparison import ComparePanel
from orch.views.followers import curve

pytestmark = pytest.mark.timeout(240)
sys.path.insert(0, str(TESTS))

CONFIGS = [{"lr": 0.01}, {"lr": 0.1, "fail": True}, {"lr": 0.2}]


def row_texts(panel: Any) -> list[str]:
    """The table's rows as shown, in the order shown: the button's label, then the cells' text."""
    out = []
    for box in panel.table.children:
        button, cells = box.children
        out.append(button.description + " " + re.sub(r"<[^>]+>", " ", cells.value))
    return out


def test_the_sweep_panel_follows_the_runs_and_marks_the_best(
    tmp_path: Path, widget_messages: list[Any]
) -> None:
    sweep = orch.sweep("jobs:lr_job", CONFIGS, world_size=2, parallel=2, run_root=str(tmp_path), name="lr")
    panel = sweep.panel()
    sweep.wait(180)  # refreshes the panel before it returns
    assert panel.wait_done(30)
    assert 'data-state="done"' in panel.header.value
    assert "3 configs" in panel.header.value and "1 failed" in panel.header.value
    assert (panel.progress.value, panel.progress.bar_style) == (3, "danger")
    assert panel.stop_button.disabled and panel.stop_button.description == "Done"
    rows = row_texts(panel)
    assert [r.split()[0] for r in rows] == ["#0", "#1", "#2"]
    assert "SUCCEEDED" in rows[0] and "FAILED" in rows[1] and "SUCCEEDED" in rows[2]
    assert "was told to fail" in rows[1]  # the failed config's root cause, on its row
    # Every point each run recorded is on its curve, the failed run's last ones included.
    for trial, mirror in zip(sweep.trials, panel.mirrors, strict=True):
        recorded = orch.load_run(trial.run_dir).history()["loss"]
        assert len(curve(mirror, "loss").x) == len({s for r in recorded.values() for s in r["step"]})
    best = sweep.best("loss").index
    assert [("best" in r) for r in rows] == [i == best for i in range(3)]
    assert panel.marked() == best
    # The plot was drawn as points came, and once more at the end.
    assert images_sent(widget_messages, panel.plot) >= 2
    # Sorted by the metric: least final loss first, the failed config last whatever its loss.
    finals = {i: float(curve(m, "loss").mean[-1]) for i, m in enumerate(panel.mirrors) if i != 1}
    panel.sort.value = "min"
    assert [r.split()[0] for r in row_texts(panel)] == [
        *(f"#{i}" for i in sorted(finals, key=finals.__getitem__)),
        "#1",
    ]
    panel.sort.value = ""
    # The sweep ended: its output is the record a saved notebook keeps, with the failure's cause.
    record = panel._repr_mimebundle_()
    assert sorted(record) == ["image/png", "text/html", "text/plain"]
    assert record["text/html"].count('<tr class="orch-trial"') == 3
    assert "was told to fail" in record["text/html"] and f"best by final loss: #{best}" in record["text/html"]
    # A click on a row's button opens that run's per-rank panel under the table.
    panel.rows[2][0].click()
    title, opened = panel.detail.children
    assert 'data-index="2"' in title.value
    run_panel = sweep.trials[2].run.panel()
    assert opened is run_panel.widget
    assert sweep.trials[2].run_id in run_panel.header.value
    assert run_panel.table.value.count('class="orch-rank"') == 2
    panel.close()


def test_stop_all_in_the_sweep_panel_stops_every_run(tmp_path: Path, widget_messages: list[Any]) -> None:
    configs = [{"lr": lr, "steps": 100000, "sleep": 0.02} for lr in (0.01, 0.02, 0.03)]
    sweep = orch.sweep("jobs:lr_job", configs, world_size=2, parallel=2, run_root=str(tmp_path))
    panel = sweep.panel()
    until(lambda: sum(t.state == "RUNNING" for t in sweep.trials) == 2, 60)
    panel.stop_button.click()
    results = sweep.wait(60)
    assert [r["state"] for r in results] == ["STOPPED", "STOPPED", "CANCELLED"]
    assert panel.wait_done(30)
    assert "CANCELLED" in row_texts(panel)[2]
    panel.close()


def test_compare_overlays_runs_on_disk_and_a_live_one(tmp_path: Path, widget_messages: list[Any]) -> None:
    done = orch.sweep("jobs:lr_job", CONFIGS[::2], world_size=2, run_root=str(tmp_path)).wait(120)
    ids = [row["run_id"] for row in done]
    live = orch.launch(
        "jobs:lr_job", world_size=2, config={"lr": 0.05, "steps": 40, "sleep": 0.02}, run_root=str(tmp_path)
    )
    try:
        panel = orch.compare(
            [ids[0], str(tmp_path / ids[1]), live.run_id], metric="loss", x="time", run_root=str(tmp_path)
        )
        assert isinstance(panel, ComparePanel)
        live.wait(120)
        assert panel.wait_done(30)
        legend = panel.legend.value
        assert legend.count('class="orch-compared"') == 3
        for run_id in (*ids, live.run_id):
            assert f'data-run="{run_id}"' in legend
        # The runs are named by their configs, in the table and in the plot's legend.
        assert [f.label for f in panel.runs] == ["lr=0.01", "lr=0.2", "lr=0.05, steps=40, sleep=0.02"]
        assert "&#9632;</span> lr=0.01 " in legend
        drawn = [t.get_text() for t in panel._plot.ax.get_legend().get_texts()]
        assert drawn == ["lr=0.01", "lr=0.2", "lr=0.05, steps=40, sleep=0.02"]
        assert legend.count("SUCCEEDED") == 3
        assert 'class="orch-compare-runs"' in panel._repr_mimebundle_()["text/html"]
        # By wall time each run starts near 0 and its last step comes last.
        for m in panel.mirrors:
            c = curve(m, "loss", "time")
            assert len(c.x) == m.progress()[0] > 0
            assert 0 <= c.x[0] < 5 and all(c.x[1:] >= c.x[:-1])
        assert images_sent(widget_messages, panel.plot) >= 1
        before = panel.redraws
        panel.x_axis.value = "step"  # redrawn by step at once
        assert panel.redraws == before + 1
        assert list(panel._plot.ax.get_lines()[0].get_xdata()) == list(curve(panel.mirrors[0], "loss").x)
        panel.close()
    finally:
        live.close()
    with pytest.raises(orch.ConfigError, match=r"no run 'nope': not a run dir, nor a run id under"):
        orch.compare(["nope"], run_root=str(tmp_path))
    with pytest.raises(orch.ConfigError, match="compare\\(\\) takes runs"):
        orch.compare([5])
    with pytest.raises(orch.ConfigError, match="x must be 'step' or 'time'"):
        orch.compare(ids, x="wall", run_root=str(tmp_path))  # type: ignore[arg-type]


def test_the_sweep_panel_draws_pruned_trials_faded_and_cut_at_their_rung(
    tmp_path: Path, widget_messages: list[Any]
) -> None:
    configs = [{"x": x, "steps": 30, "sleep": 0.03} for x in (15, 0, 26, 2, 18)]
    sweep = orch.sweep(
        "jobs:landscape_job",
        configs,
        run_root=str(tmp_path),
        name="pruned",
        prune=orch.ASHA(grace=3, reduction=3),
    )
    panel = sweep.panel()
    results = sweep.wait(300)
    assert panel.wait_done(30)
    pruned = [r["index"] for r in results if r["state"] == "PRUNED"]
    assert pruned and results[0]["state"] == "SUCCEEDED"
    assert f"{len(pruned)} pruned (orch.ASHA(" in panel.header.value
    rows = row_texts(panel)
    for i in pruned:
        at = sweep.trials[i].pruned_at  # its state and its step say its rung: "PRUNED at 3", "3/27"
        assert f"PRUNED at {at}" in rows[i] and f"{at}/{results[i]['total']}" in rows[i], rows[i]
    decorations = panel._decorations()
    assert decorations["faded"] == frozenset(pruned) and decorations["rungs"] == [3, 9, 27]
    best_final = min(r["final"]["loss"] for r in results if r["state"] == "SUCCEEDED")
    assert decorations["best_so_far"] == pytest.approx(best_final)
    # A pruned run's curve ends at its rung (its ranks waited there for the decision).
    for i, (_, _, c, _) in enumerate(panel.curves()):
        ran = len(curve(panel.mirrors[i], "loss").x)
        if i in pruned:
            assert c.x[-1] == sweep.trials[i].pruned_at and ran == len(c.x)
        else:
            assert len(c.x) == ran == 30
    assert images_sent(widget_messages, panel.plot) >= 2


def test_the_sweep_panel_takes_in_the_trials_a_sampler_draws_as_it_goes(tmp_path: Path) -> None:
    import optuna

    space = {"lr": orch.loguniform(1e-3, 0.3), "steps": 4}
    sweep = orch.sweep(
        "jobs:lr_job", space, trials=3, search=optuna.samplers.RandomSampler(seed=0), run_root=str(tmp_path)
    )
    panel = sweep.panel()
    sweep.wait(180)
    assert panel.wait_done(30)
    assert len(panel.runs) == len(panel.mirrors) == len(panel.rows) == 3
    assert [r.split()[0] for r in row_texts(panel)] == ["#0", "#1", "#2"]
    assert "3 configs" in panel.header.value and panel.progress.value == 3

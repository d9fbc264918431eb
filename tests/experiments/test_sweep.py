"""Sweeps with real runs: many configs of one function on the warm forkserver.

Every test ends with the conftest check that no process it started is still alive.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

import orch
from conftest import TESTS, orch_cli, until
from orch.views.followers import curve
from orch.wire.client import StateMirror

pytestmark = pytest.mark.timeout(240)
sweep_plan = importlib.import_module("orch.experiments.sweep_plan")
sys.path.insert(0, str(TESTS))

FOUR = [{"lr": 0.01}, {"lr": 0.05}, {"lr": 0.1, "fail": True}, {"lr": 0.2}]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / "run.json").exists())


def test_grid_is_every_combination_and_refuses_what_is_not_a_list() -> None:
    assert orch.grid(lr=[0.1, 0.01], batch=[32, 64]) == [
        {"lr": 0.1, "batch": 32},
        {"lr": 0.1, "batch": 64},
        {"lr": 0.01, "batch": 32},
        {"lr": 0.01, "batch": 64},
    ]
    with pytest.raises(orch.ConfigError, match=r"grid axis 'lr' must be a non-empty list.*lr=\[\.\.\.\]"):
        orch.grid(lr=0.1)  # type: ignore[arg-type]
    with pytest.raises(orch.ConfigError, match="grid axis 'opt'"):
        orch.grid(opt="adam")
    with pytest.raises(orch.ConfigError, match="at least one axis"):
        orch.grid()


@pytest.mark.parametrize(
    ("configs", "options", "message"),
    [
        ([], {}, "non-empty list of dicts"),
        ({"lr": 0.1}, {}, "a dict space needs at least one dimension"),
        ([{"lr": 0.1}, 3], {}, r"configs\[1\] must be a dict"),
        ([{"lr": 0.1}, {"lr": 0.1}], {}, r"configs\[1\] repeats"),
        ([{"lr": object()}], {}, "JSON-serialisable"),
        ([{"lr": 0.1}], {"parallel": 0}, "parallel must be an integer >= 1"),
        ([{"lr": 0.1}], {"max_failures": -1}, "max_failures must be None"),
        ([{"lr": 0.1}], {"world_size": 0}, "world_size must be an integer"),
    ],
)
def test_a_bad_sweep_is_refused_before_any_process_starts(
    tmp_path: Path, configs: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(orch.ConfigError, match=message):
        orch.sweep("jobs:lr_job", configs, run_root=str(tmp_path), **options)
    assert not list(tmp_path.iterdir())


def test_a_sweep_records_each_config_and_a_failure_with_its_root_cause(tmp_path: Path) -> None:
    sweep = orch.sweep("jobs:lr_job", FOUR, world_size=2, parallel=2, run_root=str(tmp_path), name="lr")
    results = sweep.wait(180)
    states = [row["state"] for row in results]
    assert states == ["SUCCEEDED", "SUCCEEDED", "FAILED", "SUCCEEDED"]
    failed = results[2]
    assert "ValueError: config lr=0.1 was told to fail" in failed["failure"]
    assert "was told to fail" in sweep.trials[2].error  # the traceback of the root cause
    assert failed["steps"] < 20
    for row in (results[0], results[1], results[3]):
        assert row["steps"] == 20
        assert set(row["final"]) == {"loss", "acc"}
    # The final loss is the mean over the ranks of the run's own last points.
    for trial, row in zip(sweep.trials, results, strict=True):
        history = orch.load_run(trial.run_dir).history()["loss"]
        last = np.mean([series["value"][-1] for series in history.values()])
        assert row["final"]["loss"] == pytest.approx(last)
        assert row["best"]["loss"] == pytest.approx(
            min(np.mean(v) for v in zip(*(s["value"] for s in history.values()), strict=False))
        )
        # Accuracy-like metrics are best at their greatest.
        assert row["best"]["acc"] >= row["final"]["acc"] - 1e-12
    finals = {i: results[i]["final"]["loss"] for i in (0, 1, 3)}
    best = sweep.best("loss")
    assert best.index == min(finals, key=finals.__getitem__)
    assert sweep.best("acc").index == best.index  # an accuracy is best at its greatest
    assert sweep.best("acc", mode="min").index != best.index
    assert sweep.best("loss", mode="max").index == max(finals, key=finals.__getitem__)
    rows = sweep.rows("loss")  # what the terminal dashboard shows
    assert [r["best_run"] for r in rows] == [i == best.index for i in range(4)]
    assert [r["state"] for r in rows] == states and "was told to fail" in rows[2]["failure"]
    with pytest.raises(
        orch.OrchError, match=r"no succeeded run of sweep lr logged 'val_loss' \(metrics logged: acc, loss\)"
    ):
        sweep.best("val_loss")
    # Each run's record names its sweep and its config's key; the table renders.
    for trial in sweep.trials:
        meta = json.loads((trial.run_dir / "run.json").read_text())
        assert (meta["sweep"], meta["config_key"], meta["config"]) == ("lr", trial.key, trial.config)
    assert results._repr_html_().count('class="orch-trial"') == 4
    assert "FAILED" in repr(results)
    # Sorted by the final loss, best first; the failed config last whatever its loss.
    every = {r["index"]: r["final"]["loss"] for r in results if r["state"] == "SUCCEEDED"}
    assert [r["index"] for r in results.sorted("loss")] == [*sorted(every, key=every.__getitem__), 2]
    assert [r["index"] for r in results.sorted("loss", "max")] == [
        *sorted(every, key=every.__getitem__)[::-1],
        2,
    ]

    # The same sweep cell again: only the failed config runs.
    before = run_dirs(tmp_path)
    again = orch.sweep("jobs:lr_job", FOUR, world_size=2, parallel=2, run_root=str(tmp_path), name="lr")
    rerun = again.wait(180)
    assert [r["reused"] for r in rerun] == [True, True, False, True]
    new = sorted(set(run_dirs(tmp_path)) - set(before))
    assert len(new) == 1
    assert json.loads((new[0] / "run.json").read_text())["config"] == FOUR[2]
    assert rerun[0]["final"]["loss"] == pytest.approx(results[0]["final"]["loss"])
    # Another name is another sweep: nothing is reused.
    other = orch.sweep("jobs:lr_job", FOUR[:1], run_root=str(tmp_path), name="other")
    assert [r["reused"] for r in other.wait(120)] == [False]


NAN_AT = 12  # lr_job's weights blow up at step 11 and are NaN from step 12 on


def test_a_nan_trial_is_flagged_from_its_step_everywhere_and_sorts_last(
    tmp_path: Path, widget_messages: list[Any], subprocess_env: dict[str, str]
) -> None:
    configs = [{"lr": 0.01}, {"lr": 0.05, "nan_at": NAN_AT}, {"lr": 0.1, "fail": True}]
    sweep = orch.sweep("jobs:lr_job", configs, world_size=2, parallel=2, run_root=str(tmp_path), name="nan")
    panel = sweep.panel()
    results = sweep.wait(180)
    assert [r["state"] for r in results] == ["SUCCEEDED", "SUCCEEDED", "FAILED"]
    nan = results[1]
    # Its final value is NaN, not the last finite one (a loss near 1e34 at step 11).
    assert np.isnan(nan["final"]["loss"])
    bad = nan["nonfinite"]["loss"]
    assert (bad["step"], bad["last_finite_step"], bad["stays"]) == (NAN_AT, NAN_AT - 1, True)
    assert bad["last_finite"] > 1e20 and np.isnan(bad["value"])
    assert "loss" not in results[0]["nonfinite"]
    # The table flags it with the step and the last finite value.
    head, body = results.table()
    final = body[1][head.index("loss last")]
    assert final.startswith(f"nan from step {NAN_AT} (last finite ") and "e+" in final, final
    assert f'data-nonfinite-loss="{NAN_AT}"' in results._repr_html_()
    assert f"nan from step {NAN_AT}" in repr(results)
    # NaN and FAILED configs sort last, whichever way is best; best() never picks the NaN one.
    assert [r["index"] for r in results.sorted("loss")] == [0, 1, 2]
    assert [r["index"] for r in results.sorted("loss", "max")] == [0, 1, 2]
    assert sweep.best("loss").index == 0
    assert sweep.best("loss", mode="max").index == 0  # its 1e34 would have won as the last finite
    assert sweep.best("loss", scope="all").index == 0
    rows = sweep.rows("loss")
    assert [r["best_run"] for r in rows] == [True, False, False] and rows[1]["nonfinite"]["loss"]
    # The record: result.json says where each rank's loss went NaN; load_run and orch show too.
    run_dir = sweep.trials[1].run_dir
    record = json.loads((run_dir / "result.json").read_text())
    # (its accuracy, 1 / (1 + loss), went NaN with it)
    assert {(d["rank"], d["metric"], d["step"]) for d in record["nonfinite"]} == {
        (rank, metric, NAN_AT) for rank in (0, 1) for metric in ("loss", "acc")
    }
    loaded = orch.load_run(run_dir).state()
    assert [(d.rank, d.step) for d in loaded.nonfinite("loss")] == [(0, NAN_AT), (1, NAN_AT)]
    assert all(r.steps_per_sec > 0 for r in loaded.ranks)  # its mean rate, not 0.0
    thinned = orch.load_run(run_dir, max_points=4).state()  # its NaN points not among those held
    assert [(d.rank, d.step) for d in thinned.nonfinite("loss")] == [(0, NAN_AT), (1, NAN_AT)]
    # orch runs: the row's loss says NaN, from which step, and the last finite value.
    table = orch.runs(tmp_path)
    row = table[sweep.trials[1].run_id]
    assert row.loss_text().startswith(f"nan from step {NAN_AT} (last finite ")
    assert row.loss_text().endswith(f"at step {NAN_AT - 1})")
    assert f"nan from step {NAN_AT}" in repr(table)
    assert row.as_dict()["nonfinite"][0]["step"] == NAN_AT
    shown = orch_cli("show", row.run_id, "--run-root", str(tmp_path), env=subprocess_env, timeout=120)
    assert f"rank 0: loss nan from step {NAN_AT} (last finite " in shown.stdout, shown.stdout + shown.stderr
    assert " mean" in shown.stdout  # each rank's mean steps/s
    # The sweep's panel: the row flagged, the NaN config never marked best, its spike clipped.
    assert panel.wait_done(30)
    texts = [b.children[1].value for b in panel.table.children]
    assert f'class="orch-trial-nonfinite" data-step="{NAN_AT}"' in texts[1]
    assert "orch-trial-nonfinite" not in texts[0]
    assert panel.marked() == 0
    y = panel._plot.y_range
    assert y is not None and y.hi < 1e3, y  # the 1e34 spike does not set the axis
    assert [(c.curve, c.top) for c in y.clipped] == [(1, True)] and y.clipped[0].value > 1e20
    panel.close()


def test_the_first_config_of_a_fresh_process_shows_the_pools_cold_start_apart(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    script = tmp_path / "cold_sweep.py"
    script.write_text(
        "import json\n"
        "import orch\n"
        "configs = [{'lr': 0.01}, {'lr': 0.02}]\n"
        f"sweep = orch.sweep('jobs:lr_job', configs, run_root={str(tmp_path / 'runs')!r})\n"
        "results = sweep.wait(180)\n"
        "print(json.dumps([(r['duration'], r['pool_start']) for r in results]))\n"
        "head, body = results.table()\n"
        "print(json.dumps([cells[head.index('wall time')] for cells in body]))\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=subprocess_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stderr
    times, cells = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
    (first, first_pool), (second, second_pool) = times
    # The first launch waited for the forkserver to import torch; the second found it warm.
    assert first_pool > 0.5 and second_pool == 0.0, times
    assert first_pool < first
    assert cells[0] == f"{first - first_pool:.1f}s (+{first_pool:.1f}s pool start)"
    assert cells[1] == f"{second:.1f}s"


def test_max_failures_stops_starting_new_runs(tmp_path: Path) -> None:
    configs = [{"lr": 0.1, "fail": True}, {"lr": 0.2}, {"lr": 0.3, "fail": True}, {"lr": 0.4}, {"lr": 0.5}]
    sweep = orch.sweep("jobs:lr_job", configs, parallel=1, max_failures=2, run_root=str(tmp_path))
    states = [r["state"] for r in sweep.wait(180)]
    assert states == ["FAILED", "SUCCEEDED", "FAILED", "CANCELLED", "CANCELLED"]
    assert "started no more runs after 2 failures (max_failures=2)" in sweep.trials[3].failure
    assert len(run_dirs(tmp_path)) == 3
    first = orch.sweep("jobs:lr_job", configs[2:], max_failures=0, run_root=str(tmp_path), name="zero")
    assert [r["state"] for r in first.wait(180)] == ["FAILED", "CANCELLED", "CANCELLED"]


def test_parallel_runs_overlap_but_never_exceed_what_the_machine_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A machine that fits 2 ranks per core: 2 runs of 2 ranks at once on 2 cores, not 4.
    monkeypatch.setattr(sweep_plan, "MAX_WORKERS_PER_CORE", 2)
    monkeypatch.setattr(sweep_plan.os, "cpu_count", lambda: 2)
    configs = [{"lr": lr, "steps": 15, "sleep": 0.05} for lr in (0.01, 0.02, 0.03, 0.04, 0.05)]
    sweep = orch.sweep("jobs:lr_job", configs, world_size=2, parallel=4, run_root=str(tmp_path))
    assert sweep.parallel == 2
    workers_seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        # The sweep's rank processes alive at once (an exited one not yet reaped is not alive).
        while not stop.is_set():
            count = 0
            for trial in list(sweep.trials):
                for proc in list(trial.run.procs) if trial.run is not None else []:
                    try:
                        count += psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
                    except (psutil.Error, ValueError, TypeError):
                        continue
            workers_seen.append(count)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        results = sweep.wait(180)
    finally:
        stop.set()
        sampler.join()
    assert [r["state"] for r in results] == ["SUCCEEDED"] * 5
    assert max(workers_seen) <= 4, workers_seen
    assert max(workers_seen) > 2, "no two runs ever overlapped"
    spans = []
    for trial in sweep.trials:
        meta = json.loads((trial.run_dir / "run.json").read_text())
        spans.append((meta["started"], (trial.run_dir / "result.json").stat().st_mtime))
    overlapping = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert overlapping == 2


def test_stop_ends_every_run_and_cancels_the_rest(tmp_path: Path) -> None:
    configs = [{"lr": lr, "steps": 100000, "sleep": 0.02} for lr in (0.01, 0.02, 0.03, 0.04)]
    sweep = orch.sweep("jobs:lr_job", configs, world_size=2, parallel=2, run_root=str(tmp_path))
    until(lambda: sum(t.state == "RUNNING" for t in sweep.trials) == 2, 60)
    sweep.stop(1)  # one run only: the next config takes its place
    until(lambda: sweep.trials[1].done and sweep.trials[2].state == "RUNNING", 60)
    assert sweep.trials[1].state == "STOPPED"
    sweep.stop()
    results = sweep.wait(60)
    assert [r["state"] for r in results] == ["STOPPED", "STOPPED", "STOPPED", "CANCELLED"]
    for trial in sweep.trials[:3]:
        assert json.loads((trial.run_dir / "result.json").read_text())["state"] == "STOPPED"
    with pytest.raises(orch.ConfigError, match="no run 7 in sweep lr_job: pass the index"):
        sweep.stop(7)


def test_close_ends_every_run_now(tmp_path: Path) -> None:
    configs = [{"lr": lr, "steps": 100000, "sleep": 0.02} for lr in (0.01, 0.02, 0.03)]
    with orch.sweep("jobs:lr_job", configs, world_size=2, parallel=2, run_root=str(tmp_path)) as sweep:
        until(lambda: sum(t.state == "RUNNING" for t in sweep.trials) == 2, 60)
    assert sweep.done
    assert [t.state for t in sweep.trials] == ["FAILED", "FAILED", "CANCELLED"]
    assert "closed while it was running" in sweep.trials[0].failure


def test_curve_is_the_mean_over_ranks_with_its_band() -> None:
    from orch.wire.client import SeriesBuffer

    m = StateMirror()
    for rank, (steps, values, times) in enumerate(
        [
            ([1, 2, 3], [4.0, 2.0, 1.0], [100.0, 101.0, 102.0]),
            ([1, 2, 3], [2.0, float("nan"), 3.0], [100.5, 101.5, 103.0]),
        ]
    ):
        buf = m.series[(rank, "loss")] = SeriesBuffer()
        buf.extend(steps, values, times)
    c = curve(m, "loss")
    assert c.x.tolist() == [1, 2, 3]
    assert c.mean.tolist() == [3.0, 2.0, 2.0]  # a NaN point is left out, not averaged in
    assert c.lo.tolist() == [2.0, 2.0, 1.0] and c.hi.tolist() == [4.0, 2.0, 3.0]
    by_time = curve(m, "loss", "time")
    assert by_time.x.tolist() == [0.5, 1.0, 3.0]  # when the step's last rank logged it
    assert curve(m, "acc").x.size == 0


def test_a_sweep_ends_with_its_process_and_starts_nothing_more(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    script = tmp_path / "sweep_then_exit.py"
    script.write_text(
        "import sys, time\n"
        "import orch\n"
        f"configs = [{{'lr': lr, 'steps': 100000, 'sleep': 0.02}} for lr in (0.01, 0.02, 0.03)]\n"
        f"sweep = orch.sweep('jobs:lr_job', configs, run_root={str(tmp_path / 'runs')!r})\n"
        "while sweep.trials[0].state != 'RUNNING':\n"
        "    time.sleep(0.05)\n"
        "print('RUNNING', flush=True)\n"
        "sys.exit(0)  # the interpreter's exit: no close(), no stop()\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=subprocess_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "RUNNING" in proc.stdout, proc.stderr
    [run_dir] = run_dirs(tmp_path / "runs")  # the runs queued behind it never started
    result = json.loads((run_dir / "result.json").read_text())
    launcher = json.loads((run_dir / "run.json").read_text())["pid"]
    assert result["state"] == "FAILED" and result["failure"].startswith(f"launcher exited (pid {launcher})")
    assert result["root_cause_rank"] == -1, result


def test_a_rerun_reuses_only_what_ran_with_the_same_code_world_size_and_a_record_that_loads(
    tmp_path: Path,
) -> None:
    root = str(tmp_path)

    def train(ctx: Any) -> None:
        for step in ctx.steps(5):
            ctx.log(step, loss=1.0 / (step + 1))

    configs = [{"lr": 1}, {"lr": 2}]
    with pytest.raises(orch.ConfigError, match=r"configs\[1\] repeats"):
        orch.sweep(train, [{"lr": 1}, {"lr": 1.0}], run_root=root)  # the same number, to JSON
    orch.sweep(train, configs, world_size=1, run_root=root, name="s").wait(120)
    again = orch.sweep(train, [{"lr": 1.0}, {"lr": 2}], world_size=1, run_root=root, name="s").wait(120)
    assert [r["reused"] for r in again] == [True, True]
    wider = orch.sweep(train, configs, world_size=2, run_root=root, name="s").wait(120)
    assert [r["reused"] for r in wider] == [False, False]  # another world size is another run
    forced = orch.sweep(train, configs, world_size=2, run_root=root, name="s", reuse=False).wait(120)
    assert [r["reused"] for r in forced] == [False, False]

    def train(ctx: Any) -> None:  # the cell, edited and run again
        for step in ctx.steps(5):
            ctx.log(step, loss=2.0 / (step + 1))

    edited = orch.sweep(train, configs, world_size=1, run_root=root, name="s").wait(120)
    assert [r["reused"] for r in edited] == [False, False]
    assert edited[0]["final"]["loss"] == pytest.approx(0.4)
    # An earlier success whose record no longer loads runs again.
    damaged = Path(root) / edited[1]["run_id"] / "result.json"
    record = json.loads(damaged.read_text())
    damaged.write_text(json.dumps({**record, "ranks": "edited by hand"}))  # still says SUCCEEDED
    last = orch.sweep(train, configs, world_size=1, run_root=root, name="s").wait(120)
    assert [r["reused"] for r in last] == [True, False]
    assert len(run_dirs(tmp_path)) == 2 + 2 + 2 + 2 + 1

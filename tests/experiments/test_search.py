"""Sweeps that search and prune, for real: DDP trials pruned on every rank at once, an Optuna
study on disk, and a sweep whose kernel was killed, run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

import orch
from conftest import TESTS, notebook_kernel, tagged_processes, until

pytestmark = pytest.mark.timeout(400)


def ranks_steps(trial: orch.Trial) -> set[int]:
    """Each rank's last step in the trial's record (one value: every rank ended at the same step)."""
    loaded = orch.load_run(trial.run_dir)
    return {max(series["step"]) for series in loaded.history()["loss"].values()}


# ctx.steps waits at each rung for the sweep's decision; so does ctx.log in a loop without it
# (ctx.data's, or range's), and the master names the step after the rung as its stop step.
@pytest.mark.parametrize(
    ("loop", "steps", "grace"),
    [(None, 30, 3), ("range", 30, 3), ("data", 30, 3)],
    ids=["ctx.steps", "plain loop", "ctx.data loop"],
)
def test_asha_prunes_ddp_trials_on_every_rank_at_the_same_step(
    tmp_path: Path, loop: str | None, steps: int, grace: int
) -> None:
    configs = [{"x": x, "steps": steps, "sleep": 0.03, "loop": loop} for x in range(9)]
    sweep = orch.sweep(
        "jobs:landscape_job",
        configs,
        world_size=2,
        run_root=str(tmp_path),
        name="asha",
        prune=orch.ASHA(grace=grace, reduction=3),
    )
    results = sweep.wait(300)
    states = Counter(row["state"] for row in results)
    assert states["PRUNED"] >= 3 and states["SUCCEEDED"] >= 1 and set(states) == {"PRUNED", "SUCCEEDED"}, (
        states
    )
    for trial, row in zip(sweep.trials, results, strict=True):
        result = json.loads((trial.run_dir / "result.json").read_text())
        assert result["state"] == row["state"]
        if row["state"] == "PRUNED":
            assert trial.pruned_at in (grace, grace * 3) and row["pruned_at"] == trial.pruned_at
            ended = ranks_steps(trial)
            assert len(ended) == 1, f"the ranks of config {trial.index} ended at steps {ended}"
            # every loop waits at each rung for the decision: it ends there, on every rank
            assert ended == {trial.pruned_at}, (trial.index, ended)
            assert 0 < row["steps"] < steps
        else:
            assert ranks_steps(trial) == {steps - 1}
    # The best is a config that ran to its end; in this landscape x=6 leads from the start.
    assert sweep.best().config["x"] == 6
    assert (
        "PRUNED" in repr(results) and results._repr_html_().count('data-state="PRUNED"') == states["PRUNED"]
    )
    record = json.loads((tmp_path / ".sweeps" / "asha" / "sweep.json").read_text())
    assert record["rungs"] == [r for r in (grace, grace * 3, grace * 9) if r < steps - 1]
    assert record["pruner"]["rungs"][0]


def test_a_tpe_search_over_loguniform_is_an_optuna_study_on_disk(tmp_path: Path) -> None:
    space = {"lr": orch.loguniform(1e-3, 0.3), "steps": 5}
    cell = dict(
        world_size=2,
        run_root=str(tmp_path),
        name="tpe",
        trials=12,
        search=optuna.samplers.TPESampler(seed=0, n_startup_trials=4),
        metric="loss",
    )
    sweep = orch.sweep("jobs:lr_job", space, **cell)  # type: ignore[arg-type]
    results = sweep.wait(300)
    assert [row["state"] for row in results] == ["SUCCEEDED"] * 12
    study = optuna.load_study(study_name="tpe", storage=sweep.storage)
    assert sweep.storage == f"sqlite:///{(tmp_path / '.sweeps' / 'tpe' / 'study.db').resolve()}"
    done = study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    assert len(done) == 12 and study.direction == optuna.study.StudyDirection.MINIMIZE
    for trial, row in zip(sweep.trials, results, strict=True):
        frozen = done[trial.number]
        # The config every rank got is the one Optuna suggested; its value is the run's final mean loss.
        meta = json.loads((trial.run_dir / "run.json").read_text())
        assert meta["config"] == {"lr": frozen.params["lr"], "steps": 5} == trial.config
        assert 1e-3 <= frozen.params["lr"] <= 0.3
        assert frozen.value == pytest.approx(row["final"]["loss"])
    assert study.best_trial.value == pytest.approx(min(r["final"]["loss"] for r in results))
    # The same cell again: every trial is kept and the study asks for nothing more.
    again = orch.sweep("jobs:lr_job", space, **cell)  # type: ignore[arg-type]
    assert [row["reused"] for row in again.wait(120)] == [True] * 12
    assert len(optuna.load_study(study_name="tpe", storage=sweep.storage).trials) == 12


def test_an_optuna_pruner_prunes_through_the_sweep(tmp_path: Path) -> None:
    configs = [{"x": x, "steps": 20, "sleep": 0.03} for x in (15, 0, 2, 26, 18)]
    sweep = orch.sweep(
        "jobs:landscape_job",
        configs,
        run_root=str(tmp_path),
        name="optuna-pruner",
        prune=optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=3),
    )
    results = sweep.wait(300)
    assert results[0]["state"] == "SUCCEEDED"  # the best of the landscape comes first and goes on
    assert any(row["state"] == "PRUNED" for row in results)
    study = optuna.load_study(study_name="optuna-pruner", storage=sweep.storage)
    by_state = Counter(t.state.name for t in study.trials)
    assert by_state["PRUNED"] == sum(row["state"] == "PRUNED" for row in results)


SWEEP_CELL = """\
import sys
sys.path.insert(0, {tests!r})
import orch
configs = [{{"x": x, "steps": 40, "sleep": 0.08, "every": 5, "trace": {trace!r}}} for x in (15, 16, 12)]
sweep = orch.sweep("jobs:landscape_job", configs, world_size=2, run_root={root!r}, name="resumed")
"""


def trace_steps(path: Path) -> Counter[tuple[int, int]]:
    """How often rank 0 of each config ran each step."""
    if not path.is_file():
        return Counter()
    return Counter(tuple(int(v) for v in line.split()) for line in path.read_text().splitlines())  # type: ignore[misc]


def test_a_sweep_whose_kernel_was_killed_resumes_its_unfinished_trial_from_its_checkpoint(
    tmp_path: Path, no_leftover_processes: str
) -> None:
    trace, root = tmp_path / "trace.txt", tmp_path / "runs"
    env = dict(os.environ)
    with notebook_kernel(tmp_path, env) as (km, kc):
        cell = SWEEP_CELL.format(tests=str(TESTS), trace=str(trace), root=str(root))
        assert kc.execute_interactive(cell, timeout=120)["content"]["status"] == "ok"
        # Config 15 ends; config 16 gets well past a checkpoint; then the kernel dies.
        until(lambda: max((s for (x, s) in trace_steps(trace) if x == 16), default=-1) >= 17, 240)
        os.kill(km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
        until(lambda: not [p for p in tagged_processes(no_leftover_processes) if p.pid != os.getpid()], 60)
    before = trace_steps(trace)
    assert all(before[(15, s)] == 1 for s in range(40))
    killed_at = max(s for (x, s) in before if x == 16)
    assert 17 <= killed_at < 39 and not any(x == 12 for (x, _) in before)

    # The same cell again, in a new process (this one): config 15 is kept, 16 resumes, 12 runs.
    sweep = orch.sweep(
        "jobs:landscape_job",
        [{"x": x, "steps": 40, "sleep": 0.08, "every": 5, "trace": str(trace)} for x in (15, 16, 12)],
        world_size=2,
        run_root=str(root),
        name="resumed",
    )
    assert [t.reused for t in sweep.trials] == [True, False, False]
    assert sweep.trials[1].resume_from is not None and sweep.trials[2].resume_from is None
    results = sweep.wait(300)
    assert [row["state"] for row in results] == ["SUCCEEDED"] * 3
    after = trace_steps(trace)
    repeats = {x: sum(n - 1 for (cx, _), n in after.items() if cx == x) for x in (15, 16, 12)}
    assert repeats[15] == 0 and repeats[12] == 0
    assert 0 < repeats[16] <= 5, repeats  # at most `every` steps again, not from step 0
    assert all(after[(x, s)] >= 1 for x in (15, 16, 12) for s in range(40))
    first = min(orch.load_run(sweep.trials[1].run_dir).history()["loss"][0]["step"])
    assert first == killed_at - repeats[16] + 1 > 0


def test_orch_sweep_cli_searches_prunes_and_shows_pruned_rows(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    from conftest import orch_cli

    space = json.dumps({"x": {"randint": [0, 26]}, "steps": 30, "sleep": 0.03})
    proc = orch_cli(
        "sweep", "--fn", "jobs:landscape_job", "--space", space, "--trials", "6", "--search", "random",
        "--prune", "asha:grace=3,reduction=3", "--name", "cli-asha", env=subprocess_env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "orch: sweep cli-asha: 6 configs, 1 at a time" in proc.stdout
    table = proc.stdout[proc.stdout.index("sweep cli-asha\n") :]
    assert "PRUNED" in table and "SUCCEEDED" in table
    record: dict[str, Any] = json.loads(
        (tmp_path / "runs" / ".sweeps" / "cli-asha" / "sweep.json").read_text()
    )
    assert sum(t["state"] == "PRUNED" for t in record["trials"]) == table.count("PRUNED")
    bad = orch_cli("sweep", "--fn", "jobs:landscape_job", "--space", space, "--trials", "2",
                   "--prune", "hyperband", env=subprocess_env, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "the kind must be asha, sha or median" in bad.stderr


def test_a_stopped_tpe_sweep_run_again_goes_on_with_the_same_study(tmp_path: Path) -> None:
    space = {"x": orch.randint(0, 26), "steps": 40, "sleep": 0.05, "every": 5}
    cell = dict(world_size=2, run_root=str(tmp_path), name="tpe-again", trials=3)

    def run_cell() -> orch.Sweep:
        sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=2)
        return orch.sweep("jobs:landscape_job", space, search=sampler, **cell)  # type: ignore[arg-type]

    sweep = run_cell()
    until(lambda: len(sweep.trials) == 2 and sweep.trials[1].state == "RUNNING", 120)
    until(lambda: sweep.trials[1].run is not None and sweep.trials[1].run.state().progress()[0] >= 12, 120)
    sweep.stop()
    first = sweep.wait(120)
    assert [r["state"] for r in first] == ["SUCCEEDED", "STOPPED"]
    study = optuna.load_study(study_name="tpe-again", storage=sweep.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "RUNNING"]
    # The same cell again: trial 0 kept, trial 1 resumed as the same Optuna trial, one more asked.
    again = run_cell()
    assert [t.config for t in again.trials] == [t.config for t in sweep.trials]
    assert again.trials[1].resume_from is not None
    results = again.wait(180)
    assert [(r["state"], r["reused"]) for r in results] == [
        ("SUCCEEDED", True), ("SUCCEEDED", False), ("SUCCEEDED", False),
    ]  # fmt: skip
    first_step = min(orch.load_run(again.trials[1].run_dir).history()["loss"][0]["step"])
    assert first_step >= 10  # from its checkpoint, not step 0
    study = optuna.load_study(study_name="tpe-again", storage=sweep.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert [t.params["x"] for t in study.trials] == [t.config["x"] for t in again.trials]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "both cores busy"])
def test_tpe_and_asha_sweeps_of_ddp_trials_never_fail_a_pruned_trial(
    tmp_path: Path, busy: bool, request: pytest.FixtureRequest
) -> None:
    """As a user sweeps: TPE over a wide learning rate, ASHA(grace=3, reduction=3), 8 trials of
    a 2-rank DDP fit of 81 steps at 20 ms a step, 4 seeds. Every rank of a pruned trial hears
    the rung before it gets there and takes the sweep's one answer there: not one trial FAILED
    (a rank that left at the rung while its peer was in backward() failed it with gloo's
    "Connection closed by peer"), and every PRUNED trial has all its ranks at the rung step."""
    if busy:
        request.getfixturevalue("cpu_hog")  # and once more, with both cores busy with other work
    pruned = 0
    seeds = range(2) if busy else range(4)
    for seed in seeds:
        sweep = orch.sweep(
            "jobs:lr_job", {"lr": orch.loguniform(1e-3, 30.0), "steps": 81, "sleep": 0.02}, trials=8,
            world_size=2, run_root=str(tmp_path), name=f"tpe-asha-{seed}",
            search=optuna.samplers.TPESampler(seed=seed), prune=orch.ASHA(grace=3, reduction=3),
        )  # fmt: skip
        results = sweep.wait(300)
        states = Counter(row["state"] for row in results)
        assert set(states) <= {"PRUNED", "SUCCEEDED"}, (seed, states, [r.get("failure") for r in results])
        for trial, row in zip(sweep.trials, results, strict=True):
            if row["state"] == "PRUNED":
                pruned += 1
                ended = ranks_steps(trial)
                assert ended == {trial.pruned_at}, (seed, trial.index, trial.pruned_at, ended)
    assert pruned >= 2 * len(seeds)  # ASHA pruned, and each prune was at its rung on both ranks


def test_a_grid_written_in_order_runs_in_a_seeded_random_order_under_a_pruner(tmp_path: Path) -> None:
    """A grid in the order people write it, whose best is in the middle: in that order each
    config beats every one before it at each rung, and ASHA keeps nearly all of them. A sweep
    with a pruner runs the list in a random order seeded by ``seed`` (recorded in its folder,
    started in that order), so the early trials at a rung come from across the grid: ASHA prunes
    more and runs fewer steps, and finds the same best."""
    configs = [{"x": x, "valley": 6, "steps": 27, "sleep": 0.01} for x in range(9)]

    def swept(name: str, **kw: Any) -> tuple[orch.Sweep, list[dict[str, Any]]]:
        sweep = orch.sweep(
            "jobs:landscape_job", configs, world_size=1, run_root=str(tmp_path), name=name,
            prune=orch.ASHA(grace=1, reduction=3), **kw,
        )  # fmt: skip
        return sweep, sweep.wait(300)

    given, given_rows = swept("given", order="given")
    shuffled, rows = swept("shuffled")
    again, _ = swept("again", seed=0)
    other, _ = swept("other", seed=1)
    assert given.order == list(range(9))
    assert sorted(shuffled.order) == list(range(9)) and shuffled.order != list(range(9))
    assert again.order == shuffled.order and other.order != shuffled.order  # seeded
    # started in that order, and recorded with the sweep
    assert [t.index for t in sorted(shuffled.trials, key=lambda t: t.started)] == shuffled.order
    record = json.loads((tmp_path / ".sweeps" / "shuffled" / "sweep.json").read_text())
    assert record["order"] == shuffled.order
    # the rows stay the list's, and the best is found in either order
    assert [row["config"]["x"] for row in rows] == list(range(9))
    assert given.best().config["x"] == shuffled.best().config["x"] == 6

    def steps(results: list[dict[str, Any]]) -> int:
        return sum(int(row["steps"]) for row in results)

    pruned = [sum(row["state"] == "PRUNED" for row in r) for r in (given_rows, rows)]
    assert steps(rows) < steps(given_rows) and pruned[1] > pruned[0], (steps(rows), steps(given_rows), pruned)
    print("steps run, given / random order:", steps(given_rows), steps(rows), "pruned:", pruned)


@pytest.mark.parametrize("checkpoints", [True, False], ids=["from its checkpoint", "from step 0"])
def test_sha_spends_the_same_steps_on_a_grid_in_any_order_and_prunes_at_the_rungs(
    tmp_path: Path, checkpoints: bool
) -> None:
    """orch.SHA on a 9-config valley of 2-rank DDP trials, 27 steps, grace 1, reduction 3: each
    rung is decided once every trial reached it, so the same configs go on whichever order the
    grid runs in. A trial waiting at a rung gives its slot up to a queued one and runs again if
    it goes on: from its checkpoint (every step is run once: 9*2 + 3*2 + 6 + 17 = 47 steps), or
    from step 0 without one (at most 9*2 + 3*4 + 10 + 27 = 67). Every pruned trial ends at its
    rung on both ranks; the grid's best (x=6) is the one that ran to the end."""
    ran: dict[str, Counter[tuple[int, int]]] = {}
    kept: dict[str, list[list[int]]] = {}
    for order in ("given", "random"):  # SHA's own order is the list's: order="random" shuffles it
        trace = tmp_path / f"{order}.trace"
        configs = [
            {"x": x, "valley": 6, "steps": 27, "sleep": 0.01, "trace": str(trace), "checkpoint": checkpoints}
            for x in range(9)
        ]
        sweep = orch.sweep(
            "jobs:landscape_job", configs, world_size=2, run_root=str(tmp_path), name=f"sha-{order}",
            prune=orch.SHA(grace=1, reduction=3), order=order,
        )  # fmt: skip
        results = sweep.wait(300)
        sweep.close()
        states = Counter(row["state"] for row in results)
        assert states == {"PRUNED": 8, "SUCCEEDED": 1}, (order, [(r["state"], r["failure"]) for r in results])
        assert sweep.best().config["x"] == 6
        pruned_at = Counter(t.pruned_at for t in sweep.trials if t.pruned_at is not None)
        assert pruned_at == {1: 6, 3: 2}, pruned_at
        for trial in sweep.trials:
            if trial.pruned_at is not None and trial.run_id not in trial.earlier_runs:
                assert ranks_steps(trial) == {trial.pruned_at}, (trial.index, ranks_steps(trial))
        ran[order] = trace_steps(trace)
        kept[order] = sweep.pruner.kept  # type: ignore[union-attr]
        record = json.loads((tmp_path / ".sweeps" / f"sha-{order}" / "sweep.json").read_text())
        assert record["pruner"]["kept"] == kept[order]
        assert any(t.earlier_runs for t in sweep.trials)  # some gave their slot up and ran again
    assert kept["given"] == kept["random"] and [sorted(k) for k in kept["given"]] == [[5, 6, 7], [6], [6]]
    for order, counts in ran.items():
        total = sum(counts.values())
        if checkpoints:
            assert total == 47 and set(counts.values()) == {1}, (order, total)
        else:
            assert 47 < total <= 67, (order, total)
        assert {x for x, _ in counts} == set(range(9)) and max(s for x, s in counts if x == 6) == 26


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """Both cores busy with another user's work for the length of the test."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


# Every loop waits at ASHA's and SHA's rungs for the decision: ctx.steps, ctx.data's and a plain
# range's (through ctx.log), so a pruned trial ends at its rung on every rank. MedianStop has no
# rungs (it may judge any step): a ctx.steps loop hears its stop through the ranks' vote, a step
# or two after the decision, or runs to its end when the decision comes after its last step.
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("loop", "world_size", "prune"),
    [
        ("data", 4, lambda: orch.ASHA(grace=3, reduction=3)),
        ("range", 3, lambda: orch.SHA(grace=3, reduction=3)),
        (None, 2, lambda: orch.MedianStop(grace=3, interval=3, min_trials=2)),
        (None, 1, lambda: orch.ASHA(grace=3, reduction=3)),
    ],
    ids=["ctx.data-ASHA-4-ranks", "range-SHA-3-ranks", "ctx.steps-MedianStop-2-ranks", "ASHA-1-rank"],
)
def test_pruned_trials_end_pruned_on_every_rank_at_one_step_on_a_busy_machine(
    tmp_path: Path, cpu_hog: None, loop: str | None, world_size: int, prune: Any
) -> None:
    steps = 30
    configs = [{"x": x, "steps": steps, "sleep": 0.02, "loop": loop} for x in range(7)]
    sweep = orch.sweep(
        "jobs:landscape_job", configs, world_size=world_size, run_root=str(tmp_path), name="busy",
        prune=prune(),
    )  # fmt: skip
    results = sweep.wait(600)
    sweep.close()
    states = Counter(row["state"] for row in results)
    assert set(states) <= {"PRUNED", "SUCCEEDED"}, (states, [r.get("failure") for r in results])
    assert states["PRUNED"] >= 2, states
    gated = not isinstance(sweep.pruner, orch.MedianStop)
    for trial, row in zip(sweep.trials, results, strict=True):
        ended = ranks_steps(trial)
        assert len(ended) == 1, f"the ranks of config {trial.index} ended at steps {ended}"
        if row["state"] == "PRUNED":
            last = ended.pop()
            assert trial.pruned_at is not None and trial.pruned_at <= last, (trial.index, last)
            if gated:
                assert last == trial.pruned_at, (trial.index, trial.pruned_at, last)  # at its rung
    assert sweep.best().config["x"] == 6  # the landscape's best leads from its first steps

"""orch.ASHA and orch.MedianStop decide as they should, and search spaces draw as they say (units)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import optuna
import pytest

import orch
from orch.experiments.pruning import ASHA, SHA, MedianStop, parse_prune
from orch.experiments.space import RandomSearch, check_space

pytestmark = pytest.mark.unit

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _feed_both(
    curves: list[list[float]], order: list[tuple[int, int]], *, grace: int, reduction: int, direction: str
) -> tuple[list[bool], list[bool]]:
    """Report ``curves[t][step]`` in ``order`` to orch's ASHA and to Optuna's successive halving
    (one study trial per curve, asked in order of first report); each one's prune decisions."""
    asha = ASHA(mode="max" if direction == "maximize" else "min", grace=grace, reduction=reduction)
    study = optuna.create_study(
        direction=direction,
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=grace, reduction_factor=reduction),
    )
    trials: dict[int, optuna.Trial] = {}
    pruned: set[int] = set()
    ours, theirs = [], []
    for t, step in order:
        if t in pruned:
            continue
        if t not in trials:
            trials[t] = study.ask()
        value = curves[t][step]
        trials[t].report(value, step)
        theirs.append(trials[t].should_prune())
        ours.append(asha.report(t, step, value))
        if theirs[-1]:
            pruned.add(t)
            study.tell(trials[t], state=optuna.trial.TrialState.PRUNED)
    return ours, theirs


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_asha_decides_as_optunas_successive_halving_fed_the_same_values(seed: int, direction: str) -> None:
    rng = random.Random(seed)
    n, steps = 27, 40
    grace, reduction = rng.choice([(1, 2), (1, 3), (3, 3), (2, 4)])
    curves = [[rng.random() * math.exp(-s / 10) + rng.random() * 0.3 for s in range(steps)] for _ in range(n)]
    if seed % 3 == 0:
        curves[5][grace] = math.nan  # a NaN is pruned at its rung by both
    # Trials interleave as in a sweep with several at once: each next report is a random trial's next step.
    at = [0] * n
    order = []
    live = list(range(n))
    while live:
        t = rng.choice(live[:4])  # about four trials run at once, in order of start
        order.append((t, at[t]))
        at[t] += 1
        if at[t] == steps:
            live.remove(t)
    ours, theirs = _feed_both(curves, order, grace=grace, reduction=reduction, direction=direction)
    assert len(ours) > 50
    assert ours == theirs
    assert 0 < sum(ours) < n  # it pruned some, not all


def test_asha_rungs_and_history_survive_a_rerun() -> None:
    asha = ASHA(grace=3, reduction=3, max_steps=81)
    assert asha.rungs() == [3, 9, 27]
    assert asha.next_step(0, 0) == 3
    assert asha.report(0, 3, 1.0) is False  # the first at a rung goes on
    assert asha.next_step(0, 3) == 9
    assert asha.report(1, 3, 2.0) is True  # worse than the best third
    again = ASHA(grace=3, reduction=3, max_steps=81)
    again.restore(asha.state())
    assert again.next_step(0, 5) == 9 and again.next_step(1, 5) == 9
    assert again.report(2, 3, 1.5) is True  # judged against the same history


def test_asha_stops_judging_at_its_last_step() -> None:
    asha = ASHA(grace=1, reduction=2, max_steps=5)
    assert asha.rungs() == [1, 2]
    asha.report(0, 1, 0.0)
    asha.report(0, 2, 0.0)
    assert asha.next_step(0, 3) is None


def test_sha_decides_a_rung_only_once_every_trial_still_in_the_sweep_reached_it() -> None:
    """9 trials, grace 1, reduction 3: at step 1 the best 3 of 9 go on, at step 3 the best of
    those 3; whatever order the values come in, and a trial that failed on the way (no longer
    alive) is not waited for."""
    for order in (list(range(9)), list(reversed(range(9))), [4, 0, 8, 2, 6, 1, 7, 3, 5]):
        sha = SHA(mode="min", grace=1, reduction=3, max_steps=27)
        assert sha.rungs() == [1, 3, 9]
        value = {t: abs(t - 4) + 0.01 * t for t in range(9)}  # a valley: 4, then 3 and 5
        alive = set(range(9))
        for k, t in enumerate(order):
            assert sha.next_step(t, 0) == 1
            assert sha.report(t, 1, value[t]) is None  # wait: not everyone is there
            sha.settle(alive, 9)
            assert sha.decided(t, 1) is (None if k < 8 else t not in (3, 4, 5))
        assert sha.kept == [[4, 3, 5]]
        assert [sha.next_step(t, 1) for t in (4, 3, 5, 0)] == [3, 3, 3, None]
        alive -= {0, 1, 2, 6, 7, 8}
        for t in (5, 3):
            sha.report(t, 3, value[t])
        alive.discard(4)  # failed before step 3: not waited for, and not kept
        sha.settle(alive, 9)
        assert sha.decided(3, 3) is False and sha.decided(5, 3) is True
        again = SHA(mode="min", grace=1, reduction=3, max_steps=27)
        again.restore(sha.state())
        assert again.kept == sha.kept and again.report(5, 3, 0.0) is True  # decided already


def test_sha_waits_for_trials_a_search_has_not_drawn_yet_and_prunes_nan_at_once() -> None:
    sha = SHA(mode="max", grace=2, reduction=2, max_steps=10)
    assert sha.report(0, 2, float("nan")) is True
    assert sha.report(1, 2, 1.0) is None
    sha.settle({1, 2}, 3)  # trial 2 is still to be drawn (the scheduler counts it alive)
    assert sha.decided(1, 2) is None
    sha.report(2, 2, 2.0)
    sha.settle({1, 2}, 3)
    assert sha.kept == [[2]] and sha.decided(1, 2) is True and sha.decided(2, 2) is False


def test_median_stop_prunes_below_the_median_of_the_others() -> None:
    med = MedianStop(mode="min", grace=2, interval=2, min_trials=2)
    assert med.next_step(0, 0) == 2
    for t, v in ((0, 1.0), (1, 2.0)):
        assert med.report(t, 2, v) is False  # too few others yet
    assert med.next_step(0, 2) == 4
    assert med.report(2, 2, 3.0) is True  # worse than the median of 1.0 and 2.0
    assert med.report(3, 2, 0.5) is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hyperband", "the kind must be asha, sha or median"),
        ("asha:grace", "must be name=value"),
        ("asha:grace=x", "grace must be an integer"),
        ("asha:grace=0", "grace must be an integer >= 1"),
        ("asha:speed=2", "unexpected keyword"),
    ],
)
def test_parse_prune_refuses_what_it_cannot_read(text: str, message: str) -> None:
    with pytest.raises(orch.ConfigError, match=message):
        parse_prune(text)


def test_parse_prune_reads_the_cli_form() -> None:
    asha = parse_prune("asha:grace=3,reduction=3,max_steps=81")
    assert isinstance(asha, ASHA) and (asha.grace, asha.reduction, asha.max_steps) == (3, 3, 81)
    assert isinstance(parse_prune("median:grace=5,mode=max"), MedianStop)
    sha = parse_prune("sha:grace=1,reduction=2")
    assert isinstance(sha, SHA) and (sha.grace, sha.reduction) == (1, 2)


def test_random_search_draws_within_the_space_the_same_configs_for_the_same_seed() -> None:
    space = {
        "lr": orch.loguniform(1e-4, 1e-1),
        "p": orch.uniform(0.0, 0.5),
        "layers": orch.randint(1, 4),
        "act": orch.choice(["relu", "gelu"]),
        "steps": 20,
    }
    draws = [RandomSearch(space, seed=1).next(i) for i in range(200)]
    assert draws == [RandomSearch(space, seed=1).next(i) for i in range(200)]
    assert draws != [RandomSearch(space, seed=2).next(i) for i in range(200)]
    assert all(1e-4 <= d["lr"] <= 1e-1 and 0 <= d["p"] <= 0.5 and d["steps"] == 20 for d in draws)
    assert {d["layers"] for d in draws} == {1, 2, 3, 4} and {d["act"] for d in draws} == {"relu", "gelu"}
    # Log-uniform: about as many draws in each decade.
    decades = [sum(10**-k <= d["lr"] < 10 ** (1 - k) for d in draws) for k in (4, 3, 2)]
    assert min(decades) > 40


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: orch.uniform(1, 1), "needs low < high"),
        (lambda: orch.loguniform(0, 1), "needs 0 < low < high"),
        (lambda: orch.randint(1.5, 3), "needs integers"),
        (lambda: orch.choice([]), "non-empty list"),
        (lambda: check_space({"lr": orch.uniform(0, 1)}, None), "needs trials=N"),
        (lambda: check_space({"lr": 0.1}, 3), "at least one dimension"),
        (lambda: check_space([{}], 0), "trials must be an integer >= 1"),
    ],
)
def test_bad_spaces_are_refused_naming_what_to_write(call: object, message: str) -> None:
    with pytest.raises(orch.ConfigError, match=message):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("configs", "options", "message"),
    [
        ([{"lr": 0.1}], {"search": "random"}, "draws configs from a dict space"),
        ([{"lr": 0.1}], {"trials": 2}, "trials=2 is more than the 1 configs given"),
        ({"lr": orch.uniform(0, 1)}, {"trials": 2, "search": "tpe"}, "search must be 'random' or an Optuna"),
        ({"lr": orch.uniform(0, 1)}, {"trials": 2, "prune": "asha"}, "prune must be orch.ASHA"),
        ({"lr": orch.uniform(0, 1)}, {"trials": 2, "mode": "up"}, "mode must be 'min' or 'max'"),
    ],
)
def test_a_bad_search_is_refused_before_anything_starts(
    tmp_path: Path, configs: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(orch.ConfigError, match=message):
        orch.sweep("jobs:lr_job", configs, run_root=str(tmp_path), **options)
    assert not list(tmp_path.iterdir())

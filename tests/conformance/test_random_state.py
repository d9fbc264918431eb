"""Each rank's random state is its own, as a fresh process's under torchrun: distinct per rank,
per launch, per sweep trial and per restart; with ``seed=``, the same across launches and
still distinct across ranks, and on record (``run.json``, ``orch show``)."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import orch
from conftest import ORCH

pytestmark = pytest.mark.timeout(300)


def _draws(ctx):  # type: ignore[no-untyped-def]
    return (torch.initial_seed(), torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random())


def _fails_once(ctx):  # type: ignore[no-untyped-def]
    """Draws, then (first attempt, rank 1) fails after a step, so that the group restarts."""
    drawn = _draws(ctx)
    with open(Path(ctx.config["folder"]) / f"a{ctx.attempt}-r{ctx.rank}.json", "w") as f:
        json.dump(drawn, f)
    for step in ctx.steps(3):
        ctx.log(step, loss=1.0)
        if ctx.attempt == 1 and ctx.rank == 1 and step == 1:
            raise RuntimeError("the first attempt fails")


def launched(tmp_path: Path, **options) -> list:  # type: ignore[no-untyped-def,type-arg]
    with orch.launch(_draws, world_size=2, run_root=str(tmp_path), **options) as run:
        return [tuple(map(str, v)) for v in run.wait(timeout=180).values]


def test_four_ranks_of_two_launches_draw_four_ways(tmp_path: Path) -> None:
    draws = launched(tmp_path) + launched(tmp_path)
    for part in range(4):  # torch's seed, torch's draw, numpy's, random's: each its own
        assert len({d[part] for d in draws}) == 4, part


def test_seed_makes_launches_alike_and_ranks_apart(tmp_path: Path) -> None:
    first, second = launched(tmp_path, seed=11), launched(tmp_path, seed=11)
    assert first == second
    assert first[0] != first[1]
    assert first[0][0] == "11" and first[1][0] == "12"  # rank r: seed + r
    runs = sorted(p for p in tmp_path.iterdir() if (p / "run.json").exists())
    assert all(json.loads((p / "run.json").read_text())["seed"] == 11 for p in runs)
    shown = subprocess.run(
        [ORCH, "show", runs[0].name, "--run-root", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert "seed       11 (rank r seeded with 11 + r)" in shown.stdout, shown.stdout + shown.stderr
    unseeded = launched(tmp_path)
    assert not set(unseeded) & set(first)
    assert (
        "from the OS"
        in subprocess.run(
            [ORCH, "show", "--run-root", str(tmp_path), _newest(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )


def _newest(root: Path) -> str:
    return max((p for p in root.iterdir() if (p / "run.json").exists()), key=lambda p: p.stat().st_mtime).name


def _draws_to_folder(ctx):  # type: ignore[no-untyped-def]
    with open(Path(ctx.config["folder"]) / f"{ctx.run_id}-r{ctx.rank}.json", "w") as f:
        json.dump(_draws(ctx), f)


def test_each_trial_of_a_sweep_draws_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "draws"
    folder.mkdir()
    space = orch.grid(x=[1, 2], folder=[str(folder)])
    sweep = orch.sweep(_draws_to_folder, space, world_size=2, run_root=str(tmp_path), name="draws")
    try:
        sweep.wait(timeout=240)
    finally:
        sweep.close()
    drawn = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    assert len(drawn) == 4 and len({str(d[1]) for d in drawn}) == 4


def test_a_restart_draws_anew(tmp_path: Path) -> None:
    folder = tmp_path / "draws"
    folder.mkdir()
    with orch.launch(
        _fails_once, world_size=2, run_root=str(tmp_path), max_restarts=1, config={"folder": str(folder)}
    ) as run:
        assert run.wait(timeout=240).state is orch.RunState.SUCCEEDED
    drawn = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    assert sorted(drawn) == ["a1-r0", "a1-r1", "a2-r0", "a2-r1"]
    assert len({str(d[1]) for d in drawn.values()}) == 4

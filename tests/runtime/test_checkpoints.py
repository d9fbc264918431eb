"""Checkpoints taken by ``ctx.steps``: rank 0 writes one only once every rank's points up to it
are at the master, so a restart from it finds no hole in any rank's history; ``keep=k`` by a
metric keeps the k best plus the newest; a damaged newest checkpoint falls back to the previous."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import orch
from orch.record.checkpoint_index import Checkpoint, best_checkpoint, keep_best
from orch.runtime.checkpoints import read_checkpoint, write_checkpoint

CPU = torch.device("cpu")


def test_rank0_writes_a_checkpoint_only_after_every_rank_handed_over_its_points(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with orch.launch(
        "jobs:slow_flush_checkpoints", world_size=2, config={"out": str(out)}, run_root=str(tmp_path)
    ) as run:
        result = run.wait(timeout=120)
        run_dir = run.run_dir
    assert result.state is orch.RunState.SUCCEEDED
    flushed = [float(line) for line in (out / "rank1-flushed").read_text().split()]
    # Each checkpoint makes rank 1 flush twice (before the others may write, then in the
    # write itself, which rank 1 skips): the first of each pair must come before the file.
    # A file's mtime comes from the kernel's coarse clock (a tick, up to 10 ms, behind
    # time.time()); a checkpoint written without waiting for rank 1 would be 1.5 s early.
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    assert [p.name for p in checkpoints] == ["step-000000004.pt", "step-000000009.pt"]
    for path, ready in zip(checkpoints, flushed[::2], strict=True):
        assert path.stat().st_mtime >= ready - 0.05, (path.name, path.stat().st_mtime - ready)
    # Every point of both ranks is in the run's history.
    history = orch.load_run(run_dir).history()
    assert [history["loss"][r]["step"] for r in (0, 1)] == [list(range(10))] * 2


# -- checkpoints kept by merit ----------------------------------------------------------------------


def test_keep_2_by_a_metric_leaves_the_2_best_and_the_newest(tmp_path: Path) -> None:
    with orch.launch("jobs:checkpoints_by_merit", world_size=2, run_root=str(tmp_path)) as run:
        result = run.wait(timeout=120)
        best = run.best_checkpoint
    assert result.state is orch.RunState.SUCCEEDED
    checkpoints = run.run_dir / "checkpoints"
    # Checkpoints at steps 1, 3, ..., 11 carry the means 5, 1, 4, 2, 3, 6: the best two are
    # steps 3 (1.0) and 7 (2.0), the newest is step 11.
    assert sorted(p.name for p in checkpoints.glob("step-*.pt")) == [
        "step-000000003.pt",
        "step-000000007.pt",
        "step-000000011.pt",
    ]
    assert (checkpoints / "latest").read_text() == "step-000000011.pt"
    assert best is not None
    # The mean over the ranks (rank 0 logged 0.5, rank 1 logged 1.5), not rank 0's own value.
    assert (best.path, best.step, best.value, best.metric) == (
        checkpoints / "step-000000003.pt",
        3,
        1.0,
        "val",
    )
    saved = torch.load(best.path, weights_only=True)
    assert saved["step"] == 3 and saved["value"] == 1.0 and torch.equal(saved["state"]["w"], torch.zeros(4))
    # The same from the record on disk.
    loaded = orch.load_run(run.run_dir).best_checkpoint
    assert loaded == best


def test_a_sweep_trial_names_its_best_checkpoint_on_its_row(tmp_path: Path) -> None:
    configs = [{"mode": "min"}, {"mode": "max"}]
    with orch.sweep("jobs:checkpoints_by_merit", configs, world_size=2, run_root=str(tmp_path)) as sweep:
        rows = sweep.wait(180)
    assert [row["state"] for row in rows] == ["SUCCEEDED", "SUCCEEDED"]
    for trial, row, (step, value) in zip(sweep.trials, rows, [(3, 1.0), (11, 6.0)], strict=True):
        best = trial.best_checkpoint
        assert best is not None and (best.step, best.value, best.metric) == (step, value, "val")
        assert best.path == trial.run_dir / "checkpoints" / f"step-{step:09d}.pt"
        assert row["checkpoint"] == {"path": str(best.path), "step": step, "value": value, "metric": "val"}


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_and_says_so(tmp_path: Path) -> None:
    # Checkpoints at steps 9 and 19; at step 22 step 19's file loses its second half; rank 1
    # dies at 25; the restarted group must resume after step 9, not fail and not start over.
    config = {"die_at": 25, "corrupt_at": 22, "steps": 30}
    with orch.launch(
        "jobs:checkpointed", world_size=2, config=config, max_restarts=1, run_root=str(tmp_path)
    ) as run:
        result = run.wait(timeout=180)
        run_dir = run.run_dir
    assert result.state is orch.RunState.SUCCEEDED
    assert run.state().attempt == 2
    history = orch.load_run(run_dir).history()
    for rank in (0, 1):
        assert history["loss"][rank]["step"] == list(range(30))  # each step once
        steps, attempts = history["attempt"][rank]["step"], history["attempt"][rank]["value"]
        assert min(s for s, a in zip(steps, attempts, strict=True) if a == 2.0) == 10  # resumed after step 9
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "step-000000019.pt.corrupt").exists()  # set aside by rank 0
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    said = [line for line in logs.splitlines() if "checkpoint fallback" in line and "resuming from" in line]
    assert len(said) == 2, logs[-3000:]  # each rank says so
    for line in said:
        assert "step-000000019.pt is unreadable" in line and "step-000000009.pt (step 9)" in line


# -- the pieces, alone ---------------------------------------------------------------------------------


def _points(values: list[float | None]) -> list[Checkpoint]:
    return [Checkpoint(Path(f"step-{i:09d}.pt"), i, v, "val") for i, v in enumerate(values)]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("values", "keep", "mode", "kept"),
    [
        ([5.0, 1.0, 4.0, 2.0, 3.0, 6.0], 2, "min", [1, 3, 5]),  # the 2 best plus the newest
        ([5.0, 1.0, 4.0, 2.0, 3.0, 6.0], 2, "max", [0, 5]),  # the newest is among the best
        ([None, None, None, None], 2, "min", [2, 3]),  # no values: the newest two, as before
        ([1.0, math.nan, None, 2.0, math.nan], 1, "min", [0, 4]),  # NaN never counts as best
        ([2.0, 1.0, 1.0, 3.0], 1, "min", [2, 3]),  # a tie: the newer
    ],
)
def test_keep_best(values: list[float | None], keep: int, mode: str, kept: list[int]) -> None:
    assert [c.step for c in keep_best(_points(values), keep, mode)] == kept  # type: ignore[arg-type]


@pytest.mark.unit
def test_writes_keep_the_best_and_the_index_ranks_them(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "checkpoints"
    for step, value in [(1, 0.5), (2, 0.9), (3, 0.2), (4, 0.7), (5, 0.8)]:
        write_checkpoint(folder, step, 1, {"x": torch.ones(1)}, value=value, metric="val", keep=2, mode="min")
    assert sorted(p.name for p in folder.glob("step-*.pt")) == [
        "step-000000001.pt",
        "step-000000003.pt",
        "step-000000005.pt",
    ]
    best = best_checkpoint(folder)
    assert best == Checkpoint(folder / "step-000000003.pt", 3, 0.2, "val")
    # A restart replays step 3 with a worse value: the new file's value counts.
    write_checkpoint(folder, 3, 2, {"x": torch.ones(1)}, value=0.95, metric="val", keep=2, mode="min")
    assert best_checkpoint(folder) == Checkpoint(folder / "step-000000001.pt", 1, 0.5, "val")
    assert best_checkpoint(tmp_path / "nowhere") is None


@pytest.mark.unit
@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "flipped", "missing", "no record"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "run" / "checkpoints"
    write_checkpoint(folder, 4, 1, {"w": torch.full((64,), 4.0)})
    newest = write_checkpoint(folder, 9, 1, {"w": torch.full((64,), 9.0)})
    data = newest.read_bytes()
    if damage == "truncated":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        newest.write_bytes(b"")
    elif damage == "garbage":
        newest.write_bytes(bytes(range(256)) * 4)
    elif damage == "flipped":  # a few bytes of the pickle inside the archive change
        at = data.index(b"\x80\x02", data.index(b"data.pkl")) + 4
        newest.write_bytes(data[:at] + bytes(b ^ 0x5A for b in data[at : at + 4]) + data[at + 4 :])
    elif damage == "missing":
        newest.unlink()
    else:  # a whole archive, but not what orch writes
        torch.save([1, 2, 3], newest)
    other_rank = read_checkpoint(folder, CPU, weights_only=True)  # reads only
    assert newest.exists() or damage == "missing"
    with caplog.at_level("WARNING"):
        saved = read_checkpoint(folder, CPU, weights_only=True, writer=True)
    assert other_rank["step"] == saved["step"] == 4 and torch.equal(
        saved["state"]["w"], torch.full((64,), 4.0)
    )
    said = caplog.text
    assert (
        f"{newest} is unreadable" in said and "resuming from" in said and "step-000000004.pt (step 4)" in said
    )
    # Rank 0 set it aside: latest and the ranking name the one loaded.
    assert not newest.exists()
    assert (folder / "latest").read_text() == "step-000000004.pt"
    assert best_checkpoint(folder) == Checkpoint(folder / "step-000000004.pt", 4)
    if damage != "missing":
        assert (folder / "step-000000009.pt.corrupt").exists()


@pytest.mark.unit
def test_no_readable_checkpoint_is_an_error_naming_each(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "checkpoints"
    for step in (4, 9):
        write_checkpoint(folder, step, 1, {}).write_bytes(b"\0" * 10)
    with pytest.raises(
        orch.OrchError, match=r"no checkpoint .* can be read back: step-000000009.pt: .*step-000000004.pt"
    ):
        read_checkpoint(folder, CPU, weights_only=True)


@pytest.mark.unit
def test_a_damaged_index_only_loses_the_ranking(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "run" / "checkpoints"
    write_checkpoint(folder, 1, 1, {}, value=0.1, keep=1)
    write_checkpoint(folder, 2, 1, {}, value=0.9, keep=1)
    (folder / "index.json").write_text('{"mode": "min", "checkpoints": [{"name": "../x.pt", "step": 1}]}')
    with caplog.at_level("WARNING"):
        best = best_checkpoint(folder)
    assert "index.json is damaged" in caplog.text
    assert best is not None and best.step == 2 and best.value is None  # the newest, unranked


def _context(checkpoint_dir: Path) -> orch.Context:
    return orch.Context(
        rank=0,
        world_size=1,
        local_rank=0,
        device=CPU,
        config={},
        run_id="r",
        sender=None,
        checkpoint_dir=checkpoint_dir,
    )


@pytest.mark.unit
def test_bad_ranking_arguments_are_refused_naming_them(tmp_path: Path) -> None:
    ctx = _context(tmp_path / "run" / "checkpoints")
    with pytest.raises(ValueError, match="keep must be an integer >= 1"):
        next(ctx.steps(3, checkpoint=dict, every=1, keep=0))
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        next(ctx.steps(3, checkpoint=dict, every=1, mode="best"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"metric=.* with checkpoint="):
        next(ctx.steps(3, metric="val"))
    with pytest.raises(TypeError, match="value='low' is a str, not a real number"):
        ctx.save_checkpoint({}, step=1, value="low")
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was written


@pytest.mark.unit
def test_one_rank_loop_ranks_by_its_own_logged_metric_and_a_tensor_value_counts(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "checkpoints"
    ctx = _context(folder)
    for step in ctx.steps(6, checkpoint=dict, every=2, keep=1, metric="val", mode="max"):
        ctx.log(step, val=[0.1, 0.9, 0.3, 0.2, 0.5, 0.4][step])
    # Checkpoints at steps 1 (0.9), 3 (0.2), 5 (0.4): the best and the newest stay.
    assert sorted(p.name for p in folder.glob("step-*.pt")) == ["step-000000001.pt", "step-000000005.pt"]
    assert best_checkpoint(folder) == Checkpoint(folder / "step-000000001.pt", 1, 0.9, "val")
    ctx.save_checkpoint({}, step=7, value=torch.tensor(2.5), metric="val", keep=1, mode="max")
    assert best_checkpoint(folder) == Checkpoint(folder / "step-000000007.pt", 7, 2.5, "val")

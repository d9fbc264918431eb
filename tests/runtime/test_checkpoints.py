"""Checkpoints taken by ``ctx.steps``: rank 0 writes one only once every rank's points up to it
are at the master, so a restart from it finds no hole in any rank's history."""

from __future__ import annotations

from pathlib import Path

import orch


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

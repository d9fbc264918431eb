"""Code built on Lightning (``Trainer(strategy="ddp", accelerator="cpu", devices=2)``) trains in
an orch run as under Lightning's own launcher: global ranks 0 and 1, the launcher's parameters,
no process of Lightning's own beside orch's ranks (it re-executed the program for its "local
rank 1" before torchrun's environment was there); OrchLogger's metrics are in the history. A
default Trainer() or Fabric(), which trains each rank alone, is a warning in the rank's row."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import orch
from conftest import until, until_value
from theirs import CODE, assert_same_training, clean_env

pytestmark = pytest.mark.timeout(300)


def test_lightning_ddp_in_an_orch_run_trains_as_under_its_own_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = Path(shutil.copy(CODE / "lightning_fn.py", tmp_path / "train_lit.py"))
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    proc = subprocess.run(  # Lightning's own launcher: it starts the second process itself
        [sys.executable, str(code)], cwd=tmp_path, env=clean_env(ORCH_TEST_OUT=str(theirs)),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCH_TEST_OUT", str(ours))
    monkeypatch.setenv("ORCH_TEST_LOGGER", "1")
    with orch.launch("train_lit.py:train", world_size=2) as run:
        result = run.wait(timeout=240)
        pids = {r.rank: r.pid for r in run.state().ranks}
    assert result.state is orch.RunState.SUCCEEDED
    for rank in (0, 1):
        seen = json.loads((ours / f"seen-rank{rank}.json").read_text())
        assert seen == {"global_rank": rank, "world_size": 2, "pid": pids[rank]}, seen  # the rank itself
    assert_same_training(ours, theirs)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run.run_id]  # no second orch run
    history = run.history()
    # 128 samples, 2 ranks, batches of 16, 2 epochs: 8 steps a rank, each logged on its own rank
    assert {r: s["step"] for r, s in history["train_loss"].items()} == {0: list(range(8)), 1: list(range(8))}
    assert history["train_loss"][0]["value"] != history["train_loss"][1]["value"]  # each its own half
    state = run.state()
    assert state.total_steps == 8 and all(r.step == 8 for r in state.ranks)  # OrchCallback's total


def test_stop_ends_a_lightning_run_at_the_same_step_on_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(CODE / "lightning_fn.py", tmp_path / "train_lit.py")
    monkeypatch.chdir(tmp_path)
    for name, value in {"ORCH_TEST_OUT": str(tmp_path), "ORCH_TEST_LOGGER": "1", "ORCH_TEST_EPOCHS": "1000",
                        "ORCH_TEST_STEP_SLEEP": "0.02"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with orch.launch("train_lit.py:train", world_size=2, stop_grace=30.0) as run:
        until(lambda: min((r.step for r in run.state().ranks), default=0) >= 10, 120)
        run.stop()
        result = run.wait(timeout=60)
        ranks = run.state().ranks
    assert result.state is orch.RunState.STOPPED
    assert [r.state for r in ranks] == [orch.RankState.STOPPED] * 2, ranks  # by OrchCallback, not terminated
    assert ranks[0].step == ranks[1].step < 8000, ranks
    assert "terminated" not in (run.state().progress_note or "")


def test_a_slow_lightning_rank_is_named_the_straggler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OrchCallback hands Lightning's DDP model to orch, whose timers read its gradient wait:
    rank 1, 40 ms slower a step in its own compute, is the straggler, its peer waiting for it."""
    shutil.copy(CODE / "lightning_fn.py", tmp_path / "train_lit.py")
    monkeypatch.chdir(tmp_path)
    for name, value in {"ORCH_TEST_OUT": str(tmp_path), "ORCH_TEST_LOGGER": "1", "ORCH_TEST_EPOCHS": "1000",
                        "ORCH_TEST_STEP_SLEEP": "0.01", "ORCH_TEST_SLOW_RANK": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with orch.launch("train_lit.py:train", world_size=2) as run:
        judged = until_value(
            lambda: (m := run.state()).stragglers_judged and m.straggler_rank >= 0 and m, 120
        )
        run.stop()
        run.wait(timeout=60)
    assert judged.straggler_rank == 1, judged.straggler_note
    assert "rank 1 is the straggler" in judged.straggler_note, judged.straggler_note
    fast, slow = judged.ranks
    assert fast.collective_ms > slow.collective_ms + 20, (fast, slow)  # rank 0 waits for rank 1


@pytest.mark.parametrize("setup", ["alone", "right"])
def test_a_lightning_world_other_than_the_runs_is_a_warning(
    setup: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A default Trainer() and Fabric() (one CPU device: a single-device strategy) train each rank
    alone, without an error, under torchrun as under orch; orch finds them (no OrchCallback here)
    and warns in each rank's row and the events. Built as the warning says, nothing is said."""
    shutil.copy(CODE / "lightning_world_fn.py", tmp_path / "train_world.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCH_TEST_OUT", str(tmp_path))
    monkeypatch.setenv("ORCH_TEST_SETUP", setup)
    with orch.launch("train_world.py:train", world_size=2) as run:
        result = run.wait(timeout=240)
        if setup == "alone":  # the ranks tell it with a beat; the last beats go out as they end
            until(lambda: all(r.note for r in run.state().ranks), 20)
        state = run.state()
    assert result.state is orch.RunState.SUCCEEDED
    n = 1 if setup == "alone" else 2
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"seen-rank{rank}.json").read_text())
        assert seen == {"trainer": n, "fabric": n, "steps": 3}, seen
    warnings = sorted((rank, text) for _, kind, rank, text in state.events if kind == "warning")
    if setup == "right":
        assert warnings == [] and not any(r.note for r in state.ranks), (warnings, state.ranks)
        return
    said = "sees 1 process, but this run has 2 ranks: pass"
    for rank in (0, 1):  # in one event, or two: those a rank finds at the same beat go as one
        told = " ".join(text for r, text in warnings if r == rank)
        assert told.startswith(f"rank {rank}: "), warnings
        assert f'Lightning {said} Trainer(strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"])' in told
        assert f'Lightning Fabric {said} Fabric(strategy="ddp", devices=int(' in told, told
    for r in state.ranks:
        assert said in r.note, r.note

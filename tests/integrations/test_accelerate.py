"""Code built on Accelerate trains in an orch run as under accelerate's notebook_launcher: each
rank sees the run's two processes, the model is wrapped in DDP, the parameters are the
launcher's; OrchTracker's values are in the run's history; an Accelerator that trains each rank
alone (no cpu=True on a machine without GPUs) is a warning in the rank's row and the events."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import orch
from conftest import until
from theirs import CODE, assert_same_training, clean_env, free_port

pytestmark = pytest.mark.timeout(300)


def test_accelerate_in_an_orch_run_trains_as_under_notebook_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = Path(shutil.copy(CODE / "accelerate_fn.py", tmp_path / "train_acc.py"))
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    proc = subprocess.run(
        [sys.executable, str(code), "2"], cwd=tmp_path,
        env=clean_env(ORCH_TEST_OUT=str(theirs), ORCH_TEST_PORT=str(free_port())),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCH_TEST_OUT", str(ours))
    monkeypatch.setenv("ORCH_TEST_TRACKER", "1")
    with orch.launch("train_acc.py:train", world_size=2) as run:
        result = run.wait(timeout=180)
    assert result.state is orch.RunState.SUCCEEDED
    for rank in (0, 1):
        seen = json.loads((ours / f"seen-rank{rank}.json").read_text())
        assert seen["num_processes"] == 2 and seen["process_index"] == rank, seen
        assert seen["wrapped"] == "DistributedDataParallel" and seen["distributed_type"].endswith("MULTI_CPU")
        assert seen["batches"] == 4  # half of 128 samples each, in batches of 16
    assert_same_training(ours, theirs)
    loss = run.history()["loss"]  # accelerator.log runs on the main process only: rank 0's
    assert sorted(loss) == [0] and loss[0]["step"] == [0, 1, 2, 3]
    assert not any(r.note for r in run.state().ranks)


def test_an_accelerator_that_trains_each_rank_alone_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(CODE / "accelerate_fn.py", tmp_path / "train_acc.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCH_TEST_OUT", str(tmp_path))
    monkeypatch.setenv("ORCH_TEST_CPU", "0")  # Accelerator() on a machine without GPUs: one process
    with orch.launch("train_acc.py:train", world_size=2) as run:
        run.wait(timeout=180)
        # the ranks tell it with a beat; the last beats go out as they end
        until(lambda: all(r.note for r in run.state().ranks), 20)
        ranks = run.state().ranks
        events = [e for e in run.state().events if e[1] == "warning"]
    assert json.loads((tmp_path / "seen-rank0.json").read_text())["num_processes"] == 1
    for r in ranks:
        assert "Accelerate sees 1 process, but this run has 2 ranks" in r.note, r.note
        assert "Accelerator(cpu=True)" in r.note
    assert sorted(rank for _, _, rank, _ in events) == [0, 1], events

"""The HF Trainer (a tiny GPT-2 built from a config: nothing is downloaded), as a torchrun
script, trains under ``orch run`` as under torchrun; OrchCallback puts its loss, learning rate
and grad norm in the history, and its global step in the progress."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import orch
from conftest import ORCH
from theirs import CODE, TORCHRUN, assert_same_training, clean_env

pytestmark = pytest.mark.timeout(300)


def test_the_hf_trainer_under_orch_run_trains_as_under_torchrun(tmp_path: Path) -> None:
    shutil.copy(CODE / "hf_script.py", tmp_path / "train_hf.py")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    env = clean_env(ORCH_TEST_OUT=str(theirs), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", "train_hf.py"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(
        [ORCH, "run", "--workers", "2", "train_hf.py"], cwd=tmp_path,
        env=clean_env(ORCH_TEST_OUT=str(ours), ORCH_TEST_CALLBACK="1", HF_HUB_OFFLINE="1"),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert (ours / f"seen-rank{rank}.txt").read_text() == f"2 {rank}"  # world size, process index
    assert_same_training(ours, theirs)
    run = orch.load_run(next((tmp_path / "runs").iterdir()))
    history = run.history()
    every_step = {0: list(range(6)), 1: list(range(6))}
    for name in ("loss", "learning_rate", "grad_norm"):
        assert {r: s["step"] for r, s in history[name].items()} == every_step, name
    assert "train_runtime" not in history  # the end-of-training summary is not a series
    assert all(r.step == 6 and r.total_steps == 6 for r in run.state().ranks)

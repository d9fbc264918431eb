"""An unmodified torchrun script (argparse, DistributedSampler, its own init_process_group and
destroy_process_group) runs under ``orch run --workers 2 train.py ARGS`` and
``orch.launch("train.py", args=[...])``, trains exactly as under torchrun in the same test,
and its SummaryWriter scalars are in the run's history."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import orch
from conftest import ORCH
from theirs import CODE, assert_same_training, clean_env, run_torchrun

pytestmark = pytest.mark.timeout(300)


def torchrun(script: Path, args: list[str], cwd: Path, **env: str) -> None:
    run_torchrun([str(script), *args], cwd, clean_env(**env))


def orch_run(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ORCH, "run", *args], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """The script in a folder of its own, as a user has it."""
    return Path(shutil.copy(CODE / "ddp_script.py", tmp_path / "train.py"))


def test_orch_run_runs_a_torchrun_script_as_torchrun_does(tmp_path: Path, script: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    # Flags of the script's that orch run also knows (--lr is not orch's; --batch-size either):
    # every argument after the script is the script's.
    args = ["train.py", "--epochs", "2", "--batch-size", "16", "--out", str(ours)]
    proc = orch_run("--workers", "2", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCEEDED" in proc.stdout
    torchrun(script, ["--epochs", "2", "--out", str(theirs)], tmp_path)
    assert_same_training(ours, theirs)
    for rank in (0, 1):  # torchrun's contract, as the script read it
        env = (ours / f"env-rank{rank}.txt").read_text()
        assert f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0" in env
    run = orch.load_run(next((tmp_path / "runs").iterdir()))
    history = run.history()
    # 256 samples, 2 ranks, batches of 16, 2 epochs: 16 steps each, from SummaryWriter.add_scalar
    assert {r: series["step"] for r, series in history["train/loss"].items()} == {
        0: list(range(16)),
        1: list(range(16)),
    }
    assert history["lr/group0"][0]["value"][0] == pytest.approx(0.05)  # add_scalars
    last = run.state().ranks[0]  # the loss column shows the script's loss tag
    assert last.has_loss and last.loss == history["train/loss"][0]["value"][-1]


def test_a_script_launched_from_python_with_args(
    tmp_path: Path, script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    monkeypatch.chdir(tmp_path)
    with orch.launch("train.py", world_size=2, args=["--lr", "0.1", "--out", str(ours)]) as run:
        result = run.wait(timeout=180)
    assert result.state is orch.RunState.SUCCEEDED
    torchrun(script, ["--lr", "0.1", "--out", str(theirs)], tmp_path)
    assert_same_training(ours, theirs)
    assert len(run.history()["train/loss"][1]["step"]) == 8


def test_a_module_runs_as_python_m_runs_it(tmp_path: Path, script: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.move(script, package / "train.py")
    proc = orch_run("--workers", "2", "-m", "mypkg.train", "--out", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.glob("params-rank*.pt")) == ["params-rank0.pt", "params-rank1.pt"]


def test_a_script_that_exits_non_zero_fails_its_rank_with_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "import os, sys\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
        "dist.barrier()\n"
    )
    proc = orch_run("--workers", "2", "bad.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rank 1" in proc.stdout and "sys.exit(3)" in proc.stdout, proc.stdout
    ok = tmp_path / "ok.py"
    ok.write_text("import sys\nsys.exit(0)\n")  # exit code 0 is a success, as for any process
    proc = orch_run("--workers", "2", "ok.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_script_that_is_not_there_is_named_before_anything_starts(tmp_path: Path) -> None:
    proc = orch_run("--workers", "2", "nope.py", "--epochs", "2", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "there is no script" in proc.stderr and "nope.py" in proc.stderr
    assert not (tmp_path / "runs").exists()


SWEPT = """
import argparse, json, os
import torch.distributed as dist
import orch

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
dist.init_process_group("gloo")
assert json.loads(os.environ["ORCH_CONFIG"])["lr"] == args.lr
for step in range(3 * args.epochs):
    orch.log(step, loss=1.0 / (step + 1) + args.lr, lr=args.lr)
dist.destroy_process_group()
"""


def test_a_sweep_passes_each_config_to_a_script_as_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "swept.py").write_text(SWEPT)
    monkeypatch.chdir(tmp_path)
    sweep = orch.sweep("swept.py", orch.grid(lr=[0.01, 0.1]), world_size=2, args=["--epochs", "2"])
    sweep.wait(timeout=240)
    assert sweep.name == "swept"
    results = sweep.results()
    assert [t.state for t in sweep.trials] == [orch.RunState.SUCCEEDED] * 2, results
    for trial in sweep.trials:
        lr = trial.run.history()["lr"]
        expected = [trial.config["lr"]] * 6
        assert {r: s["value"] for r, s in lr.items()} == {0: expected, 1: expected}
    assert sweep.best("loss", mode="min").config == {"lr": 0.01}

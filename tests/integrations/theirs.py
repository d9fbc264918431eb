"""What the tests of existing code share: the code's folder, and the check that every rank of
a run holds the same parameters as every rank of the same code under its own launcher."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

CODE = Path(__file__).resolve().parent / "code"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
# torchrun's workers sometimes abort as their interpreter exits, their work done ("terminate
# called without an active exception", SIGABRT, in torch's C++ teardown; orch's workers leave
# through os._exit, and benchmarks/_common.retry_torchrun retries the same). That is the
# reference tool's flake, not what a test compares: such a reference run is run once more.
TEARDOWN_ABORT = "terminate called without an active exception"


def run_torchrun(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> None:
    """``torchrun --standalone --nproc-per-node 2 ARGS`` as the reference a test compares with;
    once more after torchrun's own teardown abort; its output in the error otherwise."""
    for attempt in (0, 1):
        proc = subprocess.run(
            [TORCHRUN, "--standalone", "--nproc-per-node", "2", *args],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if proc.returncode == 0:
            return
        if attempt or TEARDOWN_ABORT not in proc.stderr:
            break
        print(f"torchrun aborted in its teardown; running the reference once more:\n{proc.stderr[-2000:]}")
    raise AssertionError(proc.stdout + proc.stderr)


def params(folder: Path, world: int) -> list[dict[str, torch.Tensor]]:
    """Each rank's saved parameters (params-rank<R>.pt), in rank order."""
    found = sorted(p.name for p in folder.glob("params-rank*.pt"))
    assert found == [f"params-rank{r}.pt" for r in range(world)], f"{folder}: {found}"
    return [torch.load(folder / f"params-rank{r}.pt", weights_only=True) for r in range(world)]


def assert_same_training(ours: Path, theirs: Path, world: int = 2, atol: float = 1e-6) -> None:
    """Every rank of both runs ends with the same parameters (to ``atol``)."""
    mine, reference = params(ours, world), params(theirs, world)
    for rank, state in enumerate(mine + reference):
        for name, value in state.items():
            want = reference[0][name]
            assert torch.allclose(value, want, atol=atol, rtol=0), (rank, name, (value - want).abs().max())
    # ...and training moved them: a run in which nothing trained would pass the check above too.
    assert any((mine[0][n] != torch.zeros_like(mine[0][n])).any() for n in mine[0])


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without a launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    """A port free on loopback now, for a reference run's own store (not a default another run holds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LAUNCHER_VARIABLES = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "ORCH_RANK_OF",
}  # fmt: skip

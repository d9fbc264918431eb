"""What the conformance tests share: the programs' folder, an environment without a
launcher's variables, and the runs of one program under torchrun and under each of orch's
doors, each leaving what its ranks observed (``rank<R>.json``, ``params-rank<R>.pt``) in a
folder of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PROGRAMS = Path(__file__).resolve().parent / "programs"
BIN = Path(sys.executable).parent
TORCHRUN, ORCH = str(BIN / "torchrun"), str(BIN / "orch")

LAUNCHER_VARIABLES = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "ORCH_RANK_OF", "OMP_NUM_THREADS",
}  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without a launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def workspace(tmp_path: Path, program: str = "probe.py") -> Path:
    """A user's folder holding ``program`` (as ``probe.py``) and a package with it as a module."""
    folder = tmp_path / "work"
    (folder / "pkg").mkdir(parents=True, exist_ok=True)
    shutil.copy(PROGRAMS / program, folder / "probe.py")
    shutil.copy(PROGRAMS / program, folder / "pkg" / "probe.py")
    (folder / "pkg" / "__init__.py").write_text("")
    return folder


def observed(out: Path, world: int = 2) -> list[dict[str, Any]]:
    """What each rank wrote, in rank order."""
    found = sorted(p.name for p in out.glob("rank*.json"))
    assert found == [f"rank{r}.json" for r in range(world)], f"{out}: {found}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def run(cmd: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc

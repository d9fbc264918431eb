"""What ``orch run`` prints of a script's own output, as torchrun's ``--tee`` would: rank 0's
lines by default, every rank's or none on request, a tqdm-style line in its last state, and
the script's own ``logging.basicConfig`` taking effect once, with nothing printed twice."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import ORCH
from theirs import clean_env

pytestmark = pytest.mark.timeout(240)

CHATTY = r"""
import logging
import sys
import time

import torch.distributed as dist

logging.basicConfig(level=logging.INFO, format="USER %(levelname)s %(message)s")
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"hello from rank {rank}", flush=True)
logging.getLogger("train").info("configured on rank %d", rank)
for i in range(1, 4):
    sys.stderr.write(f"\rbar {i}/3 on rank {rank}")
    sys.stderr.flush()
    time.sleep(0.05)
sys.stderr.write("\n")
dist.barrier()
print(f"bye from rank {rank}", flush=True)
dist.destroy_process_group()
"""


def orch_run(cwd: Path, *flags: str) -> str:
    proc = subprocess.run(
        [ORCH, "run", "--workers", "2", *flags, "chatty.py"],
        cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCEEDED" in proc.stdout
    return proc.stdout


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "chatty.py").write_text(CHATTY)
    return tmp_path


def test_orch_run_shows_rank_0_s_output_and_a_rewritten_line_in_its_last_state(folder: Path) -> None:
    out = orch_run(folder)
    lines = out.splitlines()
    assert lines.count("hello from rank 0") == 1 and lines.count("bye from rank 0") == 1, out
    assert "from rank 1" not in out and "on rank 1" not in out, out
    # The script's basicConfig took the root logger (orch's logging stays off it): its format,
    # once, and orch's own INFO lines stay in the log.
    assert lines.count("USER INFO configured on rank 0") == 1, out
    assert lines.count("bar 3/3 on rank 0") == 1 and "bar 1/3" not in out and "bar 2/3" not in out, out
    assert out.index("hello from rank 0") < out.index("bye from rank 0") < out.index("SUCCEEDED")
    log = next((folder / "runs").glob("*/logs/*0.log")).read_text()
    assert log.count("USER INFO configured on rank 0") == 1, log  # in the rank's log, not twice either


def test_orch_run_shows_every_rank_prefixed_or_none(folder: Path) -> None:
    every = orch_run(folder, "--output", "all").splitlines()
    for rank in (0, 1):
        assert every.count(f"[rank{rank}]: hello from rank {rank}") == 1, every
        assert every.count(f"[rank{rank}]: bar 3/3 on rank {rank}") == 1, every
    none = orch_run(folder, "--output", "none")
    assert "hello from rank" not in none and "USER" not in none, none
    one = orch_run(folder, "--output", "1").splitlines()
    assert one.count("hello from rank 1") == 1 and "hello from rank 0" not in one, one

"""What a rank starts ends with it, on every way a run ends: under torchrun no process a rank
started is left once the job is gone, and under orch none may be.

Each rank starts a child (``subprocess.Popen``) and a grandchild that its parent leaves at
once (so it is re-parented, as a daemonised server is); their pids go to a file. After the
run ended, however it ended, neither may run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import orch
from conftest import ORCH, until
from probes import clean_env

pytestmark = pytest.mark.timeout(240)

STARTS = '''
import json, os, subprocess, sys, time
def start_children(folder, rank):
    """A child, and a grandchild whose parent exits at once (re-parented to the rank)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    middle = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
        " stdout=subprocess.DEVNULL);"
        " print(p.pid)"], stdout=subprocess.PIPE, text=True)
    grandchild = int(middle.communicate()[0])
    with open(os.path.join(folder, f"pids-{rank}.json"), "w") as f:
        json.dump([child.pid, grandchild], f)
'''


def started(folder: Path, world: int = 2) -> list[int]:
    """The pids the ranks wrote, once every rank wrote them."""
    until(lambda: all((folder / f"pids-{r}.json").exists() for r in range(world)), 120)
    return [p for r in range(world) for p in json.loads((folder / f"pids-{r}.json").read_text())]


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_all_gone(pids: list[int], within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if running(p)], "processes a rank started outlived the run"


def where(tmp_path: Path) -> dict[str, object]:
    return {"config": {"folder": str(tmp_path)}, "run_root": str(tmp_path)}


def _stepping(ctx):  # type: ignore[no-untyped-def]
    ns: dict = {}
    exec(STARTS, ns)
    ns["start_children"](ctx.config["folder"], ctx.rank)
    for step in ctx.steps(10**6):
        time.sleep(0.01)
        ctx.log(step, loss=1.0)


def _deaf(ctx):  # type: ignore[no-untyped-def]
    """A loop that never reaches a step boundary orch knows of: a stop runs out its grace."""
    ns: dict = {}
    exec(STARTS, ns)
    ns["start_children"](ctx.config["folder"], ctx.rank)
    while True:
        time.sleep(0.05)


def test_run_stop_ends_what_each_rank_started(tmp_path: Path) -> None:
    with orch.launch(_stepping, world_size=2, **where(tmp_path)) as run:
        pids = started(tmp_path)
        assert all(running(p) for p in pids)
        run.stop()
        assert run.wait(timeout=60).state is orch.RunState.STOPPED
        assert_all_gone(pids)


def test_a_stop_past_its_grace_ends_what_each_rank_started(tmp_path: Path) -> None:
    with orch.launch(
        _deaf, world_size=2, config={"folder": str(tmp_path)}, run_root=str(tmp_path), stop_grace=1.0
    ) as run:
        pids = started(tmp_path)
        run.stop()
        run.wait(timeout=60)
        assert_all_gone(pids)


def test_a_rank_killed_outright_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGKILL, as the OOM killer sends it, to one rank: it cannot end its own children; the
    launcher ends them by the run's mark in their environment."""
    with orch.launch(_stepping, world_size=2, **where(tmp_path)) as run:
        pids = started(tmp_path)
        os.kill(run.procs[1].pid, signal.SIGKILL)
        with pytest.raises(orch.RunFailed):
            run.wait(timeout=60)
        assert_all_gone(pids)


def test_ctrl_c_on_orch_run_ends_what_each_rank_started(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        STARTS + "start_children(sys.argv[1], int(os.environ['RANK']))\nwhile True:\n    time.sleep(0.05)\n"
    )  # a plain script: no step boundary orch knows of, so the stop runs out its grace
    proc = subprocess.Popen(
        [ORCH, "run", "--workers", "2", "--stop-grace", "1", "train.py", str(tmp_path)],
        cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        pids = started(tmp_path)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal signals the whole group
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "STOPPED" in out, out
    assert_all_gone(pids)


def test_a_gang_closed_ends_what_its_ranks_started(tmp_path: Path) -> None:
    def start(ctx):  # type: ignore[no-untyped-def]
        ns: dict = {}
        exec(STARTS, ns)
        ns["start_children"](str(tmp_path), ctx.rank)

    gang = orch.gang(world_size=2, run_root=str(tmp_path))
    try:
        gang.run(start).wait(timeout=120)
        pids = started(tmp_path)
        assert all(running(p) for p in pids)  # a gang's ranks live on between calls, and so do theirs
    finally:
        gang.close()
    assert_all_gone(pids)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


def _trial(ctx):  # type: ignore[no-untyped-def]
    ns: dict = {}
    exec(STARTS, ns)
    ns["start_children"](ctx.config["folder"], f"{ctx.run_id}-{ctx.rank}")
    for step in ctx.steps(int(ctx.config["steps"])):
        time.sleep(0.02)
        ctx.log(step, loss=float(ctx.config["x"]))


def test_a_pruned_trial_ends_what_its_ranks_started(tmp_path: Path) -> None:
    folder = tmp_path / "pids"
    folder.mkdir()
    configs = [{"x": x, "steps": 40, "folder": str(folder)} for x in range(3)]
    sweep = orch.sweep(
        _trial,
        configs,
        world_size=2,
        run_root=str(tmp_path),
        name="pruned",
        prune=orch.MedianStop(grace=2, interval=2, min_trials=1),
        order="given",
    )
    try:
        states = [row["state"] for row in sweep.wait(300)]
    finally:
        sweep.close()
    assert "PRUNED" in states, states
    pids = [p for f in folder.glob("pids-*.json") for p in json.loads(f.read_text())]
    assert len(pids) == 2 * 2 * 3
    assert_all_gone(pids)

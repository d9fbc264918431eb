"""torchrun's contract in every rank, with real processes: its variables agree with ctx's rank
on one host and across host agents; a script's own init_process_group and
destroy_process_group, twenty runs in a row, never hang or lose a rank; a rank that starts a
distributed job of its own is named at once; nothing a rank starts outlives the run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import orch
from conftest import ORCH
from orch.errors import NestedRunError

pytestmark = pytest.mark.timeout(300)


def seen(run: orch.Run, world: int) -> list[dict[str, float]]:
    history = run.history()
    return [
        {name: history[name][r]["value"][-1] for name in history if name != "rank/memory"}
        for r in range(world)
    ]


@pytest.mark.parametrize("attempt", range(3))
def test_on_one_host_local_rank_is_the_rank_as_under_torchrun(tmp_path: Path, attempt: int) -> None:
    with orch.launch("jobs:torchrun_contract", world_size=4, run_root=str(tmp_path)) as run:
        assert run.wait(timeout=120).state is orch.RunState.SUCCEEDED
        for rank, values in enumerate(seen(run, 4)):
            assert values["ctx_rank"] == values["ctx_local_rank"] == values["env/RANK"] == rank, values
            assert values["env/LOCAL_RANK"] == rank and values["env/GROUP_RANK"] == 0, values
            assert values["env/WORLD_SIZE"] == values["env/LOCAL_WORLD_SIZE"] == 4, values
            assert 0 < values["env/MASTER_PORT"] < 65536, values


def test_host_agents_ranks_are_blocks_as_torchrun_numbers_them(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Two host agents of two ranks each: RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK,
    whichever of their four ranks registers first."""
    flags = ["--fn", "jobs:torchrun_contract", "--run-root", str(tmp_path)]
    master = subprocess.Popen(
        [ORCH, "master", "--world-size", "4", "--port", "0", "--no-dashboard", "--linger", "0.5", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=subprocess_env, cwd=tmp_path,
    )  # fmt: skip
    agents: list[subprocess.Popen[bytes]] = []
    try:
        assert master.stdout is not None
        address = master.stdout.readline().split("serving on ")[1].split(";")[0]
        worker = [ORCH, "worker", address, "--nproc-per-node", "2", "--threads", "1", *flags]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        for _ in range(2):
            agents.append(subprocess.Popen(worker, env=subprocess_env, cwd=tmp_path, **quiet))
        for agent in agents:
            assert agent.wait(timeout=120) == 0
        master.communicate(timeout=60)
    finally:
        for p in (master, *agents):
            if p.poll() is None:
                p.kill()
                p.wait()
    run = orch.load_run(next(tmp_path.glob("*/result.json")).parent)
    history = run.history()
    wanted = [n for n in history if n.startswith(("env/", "ctx_"))]
    by_rank = {r: {n: history[n][r]["value"][-1] for n in wanted} for r in range(4)}
    hosts: dict[int, set[str]] = {}
    for r in run.state().ranks:
        hosts.setdefault(int(by_rank[r.rank]["env/GROUP_RANK"]), set()).add(r.worker_id.rsplit("-", 1)[0])
    for rank, v in by_rank.items():
        assert v["env/RANK"] == rank == v["env/GROUP_RANK"] * 2 + v["env/LOCAL_RANK"], v
        assert v["ctx_local_rank"] == v["env/LOCAL_RANK"] and v["env/LOCAL_WORLD_SIZE"] == 2, v
    # each group rank is one agent's two ranks (their worker ids: host-agentpid-localrank)
    assert sorted(hosts) == [0, 1] and all(len(ids) == 1 for ids in hosts.values()), hosts


DESTROYS = """
import os
import torch
import torch.distributed as dist

for _ in range(3):  # make the group, use it, let it go, again: as scripts that call main() twice do
    dist.init_process_group("gloo", init_method="env://")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == int(os.environ["WORLD_SIZE"]), t
    dist.destroy_process_group()
"""


def test_a_scripts_destroy_process_group_twenty_runs_in_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "destroys.py").write_text(DESTROYS)
    monkeypatch.chdir(tmp_path)
    for i in range(20):
        with orch.launch("destroys.py", world_size=2, heartbeat_timeout=10.0) as run:
            result = run.wait(timeout=60)
            ranks = run.state().ranks
        assert result.state is orch.RunState.SUCCEEDED, (i, result)
        assert [r.state for r in ranks] == [orch.RankState.SUCCEEDED] * 2, (i, ranks)


def test_init_process_group_asking_for_another_world_is_refused_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "wrong.py").write_text(
        "import torch.distributed as dist\ndist.init_process_group('gloo', world_size=3, rank=0)\n"
    )
    monkeypatch.chdir(tmp_path)
    with orch.launch("wrong.py", world_size=2) as run, pytest.raises(orch.RunFailed) as failed:
        run.wait(timeout=60)
    assert "init_process_group(world_size=3)" in failed.value.traceback
    assert "orch run of 2 ranks" in failed.value.traceback


@pytest.mark.parametrize("job", ["jobs:spawns_its_own_job", "jobs:launches_a_run_inside"])
def test_a_rank_that_starts_a_job_of_its_own_is_named_at_once(tmp_path: Path, job: str) -> None:
    started = time.monotonic()
    with (
        orch.launch(job, world_size=2, run_root=str(tmp_path)) as run,
        pytest.raises(orch.RunFailed) as failed,
    ):
        run.wait(timeout=60)
    assert time.monotonic() - started < 30  # named, not left to hang in a collective
    assert NestedRunError.__name__ in failed.value.traceback
    assert "started a distributed job of its own" in failed.value.traceback
    assert [p.name for p in tmp_path.iterdir()] == [run.run_id]  # no second run was started


def test_orch_run_re_executed_inside_a_rank_refuses_to_start(tmp_path: Path) -> None:
    with orch.launch("jobs:reexecutes_orch_run", world_size=1, run_root=str(tmp_path)) as run:
        assert run.wait(timeout=120).state is orch.RunState.SUCCEEDED
        assert run.history()["child_exit"][0]["value"] == [1.0]
        log = next((tmp_path / run.run_id / "logs").iterdir()).read_text()
    assert "started a distributed job of its own (orch run)" in log, log
    assert [p.name for p in tmp_path.iterdir()] == [run.run_id]


def test_processes_a_rank_started_end_with_it(tmp_path: Path) -> None:
    # the autouse fixture fails this test if a sleep (child or orphaned grandchild) outlives it
    with orch.launch("jobs:starts_processes_and_returns", world_size=2, run_root=str(tmp_path)) as run:
        assert run.wait(timeout=60).state is orch.RunState.SUCCEEDED


def test_orch_run_inside_a_rank_is_refused_in_the_cli_too(tmp_path: Path) -> None:
    env = {"ORCH_RANK_OF": "abc123:1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "orch", "run", "--workers", "2"], env=env, capture_output=True, text=True,
        timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "rank 1 of orch run abc123 started a distributed job of its own (orch run)" in proc.stderr
    assert not (tmp_path / "runs").exists()


EXITS = """
import os
import sys
import torch
import torch.distributed as dist
import orch

torch.set_num_interop_threads(1)  # a script may size torch's pools itself, once
dist.init_process_group("gloo")
for step in range(5):
    orch.log(step, loss=1.0 / (step + 1))
dist.barrier()
sys.stdout.flush()
os._exit(int(sys.argv[1]) if dist.get_rank() == 1 else 0)  # past gloo's teardown, as scripts do
"""


@pytest.mark.parametrize("code", [0, 3])
def test_os_exit_in_a_script_is_its_exit_code_as_under_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    (tmp_path / "exits.py").write_text(EXITS)
    monkeypatch.chdir(tmp_path)
    with orch.launch("exits.py", world_size=2, args=[str(code)]) as run:
        if code == 0:
            assert run.wait(timeout=60).state is orch.RunState.SUCCEEDED
        else:
            with pytest.raises(orch.RunFailed) as failed:
                run.wait(timeout=60)
            assert failed.value.rank == 1 and "the script called os._exit(3)" in failed.value.traceback
            assert "exits.py" in failed.value.traceback  # where it was called
        ranks = run.state().ranks
        history = run.history()
    if code == 0:
        assert [r.state for r in ranks] == [orch.RankState.SUCCEEDED] * 2, ranks
    else:
        assert ranks[1].state is orch.RankState.FAILED, ranks
        # Rank 0 exits 0 at the same moment: SUCCEEDED, or (when rank 1's exit was seen first)
        # ended by the run's teardown, as torchrun ends the others, which reads STOPPED ("stopped:
        # rank 1 failed"), never FAILED of its own; the cause is rank 1 either way.
        assert ranks[0].state in (orch.RankState.SUCCEEDED, orch.RankState.STOPPED), ranks
        assert "os._exit" not in ranks[0].error, ranks[0]
    assert [history["loss"][r]["step"] for r in (0, 1)] == [list(range(5))] * 2  # every point delivered

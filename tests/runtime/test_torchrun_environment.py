"""`orch worker` under torchrun and srun: the launcher's rank is the rank.

The master's rule through the coordinator (and the status codes through a real gRPC
master), the environment each launcher sets, then real processes: torchrun starting
`python -m orch.worker`, and two `orch worker`s with Slurm's variables started rank 1 first.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import orch
from conftest import ORCH, orch_cli, until
from orch.errors import ConfigError, WorkerError
from orch.master.control.plan import RunPlan
from orch.master.control.validate import Reject
from orch.master.coordinator import Coordinator
from orch.master.server import MasterServer
from orch.runtime.joining import check_launched
from orch.runtime.launcher_env import LaunchedAs, launched_as
from orch.runtime.spec import WorkerSpec
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.auth import open_channel
from orch.wire.client import MasterClient, StateMirror

pytestmark = pytest.mark.timeout(240)

TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def register(coord: Coordinator, worker: str, rank: int | None = None, world: int = 0) -> int:
    req = pb.RegisterRequest(worker_id=worker, host="h", pid=1, address=f"10.0.0.{len(worker)}")
    if rank is not None:
        req.rank = rank
    req.world_size = world
    return coord.register(req).rank


# -- the master's rule ----------------------------------------------------------------------
def test_a_requested_rank_is_given_whatever_the_registration_order() -> None:
    coord = Coordinator(RunPlan(3), run_id="r")
    assert register(coord, "w2", 2, 3) == 2
    assert register(coord, "w0", 0, 3) == 0
    assert register(coord, "anyone") == 1  # no request: the lowest free rank
    assert [r.rank for r in coord.ranks] == [0, 1, 2]
    assert [r.worker_id for r in coord.ranks] == ["w0", "anyone", "w2"]
    assert register(coord, "w2", 2, 3) == 2  # a retried Register keeps its rank


def test_without_a_request_ranks_follow_registration_order() -> None:
    coord = Coordinator(RunPlan(3), run_id="r")
    assert [register(coord, w) for w in ("c", "a", "b")] == [0, 1, 2]


def test_the_rendezvous_is_rank_zeros_even_when_it_registered_last() -> None:
    coord = Coordinator(RunPlan(2), run_id="r", rendezvous_port=29511)
    register(coord, "w1-long-name", 1, 2)
    assert coord.snapshot(skip_series=True).rendezvous == ""  # rank 0 is not there yet
    register(coord, "w0", 0, 2)
    go = coord.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w1-long-name"))
    assert go.ready and (go.master_addr, go.master_port) == ("10.0.0.2", 29511)
    assert coord.snapshot(skip_series=True).rendezvous == "10.0.0.2:29511"


def test_a_taken_rank_is_refused_naming_the_worker_that_holds_it() -> None:
    coord = Coordinator(RunPlan(2), run_id="r")
    register(coord, "holder", 1, 2)
    with pytest.raises(Reject) as e:
        register(coord, "late", 1, 2)
    assert e.value.kind == "already_exists"
    assert "rank 1" in str(e.value) and "worker holder" in str(e.value) and "late" in str(e.value)
    assert len(coord.ranks) == 1


def test_a_rank_past_the_world_size_is_refused() -> None:
    coord = Coordinator(RunPlan(2), run_id="r")
    with pytest.raises(Reject) as e:
        register(coord, "w", 2)
    assert e.value.kind == "invalid_argument"
    assert "rank 2" in str(e.value) and "world size 2" in str(e.value)
    with pytest.raises(Reject, match="rank -1"):
        register(coord, "w", -1)
    assert coord.ranks == []


def test_a_launchers_world_size_not_the_masters_is_refused_naming_both() -> None:
    coord = Coordinator(RunPlan(2), run_id="r")
    with pytest.raises(Reject) as e:
        register(coord, "w", 0, 4)
    assert e.value.kind == "failed_precondition"
    assert "world size 4" in str(e.value) and "world size 2" in str(e.value)
    assert coord.ranks == []


def test_refusals_carry_their_grpc_status(master: MasterServer) -> None:
    cases = [
        (pb.RegisterRequest(worker_id="b", rank=0, world_size=2), grpc.StatusCode.ALREADY_EXISTS),
        (pb.RegisterRequest(worker_id="b", rank=5, world_size=2), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.RegisterRequest(worker_id="b", rank=1, world_size=3), grpc.StatusCode.FAILED_PRECONDITION),
    ]
    with open_channel(master.address) as channel:
        stub = pb_grpc.OrchestratorStub(channel)
        stub.Register(pb.RegisterRequest(worker_id="holder", rank=0, world_size=2), timeout=30)
        for req, code in cases:
            with pytest.raises(grpc.RpcError) as e:
                stub.Register(req, timeout=30)
            assert e.value.code() is code, e.value.details()
        # rank 0 asked for is a request; a field left unset is the old rule: the next free rank
        assert stub.Register(pb.RegisterRequest(worker_id="c"), timeout=30).rank == 1


def test_a_master_that_ignores_the_requested_rank_is_an_error() -> None:
    spec = WorkerSpec("127.0.0.1:1", launched=LaunchedAs("slurm", 1, 0, 2, 1))
    check_launched(spec, pb.RegisterResponse(rank=1, world_size=2))
    with pytest.raises(WorkerError, match=r"gave rank 0 of 2, not .*SLURM_PROCID=1"):
        check_launched(spec, pb.RegisterResponse(rank=0, world_size=2))


# -- the launchers' environments ------------------------------------------------------------
TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}
SLURM_ENV = {"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "6", "SLURM_NTASKS_PER_NODE": "3"}


def test_torchrun_wins_over_the_srun_task_it_runs_in() -> None:
    env = {**SLURM_ENV, **TORCHRUN_ENV, "LOCAL_WORLD_SIZE": "2"}
    assert launched_as(env) == LaunchedAs("torchrun", rank=3, local_rank=1, world_size=4, local_world_size=2)
    assert launched_as(env, "slurm") == LaunchedAs("slurm", 2, 0, 6, 3)
    assert launched_as(env, "none") is None


def test_slurm_tasks_and_their_local_world_size() -> None:
    assert launched_as(SLURM_ENV) == LaunchedAs("slurm", 2, 0, 6, 3)
    uneven = {
        **SLURM_ENV,
        "SLURM_NTASKS_PER_NODE": "",
        "SLURM_TASKS_PER_NODE": "2(x2),1",
        "SLURM_NODEID": "2",
    }
    assert launched_as(uneven) == LaunchedAs("slurm", 2, 0, 6, 1)


def test_no_launcher_mark_no_launcher() -> None:
    assert launched_as({}) is None
    assert launched_as({"RANK": "1", "WORLD_SIZE": "2"}) is None  # a stray RANK is no torchrun
    assert launched_as({"RANK": "1", "WORLD_SIZE": "2"}, "torchrun") == LaunchedAs("torchrun", 1, 0, 2, 1)
    assert launched_as({"SLURM_NTASKS": "4"}) is None  # an allocation's shell, not an srun task


@pytest.mark.parametrize(
    ("env", "choice", "message"),
    [
        ({}, "torchrun", "RANK is not set, but --launcher torchrun"),
        ({**TORCHRUN_ENV, "RANK": "one"}, "auto", "RANK='one' is not an integer"),
        ({**TORCHRUN_ENV, "RANK": "4"}, "auto", "RANK=4 does not fit WORLD_SIZE=4"),
        ({**SLURM_ENV, "SLURM_PROCID": "6"}, "auto", "SLURM_PROCID=6 does not fit SLURM_NTASKS=6"),
    ],
)
def test_a_bad_launcher_environment_is_named(env: dict[str, str], choice: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        launched_as(env, choice)


def outside_launchers(env: dict[str, str]) -> dict[str, str]:
    """``env`` without a launcher's variables (this suite may itself run in an srun task)."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in env.items() if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in names}


def test_nproc_per_node_under_a_launcher_is_a_usage_error(subprocess_env: dict[str, str]) -> None:
    env = {**outside_launchers(subprocess_env), **SLURM_ENV}
    proc = orch_cli("worker", "--master", "127.0.0.1:1", "--nproc-per-node", "2", env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--nproc-per-node 2 under a launcher (Slurm's SLURM_PROCID=2, SLURM_NTASKS=6)" in proc.stderr
    assert "--launcher none" in proc.stderr


# -- real processes ---------------------------------------------------------------------------
@pytest.fixture
def orch_master(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`orch master --world-size 2` (the CLI) on a free port; yields it and its address."""
    proc = subprocess.Popen(
        [
            ORCH,
            "master",
            "--world-size",
            "2",
            "--fn",
            "jobs:launcher_ranks",
            "--steps",
            "30",
            "--port",
            "0",
            "--no-dashboard",
            "--linger",
            "0.5",
            "--run-root",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"serving on (\S+);", line)
        assert m, line + proc.stdout.read()
        yield proc, m.group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def finished(master: subprocess.Popen[str], run_root: Path) -> dict[str, Any]:
    """The ended run's result.json, with each rank's logged launcher variables."""
    out, _ = master.communicate(timeout=120)
    assert master.returncode == 0, out
    run_dir = next(run_root.glob("*/result.json")).parent
    result: dict[str, Any] = json.loads((run_dir / "result.json").read_text())
    history = orch.load_run(run_dir).history()
    result["seen"] = {
        rank: {name: history[name][rank]["value"][-1] for name in history if name != "loss"}
        for rank in range(result["world_size"])
    }
    return result


def assert_launcher_ranks(result: dict[str, Any]) -> None:
    assert result["state"] == "SUCCEEDED", result
    for rank, seen in result["seen"].items():
        assert seen["orch_rank"] == seen["env_rank"] == rank, seen
        assert seen["orch_local_rank"] == seen["env_local_rank"], seen  # 0 for both unless read
        assert seen["env_world"] == 2
    checksums = {r["param_checksum"] for r in result["ranks"]}
    assert len(checksums) == 1 and "" not in checksums, f"DDP parameters differ: {checksums}"
    assert {r["step"] for r in result["ranks"]} == {30}


def test_torchrun_runs_orch_workers_with_its_own_ranks(
    tmp_path: Path, subprocess_env: dict[str, str], orch_master: tuple[subprocess.Popen[str], str]
) -> None:
    master, address = orch_master
    proc = subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "orch.worker",
            address,  # first: torchrun's parser would take --master for its --master-addr, and refuse it
            "--fn",
            "jobs:launcher_ranks",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env=outside_launchers(subprocess_env),
        cwd=tmp_path,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "found in sys.modules" not in proc.stderr  # runpy's warning about -m orch.worker
    result = finished(master, tmp_path)
    assert_launcher_ranks(result)


def test_slurm_ranks_follow_slurm_procid_not_the_registration_order(
    tmp_path: Path, subprocess_env: dict[str, str], orch_master: tuple[subprocess.Popen[str], str]
) -> None:
    master, address = orch_master

    def task(procid: int, ntasks: int = 2) -> subprocess.Popen[str]:
        slurm = {
            "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(procid),
            "SLURM_NTASKS": str(ntasks),
            "SLURM_NTASKS_PER_NODE": str(ntasks),
        }
        return subprocess.Popen(
            [ORCH, "worker", "--fn", "jobs:launcher_ranks", "--threads", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**outside_launchers(subprocess_env), **slurm, "ORCH_MASTER": address},
            cwd=tmp_path,
        )

    def registered() -> list[tuple[int, int]]:
        with MasterClient(address, token=subprocess_env["ORCH_TOKEN"]) as client:
            return [(r.rank, r.pid) for r in StateMirror().poll(client).ranks]

    workers = [task(1)]  # rank 1 first: registration order would make it rank 0
    try:
        until(lambda: registered() != [], timeout=90, interval=0.2)
        assert registered() == [(1, workers[0].pid)]
        # While rank 1 waits at the barrier: its rank again, and a world size not the master's.
        pid = workers[0].pid
        holder = rf"ALREADY_EXISTS: worker \S+ asked for rank 1, which worker \S+ \(host \S+, pid {pid}\)"
        for procid, ntasks, refusal in [
            (1, 2, holder),
            (0, 3, "FAILED_PRECONDITION: worker .* was started with world size 3 .* has world size 2"),
        ]:
            refused = task(procid, ntasks)
            out, _ = refused.communicate(timeout=90)
            assert refused.returncode == 1, out
            assert re.search(refusal, out), out
            assert "Slurm's SLURM_PROCID" in out and "--launcher none" in out
        workers.append(task(0))
        for w in workers:
            out, _ = w.communicate(timeout=180)
            assert w.returncode == 0, out
        result = finished(master, tmp_path)
        assert_launcher_ranks(result)
        # the process started first, with SLURM_PROCID=1, is rank 1; the one with 0 is rank 0
        assert [(r["rank"], r["pid"]) for r in result["ranks"]] == [(0, workers[1].pid), (1, workers[0].pid)]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()

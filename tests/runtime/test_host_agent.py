"""The host agent: a host's ranks reach a real gRPC master through it, their heartbeats batched."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from conftest import ORCH, TESTS, TOKEN, guarded_master, until
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.master.server import SERVICE_NAME, MasterServer
from orch.runtime.agent import HostAgent
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.auth import open_channel
from orch.wire.states import RankState, RunState

BATCH = f"/{SERVICE_NAME}/SendHostHeartbeats"
SINGLE = f"/{SERVICE_NAME}/SendHeartbeat"
DEADLINE = 30.0


@pytest.fixture
def master() -> Iterator[tuple[MasterServer, Coordinator]]:
    coord = Coordinator(RunPlan(4), run_id="r")
    with guarded_master(coord) as server:
        yield server, coord


def stub(address: str, token: str | None = TOKEN) -> pb_grpc.OrchestratorStub:
    return pb_grpc.OrchestratorStub(open_channel(address, token=token))


def join(agent: str, n: int) -> list[pb_grpc.OrchestratorStub]:
    """n ranks register through the agent and pass the start barrier."""
    stubs = [stub(agent) for _ in range(n)]
    for i, s in enumerate(stubs):
        s.Register(
            pb.RegisterRequest(
                worker_id=f"w{i}", host="h", pid=i + 1, rendezvous_port=29500 if i == 0 else 0
            ),
            timeout=DEADLINE,
        )
    for i, s in enumerate(stubs):
        assert s.CanStartTraining(
            pb.CanStartTrainingRequest(run_id="r", worker_id=f"w{i}"), timeout=DEADLINE
        ).ready
    return stubs


def beat(s: pb_grpc.OrchestratorStub, worker: str, step: int) -> pb.HeartbeatResponse:
    reply: pb.HeartbeatResponse = s.SendHeartbeat(
        pb.HeartbeatRequest(
            run_id="r",
            worker_id=worker,
            step=step + 1,
            series=[pb.Series(name="loss", steps=[step], values=[1.0])],
        ),
        timeout=DEADLINE,
    )
    return reply


def together(calls: list[object]) -> list[object]:
    """Run the calls at once, one thread each (as a host's ranks beat); their results in order."""
    out: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()  # type: ignore[operator]
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_a_hosts_heartbeats_reach_the_master_in_one_call_per_round(
    master: tuple[MasterServer, Coordinator],
) -> None:
    server, coord = master
    with HostAgent(server.address, ranks=4, window=5.0, token=TOKEN) as agent:
        stubs = join(agent.address, 4)
        for step in range(5):
            replies = together([lambda i=i, step=step: beat(stubs[i], f"w{i}", step) for i in range(4)])
            assert all(isinstance(r, pb.HeartbeatResponse) and r.command == pb.CONTINUE for r in replies), (
                replies
            )
        # A round of 4 beats went as soon as the 4th arrived, long before the 5 s window.
        assert (agent.batches, agent.beats) == (5, 20)
        assert server.budget.served[BATCH] == 5 and server.budget.served[SINGLE] == 0
        assert server.budget.served[f"/{SERVICE_NAME}/Register"] == 4  # forwarded one by one
        for rank in range(4):
            assert coord.series(rank, "loss") == ([0, 1, 2, 3, 4], [1.0] * 5)
            assert coord.ranks[rank].step == 5
        coord.request_stop("enough")
        replies = together([lambda i=i: beat(stubs[i], f"w{i}", 5) for i in range(4)])
        assert all(r.command == pb.STOP and r.stop_at_step == coord.stop_at_step for r in replies)  # type: ignore[attr-defined]
        assert coord.stop_at_step > 5


def test_a_beat_the_master_refuses_gets_its_own_status_and_the_others_go_through(
    master: tuple[MasterServer, Coordinator],
) -> None:
    server, coord = master
    with HostAgent(server.address, ranks=2, window=5.0, token=TOKEN) as agent:
        stubs = join(agent.address, 4)
        good, bad = together([lambda: beat(stubs[0], "w0", 0), lambda: beat(stubs[1], "nobody", 0)])
        assert isinstance(good, pb.HeartbeatResponse) and good.command == pb.CONTINUE
        assert isinstance(bad, grpc.RpcError) and bad.code() is grpc.StatusCode.NOT_FOUND
        assert "no worker 'nobody'" in (bad.details() or "")
        assert agent.batches == 1 and coord.series(0, "loss")[0] == [0]


def test_a_heartbeat_waits_no_longer_than_the_window_for_the_rest_of_its_host(
    master: tuple[MasterServer, Coordinator],
) -> None:
    server, coord = master
    with HostAgent(server.address, ranks=4, window=0.2, token=TOKEN) as agent:
        stubs = join(agent.address, 4)
        assert beat(stubs[2], "w2", 0).command == pb.CONTINUE  # alone: the other three never beat
        assert agent.batches == 1 and coord.series(2, "loss")[0] == [0]


def test_the_agent_takes_no_call_without_the_token(master: tuple[MasterServer, Coordinator]) -> None:
    server, _ = master
    with HostAgent(server.address, ranks=1, window=0.2, token=TOKEN) as agent:
        for token in (None, "wrong"):
            with pytest.raises(grpc.RpcError) as e:
                stub(agent.address, token).Register(
                    pb.RegisterRequest(worker_id="x", host="h"), timeout=DEADLINE
                )
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert server.budget.served[f"/{SERVICE_NAME}/Register"] == 0  # nothing reached the master


def test_a_master_that_takes_no_batches_gets_the_beats_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    async def unimplemented(self: object, request: object, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")

    monkeypatch.setattr("orch.master.server.OrchestratorServicer.SendHostHeartbeats", unimplemented)
    with (
        guarded_master(Coordinator(RunPlan(4), run_id="r")) as old,
        HostAgent(old.address, ranks=2, window=5.0, token=TOKEN) as agent,
    ):
        stubs = join(agent.address, 4)
        for step in range(2):
            replies = together([lambda i=i, step=step: beat(stubs[i], f"w{i}", step) for i in range(2)])
            assert all(isinstance(r, pb.HeartbeatResponse) for r in replies), replies
        assert old.budget.served[SINGLE] == 4 and agent.batches == 0


def orch_worker(address: str, fn: str, run_root: Path) -> list[str]:
    """`orch worker` running two ranks of ``fn`` (from tests/jobs.py) against ``address``."""
    return [
        ORCH,
        "worker",
        "--master",
        address,
        "--fn",
        fn,
        "--nproc-per-node",
        "2",
        "--run-root",
        str(run_root),
    ]


WORKER_ENV = dict(os.environ, ORCH_TOKEN=TOKEN, PYTHONPATH=str(TESTS), PYTHONUNBUFFERED="1")


def test_orch_worker_with_several_ranks_beats_through_its_agent(tmp_path: Path) -> None:
    """Real ranks (torch, gloo) under `orch worker --nproc-per-node 2`: the master sees only
    batched heartbeats, and every rank's points."""
    coord = Coordinator(RunPlan(2, config_json='{"steps": 40, "sleep": 0.02}'), run_id="agent-run")
    with guarded_master(coord) as server:
        done = subprocess.run(
            orch_worker(server.address, "jobs:allreduce_steps", tmp_path),
            env=WORKER_ENV,
            capture_output=True,
            text=True,
            timeout=200,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert coord.state is RunState.SUCCEEDED
        assert server.budget.served[BATCH] > 0 and server.budget.served[SINGLE] == 0
        for rank in range(2):
            assert coord.series(rank, "loss")[0] == list(range(40))


def test_a_rank_killed_alone_is_named_by_its_host_agent_at_once(tmp_path: Path) -> None:
    """The OOM killer takes one rank's pid: its peers' broken collectives report first, but
    the root cause is the dead rank, with its signal, reported by its host agent."""
    coord = Coordinator(RunPlan(2, config_json='{"sleep": 0.05}'), run_id="agent-kill")
    with guarded_master(coord) as server:
        worker = subprocess.Popen(
            orch_worker(server.address, "jobs:long_barriers", tmp_path),
            env=WORKER_ENV,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            until(lambda: len(coord.ranks) == 2 and all(r.step > 3 for r in coord.ranks), 120)
            victim = coord.ranks[0]
            os.kill(victim.pid, signal.SIGKILL)
            until(lambda: coord.state is RunState.FAILED, 30)
            # The peers' reports may come first; the agent's names the dead rank within the
            # judge's settle time, and nothing explains a failure better than a death.
            until(lambda: coord.root_cause is victim, 30)
            assert victim.exit_code == -signal.SIGKILL and victim.state is RankState.FAILED
            assert "signal SIGKILL (seen by its host agent" in coord.failure
            assert worker.wait(30) != 0
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

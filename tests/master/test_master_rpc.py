"""The master through a real gRPC server on a real socket: codes, health, reflection, ports."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from orch import PortInUseError
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.master.server import SERVICE_NAME, MasterServer
from orch.record.metrics_log import read_metrics
from orch.record.store import RunStore
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.client import MasterClient, StateMirror
from orch.wire.states import RunState

# The deadline of an RPC that is answered at once: generous, for a loaded 2-core machine.
RPC_DEADLINE = 30.0


@pytest.fixture
def stub(master: MasterServer) -> Iterator[pb_grpc.OrchestratorStub]:
    with grpc.insecure_channel(master.address) as channel:
        yield pb_grpc.OrchestratorStub(channel)


def code_of(call: object, request: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=RPC_DEADLINE)  # type: ignore[operator]
    return e.value.code()  # type: ignore[no-any-return]


def test_register_barrier_heartbeat_completion_over_the_wire(
    stub: pb_grpc.OrchestratorStub, coordinator: Coordinator
) -> None:
    r0 = stub.Register(
        pb.RegisterRequest(worker_id="a", host="h", pid=10, address="127.0.0.1", rendezvous_port=29501),
        timeout=RPC_DEADLINE,
    )
    assert (r0.rank, r0.world_size, r0.run_id) == (0, 2, "run-a")
    assert not stub.CanStartTraining(
        pb.CanStartTrainingRequest(run_id="run-a", worker_id="a"), timeout=RPC_DEADLINE
    ).ready
    r1 = stub.Register(pb.RegisterRequest(worker_id="b", host="h", pid=11), timeout=RPC_DEADLINE)
    assert r1.rank == 1
    go = stub.CanStartTraining(
        pb.CanStartTrainingRequest(run_id="run-a", worker_id="b"), timeout=RPC_DEADLINE
    )
    assert go.ready and go.master_port == 29501
    stub.CanStartTraining(pb.CanStartTrainingRequest(run_id="run-a", worker_id="a"), timeout=RPC_DEADLINE)
    hb = pb.HeartbeatRequest(
        run_id="run-a",
        worker_id="a",
        step=2,
        series=[pb.Series(name="loss", steps=[0, 1], values=[2.0, float("nan")])],
    )
    assert stub.SendHeartbeat(hb, timeout=RPC_DEADLINE).command == pb.CONTINUE
    for wid in ("a", "b"):
        stub.ReportCompletion(
            pb.CompletionRequest(run_id="run-a", worker_id=wid, outcome=pb.RANK_SUCCEEDED),
            timeout=RPC_DEADLINE,
        )
    assert coordinator.state is RunState.SUCCEEDED


def test_each_kind_of_bad_call_gets_its_status_code(stub: pb_grpc.OrchestratorStub) -> None:
    S = grpc.StatusCode
    assert code_of(stub.Register, pb.RegisterRequest(worker_id="")) == S.INVALID_ARGUMENT
    assert code_of(stub.SendHeartbeat, pb.HeartbeatRequest(worker_id="a")) == S.FAILED_PRECONDITION
    assert code_of(stub.Register, pb.RegisterRequest(worker_id="a", run_id="nope")) == S.FAILED_PRECONDITION
    stub.Register(pb.RegisterRequest(worker_id="a"), timeout=RPC_DEADLINE)
    assert code_of(stub.SendHeartbeat, pb.HeartbeatRequest(run_id="run-a", worker_id="ghost")) == S.NOT_FOUND
    assert (
        code_of(
            stub.ReportCompletion,
            pb.CompletionRequest(run_id="run-a", worker_id="ghost", outcome=pb.RANK_SUCCEEDED),
        )
        == S.NOT_FOUND
    )
    stub.Register(pb.RegisterRequest(worker_id="b"), timeout=RPC_DEADLINE)
    assert code_of(stub.Register, pb.RegisterRequest(worker_id="c")) == S.RESOURCE_EXHAUSTED
    assert code_of(stub.GetState, pb.GetStateRequest(cursor=b"\x0a\xff")) == S.INVALID_ARGUMENT
    assert code_of(stub.StopRun, pb.StopRunRequest(reason="x" * 5000)) == S.INVALID_ARGUMENT
    # the refusals changed nothing
    assert stub.GetState(pb.GetStateRequest(), timeout=RPC_DEADLINE).registered == 2


def test_client_mirror_and_stop(master: MasterServer, stub: pb_grpc.OrchestratorStub) -> None:
    with MasterClient(master.address) as client:
        client.wait_ready(timeout=RPC_DEADLINE)
        mirror = StateMirror().poll(client)
        assert (mirror.run_id, mirror.state, mirror.world_size) == ("run-a", RunState.PENDING, 2)
        assert client.stop_run("test") is RunState.STOPPED
        assert mirror.poll(client).state is RunState.STOPPED
        assert [e[1] for e in mirror.events][-2:] == ["stop_requested", "finished"]


def test_a_poll_carries_only_the_ranks_that_changed_and_the_mirror_keeps_the_others(
    master: MasterServer, stub: pb_grpc.OrchestratorStub
) -> None:
    # The fixture's run has 2 ranks; both run, then only rank 1 beats between two polls.
    for wid in ("a", "b"):
        stub.Register(
            pb.RegisterRequest(worker_id=wid, host="h", pid=1, rendezvous_port=29501), timeout=RPC_DEADLINE
        )
    for wid in ("a", "b", "a"):
        stub.CanStartTraining(pb.CanStartTrainingRequest(run_id="run-a", worker_id=wid), timeout=RPC_DEADLINE)

    def beat(wid: str, step: int) -> None:
        stub.SendHeartbeat(
            pb.HeartbeatRequest(run_id="run-a", worker_id=wid, step=step), timeout=RPC_DEADLINE
        )

    beat("a", 3)
    beat("b", 3)
    with MasterClient(master.address) as client:
        mirror = StateMirror().poll(client)
        assert [(r.rank, r.step) for r in mirror.ranks] == [(0, 3), (1, 3)]
        age_of_0 = mirror.ranks[0].heartbeat_age
        time.sleep(0.05)
        beat("b", 7)
        raw = client.get_state(mirror.cursor, changed_ranks=True)
        assert raw.ranks_changed_only and [(r.rank, r.step) for r in raw.ranks] == [(1, 7)]
        assert not client.get_state(mirror.cursor).ranks_changed_only  # not asked: every rank
        mirror.apply(raw)
        assert [(r.rank, r.step) for r in mirror.ranks] == [(0, 3), (1, 7)]
        # Rank 0, left out, aged by the master's clock between the two replies.
        assert mirror.ranks[0].heartbeat_age >= age_of_0 + 0.05
        whole = StateMirror().poll(client)
        assert [(r.rank, r.step, r.state, r.worker_id) for r in whole.ranks] == [
            (r.rank, r.step, r.state, r.worker_id) for r in mirror.ranks
        ]
        assert 0.0 <= whole.ranks[0].heartbeat_age - mirror.ranks[0].heartbeat_age < 2.0  # read later


def test_health_service_and_reflection(master: MasterServer) -> None:
    with grpc.insecure_channel(master.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_DEADLINE)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(
            refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=RPC_DEADLINE
            )
        )
        names = {s.name for s in replies[0].list_services_response.service}
        assert SERVICE_NAME in names and "grpc.health.v1.Health" in names


def test_a_named_port_that_is_taken_is_an_error_naming_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError) as e:
            MasterServer(Coordinator(RunPlan(1)), port=port).start()
        assert str(port) in str(e.value) and "--port" in str(e.value)


def test_a_second_master_cannot_share_the_first_ones_port(master: MasterServer) -> None:
    # gRPC's default SO_REUSEPORT would let two servers bind one port and split the traffic.
    with pytest.raises(PortInUseError):
        MasterServer(Coordinator(RunPlan(1)), port=master.port).start()


def test_default_port_falls_back_to_a_free_one_when_taken() -> None:
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("127.0.0.1", 50051))
        except OSError:
            pass  # something else already holds the default: the fallback is exercised either way
        else:
            holder.listen()
        server = MasterServer(Coordinator(RunPlan(1))).start()
        try:
            assert server.port != 50051 and server.port > 0
        finally:
            server.stop(grace=0.1)


def test_default_port_taken_between_the_look_and_the_bind_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two launches at the same moment both see the default port free; the one that binds
    # second must still serve (on any free port), as it would have had it looked later.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        monkeypatch.setattr("orch.master.server.choose_port", lambda *a, **k: taken)
        server = MasterServer(Coordinator(RunPlan(1)), host="127.0.0.1").start()
        try:
            assert server.port not in (taken, 0)
            client = MasterClient(server.address)
            client.wait_ready(5.0)  # it serves there
            client.close()
        finally:
            server.stop(grace=0.1)
        with pytest.raises(PortInUseError):  # a port the user named is never swapped
            MasterServer(Coordinator(RunPlan(1)), host="127.0.0.1", port=taken).start()


class _SlowStore(RunStore):
    """A run dir whose metrics log takes half a second per append (a slow disk)."""

    def append_metrics(self, payload: bytes) -> None:
        time.sleep(0.5)
        super().append_metrics(payload)


def _points_on_disk(run_dir: Path) -> list[tuple[str, list[int]]]:
    return [(s.name, list(s.steps)) for record in read_metrics(run_dir / "metrics.pb") for s in record.series]


@pytest.mark.parametrize("batched", [False, True], ids=["SendHeartbeat", "SendHostHeartbeats"])
def test_a_beat_is_answered_only_once_its_points_are_on_disk(tmp_path: Path, batched: bool) -> None:
    """The reply to a heartbeat says its points are safe: the run dir already holds them when
    it arrives, however slow the disk (an append that takes 0.5 s here)."""
    store = _SlowStore(tmp_path / "run")
    coord = Coordinator(RunPlan(1), run_id="r", store=store)
    try:
        with MasterServer(coord, port=0) as server, grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.OrchestratorStub(channel)
            stub.Register(pb.RegisterRequest(worker_id="w", rendezvous_port=1), timeout=RPC_DEADLINE)
            assert stub.CanStartTraining(
                pb.CanStartTrainingRequest(run_id="r", worker_id="w"), timeout=RPC_DEADLINE
            ).ready
            beat = pb.HeartbeatRequest(
                run_id="r",
                worker_id="w",
                step=3,
                series=[pb.Series(name="loss", steps=[0, 1, 2], values=[3, 2, 1])],
            )
            if batched:
                reply = stub.SendHostHeartbeats(pb.HostHeartbeatsRequest(beats=[beat]), timeout=RPC_DEADLINE)
                assert reply.replies[0].reply.command == pb.CONTINUE
            else:
                assert stub.SendHeartbeat(beat, timeout=RPC_DEADLINE).command == pb.CONTINUE
            assert _points_on_disk(tmp_path / "run") == [("loss", [0, 1, 2])]
    finally:
        store.close()

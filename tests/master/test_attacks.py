"""Strangers and careless token holders against a live master: what they cost it, and what it refuses.

All traffic goes to 127.0.0.1, bounded in count and time. The attacker runs in a process of its
own (``attack`` below), so the test process's RSS is the master's (``orch.launch`` serves it
in-process) plus one polling client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

import orch
from conftest import TESTS, TOKEN
from orch.master.control.events import MAX_EVENTS_IN_MEMORY
from orch.master.control.plan import RunPlan
from orch.master.control.series import MAX_POINTS_IN_MEMORY
from orch.master.coordinator import Coordinator
from orch.master.server import MAX_MESSAGE_BYTES, SERVICE_NAME, MasterServer
from orch.views.waiting import wait_for
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.auth import MAX_AUTH_HEADER_BYTES, open_channel
from orch.wire.states import RunState

sys.path.insert(0, str(TESTS))
pytestmark = pytest.mark.timeout(400)

RPC_DEADLINE = 30.0  # for a call answered at once, on a loaded 2-core machine
HEARTBEAT = f"/{SERVICE_NAME}/SendHeartbeat"
METHODS = ("Register", "CanStartTraining", "SendHeartbeat", "ReportCompletion", "GetState", "StopRun")

# The attack: strangers (no token) hold calls open without a body, and send 8 MiB bodies in a loop.
IDLE_CALLS = 6000
BIG_CALLERS = 40
BIG_BODY = 8 * 2**20
ATTACK_SECONDS = 15.0
GROWTH_BOUND_MIB = 100  # how much the master may grow under it (before the fix: ~4 GB)


class Silent:
    """A request stream that sends nothing until ``release`` is set: the call's body never comes."""

    def __init__(self, release: asyncio.Event) -> None:
        self.release = release

    def __aiter__(self) -> Silent:
        return self

    async def __anext__(self) -> bytes:
        await self.release.wait()
        raise StopAsyncIteration


def attack(address: str, seconds: float, idle_calls: int, big_callers: int) -> None:
    """Run the strangers' attack for ``seconds`` and print what it saw, as JSON (the child's job)."""
    print(json.dumps(asyncio.run(_attack(address, seconds, idle_calls, big_callers))), flush=True)


async def _attack(address: str, seconds: float, idle_calls: int, big_callers: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    options = [("grpc.max_send_message_length", 16 * 2**20)]
    channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(8)]
    release = asyncio.Event()
    seen: Counter[str] = Counter()

    async def idle(call: Any) -> None:
        try:
            async for _ in call:
                pass
            seen["idle_OK"] += 1
        except grpc.aio.AioRpcError as e:
            seen[f"idle_{e.code().name}"] += 1
        except asyncio.CancelledError:
            seen["idle_cancelled"] += 1

    calls = [
        channels[i % len(channels)].stream_stream(HEARTBEAT)(Silent(release))  # type: ignore[arg-type]
        for i in range(idle_calls)
    ]
    idle_tasks = [asyncio.create_task(idle(c)) for c in calls]
    body = b"\0" * BIG_BODY
    deadline = loop.time() + seconds

    async def big(i: int) -> None:
        send = channels[i % len(channels)].unary_unary(HEARTBEAT)
        while loop.time() < deadline:
            try:
                await send(body, timeout=10)
                seen["big_OK"] += 1
            except grpc.aio.AioRpcError as e:
                seen[f"big_{e.code().name}"] += 1

    await asyncio.gather(*(big(i) for i in range(big_callers)))
    still_open = sum(not t.done() for t in idle_tasks)
    release.set()
    for c in calls:
        c.cancel()
    await asyncio.wait_for(asyncio.gather(*idle_tasks), 30)
    for ch in channels:
        await ch.close()
    return {"seen": dict(seen), "idle_still_open": still_open}


def _poll_until_trained(client: orch.MasterClient, world: int) -> orch.StateMirror:
    deadline = time.monotonic() + 120  # generous: workers start on a loaded 2-core machine
    while True:
        state = orch.StateMirror().poll(client, skip_series=True)
        if len(state.ranks) == world and all(r.step > 0 for r in state.ranks):
            return state
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.2)


def test_strangers_cost_the_master_nothing(tmp_path: Path) -> None:
    with (
        orch.launch(
            "jobs:allreduce_steps",
            world_size=2,
            run_root=str(tmp_path),
            config={"steps": 1_000_000, "sleep": 0.01},
        ) as run,
        orch.MasterClient(run.address, token=run.token, timeout=RPC_DEADLINE) as client,
    ):
        before = _poll_until_trained(client, 2)
        me = psutil.Process()
        baseline = me.memory_info().rss
        peak = baseline
        here = str(Path(__file__).resolve().parent)  # test_attacks itself is the attacker
        path = os.pathsep.join([here, str(TESTS), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path}
        attacker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import test_attacks; test_attacks.attack({run.address!r}, {ATTACK_SECONDS}, "
                f"{IDLE_CALLS}, {BIG_CALLERS})",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        polls, failed, oldest_beat, states = 0, [], 0.0, set()
        steps_seen = [before.ranks[0].step]
        try:
            # The panel's part: an authenticated client polls throughout.
            deadline = time.monotonic() + ATTACK_SECONDS + 120
            while attacker.poll() is None and time.monotonic() < deadline:
                try:
                    mirror = orch.StateMirror().poll(client, skip_series=True)
                except orch.OrchError as e:
                    failed.append(str(e))
                else:
                    polls += 1
                    states.add(mirror.state)
                    steps_seen.append(min(r.step for r in mirror.ranks))
                    oldest_beat = max(oldest_beat, *(r.heartbeat_age for r in mirror.ranks))
                peak = max(peak, me.memory_info().rss)
                time.sleep(0.5)
            out, err = attacker.communicate(timeout=120)
        finally:
            if attacker.poll() is None:
                attacker.kill()
                attacker.communicate()
        after = orch.StateMirror().poll(client, skip_series=True)
        peak = max(peak, me.memory_info().rss)
        assert attacker.returncode == 0, err[-3000:]
        report = json.loads(out.strip().splitlines()[-1])
        seen = report["seen"]
        grown = (peak - baseline) / 2**20
        print(
            f"\nattack: {seen}, idle calls still open at its end: {report['idle_still_open']}; "
            f"{polls} GetState polls served, {len(failed)} failed; oldest heartbeat {oldest_beat:.2f}s; "
            f"slowest rank's step {before.ranks[0].step} -> {min(r.step for r in after.ranks)}; "
            f"master RSS {baseline / 2**20:.0f} MiB -> peak {peak / 2**20:.0f} MiB (+{grown:.0f} MiB)"
        )
        # Every stranger was refused on its headers: no idle call was held, no body let through.
        # (grpc refuses some idle calls itself, CANCELLED, when more arrive at once than it queues.)
        assert report["idle_still_open"] == 0 and "idle_OK" not in seen
        assert seen.get("idle_UNAUTHENTICATED", 0) + seen.get("idle_CANCELLED", 0) == IDLE_CALLS
        assert seen.get("idle_UNAUTHENTICATED", 0) > IDLE_CALLS // 2
        assert seen.get("big_UNAUTHENTICATED", 0) >= BIG_CALLERS and "big_OK" not in seen
        # The run trained on, its heartbeats and the panel's polls were served.
        assert not failed, failed[:3]
        assert polls >= 5 and states == {RunState.RUNNING}, states
        assert after.state is RunState.RUNNING and all(r.state.value == "RUNNING" for r in after.ranks)
        assert min(r.step for r in after.ranks) > before.ranks[0].step
        assert steps_seen[-1] > steps_seen[len(steps_seen) // 2] > steps_seen[0]  # rising throughout
        assert oldest_beat < 15.0  # the run's heartbeat timeout is 30 s
        assert grown < GROWTH_BOUND_MIB, f"the master grew by {grown:.0f} MiB under the attack"
        run.stop()
        assert run.wait(timeout=60).state is RunState.STOPPED


# -- a token holder's floods stay within the master's budgets --------------------------------------


def _start_two_ranks(stub: pb_grpc.OrchestratorStub) -> None:
    for wid in ("w0", "w1"):
        stub.Register(
            pb.RegisterRequest(worker_id=wid, host="h", rendezvous_port=29500), timeout=RPC_DEADLINE
        )
    for wid in ("w0", "w1"):
        assert stub.CanStartTraining(
            pb.CanStartTrainingRequest(run_id="r", worker_id=wid), timeout=RPC_DEADLINE
        ).ready


def test_repeated_stops_and_a_flood_of_points_stay_within_the_budgets(
    guarded: tuple[MasterServer, Coordinator],
) -> None:
    server, coord = guarded
    with open_channel(server.address, token=TOKEN) as channel:
        stub = pb_grpc.OrchestratorStub(channel)
        _start_two_ranks(stub)
        n = 50_000
        for chunk in range(30):  # 1.5M points under rank 0's name: past the master's budget
            steps = list(range(chunk * n, (chunk + 1) * n))
            stub.SendHeartbeat(
                pb.HeartbeatRequest(
                    run_id="r",
                    worker_id="w0",
                    step=steps[-1],
                    series=[pb.Series(name="flood", steps=steps, values=[1.0] * n)],
                ),
                timeout=RPC_DEADLINE,
            )
            if chunk % 10 == 0:
                stub.SendHeartbeat(
                    pb.HeartbeatRequest(
                        run_id="r",
                        worker_id="w1",
                        step=chunk,
                        series=[pb.Series(name="loss", steps=[chunk], values=[0.5])],
                    ),
                    timeout=RPC_DEADLINE,
                )
        stops = 3000
        for i in range(stops):
            assert (
                stub.StopRun(pb.StopRunRequest(reason=f"stop {i}"), timeout=RPC_DEADLINE).state == pb.STOPPING
            )
        full = stub.GetState(pb.GetStateRequest(), timeout=RPC_DEADLINE)
        with orch.MasterClient(server.address, token=TOKEN, timeout=RPC_DEADLINE) as client:
            mirror = orch.StateMirror().poll(client)
    print(
        f"\nbudgets: {coord.points.points_in_memory:,} points in memory of 1.5M logged (budget "
        f"{MAX_POINTS_IN_MEMORY:,}); {len(coord.events)} events after {coord.stop_requests} stop "
        f"requests; a full GetState reply {full.ByteSize() / 2**20:.1f} MiB"
    )
    assert coord.points.points_in_memory <= MAX_POINTS_IN_MEMORY
    assert coord.stop_requests == stops and len(coord.events) <= MAX_EVENTS_IN_MEMORY
    assert [e.kind for e in coord.events].count("stop_requested") == 1
    assert full.ByteSize() < MAX_MESSAGE_BYTES and full.more  # the rest of the points in later replies
    assert mirror.series[(1, "loss")].steps.tolist() == [0, 10, 20]  # the small series kept whole
    flood = mirror.series[(0, "flood")].steps
    assert flood[-1] == 30 * n - 1 and len(flood) <= MAX_POINTS_IN_MEMORY
    assert mirror.state is RunState.STOPPING


def test_each_method_has_its_own_budget_and_a_silent_call_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orch.master.server.REQUEST_READ_TIMEOUT", 3.0)
    coord = Coordinator(RunPlan(2), run_id="r")
    limits = {f"/{SERVICE_NAME}/GetState": 4, HEARTBEAT: 64}
    server = MasterServer(coord, port=0, token=TOKEN, call_limits=limits).start()
    try:
        with open_channel(server.address, token=TOKEN) as channel:
            _start_two_ranks(pb_grpc.OrchestratorStub(channel))
        codes = asyncio.run(_hold_get_state_calls(server.address, 10))
        print(f"\nbudgets: {dict(codes)}; refused {dict(server.budget.refused)}")
        # Four silent GetState calls took the method's slots; the others were refused at once;
        # heartbeats went on being served; the silent ones were cut off after the read timeout.
        assert codes["RESOURCE_EXHAUSTED"] == 6 and codes["DEADLINE_EXCEEDED"] == 4, codes
        assert codes["heartbeat_OK"] == 20
        # A call's slot is given back as its handler ends, just after the client saw its status.
        assert wait_for(lambda: sum(server.budget.in_flight.values()) == 0, 10), server.budget.in_flight
    finally:
        server.stop(grace=0.1)


async def _hold_get_state_calls(address: str, n: int) -> Counter[str]:
    codes: Counter[str] = Counter()
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    release = asyncio.Event()

    async with grpc.aio.insecure_channel(address) as channel:

        async def held() -> None:
            call = channel.stream_stream(f"/{SERVICE_NAME}/GetState")(Silent(release), metadata=metadata)  # type: ignore[arg-type]
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as e:
                codes[e.code().name] += 1

        tasks = [asyncio.create_task(held())]
        await asyncio.sleep(0.5)
        tasks += [asyncio.create_task(held()) for _ in range(n - 1)]
        stub = pb_grpc.OrchestratorStub(channel)
        for i in range(20):
            await stub.SendHeartbeat(
                pb.HeartbeatRequest(run_id="r", worker_id=f"w{i % 2}", step=i),
                metadata=metadata,
                timeout=RPC_DEADLINE,
            )
            codes["heartbeat_OK"] += 1
        await asyncio.wait_for(asyncio.gather(*tasks), RPC_DEADLINE)
        release.set()
    return codes


# -- malformed input -------------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [b"\x0a\x05ab", b"\xff\xff\xff\xff", b"\x0a\x80\x80\x80\x80\x80\x80"])
def test_malformed_bytes_are_invalid_argument_with_one_log_line(
    guarded: tuple[MasterServer, Coordinator], garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    server, coord = guarded
    caplog.set_level(logging.INFO)
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(server.address) as channel:
        for method in METHODS:
            with pytest.raises(grpc.RpcError) as e:
                channel.unary_unary(f"/{SERVICE_NAME}/{method}")(
                    garbage, metadata=metadata, timeout=RPC_DEADLINE
                )
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (method, e.value.details())
            assert "do not parse" in e.value.details()
        # The health check needs no token, and is held to the same rule.
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary("/grpc.health.v1.Health/Check")(garbage, timeout=RPC_DEADLINE)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    refusals = [r for r in caplog.records if "does not parse" in r.getMessage()]
    assert len(refusals) == len(METHODS) + 1
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert coord.ranks == [] and coord.state is RunState.PENDING


# -- tokens of any length ---------------------------------------------------------------------------


def test_a_600_character_token_works_end_to_end(tmp_path: Path) -> None:
    token = "k" * 599 + "!"
    with orch.launch(
        "jobs:allreduce_steps", world_size=2, run_root=str(tmp_path), config={"steps": 20}, token=token
    ) as run:
        assert run.token == token
        assert run.wait(timeout=120).state is RunState.SUCCEEDED  # the workers used it on every call
        attached = orch.attach(run.address, token=token)
        assert attached.state().state is RunState.SUCCEEDED
        attached.close()
        for wrong in ("k" * 600, token + "x", token[:512]):
            with orch.MasterClient(run.address, token=wrong) as client, pytest.raises(orch.AuthError):
                client.get_state()


def test_an_absurd_authorization_header_is_refused_cheaply(guarded: tuple[MasterServer, Coordinator]) -> None:
    server, _ = guarded
    long_token = "t" * 20_000
    coord = Coordinator(RunPlan(1), run_id="long")
    other = MasterServer(coord, port=0, token=long_token).start()
    try:
        with orch.MasterClient(other.address, token=long_token) as client:
            assert client.get_state().run_id == "long"  # 20,000 characters: still a token
    finally:
        other.stop(grace=0.1)
    with grpc.insecure_channel(server.address) as channel:
        for size in (MAX_AUTH_HEADER_BYTES + 1, 70_000):
            metadata = (("authorization", "Bearer " + "x" * size),)
            with pytest.raises(grpc.RpcError) as e:
                channel.unary_unary(f"/{SERVICE_NAME}/GetState")(b"", metadata=metadata, timeout=RPC_DEADLINE)
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED, e.value.details()


def test_budget_constants_are_what_the_security_page_states() -> None:
    security = (TESTS.parent / "docs" / "security.md").read_text()
    assert f"{MAX_POINTS_IN_MEMORY:,}" in security
    assert f"{MAX_EVENTS_IN_MEMORY:,}" in security


def test_connections_left_idle_are_closed_by_the_master() -> None:
    """A stranger who opens connections, completes the HTTP/2 handshake and then sends nothing
    holds them only until the idle limit: the master closes them (GOAWAY), so they cannot pile
    up to its open-file limit; a client that calls again reconnects by itself."""
    coord = Coordinator(RunPlan(1), run_id="idle")
    with MasterServer(coord, token=TOKEN, idle_timeout=1.0) as server:
        port = server.port
        channels = [
            grpc.insecure_channel(server.address, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(40)
        ]
        try:
            for ch in channels:
                grpc.channel_ready_future(ch).result(timeout=10)  # the handshake done, no call

            def held() -> int:
                return sum(
                    1
                    for c in psutil.Process().net_connections("tcp")
                    if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
                )

            assert held() == 40
            assert wait_for(lambda: held() == 0, 15), held()
            # A caller that comes back is served: its channel reconnects.
            stub = channels[0].unary_unary(
                f"/{SERVICE_NAME}/GetState",
                request_serializer=pb.GetStateRequest.SerializeToString,
                response_deserializer=pb.GetStateResponse.FromString,
            )
            reply = stub(pb.GetStateRequest(), timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),))
            assert reply.run_id == "idle"
        finally:
            for ch in channels:
                ch.close()

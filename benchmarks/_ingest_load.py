"""The load of ``master_ingest.py``, in processes of its own: host agents and panels.

``python benchmarks/_ingest_load.py agents SPEC`` plays the host agents of some hosts as
``orch worker --nproc-per-node K`` runs them (orch/runtime/agent.py, _host_attempts.py):
each host on its own TCP connection (``grpc.use_local_subchannel_pool``), a first
``SyncHost`` (attempt 0, not running), then one ``SendHostHeartbeats`` call per host every
heartbeat interval carrying a fresh heartbeat of each of its ranks (steps that advance, the
points logged since the last beat, a ``StepTiming`` with sections, the process's
``ProcessStats``), one call in flight per host as the agent's flush loop does, and a
``SyncHost`` (its attempt, its worker ids, running) every second beside it. With one rank per
host it plays ranks that beat directly (``SendHeartbeat``, no agent, no SyncHost), as the
ranks of ``orch.launch`` do.

``python benchmarks/_ingest_load.py panels SPEC`` plays notebook panels: each polls
incrementally (``GetState`` with the cursor of its last reply, paged while ``more``) every
``interval`` seconds, and does a full catch-up (``GetState`` from an empty cursor, paged)
every ``catchup_every`` seconds; ``catchup_every`` 0 with ``back_to_back`` does nothing but
full catch-ups.

Both print ``ready`` once connected, wait for ``go T0`` on stdin (``T0`` on the monotonic
clock, shared by every process of the machine), run the schedule the spec gives and print
one JSON line of what they saw. Every call sent in the measured window is followed to its
end (the load goes on past the window until its deadline passed), so a call still in
flight at the window's end counts as served only if it is answered within its deadline.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import threading
import time
from typing import Any

import grpc
import psutil

from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc

SERVICE = "/orch.v1.Orchestrator/"
OWN_CONNECTION = [
    ("grpc.use_local_subchannel_pool", 1),  # otherwise identical channels share one connection
    ("grpc.max_receive_message_length", 64 << 20),
]
SYNC_INTERVAL = 1.0  # orch/runtime/_host_attempts.py SYNC_INTERVAL
SYNC_TIMEOUT = 5.0  # HostAgent.sync_host's default deadline
PANEL_TIMEOUT = 5.0  # MasterClient's default deadline
CHANGED_RANKS = "changed_ranks" in pb.GetStateRequest.DESCRIPTOR.fields_by_name


def _cpu() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


def _handshake() -> float:
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        raise SystemExit(f"expected 'go T0', got {line!r}")
    return float(line[1])


# -- host agents ------------------------------------------------------------------------------
class Rank:
    """One simulated rank: its steps advance, and its timing has sections."""

    def __init__(self, run_id: str, worker_id: str, metric: str, rng: random.Random) -> None:
        self.run_id, self.worker_id, self.metric = run_id, worker_id, metric
        self.step = 0
        # A rank's own pace (ms per step), so the straggler judgement has something to judge.
        self.step_ms = 50.0 * rng.uniform(0.95, 1.05)
        self.rss = rng.randrange(2 << 30, 3 << 30)
        self.rng = rng

    def beat(self, points: int, now: float) -> pb.HeartbeatRequest:
        first = self.step
        self.step += points
        s = self.step_ms / 1e3 * points
        jitter = self.rng.uniform(0.98, 1.02)
        return pb.HeartbeatRequest(
            run_id=self.run_id,
            worker_id=self.worker_id,
            step=self.step,
            total_steps=10**7,
            series=[
                pb.Series(
                    name=self.metric,
                    steps=range(first, self.step),
                    values=[1.0 / (1 + i) for i in range(first, self.step)],
                    times=[now] * points,
                )
            ],
            timing=pb.StepTiming(
                steps=points,
                step_seconds=s * jitter,
                data_seconds=s * 0.05,
                collective_seconds=s * 0.2,
                other_seconds=s * 0.01,
                sections={"forward": s * 0.3 * jitter, "backward": s * 0.4 * jitter, "optimizer": s * 0.04},
                collectives=True,
            ),
            process=pb.ProcessStats(
                rss_bytes=self.rss,
                cpu_percent=99.0,
                memory_limit=64 << 30,
                limit_kind="machine",
                limit_used=32 << 30,
            ),
        )


class Tally:
    """What one generator saw of the calls sent in the measured window."""

    def __init__(self, seconds: int) -> None:
        self.t_measure = math.inf  # set at the go
        self.latencies: list[float] = []  # per call sent in the window; not served: inf
        self.offered = [0] * seconds  # beats the schedule called for, per second of the window
        self.served = [0] * seconds  # ... of them answered OK within the deadline
        self.codes: dict[str, int] = {}
        self.sync_latencies: list[float] = []
        self.sync_failed = 0

    def second(self, slot: float) -> int | None:
        k = math.floor(slot - self.t_measure)
        return k if 0 <= k < len(self.offered) else None

    def count(self, code: str, n: int = 1) -> None:
        self.codes[code] = self.codes.get(code, 0) + n


async def _host(
    spec: dict[str, Any],
    index: int,
    worker_ids: list[str],
    tally: Tally,
    go: asyncio.Future[float],
    ready: asyncio.Event,
) -> None:
    """One host: connect (and the agent's first SyncHost), say ready, wait for the go, beat."""
    loop = asyncio.get_running_loop()
    period, deadline, points = 1.0 / spec["rate"], spec["deadline"], spec["points"]
    meta = (("authorization", f"Bearer {spec['token']}"),)
    rng = random.Random(index)
    ranks = [Rank(spec["run_id"], w, spec["metric"], rng) for w in worker_ids]
    for r in ranks:
        r.step = spec["first_step"]  # past a preloaded history: steps only advance
    agent = spec["agent"]
    host = f"sim{index}:{1000 + index}"
    async with grpc.aio.insecure_channel(spec["address"], options=OWN_CONNECTION) as ch:
        sync = ch.unary_unary(
            SERVICE + "SyncHost",
            request_serializer=pb.HostSyncRequest.SerializeToString,
            response_deserializer=pb.HostSyncResponse.FromString,
        )
        if agent:
            call = ch.unary_unary(
                SERVICE + "SendHostHeartbeats",
                request_serializer=pb.HostHeartbeatsRequest.SerializeToString,
                response_deserializer=pb.HostHeartbeatsResponse.FromString,
            )
        else:
            call = ch.unary_unary(
                SERVICE + "SendHeartbeat",
                request_serializer=pb.HeartbeatRequest.SerializeToString,
                response_deserializer=pb.HeartbeatResponse.FromString,
            )
        attempt = 0
        if agent:
            first = await sync(
                pb.HostSyncRequest(host=host, attempt=0, running=False), timeout=60, metadata=meta
            )
            attempt = first.attempt
        else:
            await ch.channel_ready()
        ready.set()
        t0 = await go
        t_start, t_end = t0 + spec["warmup"], t0 + spec["warmup"] + spec["seconds"]
        t_stop = t_end + deadline + 0.25  # the load goes on while the window's last calls may run

        async def syncing() -> None:
            at = t0 + rng.uniform(0, SYNC_INTERVAL)
            req = pb.HostSyncRequest(host=host, attempt=attempt, worker_ids=worker_ids, running=True)
            while True:
                await asyncio.sleep(max(0.0, at - loop.time()))
                if at >= t_stop:
                    return
                sent = loop.time()
                try:
                    answer = await sync(req, timeout=SYNC_TIMEOUT, metadata=meta)
                    ok = True
                except grpc.aio.AioRpcError:
                    ok, answer = False, None
                if t_start <= at < t_end:
                    tally.sync_latencies.append(loop.time() - sent if ok else math.inf)
                    tally.sync_failed += not ok
                # The agent's sync thread waits SYNC_INTERVAL after each answer, or what the
                # master asks for in it (it spaces syncs out as hosts grow).
                asked = answer.interval if answer is not None else 0.0
                at = loop.time() + max(SYNC_INTERVAL, asked)

        sync_task = asyncio.create_task(syncing()) if agent else None
        slot = t0 + rng.uniform(0, period)
        while True:
            now = loop.time()
            if slot > now:
                await asyncio.sleep(slot - now)
                now = loop.time()
            # Slots that passed while the last call was in flight: the ranks' beats waited (the
            # agent sends one call at a time), so those beats were not served on time.
            while slot + period <= now:
                k = tally.second(slot)
                if k is not None:
                    tally.offered[k] += len(ranks)
                    tally.count("skipped: the previous call still in flight", len(ranks))
                    tally.latencies.append(math.inf)
                slot += period
            if slot >= t_stop:
                break
            wall = time.time()
            beats = [r.beat(points, wall) for r in ranks]
            request: Any = pb.HostHeartbeatsRequest(beats=beats) if agent else beats[0]
            k = tally.second(slot)
            slot += period
            sent = loop.time()
            ok_beats, code = 0, ""
            try:
                reply = await call(request, timeout=deadline, metadata=meta)
            except grpc.aio.AioRpcError as e:
                code = e.code().name
            else:
                if agent:
                    refused = [b.code for b in reply.replies if b.code]
                    ok_beats = len(reply.replies) - len(refused)
                    if k is not None:
                        for c in refused:
                            tally.count(f"beat refused (status {c})")
                        if len(reply.replies) < len(ranks):
                            tally.count("beats left unanswered", len(ranks) - len(reply.replies))
                else:
                    ok_beats = 1
                # The ranks beat as often as the master asks in its replies (it spaces beats out
                # as callers grow), never more often than their own interval.
                answers = [b.reply for b in reply.replies if not b.code] if agent else [reply]
                asked = max((a.interval for a in answers), default=0.0)
                period = max(1.0 / spec["rate"], asked)
            took = loop.time() - sent
            if k is None:
                continue
            tally.offered[k] += len(ranks)
            if code:
                tally.count(code)
                tally.latencies.append(math.inf)
            elif took > deadline:
                tally.count("answered past the deadline")
                tally.latencies.append(math.inf)
            else:
                tally.served[k] += ok_beats
                tally.latencies.append(took if ok_beats == len(ranks) else math.inf)
        if sync_task is not None:
            await sync_task


def _finite(xs: list[float]) -> list[float | None]:
    return [x if math.isfinite(x) else None for x in xs]


async def _agents(spec: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    per = spec["per_host"]
    hosts = [[f"w{(spec['first_index'] + i) * per + k}" for k in range(per)] for i in range(spec["count"])]
    tally = Tally(int(spec["seconds"]))
    readies = [asyncio.Event() for _ in hosts]
    go: asyncio.Future[float] = loop.create_future()
    sem = asyncio.Semaphore(32)  # connect a few at a time

    async def one(i: int, ids: list[str]) -> None:
        ready = readies[i]
        async with sem:
            connected = asyncio.create_task(ready.wait())
            runner = asyncio.create_task(_host(spec, spec["first_index"] + i, ids, tally, go, ready))
            await asyncio.wait([connected, runner], return_when=asyncio.FIRST_COMPLETED)
        await runner

    tasks = [asyncio.create_task(one(i, ids)) for i, ids in enumerate(hosts)]
    all_ready: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(r.wait() for r in readies)))
    while not all_ready.done():
        waiting: list[asyncio.Future[Any]] = [all_ready, *tasks]
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not all_ready:
                t.result()  # a host that ended before the go failed: raise its error
    t0 = await asyncio.to_thread(_handshake)
    tally.t_measure = t0 + spec["warmup"]
    go.set_result(t0)
    await asyncio.sleep(max(0.0, tally.t_measure - loop.time()))
    c0, w0 = _cpu(), time.monotonic()
    await asyncio.sleep(max(0.0, tally.t_measure + spec["seconds"] - loop.time()))
    cpu = (_cpu() - c0) / (time.monotonic() - w0)
    await asyncio.gather(*tasks)
    return {
        "latencies": _finite(tally.latencies),
        "offered": tally.offered,
        "served": tally.served,
        "codes": tally.codes,
        "sync_latencies": _finite(tally.sync_latencies),
        "sync_failed": tally.sync_failed,
        "cpu": cpu,
    }


# -- panels -----------------------------------------------------------------------------------
class Panel(threading.Thread):
    """One notebook panel: incremental polls, and full catch-ups, on its own connection."""

    def __init__(self, spec: dict[str, Any], conf: dict[str, Any], t0: list[float]) -> None:
        super().__init__(daemon=True)
        self.spec, self.conf, self.t0 = spec, conf, t0
        channel = grpc.insecure_channel(spec["address"], options=OWN_CONNECTION)
        self.stub = pb_grpc.OrchestratorStub(channel)
        self.meta = (("authorization", f"Bearer {spec['token']}"),)
        grpc.channel_ready_future(channel).result(timeout=30)
        self.polls: list[float] = []  # seconds per incremental poll (all its pages), in the window
        self.catchups: list[float] = []  # seconds per full catch-up, in the window
        self.catchup_points: list[int] = []
        self.failed: dict[str, int] = {}
        self.last: pb.GetStateResponse | None = None
        self.cursor = b""

    def _fetch(self, cursor: bytes) -> tuple[bytes, int]:
        points, more = 0, True
        while more:
            # As orch's panel asks (StateMirror.poll): only the ranks that changed since its cursor
            # (where the orch measured knows the field: a side-by-side run against an older one).
            request = pb.GetStateRequest(cursor=cursor)
            if CHANGED_RANKS:
                request.changed_ranks = True
            reply = self.stub.GetState(request, timeout=PANEL_TIMEOUT, metadata=self.meta)
            cursor, more = reply.cursor, reply.more
            points += sum(len(s.steps) for s in reply.series)
            self.last = reply
        return cursor, points

    def run(self) -> None:
        t0 = self.t0[0]
        start, end = t0 + self.spec["warmup"], t0 + self.spec["warmup"] + self.spec["seconds"]
        stop = end + self.spec["deadline"] + 0.25
        interval, every = self.conf["interval"], self.conf["catchup_every"]
        back_to_back = self.conf["back_to_back"]
        next_poll, next_catchup = t0, t0 + (every or 0)
        while time.monotonic() < stop:
            now = time.monotonic()
            catchup = back_to_back or (every and now >= next_catchup)
            try:
                if catchup:
                    _, got = self._fetch(b"")
                    if start <= now < end:
                        self.catchups.append(time.monotonic() - now)
                        self.catchup_points.append(got)
                    next_catchup = now + every if every else now
                else:
                    self.cursor, _ = self._fetch(self.cursor)
                    if start <= now < end:
                        self.polls.append(time.monotonic() - now)
                    next_poll = max(next_poll + interval, time.monotonic())
            except grpc.RpcError as e:
                code = e.code().name
                self.failed[code] = self.failed.get(code, 0) + 1
                next_poll = time.monotonic() + interval
            if not back_to_back:
                wake = min(next_poll, next_catchup) if every else next_poll
                time.sleep(max(0.0, wake - time.monotonic()))

    def figures(self) -> dict[str, Any]:
        ranks = list(self.last.ranks) if self.last is not None else []
        return {
            "polls": self.polls,
            "catchups": self.catchups,
            "catchup_points": self.catchup_points,
            "failed": self.failed,
            # What the master made of the load: the ranks' pace and the straggler judgement.
            "steps_per_sec": sorted(r.steps_per_sec for r in ranks)[len(ranks) // 2] if ranks else 0.0,
            "timed_ranks": sum(1 for r in ranks if r.timed),
            "stragglers_judged": bool(self.last and self.last.stragglers_judged),
            "straggler_note": self.last.straggler_note if self.last is not None else "",
        }


def _panels(spec: dict[str, Any]) -> dict[str, Any]:
    t0: list[float] = []
    panels = [Panel(spec, conf, t0) for conf in spec["panels"]]
    t0.append(_handshake())
    for p in panels:
        p.start()
    start = t0[0] + spec["warmup"]
    time.sleep(max(0.0, start - time.monotonic()))
    c0, w0 = _cpu(), time.monotonic()
    time.sleep(max(0.0, start + spec["seconds"] - time.monotonic()))
    cpu = (_cpu() - c0) / (time.monotonic() - w0)
    for p in panels:
        p.join()
    return {"panels": [p.figures() for p in panels], "cpu": cpu}


def main() -> None:
    role, spec = sys.argv[1], json.loads(sys.argv[2])
    out = asyncio.run(_agents(spec)) if role == "agents" else _panels(spec)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

"""The master under load: heartbeat ingest rate and latency with simulated workers.

Each case starts a real master in its own process (``python -m orch.cli master
--world-size N --port 0 --no-dashboard --heartbeat-timeout 600 --linger 0``, metrics log
and all) and drives it from this process: N simulated workers (no torch) register
(the first with rendezvous_port=1, so the barrier opens), pass the start barrier, then
send heartbeats over plain gRPC (grpc.aio; requests serialised once up front, so the
client spends its CPU on the RPCs, not on building messages). The cases:

- throughput: 4 workers, each sending heartbeats of 1000 points back to back (one in
  flight per worker, as the real sender does) for ``--seconds``: points/s and RPCs/s;
- host agents (case 1): 1,024 ranks as 128 hosts x 8, each host sending one SendHostHeartbeats
  call of its 8 ranks' heartbeats (5 points each) 4 times a second (the default heartbeat
  interval, 0.25 s), as ``orch worker --nproc-per-node 8`` does, while a panel client in another
  process does a full catch-up (GetState from an empty cursor, paged) every 2 s;
- single ranks (case 2): 256 and 1,024 single-rank hosts, each sending 4 heartbeats/s of 5
  points on a fixed schedule (one in flight; a late reply delays the next send): p50/p99
  latency and the rate actually achieved, after a 1 s warm-up;
- catch-up (case 3): 8 workers with 4 metrics of 200k points each, sending 10 heartbeats/s,
  while a panel client in another process fetches the whole history again and again:
  heartbeat p50/p99 while the master builds those replies.

The master's and the client's CPU use over each case tell which side saturated. The
master process is killed at the end of each case.

    .venv/bin/python benchmarks/master_ingest.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/master_ingest.py --quick    # tiny, prints only
"""

from __future__ import annotations

import asyncio
import re
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as c
import grpc
import psutil

from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc

NAME = "master_ingest"
TARGET_POINTS = 100_000
TARGET_P99_MS = 20.0
TARGET_CATCHUP_P99_MS = 5.0
HEARTBEAT = "/orch.v1.Orchestrator/SendHeartbeat"
HOST_HEARTBEATS = "/orch.v1.Orchestrator/SendHostHeartbeats"
TOKEN = secrets.token_urlsafe(16)
# orch masters may require a bearer token (ORCH_TOKEN); one that does not ignores it.
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@dataclass
class Result:
    workers: int
    kind: str
    seconds: float = 0.0
    rpcs: int = 0
    points: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    master_cpu: float = 0.0  # fraction of one core over the measured window
    client_cpu: float = 0.0
    master_rss_mb: float = 0.0
    offered_rps: float = 0.0
    codes: dict[str, int] = field(default_factory=dict)  # status codes of the failed calls
    hosts: int = 0  # callers: one per rank, or one host agent per ``workers // hosts`` ranks
    beats: int = 0  # heartbeats served (a host agent's call carries several)

    @property
    def rps(self) -> float:
        return self.rpcs / self.seconds if self.seconds else 0.0

    @property
    def pps(self) -> float:
        return self.points / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        return c.percentile(self.latencies, q) * 1e3


class Master:
    """``orch master`` in its own process; killed (with its tree) on exit."""

    def __init__(self, world: int, run_root: Path) -> None:
        cmd = [
            c.PYTHON,
            "-m",
            "orch.cli",
            "master",
            "--world-size",
            str(world),
            "--port",
            "0",
            "--no-dashboard",
            "--heartbeat-timeout",
            "600",
            "--linger",
            "0",
            "--run-root",
            str(run_root),
        ]
        self.proc = subprocess.Popen(
            cmd, env=c.bench_env(ORCH_TOKEN=TOKEN), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.address = ""

    def __enter__(self) -> Master:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            m = re.search(r"serving on (\S+);", line)
            if m:
                self.address = m.group(1)
                break
            if time.monotonic() > deadline:
                break
        if not self.address:
            raise RuntimeError("the master did not print its address")
        return self

    def __exit__(self, *exc: object) -> None:
        c.kill_tree(self.proc.pid)
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _heartbeat(run_id: str, worker: str, step: int, points: int) -> bytes:
    t = time.time()
    series = pb.Series(
        name="loss",
        steps=list(range(step, step + points)),
        values=[1.0 / (i + 1) for i in range(points)],
        times=[t] * points,
    )
    return pb.HeartbeatRequest(
        run_id=run_id, worker_id=worker, step=step + points, total_steps=10**6, series=[series]
    ).SerializeToString()


async def _join(address: str, n: int) -> str:
    """Register n workers and pass the start barrier; returns the run id."""
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.OrchestratorStub(ch)
        run_id = ""
        first = await stub.Register(
            pb.RegisterRequest(worker_id="w0", host="sim", pid=1, rendezvous_port=1),
            wait_for_ready=True,
            metadata=AUTH,
        )
        run_id = first.run_id
        sem = asyncio.Semaphore(64)

        async def reg(i: int) -> None:
            async with sem:
                await stub.Register(
                    pb.RegisterRequest(worker_id=f"w{i}", host="sim", pid=i + 1), metadata=AUTH
                )

        await asyncio.gather(*(reg(i) for i in range(1, n)))

        async def barrier(i: int) -> None:
            async with sem:
                reply = await stub.CanStartTraining(
                    pb.CanStartTrainingRequest(run_id=run_id, worker_id=f"w{i}"), metadata=AUTH
                )
                assert reply.ready, reply

        await asyncio.gather(*(barrier(i) for i in range(n)))
        return run_id


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _host_heartbeats(run_id: str, first: int, ranks: int, points: int) -> bytes:
    """One host agent's call: the heartbeats of ranks ``first`` .. ``first + ranks - 1``."""
    beats = [
        pb.HeartbeatRequest.FromString(_heartbeat(run_id, f"w{first + k}", 1000, points))
        for k in range(ranks)
    ]
    return pb.HostHeartbeatsRequest(beats=beats).SerializeToString()


async def _load(
    address: str,
    run_id: str,
    res: Result,
    *,
    points: int,
    rate: float | None,
    seconds: float,
    warmup: float,
    per_host: int = 1,
) -> None:
    """Drive the master: ``rate`` calls/s per host, or back to back when None. A host of
    ``per_host`` > 1 ranks sends them as its host agent does: one SendHostHeartbeats call."""
    n = res.workers // per_host
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(n, 64))]
    method = HEARTBEAT if per_host == 1 else HOST_HEARTBEATS
    calls = [ch.unary_unary(method, request_serializer=None, response_deserializer=None) for ch in channels]
    if per_host == 1:
        reqs = [_heartbeat(run_id, f"w{i}", 1000, points) for i in range(n)]
    else:
        reqs = [_host_heartbeats(run_id, i * per_host, per_host, points) for i in range(n)]
    loop = asyncio.get_running_loop()
    t_start = loop.time() + 0.2
    t_measure = t_start + warmup
    t_end = t_measure + seconds

    async def worker(i: int) -> None:
        call = calls[i % len(calls)]
        req = reqs[i]
        period = 1.0 / rate if rate else 0.0
        nxt = t_start + (i / n) * period
        while True:
            now = loop.time()
            if rate:
                if nxt > now:
                    await asyncio.sleep(nxt - now)
                nxt = max(nxt + period, loop.time() - period)  # late: the next one goes at once
            sent = loop.time()
            if sent >= t_end:
                return
            refused = 0
            try:
                reply = await call(req, timeout=10.0, metadata=AUTH)
                ok = True
                if per_host > 1:
                    refused = sum(1 for b in pb.HostHeartbeatsResponse.FromString(reply).replies if b.code)
            except grpc.aio.AioRpcError as e:
                ok = False
                code = e.code().name
            done = loop.time()
            if sent >= t_measure and done <= t_end:
                if refused:
                    res.errors += refused
                    res.codes["refused beats"] = res.codes.get("refused beats", 0) + refused
                if ok:
                    res.rpcs += 1
                    res.beats += per_host - refused
                    res.points += points * (per_host - refused)
                    res.latencies.append(done - sent)
                else:
                    res.errors += 1
                    res.codes[code] = res.codes.get(code, 0) + 1

    master_proc = psutil.Process(_master_pid)
    tasks = [asyncio.create_task(worker(i)) for i in range(n)]
    await asyncio.sleep(max(0.0, t_measure - loop.time()))
    m0, c0, w0 = _cpu(master_proc), _cpu(psutil.Process()), time.monotonic()
    await asyncio.sleep(max(0.0, t_end - loop.time()))
    m1, c1, w1 = _cpu(master_proc), _cpu(psutil.Process()), time.monotonic()
    await asyncio.gather(*tasks)
    res.seconds = seconds
    res.master_cpu = (m1 - m0) / (w1 - w0)
    res.client_cpu = (c1 - c0) / (w1 - w0)
    res.master_rss_mb = master_proc.memory_info().rss / 2**20
    res.offered_rps = n * rate if rate else float("nan")
    res.hosts = n
    for ch in channels:
        await ch.close()


_master_pid = 0


def run_case(
    tmp: Path,
    workers: int,
    kind: str,
    *,
    points: int,
    rate: float | None,
    seconds: float,
    warmup: float,
    per_host: int = 1,
    catchup_every: float = 0.0,
) -> Result:
    """One case on a fresh master; with ``catchup_every``, a panel client in another process
    fetches the whole state again (GetState from an empty cursor, paged) that often."""
    global _master_pid
    res = Result(workers, kind)
    with Master(workers, tmp / f"runs-{kind}-{workers}") as master:
        _master_pid = master.proc.pid

        async def go() -> None:
            run_id = await _join(master.address, workers)
            panel = None
            if catchup_every:
                panel = _catchup_client(master.address, seconds + warmup + 0.5, catchup_every)
            try:
                await _load(
                    master.address,
                    run_id,
                    res,
                    points=points,
                    rate=rate,
                    seconds=seconds,
                    warmup=warmup,
                    per_host=per_host,
                )
                if panel is not None:
                    out, _ = await asyncio.to_thread(panel.communicate, timeout=120)
                    _catchup_figures(res, out)
            finally:
                if panel is not None:
                    c.kill_tree(panel.pid)
                    panel.wait()

        asyncio.run(go())
    return res


def _catchup_client(address: str, seconds: float, every: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [c.PYTHON, "-c", CATCHUP_CLIENT, address, TOKEN, str(seconds), str(every)],
        env=c.bench_env(),
        stdout=subprocess.PIPE,
        text=True,
    )


def _catchup_figures(res: Result, out: str) -> None:
    n, got, slowest = out.split()
    res.codes["catch-ups"] = int(n)
    res.codes["points per catch-up"] = int(got) // max(1, int(n))
    res.codes["slowest catch-up ms"] = round(float(slowest) * 1e3)


CATCHUP_CLIENT = """
import sys, time, grpc
from orch.wire._proto import orchestrator_pb2 as pb, orchestrator_pb2_grpc as pb_grpc
address, token, seconds, every = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
stub = pb_grpc.OrchestratorStub(grpc.insecure_channel(address, options=[
    ("grpc.max_receive_message_length", 64 << 20)]))
end, n, points, took = time.monotonic() + seconds, 0, 0, []
while time.monotonic() < end:
    t, cursor, more = time.monotonic(), b"", True
    while more:
        reply = stub.GetState(pb.GetStateRequest(cursor=cursor), timeout=60,
                              metadata=(("authorization", "Bearer " + token),))
        cursor, more = reply.cursor, reply.more
        points += sum(len(s.steps) for s in reply.series)
    n, took = n + 1, took + [time.monotonic() - t]
    time.sleep(max(0.0, min(every - (time.monotonic() - t), end - time.monotonic())))
print(n, points, max(took) if took else 0.0, flush=True)
"""


async def _preload(address: str, run_id: str, workers: int, metrics: int, points: int) -> None:
    """Give every worker ``metrics`` series of ``points`` points: a history to catch up on."""
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.OrchestratorStub(ch)
        batch = 10_000
        for start in range(0, points, batch):
            steps = list(range(start, min(points, start + batch)))
            for w in range(workers):
                series = [
                    pb.Series(name=f"m{k}", steps=steps, values=[0.5] * len(steps)) for k in range(metrics)
                ]
                await stub.SendHeartbeat(
                    pb.HeartbeatRequest(run_id=run_id, worker_id=f"w{w}", step=steps[-1], series=series),
                    metadata=AUTH,
                )


def run_catchup_case(
    tmp: Path, *, workers: int, metrics: int, points: int, seconds: float, warmup: float
) -> Result:
    """Heartbeats of ``workers`` ranks at 10/s while another process does full catch-ups."""
    global _master_pid
    res = Result(workers, "catch-up")
    with Master(workers, tmp / "runs-catchup") as master:
        _master_pid = master.proc.pid

        async def go() -> None:
            run_id = await _join(master.address, workers)
            await _preload(master.address, run_id, workers, metrics, points)
            catchup = _catchup_client(master.address, seconds + warmup + 0.5, 0.0)
            try:
                await _load(master.address, run_id, res, points=5, rate=10.0, seconds=seconds, warmup=warmup)
                out, _ = await asyncio.to_thread(catchup.communicate, timeout=120)
            finally:
                c.kill_tree(catchup.pid)
                catchup.wait()
            _catchup_figures(res, out)

        asyncio.run(go())
    return res


def _line(r: Result) -> str:
    shape = (
        f"{r.hosts} hosts x {r.workers // r.hosts}" if r.hosts != r.workers else f"{r.workers} single ranks"
    )
    return (
        f"  {shape} x 4/s: {r.rps:,.0f} of {r.offered_rps:,.0f} calls/s ({r.beats / r.seconds:,.0f} "
        f"heartbeats/s), p50 {r.p(50):.1f} ms, p99 {r.p(99):.1f} ms, errors {r.errors} {r.codes or ''}, "
        f"master CPU {r.master_cpu:.0%}, client CPU {r.client_cpu:.0%}"
    )


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--seconds", type=float, default=6.0, help="measured seconds per case (after warm-up)")
    p.add_argument("--workers", default="256,1024", help="rank counts of the single-rank-host cases")
    args = p.parse_args()
    warmup = 1.0
    counts = [int(x) for x in args.workers.split(",")]
    hosts, per_host, catchup_points = 128, 8, 200_000
    if args.quick:
        args.seconds, warmup, counts, hosts, catchup_points = 1.0, 0.3, [64], 8, 2_000
    started = c.start()
    results: list[Result] = []
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-ingest-") as d:
            tmp = Path(d)
            big = run_case(tmp, 4, "throughput", points=1000, rate=None, seconds=args.seconds, warmup=warmup)
            print(
                f"  throughput: {big.pps:,.0f} points/s, {big.rps:,.0f} RPC/s, p50 {big.p(50):.1f} ms, "
                f"master CPU {big.master_cpu:.0%}, client CPU {big.client_cpu:.0%}",
                flush=True,
            )
            agents = run_case(
                tmp,
                hosts * per_host,
                "host agents",
                points=5,
                rate=4.0,
                seconds=args.seconds,
                warmup=warmup,
                per_host=per_host,
                catchup_every=2.0,
            )
            results.append(agents)
            print(_line(agents), flush=True)
            for n in counts:
                r = run_case(tmp, n, "single ranks", points=5, rate=4.0, seconds=args.seconds, warmup=warmup)
                results.append(r)
                print(_line(r), flush=True)
            cu = run_catchup_case(
                tmp, workers=8, metrics=4, points=catchup_points, seconds=args.seconds, warmup=warmup
            )
            print(
                f"  8 workers x 10/s during full catch-ups ({cu.codes}): p50 {cu.p(50):.2f} ms, "
                f"p99 {cu.p(99):.2f} ms, errors {cu.errors}, master CPU {cu.master_cpu:.0%}",
                flush=True,
            )
    finally:
        c.kill_all_children()

    def all_served(r: Result) -> bool:
        return r.errors == 0 and r.rps >= 0.95 * r.offered_rps

    single = {r.workers: r for r in results if r.kind == "single ranks"}
    c.emit(
        NAME,
        "host_agents_p99_ms",
        f"{agents.p(99):.2f}",
        ranks=agents.workers,
        hosts=agents.hosts,
        all_served=all_served(agents),
        master_cpu=f"{agents.master_cpu:.2f}",
        target=f"p99<{TARGET_P99_MS}ms, all served, CPU<1 core",
        met=agents.p(99) < TARGET_P99_MS and all_served(agents) and agents.master_cpu < 1.0,
    )
    for n, r in single.items():
        extra: dict[str, Any] = {}
        if n == 256:
            extra = {"target": f"p99<{TARGET_P99_MS}ms", "met": r.p(99) < TARGET_P99_MS and all_served(r)}
        c.emit(
            NAME,
            f"single_{n}_ranks_p99_ms",
            f"{r.p(99):.2f}",
            p50_ms=f"{r.p(50):.2f}",
            achieved_rps=f"{r.rps:.0f}",
            offered_rps=f"{r.offered_rps:.0f}",
            errors=r.errors,
            codes=",".join(f"{k}:{v}" for k, v in r.codes.items()) or "-",
            **extra,
        )
    c.emit(
        NAME,
        "catchup_heartbeat_p99_ms",
        f"{cu.p(99):.2f}",
        p50_ms=f"{cu.p(50):.2f}",
        catchups=cu.codes.get("catch-ups", 0),
        target=f"<={TARGET_CATCHUP_P99_MS}",
        met=cu.p(99) <= TARGET_CATCHUP_P99_MS,
    )
    c.emit(
        NAME,
        "points_per_s",
        f"{big.pps:.0f}",
        rpcs_per_s=f"{big.rps:.0f}",
        target=f">={TARGET_POINTS}",
        met=big.pps >= TARGET_POINTS,
    )
    c.check_no_leftovers(NAME)
    if args.quick:
        return

    def served(r: Result) -> str:
        if all_served(r):
            return "every heartbeat served"
        return f"{r.beats / r.seconds:,.0f} of {r.offered_rps * r.workers / r.hosts:,.0f} heartbeats/s served"

    rows = [
        c.Row(
            f"1. {agents.workers:,} ranks as {agents.hosts} hosts x {per_host} (host agents) at 4 "
            "heartbeats/s, a panel's full catch-up every 2 s: call p99, served, master CPU",
            f"< {TARGET_P99_MS:g} ms, all, < 1 core",
            f"{agents.p(99):.1f} ms, {served(agents)}, {agents.master_cpu:.0%} of a core",
            agents.p(99) < TARGET_P99_MS and all_served(agents) and agents.master_cpu < 1.0,
        )
    ]
    for n, r in single.items():
        rows.append(
            c.Row(
                f"{'2. ' if n == 256 else ''}{n:,} single-rank hosts at 4 heartbeats/s: p99",
                f"< {TARGET_P99_MS:g} ms" if n == 256 else "-",
                f"{r.p(99):.1f} ms, {served(r)}",
                r.p(99) < TARGET_P99_MS and all_served(r) if n == 256 else None,
            )
        )
    rows.append(
        c.Row(
            "3. heartbeat p99, 8 workers x 10/s during back-to-back full catch-ups of 8 x 4 x "
            f"{catchup_points // 1000}k points (the master keeps its newest 1M)",
            f"<= {TARGET_CATCHUP_P99_MS:g} ms",
            f"{cu.p(99):.1f} ms ({cu.codes.get('catch-ups', 0)} catch-ups, the slowest "
            f"{cu.codes.get('slowest catch-up ms', 0)} ms)",
            cu.p(99) <= TARGET_CATCHUP_P99_MS,
        )
    )
    rows.append(
        c.Row(
            "master ingest, 4 workers x 1000-point heartbeats",
            f">= {TARGET_POINTS:,} points/s",
            f"{big.pps:,.0f} points/s ({big.rps:,.0f} RPC/s)",
            big.pps >= TARGET_POINTS,
        )
    )
    detail = [
        (
            r.kind,
            r.workers,
            r.hosts,
            "-" if r.kind == "throughput" else f"{r.offered_rps:,.0f}",
            f"{r.rps:,.0f}",
            f"{r.beats / r.seconds:,.0f}" if r.seconds else "-",
            f"{r.pps:,.0f}",
            f"{r.p(50):.2f}",
            f"{r.p(99):.2f}",
            f"{r.errors}"
            + (" (" + ", ".join(f"{k} {v}" for k, v in r.codes.items()) + ")" if r.codes else ""),
            f"{r.master_cpu:.0%}",
            f"{r.client_cpu:.0%}",
            f"{r.master_rss_mb:.0f}",
        )
        for r in [big, *results, cu]
    ]
    body = "\n".join(
        [
            f"{args.seconds:g} s measured per case after a {warmup:g} s warm-up; a fresh `orch master` "
            "process per case (it writes its metrics log to a temp dir as usual); the load generator is this "
            "benchmark's own process (grpc.aio, up to 64 channels), the panel client a third one. A host "
            "agent's call carries the heartbeats of its 8 ranks (5 points each), as `orch worker "
            "--nproc-per-node 8` sends them; latency is per call. CPU is the fraction of one core used "
            "over the measured window (the machine has 2 cores: master + load generator can use at most "
            "200% together).",
            "",
            c.table(
                [
                    "case",
                    "ranks",
                    "callers",
                    "offered calls/s",
                    "achieved calls/s",
                    "heartbeats/s",
                    "points/s",
                    "p50 ms",
                    "p99 ms",
                    "errors",
                    "master CPU",
                    "client CPU",
                    "master RSS MB (end)",
                ],
                detail,
            ),
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

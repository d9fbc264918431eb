"""Cost of ``ctx.log(step, loss=x, acc=y)`` in the training thread, in µs per call.

A real :class:`orch.runtime.context.Context` over a real :class:`orch.runtime._sender.HeartbeatSender`
(its heartbeat thread running, every 0.25 s, as in a worker) in three cases:

- healthy: an in-process ``MasterServer`` + ``Coordinator`` with the worker registered
  and past the start barrier;
- slow: a gRPC server whose ``SendHeartbeat`` sleeps 0.5 s before answering;
- gone: the address of a closed port.

The training thread calls ``ctx.log`` in batches of ``--batch`` calls separated by a
``--pause`` (the rest of a training step, GIL released), for ``--seconds`` per case; the
result is the median over batches of (batch time / calls), with the 99th percentile and
the overall mean beside it. A last "burst" row logs in a tight loop (no pause) against
the healthy master: far above any training loop's rate, it shows what the sender thread
sustains and what the training thread pays when the sender is busy.

    .venv/bin/python benchmarks/log_cost.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/log_cost.py --quick    # tiny, prints only
"""

from __future__ import annotations

import socket
import sys
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import _common as c

NAME = "log_cost"
TARGET_US = 5.0


@dataclass
class Case:
    name: str
    per_call_us: list[float] = field(default_factory=list)
    calls: int = 0
    elapsed: float = 0.0
    logged_s: float = 0.0
    delivered: int | None = None
    dropped: int = 0
    aborts: list[str] = field(default_factory=list)
    queued_at_end: int = 0

    @property
    def median(self) -> float:
        return c.median(self.per_call_us)

    @property
    def p99(self) -> float:
        return c.percentile(self.per_call_us, 99)

    @property
    def mean(self) -> float:
        return self.logged_s / self.calls * 1e6 if self.calls else float("nan")


def _count_points(coord: Any) -> list[int]:
    """Count the points (steps of every series) the coordinator accepts; [total]."""
    count = [0]
    accept = coord.accept_heartbeat  # what the gRPC master calls for each heartbeat

    def counting(req: Any) -> Any:
        accepted = accept(req)
        count[0] += len(req.series[0].steps) if req.series else 0  # one point = one ctx.log call
        return accepted

    coord.accept_heartbeat = counting
    return count


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _slow_server(delay: float) -> tuple[Any, str]:
    import grpc

    from orch.wire._proto import orchestrator_pb2 as pb
    from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc

    class Slow(pb_grpc.OrchestratorServicer):  # type: ignore[misc]
        def SendHeartbeat(self, request: Any, context: Any) -> Any:
            time.sleep(delay)
            return pb.HeartbeatResponse(command=pb.CONTINUE)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_OrchestratorServicer_to_server(Slow(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def measure(
    case: Case,
    address: str,
    run_id: str,
    worker_id: str,
    *,
    seconds: float,
    batch: int,
    pause: float,
    close_timeout: float = 10.0,
    received: list[int] | None = None,
) -> Case:
    import grpc
    import torch

    from orch.runtime._sender import HeartbeatSender
    from orch.runtime.context import Context
    from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(address)
    sender = HeartbeatSender(
        pb_grpc.OrchestratorStub(channel),
        run_id=run_id,
        worker_id=worker_id,
        interval=0.25,
        master_timeout=1e9,  # measure the steady state: a worker would end itself after 30 s
        on_stop=lambda: None,
        on_abort=case.aborts.append,
    ).start()
    ctx = Context(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        config={},
        run_id=run_id,
        sender=sender,
    )
    log = ctx.log
    perf = time.perf_counter
    step = 0
    at_start = received[0] if received else 0
    start = perf()
    end = start + seconds
    try:
        while perf() < end:
            t0 = perf()
            for _ in range(batch):
                log(step, loss=0.5, acc=0.25)
                step += 1
            dt = perf() - t0
            case.per_call_us.append(dt / batch * 1e6)
            case.logged_s += dt
            case.calls += batch
            if pause:
                time.sleep(pause)
        case.elapsed = perf() - start
        if received is not None:
            case.delivered = received[0] - at_start  # acknowledged while logging, not after
    finally:
        case.dropped = sender.dropped
        case.queued_at_end = sender.pending
        sender.close(timeout=close_timeout)
        channel.close()
    return case


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--seconds", type=float, default=5.0, help="logging time per case")
    p.add_argument("--batch", type=int, default=100, help="ctx.log calls per timed batch")
    p.add_argument("--pause", type=float, default=0.002, help="seconds between batches (GIL released)")
    args = p.parse_args()
    if args.quick:
        args.seconds = 0.4
    started = c.start()
    from orch.master.control.plan import RunPlan
    from orch.master.coordinator import Coordinator
    from orch.master.server import MasterServer
    from orch.wire._proto import orchestrator_pb2 as pb

    cases: list[Case] = []
    coord = Coordinator(RunPlan(1, heartbeat_timeout=600.0), run_id="bench-log")
    received = _count_points(coord)
    server = MasterServer(coord, port=0).start()
    slow, slow_addr = _slow_server(0.5)
    try:
        coord.register(pb.RegisterRequest(worker_id="w0", host="h", pid=1, rendezvous_port=29500))
        assert coord.can_start(pb.CanStartTrainingRequest(run_id=coord.run_id, worker_id="w0")).ready
        # --quick does not wait for the gone case's sender to give up on its last points (3 s).
        close_timeout = 0.5 if args.quick else 10.0
        kw: dict[str, Any] = {"seconds": args.seconds, "batch": args.batch, "pause": args.pause}
        kw["close_timeout"] = close_timeout
        healthy = measure(Case("master healthy"), server.address, coord.run_id, "w0", received=received, **kw)
        cases.append(healthy)
        cases.append(measure(Case("master slow (0.5 s per heartbeat)"), slow_addr, "bench-log", "w1", **kw))
        cases.append(
            measure(Case("master gone (closed port)"), f"127.0.0.1:{_closed_port()}", "r", "w2", **kw)
        )
        burst_kw = {"seconds": min(args.seconds, 3.0), "batch": 1000, "pause": 0.0, "close_timeout": 10.0}
        burst = measure(
            Case("burst: tight loop, master healthy"),
            server.address,
            coord.run_id,
            "w0",
            received=received,
            **burst_kw,
        )
    finally:
        server.stop(grace=0.2)
        slow.stop(0.2).wait(2.0)
    for case in cases:
        key = case.name.split()[1] if case.name.startswith("master") else "burst"
        c.emit(
            NAME,
            f"{key}_us_per_call",
            f"{case.median:.3f}",
            p99=f"{case.p99:.3f}",
            mean=f"{case.mean:.3f}",
            target=f"<={TARGET_US}",
            met=case.median <= TARGET_US,
        )
    c.emit(
        NAME,
        "burst_us_per_call",
        f"{burst.median:.3f}",
        mean=f"{burst.mean:.3f}",
        calls_per_s=f"{burst.calls / burst.elapsed:.0f}",
        delivered_per_s=f"{(burst.delivered or 0) / burst.elapsed:.0f}",
        dropped=burst.dropped,
    )
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    rows = [
        c.Row(
            f"ctx.log µs/call, {case.name}",
            f"<= {TARGET_US:g} µs",
            f"{case.median:.2f} µs",
            case.median <= TARGET_US,
        )
        for case in cases
    ]
    detail = []
    for case in [*cases, burst]:
        detail.append(
            (
                case.name,
                f"{case.median:.2f}",
                f"{case.p99:.2f}",
                f"{case.mean:.2f}",
                case.calls,
                f"{case.calls / case.elapsed:,.0f}",
                "-" if case.delivered is None else f"{case.delivered:,}",
                f"{case.dropped:,}",
                f"{case.queued_at_end:,}",
            )
        )
    body = "\n".join(
        [
            f"Batches of {args.batch} calls with a {args.pause * 1e3:g} ms pause between them, "
            f"{args.seconds:g} s per case; the heartbeat thread sends every 0.25 s (timeout 1 s); "
            "`master_timeout` is set very high so the 'gone' case measures the steady state instead "
            "of the worker ending itself. The burst row logs batches of 1000 with no pause for up to 3 s.",
            "",
            c.table(
                [
                    "case",
                    "median µs/call",
                    "p99 µs/call (of batches)",
                    "mean µs/call",
                    "calls",
                    "calls/s",
                    "points at master while logging",
                    "dropped",
                    "queued at end",
                ],
                detail,
            ),
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

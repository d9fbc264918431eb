"""Calls on a Coordinator as workers make them, without sockets: for the master's unit tests and
the host-restart tests (a module of its own: test modules import it, never each other)."""

from __future__ import annotations

from orch.master.coordinator import Coordinator
from orch.wire._proto import orchestrator_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def reg(c: Coordinator, wid: str, **kw: object) -> int:
    fields = {"host": "h", "pid": 1, "address": "127.0.0.1", "rendezvous_port": 29500, **kw}
    return c.register(pb.RegisterRequest(worker_id=wid, **fields)).rank  # type: ignore[arg-type]


def heartbeat(c: Coordinator, req: pb.HeartbeatRequest) -> int:
    """A heartbeat as the gRPC master takes it: accepted, its write made, then acknowledged;
    the command for the worker (a pb.Command)."""
    reply, write = c.accept_heartbeat(req)
    if write is not None:
        write()
    return int(reply.command)


def beat(c: Coordinator, wid: str, step: int = 0, run_id: str | None = None, **series: list[float]) -> int:
    req = pb.HeartbeatRequest(run_id=c.run_id if run_id is None else run_id, worker_id=wid, step=step)
    for name, values in series.items():
        req.series.append(pb.Series(name=name, steps=list(range(len(values))), values=values))
    return heartbeat(c, req)


def complete(c: Coordinator, wid: str, outcome: int, error: str = "", checksum: str = "x") -> None:
    c.complete(
        pb.CompletionRequest(
            run_id=c.run_id,
            worker_id=wid,
            outcome=outcome,  # type: ignore[arg-type]
            error=error,
            param_checksum=checksum,
        )
    )

"""Reading a master from outside: a small client and a mirror of the run's state.

:class:`MasterClient` wraps the stub with deadlines and clear errors;
:class:`StateMirror` folds the incremental ``GetState`` replies into full per-rank
series, so each poll only moves the new points over the wire. The terminal dashboard,
the notebook panel and ``orch status`` all read a run through these two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import numpy as np
import numpy.typing as npt
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orch._text import nonfinite_words
from orch.errors import MasterUnavailable
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.auth import open_channel, token_from_env
from orch.wire.codec import take_status
from orch.wire.model import RunStatus
from orch.wire.ranks import RankView
from orch.wire.rpc import rpc_error
from orch.wire.states import SERVICE_NAME, RunState


class Snapshots(Protocol):
    """A master in this process, read without an RPC: the coordinator is one."""

    def snapshot(self, cursor: bytes = b"") -> pb.GetStateResponse: ...


class MasterClient:
    """A connection to an orch master at ``"host:port"``."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 5.0,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.tls = tls_ca is not None
        self._channel = open_channel(
            address, token=token_from_env(token), tls_ca=tls_ca, tls_server_name=tls_server_name
        )
        self.stub = pb_grpc.OrchestratorStub(self._channel)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the master's health service answers SERVING."""
        health_stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply = health_stub.Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=timeout, wait_for_ready=True
            )
        except grpc.RpcError as e:
            raise MasterUnavailable(
                f"no orch master answered at {self.address} within {timeout:g}s "
                f"({e.code().name}): check the address, that `orch master` is running there, "
                "and that TLS is used on both sides or on neither"
            ) from e
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise MasterUnavailable(f"the master at {self.address} is not serving")

    def get_state(
        self, cursor: bytes = b"", *, skip_series: bool = False, changed_ranks: bool = False
    ) -> pb.GetStateResponse:
        """The run's state after ``cursor``; ``changed_ranks``: only the ranks whose records
        changed since it (the reply says so in ``ranks_changed_only``)."""
        try:
            reply: pb.GetStateResponse = self.stub.GetState(
                pb.GetStateRequest(cursor=cursor, skip_series=skip_series, changed_ranks=changed_ranks),
                timeout=self.timeout,
            )
        except grpc.RpcError as e:
            raise rpc_error("GetState", self.address, e, tls=self.tls) from e
        return reply

    def stacks(self, wait: float = 0.0) -> pb.GetStacksResponse:
        """Every running rank's stack, asked for now (the master waits up to ``wait`` seconds
        for them; 0: its default)."""
        try:
            reply: pb.GetStacksResponse = self.stub.GetStacks(
                pb.GetStacksRequest(wait=wait), timeout=self.timeout + max(wait, 3.0) + 7.0
            )
        except grpc.RpcError as e:
            raise rpc_error("GetStacks", self.address, e, tls=self.tls) from e
        return reply

    def stop_run(self, reason: str = "") -> RunState:
        try:
            reply = self.stub.StopRun(pb.StopRunRequest(reason=reason), timeout=self.timeout)
        except grpc.RpcError as e:
            raise rpc_error("StopRun", self.address, e, tls=self.tls) from e
        return RunState(pb.RunState.Name(reply.state))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SeriesBuffer:
    """One metric series of one rank, in numpy arrays that grow by doubling.

    ``times`` are the unix seconds each point was logged at (NaN where a source had none):
    ``orch.compare(..., x="time")`` aligns runs by them. NaN and inf points are kept as
    they came: the first of them (``first_bad``) and the last finite point (``last_finite``)
    are noted as points arrive, as ``(step, value)``, for the views to flag.
    """

    __slots__ = ("_n", "_steps", "_times", "_values", "first_bad", "last_finite")

    def __init__(self) -> None:
        self._steps = np.empty(64, dtype=np.int64)
        self._values = np.empty(64, dtype=np.float64)
        self._times = np.empty(64, dtype=np.float64)
        self._n = 0
        self.first_bad: tuple[int, float] | None = None
        self.last_finite: tuple[int, float] | None = None

    def extend(self, steps: Sequence[int], values: Sequence[float], times: Sequence[float] = ()) -> None:
        k = len(steps)
        need = self._n + k
        if need > len(self._steps):
            cap = max(need, 2 * len(self._steps))
            self._steps = np.resize(self._steps, cap)
            self._values = np.resize(self._values, cap)
            self._times = np.resize(self._times, cap)
        self._steps[self._n : need] = steps
        self._values[self._n : need] = values
        self._times[self._n : need] = times if len(times) == k else np.nan
        if k:
            added = self._values[self._n : need]
            finite = np.isfinite(added)
            if self.first_bad is None and not finite.all():
                i = self._n + int(np.argmin(finite))
                self.first_bad = (int(self._steps[i]), float(self._values[i]))
            if finite.any():
                j = need - 1 - int(np.argmax(finite[::-1]))
                self.last_finite = (int(self._steps[j]), float(self._values[j]))
        self._n = need

    @property
    def steps(self) -> npt.NDArray[np.int64]:
        return self._steps[: self._n]

    @property
    def values(self) -> npt.NDArray[np.float64]:
        return self._values[: self._n]

    @property
    def times(self) -> npt.NDArray[np.float64]:
        return self._times[: self._n]

    def __len__(self) -> int:
        return self._n


@dataclass(frozen=True)
class NonFinite:
    """A rank's metric that became NaN or inf: at which step first, and its last finite value."""

    rank: int
    metric: str
    step: int  # the first step whose value was not finite
    value: float  # that value: nan, inf or -inf
    last_finite: float | None  # the last finite value logged (None: there was none)
    last_finite_step: int  # its step (-1: none)
    final: float  # the last value logged: NaN or inf unless the metric came back

    @property
    def stays(self) -> bool:
        """Its last value is not finite either: it never came back."""
        return not math.isfinite(self.final)

    def text(self) -> str:
        """``loss nan from step 45 (last finite 6.433e+35 at step 44)``, or ``loss was inf at step 45``."""
        words = nonfinite_words(self.value, self.step, self.last_finite, self.last_finite_step, self.stays)
        return f"{self.metric} {words}" if self.stays else f"{self.metric} was {words}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN and inf as their text (JSON has no number for them)."""
        return {
            "rank": self.rank,
            "metric": self.metric,
            "step": self.step,
            "value": str(self.value),
            "last_finite": self.last_finite,
            "last_finite_step": self.last_finite_step,
            "final": self.final if math.isfinite(self.final) else str(self.final),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NonFinite:
        """From :meth:`as_dict`'s JSON; a wrong field raises ``ValueError`` or ``TypeError``."""
        last = d.get("last_finite")
        return cls(
            rank=int(d["rank"]),
            metric=str(d["metric"]),
            step=int(d["step"]),
            value=float(d["value"]),
            last_finite=None if last is None else float(last),
            last_finite_step=int(d.get("last_finite_step", -1)),
            final=float(d.get("final", d["value"])),
        )


@dataclass
class StateMirror(RunStatus):
    """The full state of a run, rebuilt from incremental ``GetState`` replies: its status (the
    fields of :class:`~orch.wire.model.RunStatus`), ranks, points and events."""

    ranks: list[RankView] = field(default_factory=list)
    series: dict[tuple[int, str], SeriesBuffer] = field(default_factory=dict)
    events: list[tuple[float, str, int, str]] = field(default_factory=list)
    cursor: bytes = b""
    last_points: int = 0  # points the last reply carried
    clock: float = 0.0  # the master's clock the ranks' ages were read at

    def apply(self, reply: pb.GetStateResponse) -> None:
        if reply.full:
            self.series.clear()
            self.events.clear()
        self.take(take_status(reply))
        if reply.ranks_changed_only:
            self._merge_ranks(reply)
        else:
            self.ranks = [RankView.from_pb(r) for r in reply.ranks]
        self.clock = reply.clock
        self.last_points = 0
        for s in reply.series:
            buf = self.series.get((s.rank, s.name))
            if buf is None:
                buf = self.series[(s.rank, s.name)] = SeriesBuffer()
            buf.extend(s.steps, s.values, s.times)
            self.last_points += len(s.steps)
        self.events.extend((e.time, e.kind, e.rank, e.message) for e in reply.events)
        self.cursor = reply.cursor
        self.fill_mean_rates()

    def _merge_ranks(self, reply: pb.GetStateResponse) -> None:
        """A reply with only the ranks that changed: the others stand, a little older."""
        changed = {r.rank: RankView.from_pb(r) for r in reply.ranks}
        older = max(0.0, reply.clock - self.clock)
        merged = []
        for r in self.ranks:
            now = changed.pop(r.rank, None)
            if now is None:
                now = r
                if r.heartbeat_age >= 0:
                    r.heartbeat_age += older
                if r.progress_age >= 0:
                    r.progress_age += older
            merged.append(now)
        self.ranks = merged + sorted(changed.values(), key=lambda r: r.rank)

    def fill_mean_rates(self) -> None:
        """An ended rank's steps/s is its mean over its points (the master reports a rate only
        while a rank runs): steps from its first point to its last over the seconds between."""
        ended = {r.rank: r for r in self.ranks if r.state.done and not r.steps_per_sec}
        if not ended:
            return
        # Each series is looked at once, whatever the ranks (not once per ended rank).
        series_of: dict[int, list[SeriesBuffer]] = {}
        for (rank, _), buf in self.series.items():
            if rank in ended and len(buf) >= 2:
                series_of.setdefault(rank, []).append(buf)
        for r in ended.values():
            first: tuple[float, int] | None = None
            last: tuple[float, int] | None = None
            for buf in series_of.get(r.rank, ()):
                # Over the time it moved: its last step is timed when it was first reached (a
                # rank that hung logs its memory at that step for as long as it hung).
                at = len(buf.steps) - 1
                while at > 0 and buf.steps[at - 1] == buf.steps[-1]:
                    at -= 1
                t0, t1 = float(buf.times[0]), float(buf.times[at])
                if math.isfinite(t0) and (first is None or t0 < first[0]):
                    first = (t0, int(buf.steps[0]))
                if math.isfinite(t1) and (last is None or t1 > last[0]):
                    last = (t1, int(buf.steps[-1]))
            if first is not None and last is not None and last[0] > first[0] and last[1] > first[1]:
                r.steps_per_sec = (last[1] - first[1]) / (last[0] - first[0])

    def nonfinite(self, metric: str | None = None) -> list[NonFinite]:
        """Every rank's metric (``metric`` only, if named) that logged a NaN or inf, by step."""
        found = []
        for (rank, name), buf in sorted(self.series.items()):
            if buf.first_bad is None or (metric is not None and name != metric):
                continue
            step, value = buf.first_bad
            last_step, last = buf.last_finite if buf.last_finite is not None else (-1, None)
            found.append(NonFinite(rank, name, step, value, last, last_step, float(buf.values[-1])))
        return sorted(found, key=lambda d: (d.step, d.rank, d.metric))

    def poll(self, client: MasterClient, *, skip_series: bool = False) -> StateMirror:
        """Fetch what changed since the last poll (in several replies when there is a lot)."""
        while True:
            reply = client.get_state(self.cursor, skip_series=skip_series, changed_ranks=True)
            self.apply(reply)
            if not reply.more:
                return self

    @classmethod
    def of(cls, coordinator: Snapshots) -> StateMirror:
        """The full state of a master in this process (no RPC)."""
        mirror = cls()
        while True:
            reply = coordinator.snapshot(mirror.cursor)
            mirror.apply(reply)
            if not reply.more:
                return mirror

    def history(self) -> dict[str, dict[int, dict[str, list[float]]]]:
        """``{metric: {rank: {"step": [...], "value": [...]}}}`` for every logged scalar."""
        out: dict[str, dict[int, dict[str, list[float]]]] = {}
        for (rank, name), buf in sorted(self.series.items()):
            out.setdefault(name, {})[rank] = {"step": buf.steps.tolist(), "value": buf.values.tolist()}
        return out

    def metric_names(self) -> list[str]:
        return sorted({name for _, name in self.series})

    def progress(self) -> tuple[int, int]:
        """(slowest rank's step, total steps) — total is 0 when unknown."""
        done = min((r.step for r in self.ranks), default=0)
        return done, self.total_steps

    def as_dict(self) -> dict[str, Any]:
        """The run as ``result.json`` and ``orch status --json`` write it."""
        return {
            **self.status_json(),
            "ranks": [r.as_dict() for r in self.ranks],
            "nonfinite": [d.as_dict() for d in self.nonfinite()],
            "points": {f"{rank}/{name}": len(s) for (rank, name), s in sorted(self.series.items())},
        }

"""The master's logic, free of gRPC: registry, ranks, start barrier, series, run state.

The gRPC servicer in :mod:`orch.master` is a thin layer over :class:`Coordinator`; the
launcher calls it directly too (a child's exit code). Everything here runs under one lock
and reads time from injected clocks, so it is unit-tested without sockets or sleeps.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import re
import threading
import time
import uuid
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ._proto import orchestrator_pb2 as pb
from .states import RANK_STATE_FROM_PB, RANK_STATE_PB, RUN_STATE_PB, RankState, RunState

if TYPE_CHECKING:
    from .store import RunStore

log = logging.getLogger(__name__)

MAX_ID_LEN = 256
# A failure reported within this many seconds of the first one may still name the root
# cause: the rank whose death broke a collective is often seen after the peers that the
# broken collective failed.
SETTLE_SECONDS = 2.0
EXIT_ABORTED = 70  # a worker that ended itself because the run had already failed
MAX_METRICS_PER_RANK = 64
# Points held in memory by one master, across all its series (24 bytes each: 23 MiB). Past it
# the oldest points of the biggest series leave memory first, down to three quarters of it;
# the run dir's metrics log keeps every point.
MAX_POINTS_IN_MEMORY = 1_000_000
MAX_POINTS_PER_REPLY = 250_000  # a GetState reply stays a few MiB; the caller asks again for more
# Events held in memory (past either bound the oldest quarter leaves; the run dir keeps them
# all), and sent in one GetState reply (the caller asks again for the rest).
MAX_EVENTS_IN_MEMORY = 10_000
MAX_EVENT_BYTES_IN_MEMORY = 8 * 1024 * 1024
MAX_EVENT_BYTES_PER_REPLY = 4 * 1024 * 1024
PEER_ERROR = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|gloo/transport|DistBackendError|DistNetworkError"
    r"|NCCL (error|communicator)|ProcessGroup\w* .*(timed out|abort)",
    re.IGNORECASE,
)
MAX_ERROR_LEN = 64 * 1024
STOP_LEAD_SECONDS = 2.0  # how far ahead of the ranks a stop step is set (see _stop_step)
LOST_TOGETHER = "; lost at the same time: "
BACKENDS = ("", "gloo", "nccl")


RejectKind = Literal["invalid_argument", "failed_precondition", "not_found", "resource_exhausted"]


class Reject(Exception):
    """A request the master refuses; ``kind`` maps to a gRPC status code."""

    def __init__(self, kind: RejectKind, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class _Series:
    """One rank's points of one metric, in compact arrays.

    ``base`` is the absolute index of the first point held: the coordinator trims the oldest
    points out of memory under its budget (the run dir's metrics log keeps them all), and
    cursors, which count absolute points, stay valid.
    """

    __slots__ = ("attempt", "base", "steps", "times", "values")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.times = array("d")
        self.attempt = 0
        self.base = 0

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def end(self) -> int:
        """Absolute index after the last point."""
        return self.base + len(self.steps)

    def add(
        self, steps: Sequence[int], values: Sequence[float], times: Sequence[float], attempt: int
    ) -> bool:
        """Append points; True when a newer attempt rewound the series.

        A restarted group replays the steps after its last checkpoint: the new attempt's
        points replace those of the old one from its first step on, so no step is counted twice.
        """
        rewound = False
        if attempt > self.attempt and steps and self.steps and steps[0] <= self.steps[-1]:
            cut = bisect.bisect_left(self.steps, steps[0])
            del self.steps[cut:], self.values[cut:], self.times[cut:]
            rewound = True
        self.attempt = max(self.attempt, attempt)
        self.steps.extend(steps)
        self.values.extend(values)
        self.times.extend(times)
        return rewound

    def trim(self, drop: int) -> None:
        """Let the oldest ``drop`` points leave memory."""
        del self.steps[:drop], self.values[:drop], self.times[:drop]
        self.base += drop


def _points(rank: int, name: str, s: _Series, base: int, first: int, last: int) -> pb.Series:
    """Points ``first`` to ``last`` (absolute indexes) of ``s``, whose first point held is ``base``."""
    a, b = first - base, max(first, last) - base
    return pb.Series(rank=rank, name=name, steps=s.steps[a:b], values=s.values[a:b], times=s.times[a:b])


def _water_level(lengths: list[int], excess: int) -> int:
    """The largest length L such that cutting every longer series down to L frees ``excess`` points."""
    ordered = sorted(lengths, reverse=True)
    top = 0
    for k, n in enumerate(ordered, 1):
        top += n
        level = (top - excess) // k
        following = ordered[k] if k < len(ordered) else 0
        if level >= following:
            return max(level, 0)
    return 0


@dataclass
class RankRecord:
    rank: int
    worker_id: str
    host: str
    pid: int
    address: str
    rendezvous_port: int
    backend: str
    state: RankState = RankState.REGISTERED
    step: int = 0
    total_steps: int = 0
    last_heartbeat: float | None = None
    loss: float = math.nan
    param_checksum: str = ""
    error: str = ""
    exit_code: int = 0
    dropped_points: int = 0
    ended_at: float | None = None
    beats: int = 0
    has_loss: bool = False
    progress: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=16))

    def steps_per_sec(self) -> float:
        if len(self.progress) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self.progress[0], self.progress[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


@dataclass(frozen=True)
class Registration:
    rank: int
    world_size: int
    run_id: str
    fn: str
    config_json: str
    total_steps: int
    heartbeat_timeout: float
    attempt: int
    rendezvous_port: int


def _check_id(name: str, value: str, *, required: bool = True) -> None:
    if required and not value:
        raise Reject("invalid_argument", f"{name} is empty: pass a non-empty {name}")
    if len(value) > MAX_ID_LEN:
        raise Reject("invalid_argument", f"{name} is {len(value)} characters; the limit is {MAX_ID_LEN}")


class Coordinator:
    """Registry, barrier, metric series and state of one run.

    What callers can make it hold is bounded: ``max_points_in_memory`` points across all
    series, :data:`MAX_EVENTS_IN_MEMORY` events (and :data:`MAX_EVENT_BYTES_IN_MEMORY` of their
    messages), and one ``stop_requested`` event per stop however often it is asked for.
    """

    def __init__(
        self,
        world_size: int,
        *,
        run_id: str | None = None,
        fn: str = "orch.example:train",
        config_json: str = "{}",
        total_steps: int = 0,
        rendezvous_port: int = 0,
        backend: str = "",
        heartbeat_timeout: float = 30.0,
        max_attempts: int = 1,
        store: RunStore | None = None,
        max_points_in_memory: int = MAX_POINTS_IN_MEMORY,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.fn = fn
        self.config_json = config_json
        self.total_steps = total_steps
        self.rendezvous_port = rendezvous_port
        self.backend = backend
        self.heartbeat_timeout = heartbeat_timeout
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.state = RunState.PENDING
        self.ranks: list[RankRecord] = []
        self._by_worker: dict[str, RankRecord] = {}
        self._series: dict[tuple[int, str], _Series] = {}
        self._names: dict[int, set[str]] = {}
        self.events: list[pb.Event] = []
        self.dropped_events = 0  # the oldest events that left memory (the run dir keeps them)
        self._event_bytes = 0
        self.stop_requests = 0  # every StopRun; only the one that set the stop is an event
        self.points_in_memory = 0
        self.failure = ""
        self.root_cause: RankRecord | None = None
        self.stop_requested = False
        self.stop_at_step = 0  # with a stop: the step count loops without ctx.steps end at
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.attempt = 1
        self.max_attempts = max_attempts
        self.max_points_in_memory = max_points_in_memory
        self.store = store
        self._epoch = 0
        self._first_failure: tuple[RankRecord | None, str] | None = None
        self._cause_rank_of = 3  # how strongly the current root cause explains the failure (0: best)
        self._failed_at = 0.0

    # -- worker RPCs -------------------------------------------------------------------
    def register(self, req: pb.RegisterRequest) -> Registration:
        _check_id("worker_id", req.worker_id)
        _check_id("host", req.host, required=False)
        _check_id("address", req.address, required=False)
        if req.pid < 0:
            raise Reject("invalid_argument", f"pid must be >= 0, got {req.pid}")
        if not 0 <= req.rendezvous_port < 65536:
            raise Reject("invalid_argument", f"rendezvous_port {req.rendezvous_port} is not a port")
        if req.backend not in BACKENDS:
            raise Reject("invalid_argument", f"backend {req.backend!r} is not one of gloo, nccl")
        with self._lock:
            if req.run_id and req.run_id != self.run_id:
                raise Reject(
                    "failed_precondition",
                    f"this master runs run {self.run_id}, not {req.run_id}: "
                    "the worker belongs to another run",
                )
            rec = self._by_worker.get(req.worker_id)
            if rec is not None and req.rendezvous_port:
                rec.rendezvous_port = req.rendezvous_port  # rank 0 tells where its store listens
            if rec is None:
                if self.state.done:
                    raise Reject("failed_precondition", f"run {self.run_id} is already {self.state.value}")
                if len(self.ranks) >= self.world_size:
                    raise Reject(
                        "resource_exhausted",
                        f"run {self.run_id} already has all {self.world_size} ranks registered",
                    )
                rec = RankRecord(
                    rank=len(self.ranks),
                    worker_id=req.worker_id,
                    host=req.host,
                    pid=req.pid,
                    address=req.address or req.host,
                    rendezvous_port=req.rendezvous_port,
                    backend=req.backend,
                )
                self.ranks.append(rec)
                self._by_worker[req.worker_id] = rec
                self._event("registered", rec.rank, f"{req.worker_id} on {req.host} pid {req.pid}")
                if len(self.ranks) == self.world_size:
                    self.state = RunState.RUNNING
                    self.started_at = self._clock()
                    self._event("started", -1, f"all {self.world_size} ranks registered")
            return Registration(
                rec.rank,
                self.world_size,
                self.run_id,
                self.fn,
                self.config_json,
                self.total_steps,
                self.heartbeat_timeout,
                self.attempt,
                self.rendezvous_port,
            )

    def can_start(self, req: pb.CanStartTrainingRequest) -> pb.CanStartTrainingResponse:
        with self._lock:
            rec = self._known(req.run_id, req.worker_id)
            ready = (
                self.state is RunState.RUNNING
                and len(self.ranks) == self.world_size
                and self.active_rendezvous_port() > 0
            )
            reply = pb.CanStartTrainingResponse(
                ready=ready, registered=len(self.ranks), world_size=self.world_size
            )
            if ready:
                rank0 = self.ranks[0]
                reply.master_addr = rank0.address
                reply.master_port = self.active_rendezvous_port()
                reply.backend = self.backend or (
                    "nccl" if all(r.backend == "nccl" for r in self.ranks) else "gloo"
                )
                if rec.state is RankState.REGISTERED:
                    rec.state = RankState.RUNNING
                    rec.last_heartbeat = self._clock()
            return reply

    def heartbeat(self, req: pb.HeartbeatRequest) -> int:
        """Record progress and points; return the command for the worker (a pb.Command)."""
        command, write = self.accept_heartbeat(req)
        if write is not None:
            write()
        return command

    def accept_heartbeat(self, req: pb.HeartbeatRequest) -> tuple[int, Callable[[], None] | None]:
        """Record progress and points in memory; return the command and the run dir's write.

        The write (None when there is nothing to write) must finish before the heartbeat is
        acknowledged, so that an acknowledged point is on disk; the gRPC master runs it on
        its writer thread, off its event loop and outside this coordinator's lock.
        """
        if req.step < 0 or req.total_steps < 0 or req.dropped_points < 0:
            raise Reject("invalid_argument", "step, total_steps and dropped_points must be >= 0")
        if len(req.series) > MAX_METRICS_PER_RANK:
            raise Reject(
                "invalid_argument",
                f"a heartbeat carries {len(req.series)} series; the limit is {MAX_METRICS_PER_RANK}",
            )
        for s in req.series:
            if not s.name or len(s.name) > MAX_ID_LEN:
                raise Reject("invalid_argument", "every series needs a name of 1-256 characters")
            if len(s.steps) != len(s.values) or (s.times and len(s.times) != len(s.steps)):
                raise Reject(
                    "invalid_argument",
                    f"series {s.name!r}: steps, values and times must have the same length",
                )
        with self._lock:
            rec = self._known(req.run_id, req.worker_id)
            now = self._clock()
            if rec.state is RankState.REGISTERED:
                raise Reject(
                    "failed_precondition",
                    f"worker {req.worker_id} sent a heartbeat before the start barrier opened: "
                    "poll CanStartTraining until ready first",
                )
            rec.last_heartbeat = now
            rec.beats += 1
            if not rec.state.done:  # an ended rank may still deliver the points it logged
                rec.step = max(rec.step, req.step)
                if req.total_steps:
                    rec.total_steps = req.total_steps
                rec.progress.append((now, rec.step))
            rec.dropped_points = req.dropped_points
            wall = self._wall()
            new_names = {s.name for s in req.series} - self._names.get(rec.rank, set())
            known = self._names.setdefault(rec.rank, set())
            if len(known) + len(new_names) > MAX_METRICS_PER_RANK:
                raise Reject(
                    "resource_exhausted",
                    f"rank {rec.rank} would log more than {MAX_METRICS_PER_RANK} different metrics",
                )
            known |= new_names
            for s in req.series:
                series = self._series.get((rec.rank, s.name))
                if series is None:
                    series = self._series[(rec.rank, s.name)] = _Series()
                times = s.times if s.times else [wall] * len(s.steps)
                held = len(series)
                if series.add(s.steps, s.values, times, self.attempt):
                    self._epoch += 1
                self.points_in_memory += len(series) - held
                if s.name == "loss" and s.values:
                    rec.loss = s.values[-1]
                    rec.has_loss = True
            if self.max_points_in_memory and self.points_in_memory > self.max_points_in_memory:
                self._trim_points()
            write = None
            if self.store is not None and req.series:
                write = functools.partial(self.store.append_points, rec.rank, self.attempt, req.series)
            self._changed.notify_all()
            return self._command_for(rec), write

    def complete(self, req: pb.CompletionRequest) -> None:
        outcome = RANK_STATE_FROM_PB.get(req.outcome)
        if outcome not in (RankState.SUCCEEDED, RankState.FAILED, RankState.STOPPED):
            raise Reject("invalid_argument", "outcome must be RANK_SUCCEEDED, RANK_FAILED or RANK_STOPPED")
        if len(req.param_checksum) > MAX_ID_LEN:
            raise Reject("invalid_argument", "param_checksum is too long")
        with self._lock:
            rec = self._known(req.run_id, req.worker_id)
            if rec.state.done:
                return  # a retried report, or a rank already declared failed: keep the first
            rec.step = max(rec.step, req.step)
            rec.param_checksum = req.param_checksum
            error = req.error[:MAX_ERROR_LEN]
            self._end_rank(rec, outcome, error=error, weight=1 if PEER_ERROR.search(error) else 0)

    # -- launcher and tools --------------------------------------------------------------
    def rank_exited(self, worker_id: str, exit_code: int, detail: str = "", expected: bool = False) -> None:
        """The launcher saw a worker process exit with ``exit_code`` (negative: signal).

        ``detail`` is what the process left behind (its error file or the end of its log);
        ``expected`` says the launcher ended it itself (tearing the group down).
        """
        with self._lock:
            rec = self._by_worker.get(worker_id)
            if rec is None:
                if exit_code != 0 and not self.state.done:
                    self._fail_run(
                        None,
                        f"worker {worker_id} exited with {_describe_exit(exit_code)} before it registered",
                    )
                return
            rec.exit_code = exit_code
            if rec.state.done:
                return
            what = _describe_exit(exit_code)
            if exit_code == 0:
                what += " without reporting completion"
            error = f"process exited with {what}"
            weight = 2 if expected or exit_code == EXIT_ABORTED else 0
            self._end_rank(
                rec, RankState.FAILED, error=f"{detail.rstrip()}\n{error}" if detail else error, weight=weight
            )

    def rank_reported(self, worker_id: str) -> bool:
        """True when the worker's rank reported its end (or its process exited), unlike a LOST one."""
        with self._lock:
            rec = self._by_worker.get(worker_id)
            return rec is not None and rec.state.done and rec.state is not RankState.LOST

    def request_stop(self, reason: str = "") -> RunState:
        """Ask the ranks to stop. Only the request that sets the stop is an event; the ones
        after it (a user clicking Stop again, a script in a loop) are only counted."""
        with self._lock:
            self.stop_requests += 1
            if self.state.done or self.stop_requested:
                return self.state
            self._event("stop_requested", -1, reason or "stop requested")
            if self.state is RunState.PENDING:
                self._finish(RunState.STOPPED)
            else:
                self.stop_requested = True
                self.stop_at_step = self.stop_at_step or self._stop_step()
            return self.state

    def _stop_step(self) -> int:
        """Where loops without ``ctx.steps`` end: one step count for every rank, far enough
        ahead (``STOP_LEAD_SECONDS`` of the fastest rank's steps) that each rank hears of it
        before it gets there, so all leave their DDP collectives at the same step."""
        ahead = max((r.steps_per_sec() for r in self.ranks), default=0.0) * STOP_LEAD_SECONDS
        return max((r.step for r in self.ranks), default=0) + max(2, math.ceil(ahead))

    def restart(self) -> int:
        """Open a new attempt after a failure: the ranks re-register, the series go on.

        Returns the new attempt number. Only a RESTARTING run restarts.
        """
        with self._lock:
            if self.state is not RunState.RESTARTING:
                raise Reject("failed_precondition", "only a failed run with restarts left can restart")
            if self._first_failure is None:
                self._first_failure = (self.root_cause, self.failure)
            self.attempt += 1
            self.ranks = []
            self._by_worker = {}
            self.root_cause = None
            self.failure = ""
            # A stop asked for while the group was torn down carries over: the next attempt stops.
            self.stop_at_step = 0
            self.state = RunState.PENDING
            self.ended_at = None
            self._event("restart", -1, f"attempt {self.attempt} of {self.max_attempts}")
            self._changed.notify_all()
            return self.attempt

    def close_run(self, message: str) -> None:
        """End a live run from outside: STOPPED when a stop was asked for, else FAILED."""
        with self._lock:
            if self.state.done:
                return
            self._event("closed", -1, message)
            if self.stop_requested:
                self._finish(RunState.STOPPED)
            else:
                self.root_cause, self.failure = None, message
                self._finish(RunState.FAILED)

    def fail(self, message: str) -> None:
        """Fail the run from outside, for good (the launcher gave up on it)."""
        with self._lock:
            if not self.state.done:
                self.root_cause, self.failure = None, message
                self._finish(RunState.FAILED)

    def expire(self) -> None:
        """Mark ranks whose heartbeats stopped as LOST (and so the run FAILED)."""
        with self._lock:
            now = self._clock()
            lost = []
            for rec in self.ranks:
                if (
                    rec.state is RankState.RUNNING
                    and rec.last_heartbeat is not None
                    and now - rec.last_heartbeat > self.heartbeat_timeout
                ):
                    lost.append(rec)
                    where = (
                        ""
                        if rec.beats
                        else " since the start barrier: stuck in the torch.distributed "
                        "rendezvous or process-group set-up"
                    )
                    self._end_rank(
                        rec,
                        RankState.LOST,
                        error=f"no heartbeat for {now - rec.last_heartbeat:.1f}s "
                        f"(timeout {self.heartbeat_timeout:g}s){where}",
                    )
            root = self.root_cause
            if not lost or root is None or root.state is not RankState.LOST or root.last_heartbeat is None:
                return
            # A host that dropped off takes all its ranks with it: name them together. They fell
            # silent within a heartbeat interval of each other, so the expiry that finds the first
            # may come just before the others'; the ranks aborted because the run failed fall
            # silent a whole timeout after it, and are not named.
            together = [
                r
                for r in lost
                if r is not root
                and r.last_heartbeat is not None
                and (
                    root in lost or abs(r.last_heartbeat - root.last_heartbeat) <= self.heartbeat_timeout / 2
                )
            ]
            if together:
                self.failure += (", " if LOST_TOGETHER in self.failure else LOST_TOGETHER) + ", ".join(
                    f"rank {r.rank} ({r.address or r.host})" for r in together
                )

    def wait_changed(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def series(self, rank: int, name: str) -> tuple[list[int], list[float]]:
        """The points of one series still held in memory."""
        with self._lock:
            s = self._series.get((rank, name), _Series())
            return list(s.steps), list(s.values)

    @property
    def trimmed(self) -> bool:
        """True when some points are only in the run dir's metrics log, no longer in memory."""
        with self._lock:
            return any(s.base for s in self._series.values())

    def snapshot(
        self, cursor: bytes = b"", *, skip_series: bool = False, max_points: int = 0
    ) -> pb.GetStateResponse:
        """The run's state, with only the points and events after ``cursor``.

        At most ``max_points`` points (default and ceiling :data:`MAX_POINTS_PER_REPLY`) go in
        one reply; ``more`` then says to ask again with its cursor. ``skip_series``: no points.
        """
        if max_points < 0:
            raise Reject("invalid_argument", f"max_points must be >= 0, got {max_points}")
        budget = min(max_points or MAX_POINTS_PER_REPLY, MAX_POINTS_PER_REPLY)
        prev = pb.StateCursor()
        if cursor:
            try:
                prev.ParseFromString(cursor)
            except Exception as e:  # protobuf raises DecodeError; any parse failure is bad input
                raise Reject("invalid_argument", "cursor is not one this master returned") from e
            if len(prev.keys) != len(prev.offsets):
                raise Reject("invalid_argument", "cursor is not one this master returned")
        self.expire()
        with self._lock:
            full = not cursor or prev.run_id != self.run_id or prev.epoch != self._epoch
            sent = {} if full else dict(zip(prev.keys, prev.offsets, strict=True))
            now = self._clock()
            reply = pb.GetStateResponse(
                run_id=self.run_id,
                state=RUN_STATE_PB[self.state.value],
                world_size=self.world_size,
                registered=len(self.ranks),
                total_steps=self.total_steps or max((r.total_steps for r in self.ranks), default=0),
                elapsed=self._elapsed(now),
                failure=self.failure,
                full=full,
                root_cause_rank=self.root_cause.rank if self.root_cause is not None else -1,
                attempt=self.attempt,
                max_attempts=self.max_attempts,
                root_cause_error=self.root_cause.error if self.root_cause is not None else "",
                root_cause_exit_code=self.root_cause.exit_code if self.root_cause is not None else 0,
                rendezvous=f"{self.ranks[0].address}:{self.active_rendezvous_port()}"
                if self.ranks and self.active_rendezvous_port()
                else "",
            )
            for rec in self.ranks:
                reply.ranks.append(self._rank_info(rec, now))
            nxt = pb.StateCursor(run_id=self.run_id, epoch=self._epoch)
            # Under the lock only the plan: which points of which series. The copies (the bulk
            # of a catch-up) are made after it, so heartbeats never wait for them.
            plan: list[tuple[int, str, _Series, int, int, int]] = []
            for (rank, name), s in sorted(self._series.items()) if not skip_series else ():
                key = f"{rank}/{name}"
                first = max(sent.get(key, 0), s.base)  # absolute; points before base left memory
                last = min(s.end, first + budget)
                if last > first:
                    plan.append((rank, name, s, s.base, first, last))
                    budget -= last - first
                reply.more = reply.more or last < s.end
                nxt.keys.append(key)
                nxt.offsets.append(last)
            nxt.events = self._events_since(0 if full else max(0, prev.events), reply)
        # Appends (and the array slices here) are atomic under the GIL and never move held
        # points; a trim does, so a series trimmed meanwhile is copied again under the lock.
        built = [_points(rank, name, s, base, first, last) for rank, name, s, base, first, last in plan]
        with self._lock:
            for i, (rank, name, s, base, first, last) in enumerate(plan):
                if s.base != base:
                    built[i] = _points(rank, name, s, s.base, max(first, s.base), last)
        reply.series.extend(p for p in built if p.steps)
        reply.cursor = nxt.SerializeToString()
        return reply

    def _events_since(self, cursor: int, reply: pb.GetStateResponse) -> int:
        """Put the events from absolute index ``cursor`` on in ``reply`` (as many as one reply
        takes; ``more`` says to ask again); return the cursor after them. Events that left
        memory before the caller saw them are named by one ``events_dropped`` event."""
        if cursor < self.dropped_events:
            missed = self.dropped_events - cursor
            reply.events.append(
                pb.Event(
                    time=self.events[0].time if self.events else self._wall(),
                    kind="events_dropped",
                    rank=-1,
                    message=f"{missed} earlier events are no longer in the master's memory "
                    "(the run dir's events.jsonl keeps them all)",
                )
            )
            cursor = self.dropped_events
        size = 0
        for event in self.events[cursor - self.dropped_events :]:
            size += len(event.message) + 64
            if size > MAX_EVENT_BYTES_PER_REPLY and reply.events:
                reply.more = True
                break
            reply.events.append(event)
            cursor += 1
        return cursor

    # -- internals (lock held) -------------------------------------------------------------
    def _known(self, run_id: str, worker_id: str) -> RankRecord:
        _check_id("worker_id", worker_id)
        if not run_id:
            raise Reject(
                "failed_precondition",
                "the request carries no run_id: call Register first and use the run_id it returns",
            )
        if run_id != self.run_id:
            raise Reject(
                "failed_precondition",
                f"this master runs run {self.run_id}, not {run_id}: the worker belongs to another run",
            )
        rec = self._by_worker.get(worker_id)
        if rec is None:
            raise Reject("not_found", f"no worker {worker_id!r} is registered in run {self.run_id}")
        return rec

    def active_rendezvous_port(self) -> int:
        """The rendezvous port in use: the fixed one, or the one rank 0 bound (0: not yet)."""
        return self.rendezvous_port or (self.ranks[0].rendezvous_port if self.ranks else 0)

    def _command_for(self, rec: RankRecord) -> int:
        if self.state.failing:
            return int(pb.ABORT)
        if self.stop_requested or self.state is RunState.STOPPED:
            return int(pb.STOP)
        return int(pb.CONTINUE)

    def _end_rank(self, rec: RankRecord, outcome: RankState, *, error: str = "", weight: int = 0) -> None:
        """End one rank. A failure's ``weight`` says how well it explains the run's failure:
        0 its own error or death, 1 a collective broken by a peer, 2 torn down by the launcher.
        """
        rec.state = outcome
        rec.ended_at = self._clock()
        if error:
            rec.error = error
        if outcome in (RankState.FAILED, RankState.LOST):
            self._event("rank_failed", rec.rank, error or outcome.value)
            where = rec.host if rec.address in ("", rec.host) else f"{rec.host} at {rec.address}"
            message = (
                f"rank {rec.rank} (worker {rec.worker_id}, host {where}, pid {rec.pid}) "
                f"{'was lost' if outcome is RankState.LOST else 'failed'}: {_last_line(error)}"
            )
            if not self.state.done and not self.state.failing:
                self._fail_run(rec, message)
                self._cause_rank_of, self._failed_at = weight, rec.ended_at
            elif (
                self.state.failing
                and weight < self._cause_rank_of
                and rec.ended_at - self._failed_at <= SETTLE_SECONDS
            ):
                # A better explanation arrived just after the first report: it is the root cause.
                self.root_cause, self.failure, self._cause_rank_of = rec, message, weight
            return
        self._event("rank_" + outcome.value.lower(), rec.rank, f"at step {rec.step}")
        if self.state.done or not all(r.state.done for r in self.ranks) or len(self.ranks) < self.world_size:
            return
        if all(r.state is RankState.SUCCEEDED for r in self.ranks) and not self.stop_requested:
            self._finish(RunState.SUCCEEDED)
        else:
            self._finish(RunState.STOPPED)

    def _fail_run(self, rec: RankRecord | None, message: str) -> None:
        self.root_cause = rec
        self.failure = message
        if self.attempt < self.max_attempts and any(r.step > 0 for r in self.ranks):
            # Not final: the launcher tears the group down and starts the next attempt.
            self.state = RunState.RESTARTING
            self._event("attempt_failed", -1, f"attempt {self.attempt}: {message}")
            self._changed.notify_all()
        else:
            self._finish(RunState.FAILED)

    def give_up(self, reason: str = "") -> None:
        """No restart follows this failure: the run is FAILED, with the first attempt's root cause."""
        with self._lock:
            if self.state is RunState.RESTARTING:
                self._finish(RunState.FAILED)
            if self._first_failure is not None and self.state is RunState.FAILED:
                self.root_cause, first = self._first_failure
                self.failure = f"{first} (after {self.attempt} attempts{'; ' + reason if reason else ''})"
            elif reason and self.state is RunState.FAILED:
                self.failure = f"{self.failure} ({reason})"

    def _finish(self, state: RunState) -> None:
        self.state = state
        self.ended_at = self._clock()
        self._event("finished", -1, state.value + (f": {self.failure}" if self.failure else ""))
        self._changed.notify_all()

    def _event(self, kind: str, rank: int, message: str) -> None:
        event = pb.Event(time=self._wall(), kind=kind, rank=rank, message=message)
        self.events.append(event)
        self._event_bytes += len(message) + 64
        if len(self.events) > MAX_EVENTS_IN_MEMORY or self._event_bytes > MAX_EVENT_BYTES_IN_MEMORY:
            self._trim_events()
        if self.store is not None:
            self.store.append_event(event)
        log.debug("run %s: %s rank=%d %s", self.run_id, kind, rank, message)

    def _trim_events(self) -> None:
        """Let the oldest events leave memory, down to three quarters of both bounds."""
        drop = 0
        count, size = len(self.events), self._event_bytes
        while drop < len(self.events) - 1 and (
            count - drop > MAX_EVENTS_IN_MEMORY * 3 // 4 or size > MAX_EVENT_BYTES_IN_MEMORY * 3 // 4
        ):
            size -= len(self.events[drop].message) + 64
            drop += 1
        del self.events[:drop]
        self._event_bytes = size
        self.dropped_events += drop

    def _trim_points(self) -> None:
        """Bring the points in memory down to three quarters of the budget, from the oldest
        points of the biggest series: every series longer than one level is cut to it, so a
        flood of one series leaves the others whole."""
        excess = self.points_in_memory - self.max_points_in_memory * 3 // 4
        level = _water_level([len(s) for s in self._series.values()], excess)
        for s in self._series.values():
            if len(s) > level:
                self.points_in_memory -= len(s) - level
                s.trim(len(s) - level)

    def _elapsed(self, now: float) -> float:
        if self.started_at is None:
            return 0.0
        return (self.ended_at if self.ended_at is not None else now) - self.started_at

    def _rank_info(self, rec: RankRecord, now: float) -> pb.RankInfo:
        return pb.RankInfo(
            rank=rec.rank,
            worker_id=rec.worker_id,
            host=rec.host,
            pid=rec.pid,
            state=RANK_STATE_PB[rec.state.value],
            step=rec.step,
            total_steps=rec.total_steps,
            steps_per_sec=rec.steps_per_sec() if not rec.state.done else 0.0,
            heartbeat_age=-1.0 if rec.last_heartbeat is None else now - rec.last_heartbeat,
            loss=rec.loss,
            param_checksum=rec.param_checksum,
            error=rec.error,
            exit_code=rec.exit_code,
            dropped_points=rec.dropped_points,
            address=rec.address,
            has_loss=rec.has_loss,
        )


def _describe_exit(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "no error message"

"""The master's logic, free of gRPC: one run's parts (see :mod:`orch.master.control`) under one lock.

The gRPC servicer in :mod:`orch.master` is a thin layer over :class:`Coordinator`; the
launcher calls it directly too (a child's exit code). Every method here is short: it holds the
lock only to read and update memory (the run dir's writes and the copies of a catch-up's
points happen outside it), and it reads time from injected clocks, so it is unit-tested
without sockets or sleeps.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from orch.master.control.events import MAX_EVENTS_IN_MEMORY, EventLog
from orch.master.control.hosts import HostTable
from orch.master.control.judge import CauseKind, FailureJudge, RootCause, reported_kind
from orch.master.control.lifecycle import Lifecycle
from orch.master.control.registry import RankRecord, Registry
from orch.master.control.series import MAX_POINTS_IN_MEMORY, MAX_POINTS_PER_REPLY, SeriesLog
from orch.master.control.stragglers import Verdict, judge, scores
from orch.master.control.validate import (
    STATUS_CODE,
    Reject,
    check_completion,
    check_heartbeat,
    check_host_sync,
    check_id,
    check_register,
    check_run_id,
    parse_cursor,
)
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.limits import MAX_BEATS_PER_BATCH, MAX_ERROR_LEN
from orch.wire.states import EXIT_ABORTED, RUN_STATE_PB, RankState, RunState, describe_exit

if TYPE_CHECKING:
    from orch.record.store import RunStore

__all__ = [
    "MAX_EVENTS_IN_MEMORY",
    "MAX_POINTS_IN_MEMORY",
    "Coordinator",
    "RankRecord",
    "RankState",
    "Reject",
    "RunState",
]

log = logging.getLogger(__name__)

JUDGE_EVERY = 1.0  # seconds between straggler judgements
NOT_YET_JUDGED = Verdict(False, note="stragglers are judged once every rank runs")
STOP_LEAD_SECONDS = 2.0  # how far ahead of the ranks a stop step is set (see _stop_step)


class Coordinator:
    """Registry, barrier, metric series, events, state and root cause of one run.

    What callers can make it hold is bounded: ``max_points_in_memory`` points across all
    series, :data:`MAX_EVENTS_IN_MEMORY` events, and one ``stop_requested`` event per stop
    however often it is asked for.
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
        restart_through_hosts: bool = False,
        min_world_size: int | None = None,
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
        self.store = store
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.registry = Registry(world_size)
        self.points = SeriesLog(max_points_in_memory)
        self.event_log = EventLog()
        self.lifecycle = Lifecycle(max_attempts)
        self.judge = FailureJudge()
        self.stop_requested = False  # a stop was asked for (it carries over a restart)
        self.stop_requests = 0  # every StopRun; only the one that set the stop is an event
        self.stop_at_step = 0  # with a stop: the step count loops without ctx.steps end at
        # Across machines the host agents respawn the ranks of a restart (SyncHost); on one
        # machine the launcher does, and this is False.
        self.restart_through_hosts = restart_through_hosts
        # Elastic: a restart goes on without hosts that fell silent while this many ranks remain.
        self.min_world_size = min_world_size
        self.hosts = HostTable()
        self.job: pb.ClusterJob | None = None  # the scheduler's job the ranks run in
        self.verdict = NOT_YET_JUDGED
        self._straggler_said: tuple[int, str] = (-1, "")  # the straggler last put in the event log
        self._last_verdict: tuple[int, str] = (-1, "")  # the judgement before the last
        self._judged_at = -math.inf

    # -- what the parts hold, by the names callers use -------------------------------------
    @property
    def state(self) -> RunState:
        return self.lifecycle.state

    @property
    def attempt(self) -> int:
        return self.lifecycle.attempt

    @property
    def max_attempts(self) -> int:
        return self.lifecycle.max_attempts

    @property
    def started_at(self) -> float | None:
        return self.lifecycle.started_at

    @property
    def ended_at(self) -> float | None:
        return self.lifecycle.ended_at

    @property
    def ranks(self) -> list[RankRecord]:
        return self.registry.ranks

    @property
    def events(self) -> list[pb.Event]:
        return self.event_log.events

    @property
    def dropped_events(self) -> int:
        return self.event_log.dropped

    @property
    def points_in_memory(self) -> int:
        return self.points.points_in_memory

    @property
    def max_points_in_memory(self) -> int:
        return self.points.max_points_in_memory

    @property
    def root_cause(self) -> RankRecord | None:
        """The rank whose failure explains the run's (None: no rank, or no failure)."""
        cause = self.judge.cause
        return cause.record if cause is not None else None

    @property
    def cause(self) -> RootCause | None:
        return self.judge.cause

    @property
    def failure(self) -> str:
        cause = self.judge.cause
        return cause.describe() if cause is not None else ""

    # -- worker RPCs -------------------------------------------------------------------
    def register(self, req: pb.RegisterRequest) -> pb.RegisterResponse:
        check_register(req)
        with self._lock:
            if req.run_id:  # rank 0 registering again to say where its store listens names its run
                check_run_id(req.run_id, self.run_id)
            if self.registry.get(req.worker_id) is None and self.state.done:
                raise Reject("failed_precondition", f"run {self.run_id} is already {self.state.value}")
            rec, new = self.registry.add(req, self.run_id)
            if new:
                self._event("registered", rec.rank, f"{req.worker_id} on {req.host} pid {req.pid}")
                if self.registry.full:
                    self.lifecycle.to(RunState.RUNNING, self._clock())
                    self._event("started", -1, f"all {self.world_size} ranks registered")
            return pb.RegisterResponse(
                rank=rec.rank,
                world_size=self.world_size,
                run_id=self.run_id,
                fn=self.fn,
                config_json=self.config_json,
                total_steps=self.total_steps,
                heartbeat_timeout=self.heartbeat_timeout,
                attempt=self.attempt,
                rendezvous_port=self.rendezvous_port,
            )

    def can_start(self, req: pb.CanStartTrainingRequest) -> pb.CanStartTrainingResponse:
        with self._lock:
            rec = self._known(req.run_id, req.worker_id)
            return self.registry.barrier(
                rec,
                open_=self.state in (RunState.RUNNING, RunState.STOPPING),
                fixed_port=self.rendezvous_port,
                backend=self.backend,
                now=self._clock(),
            )

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
        check_heartbeat(req)
        with self._lock:
            return self._accept(req)

    def accept_heartbeats(
        self, beats: Sequence[pb.HeartbeatRequest]
    ) -> tuple[list[pb.BeatReply], Callable[[], None] | None]:
        """A host agent's batch: each beat as :meth:`accept_heartbeat` takes it, under one
        lock. A refused beat gets its refusal in its reply; the others go on. Returns the
        replies, in order, and one run dir write for all the batch's points."""
        if len(beats) > MAX_BEATS_PER_BATCH:
            raise Reject(
                "invalid_argument",
                f"a batch carries {len(beats)} heartbeats; the limit is {MAX_BEATS_PER_BATCH}",
            )
        checked: list[Reject | None] = []
        for req in beats:
            try:
                check_heartbeat(req)
                checked.append(None)
            except Reject as e:
                checked.append(e)
        replies, writes = [], []
        with self._lock:
            for req, refused in zip(beats, checked, strict=True):
                if refused is None:
                    try:
                        command, write = self._accept(req)
                    except Reject as e:
                        refused = e
                if refused is not None:
                    replies.append(pb.BeatReply(code=STATUS_CODE[refused.kind], error=str(refused)))
                    continue
                if write is not None:
                    writes.append(write)
                stop_at = self.stop_at_step if command == pb.STOP else 0
                reply = pb.HeartbeatResponse(command=command, stop_at_step=stop_at)  # type: ignore[arg-type]
                replies.append(pb.BeatReply(reply=reply))
        return replies, (functools.partial(_run_all, writes) if writes else None)

    def _accept(self, req: pb.HeartbeatRequest) -> tuple[int, Callable[[], None] | None]:
        rec = self._known(req.run_id, req.worker_id)
        if rec.state is RankState.REGISTERED:
            raise Reject(
                "failed_precondition",
                f"worker {req.worker_id} sent a heartbeat before the start barrier opened: "
                "poll CanStartTraining until ready first",
            )
        self.points.check_names(rec.rank, req.series)
        now = self._clock()
        rec.beat(now, req.step, req.total_steps, req.dropped_points)
        if req.HasField("timing"):
            rec.timing.add(now, req.timing)
        loss = self.points.add(rec.rank, req.series, self.attempt, self._wall())
        if loss is not None:
            rec.loss, rec.has_loss = loss, True
        write = None
        if self.store is not None and req.series:
            write = functools.partial(self.store.append_points, rec.rank, self.attempt, req.series)
        self._changed.notify_all()
        return self._command_for(rec), write

    def complete(self, req: pb.CompletionRequest) -> None:
        outcome = check_completion(req)
        with self._lock:
            rec = self._known(req.run_id, req.worker_id)
            if rec.state.done:
                return  # a retried report, or a rank already declared failed: keep the first
            rec.step = max(rec.step, req.step)
            rec.param_checksum = req.param_checksum
            error = req.error[:MAX_ERROR_LEN]
            kind = reported_kind(error)
            if req.exit_code:  # its host agent saw the process die
                rec.exit_code = req.exit_code
                kind = CauseKind.TORN_DOWN if req.exit_code == EXIT_ABORTED else CauseKind.EXITED
            self._end_rank(rec, outcome, error=error, kind=kind)

    # -- launcher and tools --------------------------------------------------------------
    def rank_exited(self, worker_id: str, exit_code: int, detail: str = "", expected: bool = False) -> None:
        """The launcher saw a worker process exit with ``exit_code`` (negative: signal).

        ``detail`` is what the process left behind (its error file or the end of its log);
        ``expected`` says the launcher ended it itself (tearing the group down).
        """
        with self._lock:
            rec = self.registry.get(worker_id)
            if rec is None:
                if exit_code != 0 and not self.state.done:
                    what = f"worker {worker_id} exited with {describe_exit(exit_code)} before it registered"
                    self._fail_run(RootCause(CauseKind.OUTSIDE, what))
                return
            rec.exit_code = exit_code
            if rec.state.done:
                return
            what = describe_exit(exit_code)
            if exit_code == 0:
                what += " without reporting completion"
            error = f"process exited with {what}"
            kind = CauseKind.TORN_DOWN if expected or exit_code == EXIT_ABORTED else CauseKind.EXITED
            self._end_rank(
                rec, RankState.FAILED, error=f"{detail.rstrip()}\n{error}" if detail else error, kind=kind
            )

    def rank_reported(self, worker_id: str) -> bool:
        """True when the worker's rank reported its end (or its process exited), unlike a LOST one."""
        with self._lock:
            return self.registry.reported(worker_id)

    def request_stop(self, reason: str = "") -> RunState:
        """Ask the ranks to stop. Only the request that sets the stop is an event; the ones
        after it (a user clicking Stop again, a script in a loop) are only counted."""
        with self._lock:
            self.stop_requests += 1
            if self.state.done or self.stop_requested:
                return self.state
            self._event("stop_requested", -1, reason or "stop requested")
            self.stop_requested = True
            if self.state is RunState.PENDING:
                self._finish(RunState.STOPPED)
            elif self.state is RunState.RUNNING:
                self.lifecycle.to(RunState.STOPPING, self._clock())
                self.stop_at_step = self._stop_step()
                self._changed.notify_all()
            return self.state  # RESTARTING: the launcher ends the run instead of restarting it

    def _stop_step(self) -> int:
        """Where loops without ``ctx.steps`` end: one step count for every rank, far enough
        ahead (``STOP_LEAD_SECONDS`` of the fastest rank's steps) that each rank hears of it
        before it gets there, so all leave their DDP collectives at the same step."""
        ahead = max((r.steps_per_second() for r in self.ranks), default=0.0) * STOP_LEAD_SECONDS
        return max((r.step for r in self.ranks), default=0) + max(2, math.ceil(ahead))

    def restart_refusal(self) -> str | None:
        """Why a failure of this attempt does not restart the group (None: it does). The
        one place of the restart rule; ``""`` when there is nothing to say (no restarts asked)."""
        with self._lock:
            return self._restart_refusal()

    def _restart_refusal(self) -> str | None:
        if not self.lifecycle.restarts_left:
            return "no restarts left" if self.max_attempts > 1 else ""
        if not any(r.step > 0 for r in self.ranks):
            return "it failed during start-up, before any step: not restarted"
        return None

    def restart(self) -> int:
        """Open a new attempt after a failure: the ranks re-register, the series go on.

        Returns the new attempt number. Only a RESTARTING run restarts.
        """
        with self._lock:
            if self.state is not RunState.RESTARTING:
                raise Reject("failed_precondition", "only a failed run with restarts left can restart")
            return self._restart()

    def _restart(self) -> int:
        self.judge.new_attempt()
        self.verdict = NOT_YET_JUDGED
        self._straggler_said = self._last_verdict = (-1, "")
        self.registry = Registry(self.world_size)
        self.stop_at_step = 0
        self.lifecycle.to(RunState.PENDING, self._clock())
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
                self.judge.outside(message)
                self._finish(RunState.FAILED)

    def fail(self, message: str, detail: str = "") -> None:
        """Fail the run from outside, for good (the launcher gave up on it); ``detail`` is
        shown as the root cause's traceback (a job's output)."""
        with self._lock:
            if not self.state.done:
                self.judge.outside(message, detail)
                self._finish(RunState.FAILED)

    def give_up(self, reason: str = "") -> None:
        """No restart follows this failure: the run is FAILED, with the first attempt's root cause."""
        with self._lock:
            if self.state is RunState.RESTARTING:
                self._give_up(reason)
            elif self.state is RunState.FAILED:
                self.judge.final(self.attempt, reason)

    def expire(self) -> None:
        """Mark ranks whose heartbeats stopped as LOST (and so the run FAILED), and move a
        restart across hosts on (see :meth:`sync_host`)."""
        with self._lock:
            now = self._clock()
            self._settle_hosts(now)
            self._judge_stragglers(now)
            lost = self.registry.silent(now, self.heartbeat_timeout)
            for rec in lost:
                assert rec.last_heartbeat is not None
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
                    kind=CauseKind.LOST,
                )
            if lost:
                # They fell silent within a heartbeat interval of each other, so the expiry that
                # finds the first may come just before the others'.
                self.judge.lost_together(lost, self.heartbeat_timeout / 2)

    # -- host agents and the scheduler's job ----------------------------------------------
    def sync_host(self, req: pb.HostSyncRequest) -> pb.HostSyncResponse:
        """A host agent's word: which ranks it started for which attempt, and whether they
        run. The answer says to go on, to start the ranks of the current attempt, to wait (a
        restart is under way) or to exit (the run ended)."""
        check_host_sync(req, self.world_size)
        with self._lock:
            if req.attempt > self.attempt:
                raise Reject(
                    "failed_precondition",
                    f"host {req.host} speaks of attempt {req.attempt}; the run is at {self.attempt}",
                )
            if req.host not in self.hosts.hosts and len(self.hosts.hosts) >= self.world_size:
                # Every host runs a rank at least: more hosts than ranks is not a run's.
                raise Reject(
                    "resource_exhausted",
                    f"{len(self.hosts.hosts)} hosts already joined a run of {self.world_size} ranks",
                )
            now = self._clock()
            rec = self.hosts.seen(req.host, now, req.attempt, req.running, list(req.worker_ids))
            if req.failure and req.attempt == self.attempt and not self.state.done and not self.state.failing:
                self._fail_run(
                    RootCause(CauseKind.OUTSIDE, f"host {rec.name}: {req.failure[:MAX_ERROR_LEN]}")
                )
            self._settle_hosts(now)
            reply = pb.HostSyncResponse(
                attempt=self.attempt,
                run_id=self.run_id,
                restarts=self.restart_through_hosts and self.max_attempts > 1,
                heartbeat_timeout=self.heartbeat_timeout,
                state=RUN_STATE_PB[self.state.value],
            )
            if self.state.done or self.hosts.dropped(req.host):
                reply.action = pb.HOST_EXIT
            elif self.state is RunState.RESTARTING:
                reply.action = pb.HOST_WAIT
            elif rec.attempt < self.attempt and not rec.running:
                reply.action = pb.HOST_START
            else:
                reply.action = pb.HOST_CONTINUE
            return reply

    def _settle_hosts(self, now: float) -> None:
        """Move a restart across hosts on: once the failed attempt's ranks ended on every
        host, open the next attempt (the agents start their ranks when they next call); give
        up when a host fell silent or a rank has no agent to start it again."""
        if self.state is not RunState.RESTARTING or not self.restart_through_hosts:
            return
        silent = self.hosts.silent(self.attempt, now, self.heartbeat_timeout)
        if self.stop_requested:  # no next attempt: wait only for the hosts that still answer
            if any(h not in silent for h in self.hosts.busy(self.attempt)):
                return
            self._event("closed", -1, "stopped while restarting: the next attempt was not started")
            self._finish(RunState.STOPPED)
            return
        if silent:
            said = (
                f"host {self.hosts.names(silent)} fell silent, no word from its agent for more than "
                f"{self.heartbeat_timeout:g}s"
            )
            left = sum(len(h.worker_ids) for h in self.hosts.of_attempt(self.attempt) if h not in silent)
            if self.min_world_size is None or left < self.min_world_size:
                floor = f" (the {left} ranks left are fewer than min_world_size {self.min_world_size})"
                self._give_up(
                    f"{said}: the group cannot restart without it{floor if self.min_world_size else ''}"
                )
                return
            # Elastic: the next attempt runs on the hosts that are left.
            self.hosts.drop(silent)
            self._event("resized", -1, f"{said}: the next attempt runs on the {left} ranks left")
            self.world_size = left
        if self.hosts.busy(self.attempt):
            return  # ranks of the failed attempt still run somewhere: they are being torn down
        managed = self.hosts.managed(self.attempt)
        orphans = [r for r in self.ranks if r.worker_id not in managed | self.hosts.gone_workers]
        if orphans:
            named = ", ".join(f"rank {r.rank} (worker {r.worker_id} on {r.host})" for r in orphans[:4])
            self._give_up(
                f"{named} {'was' if len(orphans) == 1 else 'were'} not started by a host agent "
                "(orch worker --nproc-per-node): nothing would start it again"
            )
            return
        refusal = self._restart_refusal()
        if refusal is not None:
            self._give_up(refusal)
            return
        self._restart()

    def _judge_stragglers(self, now: float) -> None:
        """Judge which rank holds the others back (see :mod:`orch.master.control.stragglers`), at most
        once a second, while every rank trains; show each rank's step split. A straggler is
        shown once two judgements in a row agree, and a new one goes into the event log."""
        if self.state not in (RunState.RUNNING, RunState.STOPPING) or now - self._judged_at < JUDGE_EVERY:
            return
        if any(r.state.done for r in self.ranks):
            return  # ranks are ending: the last judgement stands
        self._judged_at = now
        running = self.ranks
        for r in running:
            r.timing.trim(now)
        means = {r.rank: r.timing.means() for r in running}
        verdict = judge(means, self.world_size)
        seen, self._last_verdict = self._last_verdict, verdict.key
        if verdict.key != self.verdict.key and verdict.key != seen:
            verdict = self.verdict  # one judgement alone does not move the mark
        self.verdict = verdict
        scored = scores(means, {r.rank: r.timing for r in running})
        for r in running:
            m = means[r.rank]
            r.timed = m is not None
            if m is not None:
                r.step_ms, r.data_ms, r.compute_ms = m.step * 1000, m.data * 1000, m.compute * 1000
                r.collective_ms, r.other_ms = m.collective * 1000, m.other * 1000
                r.relative_score, r.individual_score = scored.get(r.rank, (0.0, 0.0))
            r.slow_in = self.verdict.section if r.rank == self.verdict.rank else ""
        if self.verdict.rank >= 0 and self.verdict.key != self._straggler_said:
            self._straggler_said = self.verdict.key  # each straggler (and part) is told once
            self._event("straggler", self.verdict.rank, self.verdict.note)

    def _give_up(self, reason: str) -> None:
        self._finish(RunState.FAILED)
        self.judge.final(self.attempt, reason)

    def set_job(self, job: pb.ClusterJob) -> None:
        """What the scheduler last said of the run's job; a change is an event."""
        with self._lock:
            before = self.job
            self.job = job
            said = (job.state, job.reason, job.nodes)
            if before is None or (before.state, before.reason, before.nodes) != said:
                where = f" on {job.nodes}" if job.nodes else ""
                why = f" ({job.reason})" if job.reason and job.reason != "None" else ""
                self._event("job", -1, f"{job.scheduler} job {job.job_id} {job.state}{why}{where}")
                self._changed.notify_all()

    def wait_changed(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def active_rendezvous_port(self) -> int:
        """The rendezvous port in use: the fixed one, or the one rank 0 bound (0: not yet)."""
        return self.registry.rendezvous_port(self.rendezvous_port)

    # -- reading ---------------------------------------------------------------------------
    def series(self, rank: int, name: str) -> tuple[list[int], list[float]]:
        """The points of one series still held in memory."""
        with self._lock:
            s = self.points.get(rank, name)
            return list(s.steps), list(s.values)

    @property
    def trimmed(self) -> bool:
        """True when some points are only in the run dir's metrics log, no longer in memory."""
        with self._lock:
            return self.points.trimmed

    def snapshot(
        self, cursor: bytes = b"", *, skip_series: bool = False, max_points: int = 0
    ) -> pb.GetStateResponse:
        """The run's state, with only the points and events after ``cursor``.

        At most ``max_points`` points (default and ceiling :data:`MAX_POINTS_PER_REPLY`) go in
        one reply; ``more`` then says to ask again with its cursor. ``skip_series``: no points.
        """
        prev = parse_cursor(cursor, max_points)
        budget = min(max_points or MAX_POINTS_PER_REPLY, MAX_POINTS_PER_REPLY)
        self.expire()
        with self._lock:
            full = not cursor or prev.run_id != self.run_id or prev.epoch != self.points.epoch
            sent = {} if full else dict(zip(prev.keys, prev.offsets, strict=True))
            now = self._clock()
            cause = self.judge.cause
            root = cause.record if cause is not None else None
            port = self.active_rendezvous_port()
            reply = pb.GetStateResponse(
                run_id=self.run_id,
                state=RUN_STATE_PB[self.state.value],
                world_size=self.world_size,
                registered=len(self.ranks),
                total_steps=self.total_steps or max((r.total_steps for r in self.ranks), default=0),
                elapsed=self.lifecycle.elapsed(now),
                failure=self.failure,
                full=full,
                root_cause_rank=root.rank if root is not None else -1,
                attempt=self.attempt,
                max_attempts=self.max_attempts,
                root_cause_error=root.error if root is not None else "",
                root_cause_exit_code=root.exit_code if root is not None else 0,
                rendezvous=f"{rank0.address}:{port}" if (rank0 := self.registry.rank0) and port else "",
            )
            if self.job is not None:
                reply.job.CopyFrom(self.job)
            v = self.verdict
            reply.stragglers_judged, reply.straggler_rank = v.judged, v.rank
            reply.straggler_section, reply.straggler_note = v.section, v.note
            # An ended run's ages stand still at its end (a finished rank beats no more).
            at = self.ended_at if self.ended_at is not None else now
            reply.ranks.extend(rec.published(at) for rec in self.ranks)
            nxt = pb.StateCursor(run_id=self.run_id, epoch=self.points.epoch)
            # Under the lock only the plan: which points of which series. The copies (the bulk
            # of a catch-up) are made after it, so heartbeats never wait for them.
            plan, more = ([], False) if skip_series else self.points.plan(sent, budget, nxt)
            nxt.events = self.event_log.since(0 if full else max(0, prev.events), reply, self._wall())
            reply.more = reply.more or more
        built = SeriesLog.copy(plan)
        if any(sl.series.base != sl.base for sl in plan):
            with self._lock:
                SeriesLog.recopy_trimmed(plan, built)
        reply.series.extend(p for p in built if p.steps)
        reply.cursor = nxt.SerializeToString()
        return reply

    # -- internals (lock held) -------------------------------------------------------------
    def _known(self, run_id: str, worker_id: str) -> RankRecord:
        check_id("worker_id", worker_id)
        check_run_id(run_id, self.run_id)
        return self.registry.known(worker_id, self.run_id)

    def _command_for(self, rec: RankRecord) -> int:
        if self.state.failing:
            return int(pb.ABORT)
        if self.stop_requested or self.state in (RunState.STOPPING, RunState.STOPPED):
            return int(pb.STOP)
        return int(pb.CONTINUE)

    def _end_rank(self, rec: RankRecord, outcome: RankState, *, error: str = "", kind: CauseKind) -> None:
        """End one rank; a failure's ``kind`` says how well it explains the run's failure."""
        rec.state = outcome
        rec.ended_at = now = self._clock()
        if error:
            rec.error = error
        if outcome in (RankState.FAILED, RankState.LOST):
            self._event("rank_failed", rec.rank, error or outcome.value)
            where = rec.host if rec.address in ("", rec.host) else f"{rec.host} at {rec.address}"
            cause = RootCause(
                kind,
                f"rank {rec.rank} (worker {rec.worker_id}, host {where}, pid {rec.pid}) "
                f"{'was lost' if outcome is RankState.LOST else 'failed'}: {_last_line(error)}",
                rec,
            )
            if not self.state.done and not self.state.failing:
                self._fail_run(cause)
            elif self.state.failing and self.judge.later_failure(cause, now):
                # The record of the failure, already written, named another rank: say so.
                self._event("root_cause", rec.rank, f"the root cause is {self.failure}")
            return
        self._event("rank_" + outcome.value.lower(), rec.rank, f"at step {rec.step}")
        if self.state.done or not all(r.state.done for r in self.ranks) or not self.registry.full:
            return
        if all(r.state is RankState.SUCCEEDED for r in self.ranks) and not self.stop_requested:
            self._finish(RunState.SUCCEEDED)
        else:
            self._finish(RunState.STOPPED)

    def _fail_run(self, cause: RootCause) -> None:
        self.judge.first_failure(cause, self._clock())
        if self.state is RunState.RUNNING and self._restart_refusal() is None:
            # Not final: the launcher tears the group down and starts the next attempt.
            self.lifecycle.to(RunState.RESTARTING, self._clock())
            self._event("attempt_failed", -1, f"attempt {self.attempt}: {self.failure}")
            self._changed.notify_all()
        else:
            self._finish(RunState.FAILED)

    def _finish(self, state: RunState) -> None:
        self.lifecycle.to(state, self._clock())
        self._event("finished", -1, state.value + (f": {self.failure}" if self.failure else ""))
        self._changed.notify_all()

    def _event(self, kind: str, rank: int, message: str) -> None:
        event = pb.Event(time=self._wall(), kind=kind, rank=rank, message=message)
        self.event_log.append(event)
        if self.store is not None:
            self.store.append_event(event)
        log.debug("run %s: %s rank=%d %s", self.run_id, kind, rank, message)


def _run_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "no error message"

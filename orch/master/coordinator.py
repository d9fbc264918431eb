"""The master's logic, free of gRPC: one run's parts (see :mod:`orch.master.control`) under one lock.

The gRPC servicer in :mod:`orch.master` is a thin layer over :class:`Coordinator`; the
launcher calls it directly too (a child's exit code), and host agents, the scheduler's job
and the stacks go through it as well. The coordinator owns its parts and only joins them:
each method checks the request once, takes the one lock, reads the time from the injected
clocks and hands both to the parts by name, which hold no lock and read no clock of their
own. It holds the lock only to read and update memory (the run dir's writes and the copies
of a catch-up's points happen outside it), so it is unit-tested without sockets or sleeps.
What it was told to hold the run to is one :class:`~orch.master.control.plan.RunPlan`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from orch.master.control.cluster_job import JobWatch
from orch.master.control.events import EventLog
from orch.master.control.fate import Fate
from orch.master.control.host_sync import HostSync
from orch.master.control.hosts import HostTable
from orch.master.control.intake import Intake
from orch.master.control.memory_watch import MemoryWatch
from orch.master.control.pace import beat_interval, sync_interval
from orch.master.control.plan import RunPlan
from orch.master.control.progress import ProgressWatch
from orch.master.control.published import Published
from orch.master.control.registry import RankRecord, Registry
from orch.master.control.series import SeriesLog, yield_gil
from orch.master.control.snapshot import StateDraft, draft_reply
from orch.master.control.startup import StartupWatch
from orch.master.control.straggler_watch import StragglerWatch
from orch.master.control.validate import (
    STATUS_CODE,
    Reject,
    check_completion,
    check_heartbeat,
    check_heartbeats,
    check_host_sync,
    check_register,
    parse_cursor,
)
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import COMMANDS, HOST_ACTIONS, decode, encode, metric_record
from orch.wire.limits import MAX_SECTIONS, MORE_SECTIONS
from orch.wire.model import Beat, Command, Completion, Event, HostReport, JobView, Registration
from orch.wire.states import BARRIER_CLOSED, RUN_STATE_PB, RankState, RunState

if TYPE_CHECKING:
    from orch.record.store import RunStore

__all__ = ["Coordinator"]

log = logging.getLogger(__name__)
# Seconds a look at the run may come late before the master counts itself stalled (see
# watch_stalls): under load it comes a beat or so late; in a process whose GIL a C call holds,
# as late as the call is long.
STALL_SECONDS = 2.0
STALL_TOLD = 5.0  # seconds of a stall of the master's that its run's events tell (see stalled)
MEANS_AT_ONCE = 256  # ranks whose step times are read under one hold of the lock (see expire)


class Coordinator:
    """Registry, barrier, metric series, events, state and root cause of one run.

    What callers can make it hold is bounded: ``plan.max_points_in_memory`` points across all
    series, :data:`MAX_EVENTS_IN_MEMORY` events, and one ``stop_requested`` event per stop
    however often it is asked for. Its parts: ``fate`` (the state machine, the root cause, the
    stop and the restart rule), ``intake`` (the ranks of the attempt and the series),
    ``host_sync`` and ``cluster_job`` (host agents, the scheduler's job), ``progress``,
    ``memory``, ``stragglers`` and ``startup`` (the run's health), ``event_log`` and
    ``published`` (what readers are served).
    """

    def __init__(
        self,
        plan: RunPlan,
        *,
        run_id: str | None = None,
        rendezvous_port: int = 0,
        store: RunStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.plan = plan
        self.world_size = plan.world_size  # an elastic restart may go on with fewer
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.rendezvous_port = rendezvous_port  # fixed by the launcher, or 0: the one rank 0 binds
        self.rendezvous_file = False  # the ranks meet through a file store (one host): no port
        self.store = store
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._stall_watch: tuple[float, float] | None = None  # see watch_stalls
        self._changed = threading.Condition(self._lock)
        self.intake = Intake(plan.world_size, plan.max_points_in_memory)
        self.event_log = EventLog()
        self.published = Published()
        self.fate = Fate(plan.max_attempts, self._event, self._changed.notify_all, created_at=clock())
        self.host_sync = HostSync(plan.restart_through_hosts, plan.min_world_size)
        self.cluster_job = JobWatch()
        self.stragglers = StragglerWatch()
        self.progress = ProgressWatch(
            plan.hang_timeout, plan.startup_timeout, plan.on_hang, plan.heartbeat_interval
        )
        self.beat_interval = plan.heartbeat_interval  # what the ranks are asked for (see control.pace)
        # A sweep's rungs (steps) where ctx.steps waits for its decision, and the last one it passed.
        self.gates: list[int] = []
        self.gate_passed = 0
        self.memory = MemoryWatch()
        self.startup = StartupWatch(clock())

    # -- the run, as callers read it (no lock: a consistent view is ``snapshot``'s) ---------------
    @property
    def state(self) -> RunState:
        return self.fate.lifecycle.state

    @property
    def attempt(self) -> int:
        return self.fate.lifecycle.attempt

    @property
    def max_attempts(self) -> int:
        return self.fate.lifecycle.max_attempts

    @property
    def started_at(self) -> float | None:
        return self.fate.lifecycle.started_at

    @property
    def ended_at(self) -> float | None:
        return self.fate.lifecycle.ended_at

    @property
    def failure(self) -> str:
        return self.fate.failure

    @property
    def root_cause(self) -> RankRecord | None:
        """The rank whose failure explains the run's (None: no rank, or no failure)."""
        cause = self.fate.judge.cause
        return cause.record if cause is not None else None

    @property
    def stop_requested(self) -> bool:
        """A stop was asked for (it carries over a restart)."""
        return self.fate.stop.requested

    @property
    def stop_requests(self) -> int:
        """Every StopRun; only the one that set the stop is an event."""
        return self.fate.stop.requests

    @property
    def stop_at_step(self) -> int:
        """With a stop: the step count loops without ctx.steps end at (0: none)."""
        return self.fate.stop.at_step

    @property
    def registry(self) -> Registry:
        """The ranks of the current attempt (a new registry each attempt)."""
        return self.intake.registry

    @property
    def ranks(self) -> list[RankRecord]:
        return self.intake.registry.ranks

    @property
    def points(self) -> SeriesLog:
        return self.intake.points

    @property
    def events(self) -> list[Event]:
        return self.event_log.events

    @property
    def dropped_events(self) -> int:
        return self.event_log.dropped

    @property
    def hosts(self) -> HostTable:
        return self.host_sync.hosts

    @property
    def min_world_size(self) -> int | None:
        """Elastic: a restart goes on without hosts that fell silent while this many ranks remain."""
        return self.host_sync.min_world_size

    @min_world_size.setter
    def min_world_size(self, value: int | None) -> None:
        self.host_sync.min_world_size = value

    def active_rendezvous_port(self) -> int:
        """The rendezvous port in use: the fixed one, or the one rank 0 bound (0: not yet)."""
        return self.intake.registry.rendezvous_port(self.rendezvous_port)

    # -- worker RPCs -------------------------------------------------------------------
    def register(self, req: pb.RegisterRequest) -> pb.RegisterResponse:
        check_register(req)
        reg = decode(Registration, req)
        with self._lock:
            rec, new = self.intake.register(reg, self.run_id, self.state)
            if new:
                self._event("registered", rec.rank, f"{req.worker_id} on {req.host} pid {req.pid}")
                if self.registry.full:
                    self.fate.start(self.world_size, self._clock())
            return pb.RegisterResponse(
                rank=rec.rank,
                world_size=self.world_size,
                run_id=self.run_id,
                fn=self.plan.fn,
                config_json=self.plan.config_json,
                total_steps=self.plan.total_steps,
                heartbeat_timeout=self.plan.heartbeat_timeout,
                attempt=self.attempt,
                rendezvous_port=self.rendezvous_port,
                seed=self.plan.seed,
            )

    def can_start(self, req: pb.CanStartTrainingRequest) -> pb.CanStartTrainingResponse:
        with self._lock:
            rec = self.intake.known(req.run_id, req.worker_id, self.run_id)
            if self.state.done:
                # A rank that failed before this one came to the barrier: it will never open.
                raise Reject("failed_precondition", f"{BARRIER_CLOSED} ({self.state.value})")
            barrier = self.registry.barrier(
                rec,
                open_=self.state in (RunState.RUNNING, RunState.STOPPING),
                fixed_port=self.rendezvous_port,
                file_store=self.rendezvous_file,
                backend=self.plan.backend,
                now=self._clock(),
            )
        return encode(barrier)

    def accept_heartbeat(
        self, req: pb.HeartbeatRequest
    ) -> tuple[pb.HeartbeatResponse, Callable[[], None] | None]:
        """Record progress and points in memory; return the reply and the run dir's write.

        The write (None when there is nothing to write) must finish before the heartbeat is
        acknowledged, so that an acknowledged point is on disk; the gRPC master runs it on
        its writer thread, off its event loop and outside this coordinator's lock.
        """
        try:
            check_heartbeat(req)
        except Reject as e:
            with self._lock:
                self.intake.refused((req.run_id, req.worker_id), self.run_id, e, self._clock())
            raise
        beat, wire = _decoded(req)
        with self._lock:
            return self._accept(beat, req.series, wire)

    def _accept(
        self, beat: Beat, sent: Sequence[pb.Series], wire: list[bytes]
    ) -> tuple[pb.HeartbeatResponse, Callable[[], None] | None]:
        """One beat, checked and decoded (``sent``: its series as they came, for the run dir's
        log; ``wire``: each serialized, for the replies)."""
        now = self._clock()
        try:
            rec = self.intake.beat(beat, self.run_id, self.attempt, now, self._wall(), wire)
        except Reject as e:
            self.intake.refused((beat.run_id, beat.worker_id), self.run_id, e, now)
            raise
        if beat.stack is not None:
            rec.take_stack(beat.stack, now)
        if beat.note and beat.note != rec.note:
            rec.note = beat.note  # a warning of its code's (a library sees another world size)
            self._event("warning", rec.rank, f"rank {rec.rank}: {beat.note}")
        if beat.timing is not None and MORE_SECTIONS in beat.timing.sections and not rec.many_sections:
            rec.many_sections = True  # told once per rank: the straggler note names the bucket
            self._event(
                "sections",
                rec.rank,
                f"rank {rec.rank} marked more than {MAX_SECTIONS - 1} ctx.section names: the rest are "
                f"timed together as {MORE_SECTIONS!r}",
            )
        write = None
        if self.store is not None and sent and not rec.resent:
            write = functools.partial(_append_points, self.store, rec.rank, self.attempt, sent)
        self._changed.notify_all()
        command = self.fate.command(rec)
        reply = pb.HeartbeatResponse(command=COMMANDS[command], send_stack=rec.stack_wanted)
        if self.beat_interval > self.plan.heartbeat_interval:
            reply.interval = self.beat_interval
        if command is Command.CONTINUE and self.gates:
            reply.hold_after_step = next((g for g in self.gates if g > self.gate_passed), 0)
        if command is Command.STOP:
            reply.stop_at_step = self.stop_at_step
        elif command is Command.ABORT:
            reply.reason = self.fate.abort_reason(rec)
        return reply, write

    def complete(self, req: pb.CompletionRequest) -> None:
        outcome = check_completion(req)
        done = decode(Completion, req)
        with self._lock:
            rec = self.intake.known(done.run_id, done.worker_id, self.run_id)
            self.fate.completed(rec, done, outcome, self.registry, self._clock())

    # -- launcher and tools --------------------------------------------------------------
    def rank_exited(
        self,
        worker_id: str,
        exit_code: int,
        detail: str = "",
        expected: bool = False,
        cause: str = "",
        oom_killed: bool = False,
    ) -> None:
        """The launcher saw a worker process exit with ``exit_code`` (negative: signal).

        ``detail`` is what the process left behind (its error file or the end of its log);
        ``expected`` says the launcher ended it itself (tearing the group down); ``cause`` is
        one line of ``detail`` that explains the exit (a native library's last words);
        ``oom_killed`` that the worker's cgroup counted an out-of-memory kill since it started.
        """
        with self._lock:
            self.fate.exited(
                worker_id,
                exit_code,
                detail,
                expected,
                self.registry,
                self._clock(),
                cause,
                oom_killed=oom_killed,
            )

    def rank_reported(self, worker_id: str) -> bool:
        """True when the worker's rank reported its end (or its process exited), unlike a LOST one."""
        with self._lock:
            return self.registry.reported(worker_id)

    def hold_at(self, steps: list[int], passed: int = 0) -> None:
        """A sweep's rungs: ``ctx.steps`` waits after each of these steps (past ``passed``) until
        :meth:`pass_gate` or a stop says how to go on, so that a pruned trial ends at its rung."""
        with self._lock:
            self.gates, self.gate_passed = sorted(steps), passed

    def pass_gate(self, step: int) -> None:
        """The sweep let the trial go on past its rung at ``step``."""
        with self._lock:
            self.gate_passed = max(self.gate_passed, step)

    def request_stop(self, reason: str = "", *, prune: bool = False) -> RunState:
        """Ask the ranks to stop. Only the request that sets the stop is an event; the ones
        after it (a user clicking Stop again, a script in a loop) are only counted. A stop
        with ``prune`` (a sweep's pruner's) ends the run PRUNED instead of STOPPED."""
        with self._lock:
            gate = next((g for g in self.gates if g > self.gate_passed), 0)
            return self.fate.request_stop(reason, self.registry, self._clock(), prune=prune, gate=gate)

    def restart_refusal(self) -> str | None:
        """Why a failure of this attempt does not restart the group (None: it does). The
        one place of the restart rule; ``""`` when there is nothing to say (no restarts asked)."""
        with self._lock:
            return self.fate.refusal(self.registry)

    def restart(self) -> int:
        """Open a new attempt after a failure: the ranks re-register, the series go on.

        Returns the new attempt number. Only a RESTARTING run restarts.
        """
        with self._lock:
            if self.state is not RunState.RESTARTING:
                raise Reject("failed_precondition", "only a failed run with restarts left can restart")
            return self._restart(self._clock())

    def _restart(self, now: float) -> int:
        self.stragglers.new_attempt()
        self.progress.new_attempt()
        self.intake.new_attempt(self.world_size)
        self.startup.set_phase("", now, new_attempt=True)
        return self.fate.new_attempt(now)

    def close_run(self, message: str) -> None:
        """End a live run from outside: STOPPED when a stop was asked for, else FAILED."""
        with self._lock:
            self.fate.close(message, self._clock(), self.registry)

    def fail(self, message: str, detail: str = "") -> None:
        """Fail the run from outside, for good (the launcher gave up on it); ``detail`` is
        shown as the root cause's traceback (a job's output)."""
        with self._lock:
            self.fate.fail_outside(message, detail, self._clock())

    def give_up(self, reason: str = "") -> None:
        """No restart follows this failure: the run is FAILED, with the first attempt's root cause."""
        with self._lock:
            self.fate.give_up(reason, self._clock())

    def watch_stalls(self, interval: float) -> None:
        """The master's server looks at the run (:meth:`expire`) every ``interval`` seconds: a
        look that comes more than :data:`STALL_SECONDS` late, whoever makes it (the server's
        loop, a panel's poll), finds the master's process was stalled, and says so first
        (:meth:`stalled`), before any rank is judged silent."""
        with self._lock:
            self._stall_watch = (interval, time.monotonic())

    def _stall_check(self) -> None:
        if self._stall_watch is None:
            return
        interval, last = self._stall_watch
        now = time.monotonic()
        self._stall_watch = (interval, now)
        lag = now - last - interval
        if lag > STALL_SECONDS:
            self._stalled(lag)

    def stalled(self, seconds: float) -> None:
        """The master could not run for ``seconds`` (its process was busy or suspended): what
        its ranks sent meanwhile waited unread, so their silence and their standing still over
        that while count for nothing: their last beat and step move on by it. Said once in the
        run's events when it is long enough to have mattered."""
        with self._lock:
            self._stalled(seconds)

    def _stalled(self, seconds: float) -> None:
        now = self._clock()
        for rec in self.ranks:
            if rec.last_heartbeat is not None:
                rec.last_heartbeat = min(now, rec.last_heartbeat + seconds)
            if rec.moved_at is not None:
                rec.moved_at = min(now, rec.moved_at + seconds)
        if seconds >= STALL_TOLD and not self.state.done:
            self._event(
                "master_stalled",
                -1,
                f"the master could not run for {seconds:.1f}s (the process it runs in was busy: "
                "in a notebook, a cell in one long C call holds the GIL the master shares); the "
                "ranks' silence over that while is not held against them",
            )

    def expire(self) -> None:
        """Mark ranks whose heartbeats stopped as LOST (and so the run FAILED), move a restart
        across hosts on (see :meth:`sync_host`) and judge the stragglers."""
        with self._lock:
            self._stall_check()
            now = self._clock()
            callers = len(self.hosts.hosts) or len(self.ranks)
            self.beat_interval = beat_interval(
                callers, self.plan.heartbeat_interval, self.plan.heartbeat_timeout
            )
            self._settle_hosts(now)
            for rank, warning in self.memory.look(self.ranks, now):
                self._event("memory", rank, warning)
            lost = self.registry.silent(now, self.plan.heartbeat_timeout)
            self.fate.lost(lost, self.registry, now, self.plan.heartbeat_timeout)
            tells, hung = self.progress.look(self.state, self.ranks, now)
            for tell in tells:
                self._event(tell.kind, tell.rank, tell.message)
            if hung is not None and not self.state.done and not self.state.failing:
                self.fate.fail(hung, self.registry, now)
            judging = False
            if self.progress.stalled:
                self.stragglers.standing_still()  # nothing moves: no straggler
            else:
                judging = self.stragglers.due(self.state, self.ranks, now)
            if self.fate.overdue_stop(self.registry, now, self.plan.stop_grace):
                self._want_stacks()
            ranks = list(self.ranks) if judging else []
        if judging:
            self._judge_stragglers(ranks, now)

    def _judge_stragglers(self, ranks: list[RankRecord], now: float) -> None:
        """The straggler judgement, the lock taken for a block of ranks at a time: at 4,096
        ranks reading every window at once held the heartbeats off for a tenth of a second."""
        means = {}
        for i in range(0, len(ranks), MEANS_AT_ONCE):
            with self._lock:
                means.update(self.stragglers.means(ranks[i : i + MEANS_AT_ONCE], now))
        with self._lock:
            if self.ranks != ranks:
                return  # a restart since: its ranks are judged afresh
            straggler = self.stragglers.conclude(ranks, self.world_size, means)
            if straggler is not None:
                self._event("straggler", straggler.rank, straggler.note)

    def starting(self, phase: str, *, new_attempt: bool = False) -> None:
        """The launcher's words for what it does before the ranks register ("starting 4
        workers: importing torch"); ``new_attempt``: the start-up of a restart begins."""
        with self._lock:
            if self.startup.set_phase(phase, self._clock(), new_attempt=new_attempt):
                self._changed.notify_all()

    def wait_changed(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    # -- host agents and the scheduler's job (see control.host_sync) ---------------------------
    def accept_heartbeats(
        self, beats: Sequence[pb.HeartbeatRequest]
    ) -> tuple[list[pb.BeatReply], Callable[[], None] | None]:
        """A host agent's batch: each beat as the coordinator's ``accept_heartbeat`` takes it,
        under one lock. A refused beat gets its refusal in its reply; the others go on. Returns the
        replies, in order, and one run dir write for all the batch's points."""
        checked = check_heartbeats(beats)
        decoded = [  # off the lock
            _decoded(req) if refused is None else None for req, refused in zip(beats, checked, strict=True)
        ]
        replies, writes = [], []
        with self._lock:
            for req, taken, refused in zip(beats, decoded, checked, strict=True):
                if taken is not None:
                    try:
                        reply, write = self._accept(taken[0], req.series, taken[1])
                    except Reject as e:
                        refused = e
                elif refused is not None:
                    self.intake.refused((req.run_id, req.worker_id), self.run_id, refused, self._clock())
                if refused is not None:
                    replies.append(pb.BeatReply(code=STATUS_CODE[refused.kind], error=str(refused)))
                    continue
                if write is not None:
                    writes.append(write)
                replies.append(pb.BeatReply(reply=reply))
        return replies, (functools.partial(_run_all, writes) if writes else None)

    def sync_host(self, req: pb.HostSyncRequest) -> pb.HostSyncResponse:
        """A host agent's word: which ranks it started for which attempt, and whether they
        run. The answer says to go on, to start the ranks of the current attempt, to wait (a
        restart is under way) or to exit (the run ended)."""
        check_host_sync(req, self.world_size)
        report = decode(HostReport, req)
        with self._lock:
            now = self._clock()
            rec = self.host_sync.join(report, self.attempt, self.world_size, now)
            cause = self.host_sync.failure(report, rec, self.state, self.attempt)
            if cause is not None:
                self.fate.fail(cause, self.registry, now)
            self._settle_hosts(now)
            return pb.HostSyncResponse(
                attempt=self.attempt,
                run_id=self.run_id,
                restarts=self.plan.restart_through_hosts and self.max_attempts > 1,
                heartbeat_timeout=self.plan.heartbeat_timeout,
                state=RUN_STATE_PB[self.state.value],
                action=HOST_ACTIONS[self.host_sync.action(report.host, rec, self.state, self.attempt)],
                interval=sync_interval(len(self.hosts.hosts), self.plan.heartbeat_timeout),
            )

    def _settle_hosts(self, now: float) -> None:
        """Carry out where a restart across hosts stands (see :meth:`HostSync.settle`)."""
        settled = self.host_sync.settle(
            self.state,
            self.attempt,
            self.ranks,
            now,
            self.plan.heartbeat_timeout,
            stopping=self.stop_requested,
        )
        if settled.resized:  # elastic: the next attempt runs on the hosts that are left
            self._event("resized", -1, settled.resized)
            self.world_size = settled.world_size
        if self.fate.settle(settled, self.registry, now):
            self._restart(now)

    def host_lost(self, host: str, why: str) -> bool:
        """The launcher knows the host agent ``host`` (its ``hostname:pid``) is gone with its
        node (``why``): its ranks are LOST now, naming it, and a restart across hosts goes on
        without waiting out the heartbeat timeout. False for a host that never called."""
        with self._lock:
            now = self._clock()
            rec = self.host_sync.hosts.lose(host, why)
            if rec is None:
                return False
            ended = [r for r in (self.registry.get(w) for w in sorted(rec.worker_ids)) if r is not None]
            self.fate.gone(ended, why, self.registry, now)
            self._settle_hosts(now)
            self._changed.notify_all()
            return True

    def set_job(self, job: JobView) -> None:
        """What the scheduler last said of the run's job; a change is an event."""
        with self._lock:
            news = self.cluster_job.update(job)
            if news is not None:
                self._event("job", -1, news)
                self._changed.notify_all()

    # -- the ranks' stacks -------------------------------------------------------------------------
    def _want_stacks(self) -> float:
        """Ask every running rank for its stack in its next heartbeat's reply; returns when."""
        now = self._clock()
        for r in self.ranks:
            if r.state is RankState.RUNNING:
                r.stack_wanted = True
        return now

    def lost_workers(self) -> list[str]:
        """The worker ids of LOST ranks (heartbeats stopped) without a stack taken since."""
        with self._lock:
            return [
                r.worker_id
                for r in self.ranks
                if r.state is RankState.LOST and (r.stack_at is None or r.stack_at < (r.ended_at or 0.0))
            ]

    def outside_stack(self, worker_id: str, text: str) -> None:
        """A lost rank's stack read from outside its process (py-spy), or why there is none: it
        goes with its error, which the root cause shows."""
        with self._lock:
            rec = self.registry.get(worker_id)
            if rec is None:
                return
            rec.stack, rec.stack_at = text, self._clock()
            rec.error = f"{rec.error}\n{text}" if rec.error else text
            self._event("stack", rec.rank, text)

    def ask_stacks(self) -> float:
        """Ask every running rank for its training thread's stack; returns the time asked (the
        master's clock) for :meth:`stacks_since`."""
        with self._lock:
            return self._want_stacks()

    def stacks_since(self, asked: float) -> bool:
        """True when every running rank sent its stack since ``asked`` (or none is running)."""
        with self._lock:
            return all(
                r.stack_at is not None and r.stack_at >= asked
                for r in self.ranks
                if r.state is RankState.RUNNING
            )

    def stacks(self) -> pb.GetStacksResponse:
        """Every rank's last stack, and the stacks grouped by frame."""
        with self._lock:
            grouped = self.progress.grouped(self.ranks, self._clock())
            reply = pb.GetStacksResponse(grouped=str(grouped))
            for r in self.ranks:
                if r.stack_sent is not None:
                    reply.ranks.append(pb.RankStack(rank=r.rank, stack=encode(r.stack_sent), text=r.stack))
            return reply

    # -- the run's state, served (see control.snapshot) -------------------------------------------
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
        self,
        cursor: bytes = b"",
        *,
        skip_series: bool = False,
        max_points: int = 0,
        changed_ranks: bool = False,
    ) -> pb.GetStateResponse:
        """The run's state, with only the points and events after ``cursor``.

        At most ``max_points`` points (default and ceiling ``MAX_POINTS_PER_REPLY``) go in
        one reply; ``more`` then says to ask again with its cursor. ``skip_series``: no points.
        ``changed_ranks``: only the ranks whose records changed since ``cursor``.
        """
        self.expire()
        draft = self._draft(cursor, skip_series, max_points, changed_ranks)
        draft.publish()  # outside the lock: heartbeats never wait for a thousand ranks' records
        built = draft.copy()  # ... nor for a catch-up's copies
        if draft.trimmed_meanwhile():
            with self._lock:
                draft.recopy(built)
        return draft.finish(built)

    def snapshot_bytes(
        self,
        cursor: bytes = b"",
        *,
        skip_series: bool = False,
        max_points: int = 0,
        pause: Callable[[], None] = yield_gil,
        changed_ranks: bool = False,
    ) -> bytes:
        """:meth:`snapshot`, serialized, for the gRPC master: its ranks and points are built
        outside the lock, calling ``pause`` after each millisecond of it, so that a reply never
        holds the GIL (and the event loop that serves heartbeats) for long. ``changed_ranks``:
        only the ranks whose records changed since ``cursor``."""
        # No expire() here: the server's expiry thread runs it four times a second.
        draft = self._draft(cursor, skip_series, max_points, changed_ranks)
        draft.publish(pause)
        encoded = draft.encode(pause)
        if draft.trimmed_meanwhile():
            with self._lock:
                draft.reencode_trimmed(encoded)
        return draft.finish_bytes(encoded)

    def _draft(self, cursor: bytes, skip_series: bool, max_points: int, changed_ranks: bool) -> StateDraft:
        """The reply after ``cursor``, but for its ranks and points, drafted under the lock."""
        prev = parse_cursor(cursor, max_points)
        with self._lock:
            return draft_reply(
                self,
                cursor,
                prev,
                self._clock(),
                self._wall(),
                skip_series=skip_series,
                max_points=max_points,
                changed_ranks=changed_ranks,
            )

    # -- internals (lock held) -------------------------------------------------------------
    def _event(self, kind: str, rank: int, message: str) -> None:
        event = Event(time=self._wall(), kind=kind, rank=rank, message=message)
        self.event_log.append(event)
        if self.store is not None:
            self.store.append_event(event)
        log.debug("run %s: %s rank=%d %s", self.run_id, kind, rank, message)


def _decoded(req: pb.HeartbeatRequest) -> tuple[Beat, list[bytes]]:
    """A checked heartbeat as the parts take it, and each of its series serialized as it came
    (each beat's points are kept encoded once for every reply: see control.series)."""
    return decode(Beat, req), [s.SerializeToString() for s in req.series]


def _append_points(store: RunStore, rank: int, attempt: int, series: Sequence[pb.Series]) -> None:
    """A beat's points into the run dir's metrics log (on the master's writer thread)."""
    store.append_metrics(metric_record(rank, attempt, series))


def _run_all(writes: list[Callable[[], None]]) -> None:
    for write in writes:
        write()

"""The master's logic, free of gRPC: one run's parts (see :mod:`orch.master.control`) under one lock.

The gRPC servicer in :mod:`orch.master` is a thin layer over :class:`Coordinator`; the
launcher calls it directly too (a child's exit code). The coordinator only joins the parts:
each method checks the request, takes the one lock, reads the time from the injected clocks
and hands both to the parts, which hold no lock and read no clock of their own. It holds the
lock only to read and update memory (the run dir's writes and the copies of a catch-up's
points happen outside it), so it is unit-tested without sockets or sleeps.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from orch.master.control.cluster_job import JobWatch
from orch.master.control.events import MAX_EVENTS_IN_MEMORY, EventLog
from orch.master.control.fate import Fate
from orch.master.control.host_sync import HostSync
from orch.master.control.intake import Intake
from orch.master.control.memory_watch import MemoryWatch
from orch.master.control.pace import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, beat_interval
from orch.master.control.progress import STARTUP_TIMEOUT, ProgressWatch
from orch.master.control.published import Published
from orch.master.control.registry import RankRecord
from orch.master.control.series import MAX_POINTS_IN_MEMORY
from orch.master.control.startup import StartupWatch
from orch.master.control.stopping import STOP_GRACE
from orch.master.control.straggler_watch import StragglerWatch
from orch.master.control.validate import (
    Reject,
    check_completion,
    check_heartbeat,
    check_register,
)
from orch.master.host_desk import HostDesk
from orch.master.stack_desk import StackDesk
from orch.master.state_desk import StateDesk
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.limits import MAX_SECTIONS, MORE_SECTIONS
from orch.wire.states import BARRIER_CLOSED, RankState, RunState

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
# Seconds a look at the run may come late before the master counts itself stalled (see
# watch_stalls): under load it comes a beat or so late; in a process whose GIL a C call holds,
# as late as the call is long.
STALL_SECONDS = 2.0
STALL_TOLD = 5.0  # seconds of a stall of the master's that its run's events tell (see stalled)
MEANS_AT_ONCE = 256  # ranks whose step times are read under one hold of the lock (see expire)


class Coordinator(StateDesk, HostDesk, StackDesk):
    """Registry, barrier, metric series, events, state and root cause of one run.

    What callers can make it hold is bounded: ``max_points_in_memory`` points across all
    series, :data:`MAX_EVENTS_IN_MEMORY` events, and one ``stop_requested`` event per stop
    however often it is asked for. What it holds is read by the names of :class:`RunFacade`.
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
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        max_attempts: int = 1,
        restart_through_hosts: bool = False,
        min_world_size: int | None = None,
        seed: int | None = None,
        store: RunStore | None = None,
        max_points_in_memory: int = MAX_POINTS_IN_MEMORY,
        hang_timeout: float | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        on_hang: str = "warn",
        stop_grace: float = STOP_GRACE,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
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
        self.seed = seed  # each rank seeds its generators with seed + rank; None: from the OS
        self.rendezvous_port = rendezvous_port
        self.rendezvous_file = False  # the ranks meet through a file store (one host): no port
        self.backend = backend
        self.heartbeat_timeout = heartbeat_timeout
        self.store = store
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._stall_watch: tuple[float, float] | None = None  # see watch_stalls
        self._changed = threading.Condition(self._lock)
        self.intake = Intake(world_size, max_points_in_memory)
        self.event_log = EventLog()
        self.published = Published()
        self.fate = Fate(max_attempts, self._event, self._changed.notify_all, created_at=clock())
        self.host_sync = HostSync(restart_through_hosts, min_world_size)
        self.cluster_job = JobWatch()
        self.stragglers = StragglerWatch()
        self.progress = ProgressWatch(hang_timeout, startup_timeout, on_hang, heartbeat_interval)
        self.stop_grace = stop_grace
        self.heartbeat_interval = heartbeat_interval
        self.beat_interval = heartbeat_interval  # what the ranks are asked for (see control.pace)
        # A sweep's rungs (steps) where ctx.steps waits for its decision, and the last one it passed.
        self.gates: list[int] = []
        self.gate_passed = 0
        self.memory = MemoryWatch()
        self.startup = StartupWatch(clock())

    # -- worker RPCs -------------------------------------------------------------------
    def register(self, req: pb.RegisterRequest) -> pb.RegisterResponse:
        check_register(req)
        with self._lock:
            rec, new = self.intake.register(req, self.run_id, self.state)
            if new:
                self._event("registered", rec.rank, f"{req.worker_id} on {req.host} pid {req.pid}")
                if self.registry.full:
                    self.fate.start(self.world_size, self._clock())
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
                seed=self.seed,
            )

    def can_start(self, req: pb.CanStartTrainingRequest) -> pb.CanStartTrainingResponse:
        with self._lock:
            rec = self.intake.known(req.run_id, req.worker_id, self.run_id)
            if self.state.done:
                # A rank that failed before this one came to the barrier: it will never open.
                raise Reject("failed_precondition", f"{BARRIER_CLOSED} ({self.state.value})")
            return self.registry.barrier(
                rec,
                open_=self.state in (RunState.RUNNING, RunState.STOPPING),
                fixed_port=self.rendezvous_port,
                file_store=self.rendezvous_file,
                backend=self.backend,
                now=self._clock(),
            )

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
                self.intake.refused(req, self.run_id, e, self._clock())
            raise
        with self._lock:
            return self._accept(req)

    def _accept(self, req: pb.HeartbeatRequest) -> tuple[pb.HeartbeatResponse, Callable[[], None] | None]:
        now = self._clock()
        try:
            rec = self.intake.beat(req, self.run_id, self.attempt, now, self._wall())
        except Reject as e:
            self.intake.refused(req, self.run_id, e, now)
            raise
        if req.HasField("stack"):
            rec.take_stack(req.stack, now)
        if req.note and req.note != rec.note:
            rec.note = req.note  # a warning of its code's (a library sees another world size)
            self._event("warning", rec.rank, f"rank {rec.rank}: {req.note}")
        if MORE_SECTIONS in req.timing.sections and not rec.many_sections:
            rec.many_sections = True  # told once per rank: the straggler note names the bucket
            self._event(
                "sections",
                rec.rank,
                f"rank {rec.rank} marked more than {MAX_SECTIONS - 1} ctx.section names: the rest are "
                f"timed together as {MORE_SECTIONS!r}",
            )
        write = None
        if self.store is not None and req.series and not rec.resent:
            write = functools.partial(self.store.append_points, rec.rank, self.attempt, req.series)
        self._changed.notify_all()
        command = self.fate.command(rec)
        reply = pb.HeartbeatResponse(command=command, send_stack=rec.stack_wanted)  # type: ignore[arg-type]
        if self.beat_interval > self.heartbeat_interval:
            reply.interval = self.beat_interval
        if command == pb.CONTINUE and self.gates:
            reply.hold_after_step = next((g for g in self.gates if g > self.gate_passed), 0)
        if command == pb.STOP:
            reply.stop_at_step = self.stop_at_step
        elif command == pb.ABORT:
            reply.reason = self.fate.abort_reason(rec)
        return reply, write

    def complete(self, req: pb.CompletionRequest) -> None:
        outcome = check_completion(req)
        with self._lock:
            rec = self.intake.known(req.run_id, req.worker_id, self.run_id)
            self.fate.completed(rec, req, outcome, self.registry, self._clock())

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
            self.beat_interval = beat_interval(callers, self.heartbeat_interval, self.heartbeat_timeout)
            self._settle_hosts(now)
            for rank, warning in self.memory.look(self.ranks, now):
                self._event("memory", rank, warning)
            lost = self.registry.silent(now, self.heartbeat_timeout)
            self.fate.lost(lost, self.registry, now, self.heartbeat_timeout)
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
            if self.fate.overdue_stop(self.registry, now, self.stop_grace):
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

    # -- internals (lock held) -------------------------------------------------------------
    def _event(self, kind: str, rank: int, message: str) -> None:
        event = pb.Event(time=self._wall(), kind=kind, rank=rank, message=message)
        self.event_log.append(event)
        if self.store is not None:
            self.store.append_event(event)
        log.debug("run %s: %s rank=%d %s", self.run_id, kind, rank, message)

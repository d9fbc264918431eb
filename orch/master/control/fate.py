"""How the ends of ranks, stops and failures move a run: the one place that drives the state
machine (:mod:`.lifecycle`) and feeds the root-cause judge (:mod:`.judge`).

A rank's end comes three ways: it reports it (``Complete``, which its host agent also sends
for a process that died), the launcher sees its process exit, or its heartbeats stop (expiry).
Each becomes one :meth:`Fate.end_rank`, which decides for the run: the last rank's end ends it;
the first failure fails it, or moves it to RESTARTING when the restart rule
(:class:`.policies.RestartPolicy`) allows; a later failure may only correct the root cause. Stops,
restarts and the launcher's last word (close, fail, give up) go through here too, so every
transition and the event that tells it are written once; a restart across hosts is decided by
:mod:`.host_sync` and carried out here. Events go out through the ``tell`` the coordinator
passes (its event log and run dir), waiters are woken through ``changed``, and the time is
always the caller's.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from orch.master.control.host_sync import Settled
from orch.master.control.judge import CauseKind, FailureJudge, RootCause, reported_kind
from orch.master.control.lifecycle import Lifecycle
from orch.master.control.memory import oom_cause
from orch.master.control.policies import RestartPolicy
from orch.master.control.registry import RankRecord, Registry
from orch.master.control.stopping import StopOrder, stop_step
from orch.wire.limits import clip
from orch.wire.model import Command, Completion
from orch.wire.stacks import ranks_text
from orch.wire.states import EXIT_ABORTED, RankState, RunState, describe_exit

Tell = Callable[[str, int, str], None]  # (kind, rank, message): an event for the run's log


class Fate:
    """The run's state, its root cause and its stop, moved by the ends of its ranks."""

    def __init__(
        self, max_attempts: int, tell: Tell, changed: Callable[[], None], created_at: float | None = None
    ) -> None:
        self.lifecycle = Lifecycle(max_attempts, created_at)
        self.restarts = RestartPolicy(max_attempts)
        self.judge = FailureJudge()
        self.stop = StopOrder()
        self._tell = tell
        self._changed = changed

    @property
    def state(self) -> RunState:
        return self.lifecycle.state

    @property
    def failure(self) -> str:
        cause = self.judge.cause
        return cause.describe() if cause is not None else ""

    def command(self, rec: RankRecord | None = None) -> Command:
        """What a heartbeat's reply tells its rank (``rec``) to do."""
        if self.state.failing or (rec is not None and rec.forced):
            return Command.ABORT
        if self.stop.requested or self.state in (RunState.STOPPING, RunState.STOPPED, RunState.PRUNED):
            return Command.STOP
        return Command.CONTINUE

    def abort_reason(self, rec: RankRecord) -> str:
        """Why an ABORT ends ``rec`` now, in the words its log shows."""
        if rec.forced and rec.state is RankState.STOPPED:
            return f"the run was stopped and this rank {rec.error}"
        if rec.forced:
            return f"this rank was {rec.error}"
        if self.state is RunState.RESTARTING:
            return "the run's group is being restarted after a failure"
        return f"the run failed: {self.failure}"[:500]

    def start(self, world_size: int, now: float) -> None:
        """All ``world_size`` ranks registered: the attempt runs."""
        self.lifecycle.to(RunState.RUNNING, now)
        self._tell("started", -1, f"all {world_size} ranks registered")

    # -- the three ways a rank ends, and what its end does to the run ---------------------
    def completed(
        self, rec: RankRecord, req: Completion, outcome: RankState, registry: Registry, now: float
    ) -> None:
        """The rank reported its end (``outcome``, checked), or its host agent saw it die."""
        if req.exit_code:
            self._unsent(rec, req.exit_code, now)
        if rec.state.done:
            return  # a retried report, or a rank already declared failed: keep the first
        rec.step = max(rec.step, req.step)
        rec.param_checksum = req.param_checksum
        error = clip(req.error)  # its head and tail: where the exception and its frames are
        kind = reported_kind(error)
        if req.exit_code:  # its host agent saw the process die
            rec.exit_code = req.exit_code
            oom = oom_cause(rec, rec.memory, False) if req.exit_code == -signal.SIGKILL else ""
            error += f": {oom}" if oom else ""
            kind = CauseKind.TORN_DOWN if req.exit_code == EXIT_ABORTED else CauseKind.EXITED
        self.end_rank(rec, outcome, registry, now, error=error, kind=kind)

    def exited(
        self,
        worker_id: str,
        exit_code: int,
        detail: str,
        expected: bool,
        registry: Registry,
        now: float,
        cause: str = "",
        *,
        oom_killed: bool = False,
    ) -> None:
        """The launcher saw a worker's process exit (see ``Coordinator.rank_exited``). A worker
        that never registered and failed is a failure from outside any rank. ``cause``: one line
        that explains the exit; it ends the error, so it is the root cause's line. A SIGKILL it
        did not send says whether the OOM killer sent it (``oom_killed``: the cgroup counted it)."""
        rec = registry.get(worker_id)
        if rec is None:
            if exit_code != 0 and not self.state.done:
                what = f"worker {worker_id} exited with {describe_exit(exit_code)} before it registered"
                self.fail(RootCause(CauseKind.OUTSIDE, what), registry, now)
            return
        rec.exit_code = exit_code
        self._unsent(rec, exit_code, now)
        if rec.state.done:
            return
        what = describe_exit(exit_code)
        if exit_code == 0:
            what += " without reporting completion"
        elif exit_code == -signal.SIGKILL and not expected:
            oom = oom_cause(rec, rec.memory, oom_killed)
            what += f": {oom}" if oom else ""
        error = f"process exited with {what}" + (f": {cause}" if cause else "")
        kind = CauseKind.TORN_DOWN if expected or exit_code == EXIT_ABORTED else CauseKind.EXITED
        error = clip(f"{detail.rstrip()}\n{error}") if detail else error
        self.end_rank(rec, RankState.FAILED, registry, now, error=error, kind=kind)

    def _unsent(self, rec: RankRecord, exit_code: int, now: float) -> None:
        """A rank whose process ended without its last words (killed outright: SIGKILL, a crash;
        an exit that skipped them) may have logged points no heartbeat carried: at most those
        of its last beat interval. Its row and the run's events say from which step. A SIGTERM
        (its launcher's) and the master's ABORT each send them first; so does a rank's own end."""
        said = exit_code in (-signal.SIGTERM, EXIT_ABORTED) or (
            rec.state in (RankState.SUCCEEDED, RankState.STOPPED, RankState.FAILED) and not rec.forced
        )
        if said or rec.last_heartbeat is None:
            return
        rec.note = (
            f"its process ended ({describe_exit(exit_code)}) {max(0.0, now - rec.last_heartbeat):.1f}s after "
            f"its last heartbeat, without sending what it logged since: its points from step {rec.step} "
            "may be missing"
        )
        self._tell("unsent", rec.rank, f"rank {rec.rank}: {rec.note}")

    def gone(self, ranks: list[RankRecord], why: str, registry: Registry, now: float) -> None:
        """Ranks whose host the launcher knows is gone (``why``: its node, in the launcher's
        words) are LOST, at once, naming it; a peer's broken collective reported before the
        launcher said so was its consequence, and the run's failure names the host instead."""
        for rec in ranks:
            if not rec.state.done:
                error = f"its host is gone: {why}"
                self.end_rank(
                    rec, RankState.LOST, registry, now, error=error, kind=CauseKind.LOST, known=True
                )

    def lost(self, lost: list[RankRecord], registry: Registry, now: float, timeout: float) -> None:
        """Ranks whose heartbeats stopped for ``timeout`` seconds are LOST."""
        for rec in lost:
            assert rec.last_heartbeat is not None
            where = (
                ""
                if rec.beats
                else " since the start barrier: stuck in the torch.distributed "
                "rendezvous or process-group set-up"
            )
            error = f"no heartbeat for {now - rec.last_heartbeat:.1f}s (timeout {timeout:g}s){where}"
            self.end_rank(rec, RankState.LOST, registry, now, error=error, kind=CauseKind.LOST)
        if lost:
            # They fell silent within a heartbeat interval of each other, so the expiry that
            # finds the first may come just before the others'.
            self.judge.lost_together(lost, timeout / 2)

    def end_rank(
        self,
        rec: RankRecord,
        outcome: RankState,
        registry: Registry,
        now: float,
        *,
        error: str = "",
        kind: CauseKind,
        known: bool = False,
    ) -> None:
        """End one rank; a failure's ``kind`` says how well it explains the run's failure
        (``known``: its host is known gone, see :meth:`gone`). A rank
        torn down (or whose collective broke) after another rank's failure explains nothing: it
        ends STOPPED, saying which rank failed, and only the root cause's rank reads FAILED."""
        cause = self.judge.cause
        consequence = (
            outcome is RankState.FAILED
            and kind in (CauseKind.TORN_DOWN, CauseKind.PEER)
            and (self.state.failing or self.state.done)
            and cause is not None
            and cause.record is not None
            and cause.record is not rec
            and kind.weight >= cause.kind.weight
        )
        if consequence:
            assert cause is not None and cause.record is not None
            outcome = RankState.STOPPED
            why = f"rank {cause.record.rank} {'was lost' if cause.kind is CauseKind.LOST else 'failed'}"
            error = f"stopped: {why}" + (f"\n{error}" if error and kind is CauseKind.PEER else "")
        rec.state = outcome
        rec.ended_at = now
        if error:
            rec.error = error
        if outcome in (RankState.FAILED, RankState.LOST):
            self._tell("rank_failed", rec.rank, error or outcome.value)
            where = rec.host if rec.address in ("", rec.host) else f"{rec.host} at {rec.address}"
            cause = RootCause(
                kind,
                f"rank {rec.rank} (host {where}, pid {rec.pid}) "
                f"{'was lost' if outcome is RankState.LOST else 'failed'}: {_last_line(error)}",
                rec,
            )
            if not self.state.done and not self.state.failing:
                self.fail(cause, registry, now)
            elif self.state.failing and self.judge.later_failure(cause, now, known=known):
                # The record of the failure, already written, named another rank: say so.
                self._tell("root_cause", rec.rank, f"the root cause is {self.failure}")
                self._blame(rec, registry)
            return
        if consequence:  # the failure's path decides how the run ends (a restart, or FAILED)
            self._tell("rank_stopped", rec.rank, f"{error.splitlines()[0]} at step {rec.step}")
            return
        self._tell("rank_" + outcome.value.lower(), rec.rank, f"at step {rec.step}")
        if self.state.done or not all(r.state.done for r in registry.ranks) or not registry.full:
            return
        if all(r.state is RankState.SUCCEEDED for r in registry.ranks) and not self.stop.requested:
            self.finish(RunState.SUCCEEDED, now)
        else:
            self.finish(self.stop.ended, now)

    def _blame(self, root: RankRecord, registry: Registry) -> None:
        """A later failure became the root cause: the ranks that failed before it, as its
        consequences, and those already said stopped by another rank, read stopped by it."""
        why = f"stopped: rank {root.rank} failed"
        for r in registry.ranks:
            if r is root:
                continue
            if r.state is RankState.STOPPED and r.error.startswith("stopped: rank "):
                r.error = "\n".join([why, *r.error.splitlines()[1:]])
            elif r.state is RankState.FAILED:
                r.state, r.error = RankState.STOPPED, f"{why}\n{r.error}".rstrip()

    # -- the run's failure, restart and end ------------------------------------------------
    def fail(self, cause: RootCause, registry: Registry, now: float) -> None:
        """The attempt's first failure: it restarts when the rule allows, else the run fails."""
        self.judge.first_failure(cause, now)
        if self.state is RunState.RUNNING and self.refusal(registry) is None:
            # Not final: the launcher (or the host agents) tear the group down and start the next attempt.
            self.lifecycle.to(RunState.RESTARTING, now)
            self._tell("attempt_failed", -1, f"attempt {self.lifecycle.attempt}: {self.failure}")
            self._changed()
        else:
            self.finish(RunState.FAILED, now)

    def refusal(self, registry: Registry) -> str | None:
        """Why a failure of this attempt does not restart the group (None: it does), as the
        restart policy decides; ``""`` when there is nothing to say (no restarts asked)."""
        decision = self.restarts.decide(self.lifecycle.attempt, any(r.step > 0 for r in registry.ranks))
        return None if decision.restart else decision.reason

    def settle(self, settled: Settled, registry: Registry, now: float) -> bool:
        """Carry out where a restart across hosts stands (see :meth:`.host_sync.HostSync.settle`);
        True when the next attempt may open (the caller opens it, with the ranks' new registry)."""
        if settled.then == "stop":
            self.close(settled.reason, now, registry)
        elif settled.then == "give_up":
            self.give_up(settled.reason, now)
        elif settled.then == "restart":
            refusal = self.refusal(registry)
            if refusal is None:
                return True
            self.give_up(refusal, now)
        return False

    def new_attempt(self, now: float) -> int:
        """Open the next attempt (the caller gives it a fresh registry); returns its number."""
        self.judge.new_attempt()
        self.stop.new_attempt()
        self.lifecycle.to(RunState.PENDING, now)
        self._tell("restart", -1, f"attempt {self.lifecycle.attempt} of {self.lifecycle.max_attempts}")
        self._changed()
        return self.lifecycle.attempt

    def request_stop(
        self, reason: str, registry: Registry, now: float, *, prune: bool = False, gate: int = 0
    ) -> RunState:
        """Ask the ranks to stop (see :class:`.stopping.StopOrder`); returns the run's state.
        A ``prune`` stop (a sweep's pruner's) ends the run PRUNED where a stop ends it STOPPED.
        ``gate``: a sweep's rung the ranks wait after (0: none); no rank past it, a loop without
        ctx.steps ends there (see :func:`.stopping.stop_step`)."""
        if not self.stop.ask(self.state.done):
            return self.state
        self.stop.prune = prune
        self._tell("pruned" if prune else "stop_requested", -1, reason or "stop requested")
        if self.state is RunState.PENDING:
            self.finish(self.stop.ended, now)
        elif self.state is RunState.RUNNING:
            self.lifecycle.to(RunState.STOPPING, now)
            self.stop.at_step = stop_step(registry.ranks, gate)
            self.stop.asked_at = now
            self._changed()
        return self.state  # RESTARTING: the launcher ends the run instead of restarting it

    def overdue_stop(self, registry: Registry, now: float, grace: float) -> bool:
        """A stop the ranks did not reach within ``grace`` seconds (ranks stuck in a collective
        never reach their next step): the ranks left are ended (their heartbeats' replies say
        ABORT; the launcher terminates what does not go) and the run is STOPPED, saying so.
        Half way through, their stacks are asked for, to show where they were stuck. True when
        the stacks are to be asked for now."""
        asked = self.stop.asked_at
        if self.state is not RunState.STOPPING or asked is None:
            return False
        left = [r for r in registry.ranks if not r.state.done]
        if now - asked <= grace or not left:
            if now - asked > grace / 2 and left and not self.stop.stacks_asked:
                self.stop.stacks_asked = True
                return True
            return False
        note = (
            f"stopped; {ranks_text([r.rank for r in left])} did not reach a step boundary within "
            f"{grace:g}s and {'was' if len(left) == 1 else 'were'} terminated"
        )
        self.stop.note = note
        self._tell("stop_escalated", -1, note)
        self._force_end(
            left,
            RankState.STOPPED,
            f"did not reach a step boundary within {grace:g}s of the stop: terminated",
            now,
        )
        self.finish(self.stop.ended, now)
        return False

    def finish(self, state: RunState, now: float) -> None:
        self.lifecycle.to(state, now)
        self._tell("finished", -1, state.value + (f": {self.failure}" if self.failure else ""))
        self._changed()

    def _force_end(self, ranks: list[RankRecord], state: RankState, why: str, now: float) -> None:
        """End ranks from outside (the launcher terminates their processes): the record says
        so at once, not only once their exits are seen."""
        for rec in ranks:
            rec.state, rec.ended_at, rec.forced = state, now, True
            rec.error = rec.error or why

    def close(self, message: str, now: float, registry: Registry | None = None) -> None:
        """End a live run from outside: STOPPED when a stop was asked for, else FAILED. Its
        live ranks end with it (they are terminated next)."""
        if self.state.done:
            return
        self._tell("closed", -1, message)
        left = [r for r in registry.ranks if not r.state.done] if registry is not None else []
        if self.stop.requested:
            if left:
                self.stop.note = f"stopped; {ranks_text([r.rank for r in left])} terminated: {message}"
            self._force_end(left, RankState.STOPPED, f"terminated: {message}", now)
            self.finish(self.stop.ended, now)
        else:
            self.judge.outside(message)
            self._force_end(left, RankState.FAILED, f"terminated: {message}", now)
            self.finish(RunState.FAILED, now)

    def fail_outside(self, message: str, detail: str, now: float) -> None:
        """Fail the run from outside, for good; ``detail`` is the root cause's traceback.
        A run already FAILED on a rank whose error only says that a peer went away (or that
        the launcher ended it) takes this reason instead: a cancelled job explains it."""
        if not self.state.done:
            self.judge.outside(message, detail)
            self.finish(RunState.FAILED, now)
        elif self.state is RunState.FAILED and self.weak_cause:
            self.judge.outside(message, detail)
            self._tell("root_cause", -1, f"the root cause is {self.failure}")

    @property
    def weak_cause(self) -> bool:
        """The root cause only says a peer went away, or that the launcher ended the rank."""
        cause = self.judge.cause
        return cause is not None and cause.kind.weight > 0

    def give_up(self, reason: str, now: float) -> None:
        """No restart follows this failure: the run is FAILED, with the first attempt's root
        cause and ``reason``."""
        if self.state is RunState.RESTARTING:
            self.finish(RunState.FAILED, now)
            self.judge.final(self.lifecycle.attempt, reason)
        elif self.state is RunState.FAILED:
            self.judge.final(self.lifecycle.attempt, reason)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "no error message"

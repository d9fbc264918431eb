"""orch.master.control.fate: how the ends of ranks, stops, failures and restarts move a run.

No coordinator, lock or clock: the events it tells are collected in a list, the times are
plain floats, the ranks live in a bare :class:`Registry`.
"""

from __future__ import annotations

import pytest

from orch.master.control.fate import Fate
from orch.master.control.host_sync import Settled
from orch.master.control.judge import CauseKind, RootCause
from orch.master.control.registry import Registry
from orch.wire.model import Command, Completion, Registration
from orch.wire.states import EXIT_ABORTED, RankState, RunState

S = RunState


class Told:
    """What a Fate told (kind, rank, message), and how often it woke the waiters."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []
        self.wakes = 0

    def __call__(self, kind: str, rank: int, message: str) -> None:
        self.events.append((kind, rank, message))

    def wake(self) -> None:
        self.wakes += 1

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.events]


def running(world: int = 2, *, max_attempts: int = 1, step: int = 5) -> tuple[Fate, Registry, Told]:
    """A run whose ``world`` ranks registered, passed the barrier and reached ``step``."""
    told = Told()
    fate = Fate(max_attempts, told, told.wake)
    reg = Registry(world)
    for i in range(world):
        rec, _ = reg.add(Registration(worker_id=f"w{i}", host=f"h{i}", pid=10 + i), "r1")
        rec.state, rec.step, rec.last_heartbeat = RankState.RUNNING, step, 100.0
    fate.start(reg.world_size, 100.0)
    return fate, reg, told


def test_start_runs_the_attempt_and_says_so() -> None:
    fate, _, told = running(3)
    assert fate.state is S.RUNNING and fate.lifecycle.started_at == 100.0
    assert told.events == [("started", -1, "all 3 ranks registered")]


def test_the_last_rank_to_succeed_ends_the_run_succeeded() -> None:
    fate, reg, told = running()
    fate.end_rank(reg.ranks[0], RankState.SUCCEEDED, reg, 101.0, kind=CauseKind.ERROR)
    assert fate.state is S.RUNNING and told.wakes == 0
    fate.end_rank(reg.ranks[1], RankState.SUCCEEDED, reg, 102.0, kind=CauseKind.ERROR)
    assert fate.state is S.SUCCEEDED and fate.lifecycle.ended_at == 102.0 and told.wakes == 1
    assert told.kinds() == ["started", "rank_succeeded", "rank_succeeded", "finished"]
    assert told.events[-1] == ("finished", -1, "SUCCEEDED")
    assert reg.ranks[1].ended_at == 102.0


def test_ranks_that_succeed_after_a_stop_end_the_run_stopped() -> None:
    fate, reg, _ = running()
    fate.request_stop("enough", reg, 101.0)
    for rec in reg.ranks:
        fate.end_rank(rec, RankState.SUCCEEDED, reg, 102.0, kind=CauseKind.ERROR)
    assert fate.state is S.STOPPED


def test_a_run_not_fully_registered_does_not_end_with_its_ranks() -> None:
    told = Told()
    fate, reg = Fate(1, told, told.wake), Registry(2)
    rec, _ = reg.add(Registration(worker_id="w0"), "r1")
    fate.end_rank(rec, RankState.SUCCEEDED, reg, 1.0, kind=CauseKind.ERROR)
    assert fate.state is S.PENDING


def test_the_first_failure_fails_the_run_naming_the_rank_where_and_its_last_line() -> None:
    fate, reg, told = running()
    reg.ranks[1].address = "10.0.0.2"
    fate.end_rank(
        reg.ranks[1],
        RankState.FAILED,
        reg,
        101.0,
        error="Traceback\n  x\nValueError: boom\n\n",
        kind=CauseKind.ERROR,
    )
    assert fate.state is S.FAILED and told.wakes == 1
    assert fate.failure == "rank 1 (host h1 at 10.0.0.2, pid 11) failed: ValueError: boom"
    assert fate.judge.cause is not None and fate.judge.cause.record is reg.ranks[1]
    assert told.kinds()[1:] == ["rank_failed", "finished"]
    assert told.events[-1][2] == f"FAILED: {fate.failure}"


def test_a_failure_with_restarts_left_after_progress_restarts() -> None:
    fate, reg, told = running(max_attempts=2)
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error="boom", kind=CauseKind.ERROR)
    assert fate.state is S.RESTARTING and told.wakes == 1
    assert told.events[-1] == ("attempt_failed", -1, f"attempt 1: {fate.failure}")
    assert fate.lifecycle.ended_at is None  # not final


def test_a_failure_before_any_step_is_not_restarted() -> None:
    fate, reg, _ = running(max_attempts=2, step=0)
    assert fate.refusal(reg) == "it failed during start-up, before any step: not restarted"
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error="boom", kind=CauseKind.ERROR)
    assert fate.state is S.FAILED


def test_the_restart_rule() -> None:
    fate, reg, _ = running(max_attempts=1)
    assert fate.refusal(reg) == ""  # no restarts asked for: nothing to say
    fate, reg, _ = running(max_attempts=2)
    assert fate.refusal(reg) is None
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error="boom", kind=CauseKind.ERROR)
    fate.new_attempt(102.0)
    assert fate.refusal(reg) == "no restarts left"


def test_a_better_explanation_within_the_settle_time_becomes_the_root_cause_and_is_told() -> None:
    fate, reg, told = running(3)
    peer = "RuntimeError: Connection reset by peer"
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error=peer, kind=CauseKind.PEER)
    fate.end_rank(reg.ranks[2], RankState.FAILED, reg, 101.2, error="x", kind=CauseKind.TORN_DOWN)
    fate.end_rank(reg.ranks[1], RankState.FAILED, reg, 101.3, error="SIGSEGV", kind=CauseKind.EXITED)
    assert fate.judge.cause is not None and fate.judge.cause.record is reg.ranks[1]
    # Only the root cause's rank reads FAILED; the others were stopped by it, and say so.
    assert [r.state for r in reg.ranks] == [RankState.STOPPED, RankState.FAILED, RankState.STOPPED]
    assert reg.ranks[0].error == f"stopped: rank 1 failed\n{peer}"
    assert reg.ranks[2].error == "stopped: rank 1 failed"
    assert [e for e in told.events if e[0] == "root_cause"] == [
        ("root_cause", 1, f"the root cause is {fate.failure}")
    ]
    assert told.kinds().count("finished") == 1


def test_a_reason_from_outside_replaces_a_peers_error_but_never_a_ranks_own() -> None:
    # A job cancelled behind the run's back: the first rank to report only saw its peer go.
    fate, reg, told = running(2)
    peer = "RuntimeError: Connection reset by peer"
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error=peer, kind=CauseKind.PEER)
    assert fate.state is S.FAILED and fate.weak_cause
    fate.fail_outside("Slurm job 4 ended CANCELLED before the run did", "job output", 104.0)
    cause = fate.judge.cause
    assert cause is not None and cause.kind is CauseKind.OUTSIDE and cause.detail == "job output"
    assert "ended CANCELLED" in fate.failure and told.events[-1][0] == "root_cause"
    assert told.kinds().count("finished") == 1
    # A rank's own error explains its run: a later reason from outside does not replace it.
    fate, reg, _ = running(2)
    fate.end_rank(reg.ranks[1], RankState.FAILED, reg, 101.0, error="ValueError: x", kind=CauseKind.ERROR)
    fate.fail_outside("Slurm job 5 ended CANCELLED before the run did", "", 104.0)
    assert fate.judge.cause is not None and fate.judge.cause.kind is CauseKind.ERROR and not fate.weak_cause


def test_a_completion_is_taken_once_with_its_step_checksum_and_kind() -> None:
    fate, reg, _ = running(max_attempts=2)
    rec = reg.ranks[0]
    done = Completion(step=9, param_checksum="abc", exit_code=EXIT_ABORTED, error="x" * 100_000)
    fate.completed(rec, done, RankState.FAILED, reg, 101.0)
    assert (rec.step, rec.param_checksum, rec.exit_code, len(rec.error)) == (
        9,
        "abc",
        EXIT_ABORTED,
        64 * 1024,
    )
    assert fate.judge.cause is not None and fate.judge.cause.kind is CauseKind.TORN_DOWN
    fate.completed(rec, Completion(step=20, param_checksum="new"), RankState.SUCCEEDED, reg, 102.0)
    assert (rec.state, rec.step, rec.param_checksum) == (RankState.FAILED, 9, "abc")  # the first stands


@pytest.mark.parametrize(
    ("exit_code", "error", "kind"),
    [
        (0, "", CauseKind.ERROR),  # a reported error: its text decides (here, no peer's)
        (-9, "", CauseKind.EXITED),  # its host agent saw it die
        (EXIT_ABORTED, "", CauseKind.TORN_DOWN),
        (0, "gloo/transport: Connection closed by peer", CauseKind.PEER),
    ],
)
def test_a_reported_failures_kind(exit_code: int, error: str, kind: CauseKind) -> None:
    fate, reg, _ = running()
    req = Completion(exit_code=exit_code, error=error)
    fate.completed(reg.ranks[0], req, RankState.FAILED, reg, 101.0)
    assert fate.judge.cause is not None and fate.judge.cause.kind is kind


def test_an_exit_names_the_signal_and_keeps_what_the_process_left() -> None:
    fate, reg, _ = running()
    fate.exited("w1", -11, "Traceback\nMemoryError\n", False, reg, 101.0)
    rec = reg.ranks[1]
    assert rec.exit_code == -11 and rec.state is RankState.FAILED
    assert rec.error == "Traceback\nMemoryError\nprocess exited with signal SIGSEGV"
    assert fate.judge.cause is not None and fate.judge.cause.kind is CauseKind.EXITED
    assert fate.failure.endswith("failed: process exited with signal SIGSEGV")


@pytest.mark.parametrize(("expected", "code"), [(True, -15), (False, EXIT_ABORTED)])
def test_an_exit_the_launcher_caused_is_torn_down(expected: bool, code: int) -> None:
    fate, reg, _ = running()
    fate.exited("w0", code, "", expected, reg, 101.0)
    assert fate.judge.cause is not None and fate.judge.cause.kind is CauseKind.TORN_DOWN


def test_a_clean_exit_without_a_report_is_a_failure_and_one_after_a_report_is_not() -> None:
    fate, reg, _ = running()
    fate.end_rank(reg.ranks[0], RankState.SUCCEEDED, reg, 101.0, kind=CauseKind.ERROR)
    fate.exited("w0", 0, "", False, reg, 102.0)
    assert reg.ranks[0].state is RankState.SUCCEEDED and fate.state is S.RUNNING
    fate.exited("w1", 0, "", False, reg, 103.0)
    assert reg.ranks[1].error == "process exited with exit code 0 without reporting completion"
    assert fate.state is S.FAILED


def test_a_worker_that_died_before_registering_fails_the_run_from_outside() -> None:
    fate, reg, _ = running()
    fate.exited("ghost", 0, "", False, reg, 101.0)  # a clean exit says nothing
    assert fate.state is S.RUNNING
    fate.exited("ghost", 1, "", False, reg, 101.0)
    assert fate.state is S.FAILED
    assert fate.judge.cause is not None and fate.judge.cause.kind is CauseKind.OUTSIDE
    assert fate.failure == "worker ghost exited with exit code 1 before it registered"


def test_lost_ranks_say_how_long_and_why_and_are_named_together() -> None:
    fate, reg, told = running(3)
    for rec in reg.ranks:
        rec.beats = 1
    reg.ranks[1].last_heartbeat = reg.ranks[2].last_heartbeat = 94.0
    reg.ranks[2].beats = 0  # silent since the barrier
    fate.lost([reg.ranks[1], reg.ranks[2]], reg, 100.5, 5.0)
    assert reg.ranks[1].error == "no heartbeat for 6.5s (timeout 5s)"
    assert reg.ranks[2].error.startswith("no heartbeat for 6.5s (timeout 5s) since the start barrier")
    assert fate.state is S.FAILED and fate.failure.startswith("rank 1 (host h1, pid 11) was lost")
    assert fate.failure.endswith("lost at the same time: rank 2 (h2)")
    assert told.kinds().count("rank_failed") == 2
    fate.lost([], reg, 200.0, 5.0)  # nothing silent: nothing happens
    assert told.kinds().count("rank_failed") == 2


def test_a_stop_while_running_sets_one_stop_step_and_is_told_once() -> None:
    fate, reg, told = running()
    for rec in reg.ranks:
        rec.progress.extend([(0.0, 0), (1.0, 10)])
        rec.step = 10
    assert fate.command() == Command.CONTINUE
    assert fate.request_stop("", reg, 101.0) is S.STOPPING
    assert fate.stop.at_step == 10 + 20 and told.wakes == 1 and fate.command() == Command.STOP
    assert fate.request_stop("again", reg, 102.0) is S.STOPPING
    assert fate.stop.at_step == 30 and fate.stop.requests == 2
    assert [e for e in told.events if e[0] == "stop_requested"] == [("stop_requested", -1, "stop requested")]


def test_a_stop_before_the_start_ends_the_run_and_one_while_restarting_waits() -> None:
    told = Told()
    fate = Fate(1, told, told.wake)
    assert fate.request_stop("early", Registry(2), 1.0) is S.STOPPED
    assert told.kinds() == ["stop_requested", "finished"]
    fate, reg, _ = running(max_attempts=2)
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error="boom", kind=CauseKind.ERROR)
    assert fate.request_stop("user", reg, 102.0) is S.RESTARTING  # the launcher ends it
    assert fate.stop.requested and fate.stop.at_step == 0


def test_a_failing_run_tells_its_ranks_to_abort() -> None:
    fate, reg, _ = running(max_attempts=2)
    fate.request_stop("", reg, 100.5)
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error="boom", kind=CauseKind.ERROR)
    assert fate.command() == Command.ABORT  # ABORT wins over STOP


def test_a_new_attempt_keeps_the_first_cause_and_the_stop_but_not_its_step() -> None:
    fate, reg, told = running(max_attempts=3)
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error="first", kind=CauseKind.ERROR)
    first = fate.judge.cause
    fate.stop.at_step = 77
    assert fate.new_attempt(102.0) == 2
    assert fate.state is S.PENDING and fate.judge.cause is None and fate.judge.first is first
    assert fate.stop.at_step == 0 and told.events[-1] == ("restart", -1, "attempt 2 of 3")


def test_closing_a_live_run_fails_it_unless_a_stop_was_asked() -> None:
    fate, _, told = running()
    fate.close("the notebook was closed", 101.0)
    assert fate.state is S.FAILED and fate.failure == "the notebook was closed"
    assert told.kinds()[-2:] == ["closed", "finished"]
    fate.close("again", 102.0)  # an ended run stays as it ended
    assert told.kinds().count("closed") == 1
    fate, reg, _ = running()
    fate.request_stop("", reg, 100.5)
    fate.close("closed", 101.0)
    assert fate.state is S.STOPPED and fate.failure == ""


def test_failing_from_outside_keeps_the_detail_and_only_a_live_run() -> None:
    fate, _, _ = running()
    fate.fail_outside("Slurm job 7 ended CANCELLED", "slurm output\n", 101.0)
    assert fate.state is S.FAILED and fate.judge.cause is not None
    assert fate.judge.cause.error == "slurm output\n" and fate.failure == "Slurm job 7 ended CANCELLED"
    fate.fail_outside("later", "", 102.0)
    assert fate.failure == "Slurm job 7 ended CANCELLED"


def test_giving_up_ends_a_restart_with_the_first_attempts_cause_and_why() -> None:
    fate, reg, _ = running(max_attempts=3)
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error="first", kind=CauseKind.ERROR)
    fate.new_attempt(102.0)
    fate.start(reg.world_size, 103.0)
    fate.end_rank(reg.ranks[1], RankState.FAILED, reg, 104.0, error="second", kind=CauseKind.ERROR)
    assert fate.state is S.RESTARTING
    fate.give_up("the host is gone", 105.0)
    assert fate.state is S.FAILED
    assert fate.failure.endswith("failed: first (after 2 attempts; the host is gone)")
    fate.give_up("a later word", 106.0)  # on a FAILED run: the reason is set again, nothing else
    assert fate.failure.endswith("(after 2 attempts; a later word)")


def test_giving_up_a_running_run_changes_nothing() -> None:
    fate, _, told = running()
    fate.give_up("why", 101.0)
    assert fate.state is S.RUNNING and told.kinds() == ["started"]


@pytest.mark.parametrize(
    ("settled", "state", "opens"),
    [
        (Settled("wait"), S.RESTARTING, False),
        (Settled("stop", "stopped while restarting"), S.STOPPED, False),
        (Settled("give_up", "host b fell silent"), S.FAILED, False),
        (Settled("restart"), S.RESTARTING, True),  # the caller opens it
    ],
)
def test_what_host_sync_settled_is_carried_out(settled: Settled, state: RunState, opens: bool) -> None:
    fate, reg, told = running(max_attempts=2)
    if settled.then == "stop":
        fate.stop.requested = True
    fate.end_rank(reg.ranks[0], RankState.FAILED, reg, 101.0, error="boom", kind=CauseKind.ERROR)
    assert fate.settle(settled, reg, 102.0) is opens
    assert fate.state is state
    if settled.then == "stop":
        assert ("closed", -1, "stopped while restarting") in told.events
    if settled.then == "give_up":
        assert fate.failure.endswith("(host b fell silent)")


def test_a_restart_host_sync_allows_is_refused_by_the_restart_rule() -> None:
    fate, reg, _ = running(max_attempts=2)
    fate.fail(RootCause(CauseKind.OUTSIDE, "host a: died"), reg, 101.0)
    fate.new_attempt(102.0)  # attempt 2 of 2, no rank stepped yet
    fate.start(reg.world_size, 103.0)
    fate.fail(RootCause(CauseKind.OUTSIDE, "again"), reg, 104.0)
    assert fate.state is S.FAILED  # no restarts left: failed at once
    fate, reg, _ = running(max_attempts=2)
    fate.fail(RootCause(CauseKind.OUTSIDE, "host a: died"), reg, 101.0)
    for rec in reg.ranks:
        rec.step = 0  # a registry of an attempt that made no step
    assert not fate.settle(Settled("restart"), reg, 102.0)
    assert fate.state is S.FAILED and "before any step" in fate.failure


# -- a stop the ranks never reach --------------------------------------------------------------


def test_a_stop_the_ranks_never_reach_ends_them_after_the_grace_and_says_so() -> None:
    fate, reg, told = running(4)
    fate.request_stop("Stop pressed", reg, 200.0)
    reg.ranks[2].state = RankState.STOPPED  # one got there
    assert not fate.overdue_stop(reg, 204.0, grace=10.0)
    assert fate.overdue_stop(reg, 205.5, grace=10.0)  # half way: their stacks are asked for, once
    assert not fate.overdue_stop(reg, 206.0, grace=10.0)
    assert fate.state is S.STOPPING
    fate.overdue_stop(reg, 210.5, grace=10.0)
    assert fate.state is S.STOPPED
    note = "stopped; ranks 0, 1, 3 did not reach a step boundary within 10s and were terminated"
    assert fate.stop.note == note
    assert ("stop_escalated", -1, note) in told.events
    assert [r.state for r in reg.ranks] == [RankState.STOPPED] * 4
    assert [r.forced for r in reg.ranks] == [True, True, False, True]
    # The ranks left get ABORT with the reason; the launcher then terminates what does not go.
    assert fate.command(reg.ranks[0]) == Command.ABORT and fate.command(reg.ranks[2]) == Command.STOP
    why = fate.abort_reason(reg.ranks[0])
    assert "did not reach a step boundary within 10s of the stop: terminated" in why
    assert not reg.reported("w0") and reg.reported("w2")  # the launcher SIGTERMs w0, not w2


def test_closing_a_live_run_ends_its_ranks_in_the_record_at_once() -> None:
    fate, reg, _ = running(2)
    fate.request_stop("", reg, 200.0)
    fate.close("the run was closed", 201.0, reg)
    assert fate.state is S.STOPPED
    assert [r.state for r in reg.ranks] == [RankState.STOPPED] * 2
    assert fate.stop.note == "stopped; ranks 0, 1 terminated: the run was closed"
    fate, reg, _ = running(2)
    fate.close("the run was closed", 201.0, reg)
    assert fate.state is S.FAILED and fate.judge.cause is not None
    assert fate.judge.cause.kind is CauseKind.OUTSIDE  # no rank is blamed
    assert [r.state for r in reg.ranks] == [RankState.FAILED] * 2
    assert all(r.error == "terminated: the run was closed" for r in reg.ranks)


def test_ranks_torn_down_after_a_ranks_failure_read_stopped_by_it() -> None:
    """torch elastic's agent says its other workers were terminated: here rank 2 raised, and the
    launcher's SIGTERM and a peer's broken collective end the others, which read STOPPED."""
    fate, reg, told = running(4)
    fate.end_rank(reg.ranks[2], RankState.FAILED, reg, 101.0, error="ValueError: bad", kind=CauseKind.ERROR)
    fate.exited("w0", -15, "", True, reg, 101.1)
    fate.end_rank(
        reg.ranks[1], RankState.FAILED, reg, 101.2, error="RuntimeError: Connection closed by peer",
        kind=CauseKind.PEER,
    )  # fmt: skip
    fate.exited("w3", EXIT_ABORTED, "", False, reg, 101.3)
    stopped, failed = RankState.STOPPED, RankState.FAILED
    assert [r.state for r in reg.ranks] == [stopped, stopped, failed, stopped]
    assert all(reg.ranks[i].error.startswith("stopped: rank 2 failed") for i in (0, 1, 3))
    assert "Connection closed by peer" in reg.ranks[1].error  # what it saw is kept beside it
    assert fate.state is S.FAILED
    assert fate.failure.startswith("rank 2 (host h2, pid 12) failed: ValueError: bad")
    assert [e for e in told.events if e[0] == "rank_stopped"] == [
        ("rank_stopped", r, "stopped: rank 2 failed at step 5") for r in (0, 1, 3)
    ]

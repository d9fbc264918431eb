"""The master's logic without sockets: ranks, barrier, validation, series, state, clocks."""

from __future__ import annotations

import math

import pytest

from coordinator_calls import Clock, beat, complete, heartbeat, reg
from orch.master.control.plan import RunPlan
from orch.master.control.validate import Reject
from orch.master.coordinator import Coordinator
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.client import StateMirror
from orch.wire.limits import MAX_METRICS_PER_RANK
from orch.wire.states import RankState, RunState


def started(world: int = 2, clock: Clock | None = None) -> Coordinator:
    c = Coordinator(RunPlan(world, heartbeat_timeout=5.0), run_id="r1", clock=clock or Clock())
    for i in range(world):
        reg(c, f"w{i}")
    for i in range(world):
        assert c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id=f"w{i}")).ready
    return c


def kind(excinfo: pytest.ExceptionInfo[Reject]) -> str:
    return excinfo.value.kind


def test_ranks_follow_registration_order_and_reregistration_is_idempotent() -> None:
    c = Coordinator(RunPlan(3), run_id="r1")
    assert [reg(c, "b"), reg(c, "a"), reg(c, "b")] == [0, 1, 0]
    assert c.state is RunState.PENDING
    assert reg(c, "c") == 2
    assert c.state is RunState.RUNNING
    assert reg(c, "a") == 1  # a retried registration after the barrier opened


def test_full_world_is_resource_exhausted() -> None:
    c = Coordinator(RunPlan(1), run_id="r1")
    reg(c, "a")
    with pytest.raises(Reject) as e:
        reg(c, "b")
    assert kind(e) == "resource_exhausted"
    assert "1 ranks" in str(e.value)


@pytest.mark.parametrize(
    "fields",
    [
        {"worker_id": ""},
        {"worker_id": "x" * 300},
        {"worker_id": "a", "pid": -1},
        {"worker_id": "a", "rendezvous_port": 70000},
        {"worker_id": "a", "backend": "mpi"},
    ],
)
def test_malformed_registration_is_invalid_argument(fields: dict[str, object]) -> None:
    c = Coordinator(RunPlan(2), run_id="r1")
    with pytest.raises(Reject) as e:
        c.register(pb.RegisterRequest(**fields))  # type: ignore[arg-type]
    assert kind(e) == "invalid_argument"
    assert c.ranks == []


def test_registration_for_another_run_is_failed_precondition() -> None:
    c = Coordinator(RunPlan(2), run_id="r1")
    with pytest.raises(Reject) as e:
        c.register(pb.RegisterRequest(worker_id="a", run_id="r0"))
    assert kind(e) == "failed_precondition"
    assert "another run" in str(e.value)


def test_barrier_opens_when_every_rank_registered_with_rank0_rendezvous() -> None:
    c = Coordinator(RunPlan(2), run_id="r1")
    reg(c, "a", address="10.1.0.1", rendezvous_port=29555)
    first = c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id="a"))
    assert not first.ready and first.registered == 1 and first.world_size == 2
    reg(c, "b", address="10.1.0.2", rendezvous_port=29600)
    go = c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id="b"))
    assert go.ready
    assert (go.master_addr, go.master_port, go.backend) == ("10.1.0.1", 29555, "gloo")


def test_configured_rendezvous_port_and_nccl_when_every_rank_has_it() -> None:
    c = Coordinator(RunPlan(2), run_id="r1", rendezvous_port=29999)
    reg(c, "a", backend="nccl")
    reg(c, "b", backend="nccl")
    go = c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id="a"))
    assert (go.master_port, go.backend) == (29999, "nccl")


def test_out_of_order_and_unknown_callers() -> None:
    c = Coordinator(RunPlan(2), run_id="r1")
    reg(c, "a")
    # heartbeat before registering: the caller has no run id yet
    with pytest.raises(Reject) as e:
        beat(c, "zz", run_id="")
    assert kind(e) == "failed_precondition" and "Register first" in str(e.value)
    # a run id that is not this master's
    with pytest.raises(Reject) as e:
        beat(c, "a", run_id="other")
    assert kind(e) == "failed_precondition"
    # the right run, a worker it never registered
    with pytest.raises(Reject) as e:
        beat(c, "zz")
    assert kind(e) == "not_found"
    with pytest.raises(Reject) as e:
        c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id="zz"))
    assert kind(e) == "not_found"
    # registered, but the barrier has not opened for it yet
    with pytest.raises(Reject) as e:
        beat(c, "a")
    assert kind(e) == "failed_precondition" and "CanStartTraining" in str(e.value)


def test_malformed_heartbeat_is_invalid_argument_and_records_nothing() -> None:
    c = started()
    bad = pb.HeartbeatRequest(run_id="r1", worker_id="w0", step=1)
    bad.series.append(pb.Series(name="loss", steps=[1, 2], values=[0.5]))
    with pytest.raises(Reject) as e:
        heartbeat(c, bad)
    assert kind(e) == "invalid_argument"
    with pytest.raises(Reject) as e:
        heartbeat(c, pb.HeartbeatRequest(run_id="r1", worker_id="w0", step=-4))
    assert kind(e) == "invalid_argument"
    assert c.series(0, "loss") == ([], [])
    assert c.ranks[0].step == 0


def test_nan_and_inf_losses_are_recorded_not_refused() -> None:
    c = started()
    assert beat(c, "w0", step=3, loss=[1.0, math.nan, math.inf]) == pb.CONTINUE
    steps, values = c.series(0, "loss")
    assert steps == [0, 1, 2]
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2] == math.inf
    assert c.ranks[0].loss == math.inf


def test_state_is_incremental_through_the_cursor() -> None:
    c = started()
    beat(c, "w0", step=2, loss=[3.0, 2.0])
    first = c.snapshot()
    assert first.full and sum(len(s.steps) for s in first.series) == 2
    again = c.snapshot(first.cursor)
    assert not again.full and list(again.series) == [] and list(again.events) == []
    beat(c, "w1", step=1, loss=[9.0])
    beat(c, "w0", step=3, loss=[1.0])
    third = c.snapshot(again.cursor)
    assert sorted((s.rank, list(s.values)) for s in third.series) == [(0, [1.0]), (1, [9.0])]
    mirror = StateMirror()
    for reply in (first, again, third):
        mirror.apply(reply)
    assert mirror.series[(0, "loss")].values.tolist() == [3.0, 2.0, 1.0]
    assert mirror.series[(1, "loss")].steps.tolist() == [0]
    assert mirror.history()["loss"][1] == {"step": [0], "value": [9.0]}


def test_bad_cursor_is_invalid_argument_and_foreign_cursor_restarts() -> None:
    c = started()
    with pytest.raises(Reject) as e:
        c.snapshot(b"\xff\xfe not a cursor")
    assert kind(e) == "invalid_argument"
    other = Coordinator(RunPlan(1), run_id="other")
    foreign = other.snapshot().cursor
    assert c.snapshot(foreign).full


def test_heartbeat_age_and_expiry_on_an_injected_clock() -> None:
    clock = Clock()
    c = started(clock=clock)
    beat(c, "w0", step=1)
    beat(c, "w1", step=1)
    clock.t += 2.5
    beat(c, "w1", step=2)
    ages = {r.rank: r.heartbeat_age for r in c.snapshot().ranks}
    assert ages == {0: pytest.approx(2.5), 1: pytest.approx(0.0)}
    clock.t += 2.4  # rank 0 silent 4.9 s: still inside the 5 s timeout
    c.expire()
    assert c.state is RunState.RUNNING
    clock.t += 0.2
    c.expire()
    assert c.ranks[0].state is RankState.LOST and c.ranks[1].state is RankState.RUNNING
    assert c.state is RunState.FAILED
    assert "rank 0" in c.failure and "no heartbeat" in c.failure
    assert beat(c, "w1", step=3) == pb.ABORT


def test_a_refused_beat_keeps_its_rank_alive_and_says_why() -> None:
    """A rank whose every beat is refused for what it carries (here a name past the cap, in
    a direct call and in a host agent's batch) still beats: never LOST, never "stuck in the
    rendezvous"; its record says why its points went."""
    clock = Clock()
    c = started(world=2, clock=clock)
    for _ in range(4):
        clock.t += 2.0
        with pytest.raises(Reject):
            beat(c, "w0", **{"x" * 300: [1.0]})
        bad = pb.HeartbeatRequest(
            run_id="r1", worker_id="w1", series=[pb.Series(name="", steps=[0], values=[1])]
        )
        replies, _ = c.accept_heartbeats([bad])
        assert replies[0].code == 3  # INVALID_ARGUMENT, for that beat alone
        c.expire()
    assert clock.t > 5.0 and c.state is RunState.RUNNING  # past the 5 s timeout
    assert [r.state for r in c.ranks] == [RankState.RUNNING, RankState.RUNNING]
    assert "refused a heartbeat" in c.ranks[0].dropped_reason
    assert "name of 1-256 characters; one has 300" in c.ranks[0].dropped_reason
    clock.t += 5.1  # then silence: lost as any rank, not "since the start barrier"
    c.expire()
    assert "no heartbeat for 5.1s" in c.failure and "start barrier" not in c.failure


def test_a_beat_of_another_run_or_before_the_barrier_keeps_nothing_alive() -> None:
    clock = Clock()
    c = started(world=1, clock=clock)
    clock.t += 4.0
    with pytest.raises(Reject):
        beat(c, "w0", run_id="other", **{"x" * 300: [1.0]})
    clock.t += 1.1
    c.expire()
    assert c.ranks[0].state is RankState.LOST


def test_steps_per_second_from_progress() -> None:
    clock = Clock()
    c = started(clock=clock)
    for i in range(5):
        beat(c, "w0", step=10 * i)
        clock.t += 1.0
    assert c.snapshot().ranks[0].steps_per_sec == pytest.approx(10.0)


def test_run_succeeds_when_every_rank_finished() -> None:
    c = started()
    complete(c, "w0", pb.RANK_SUCCEEDED)
    assert c.state is RunState.RUNNING
    complete(c, "w1", pb.RANK_SUCCEEDED)
    assert c.state is RunState.SUCCEEDED
    assert [r.param_checksum for r in c.snapshot().ranks] == ["x", "x"]


def test_first_failure_is_the_root_cause() -> None:
    c = started()
    complete(c, "w1", pb.RANK_FAILED, error="Traceback ...\nRuntimeError: boom")
    complete(c, "w0", pb.RANK_FAILED, error="Traceback ...\nRuntimeError: connection closed by peer")
    assert c.state is RunState.FAILED
    assert c.root_cause is not None and c.root_cause.rank == 1
    assert "rank 1" in c.failure and "RuntimeError: boom" in c.failure
    assert beat(c, "w0") == pb.ABORT


def test_launcher_exit_codes_fail_the_run_and_name_the_signal() -> None:
    c = started()
    c.rank_exited("w0", -9)
    assert c.state is RunState.FAILED
    assert "signal SIGKILL" in c.failure and c.ranks[0].exit_code == -9
    c2 = started()
    complete(c2, "w0", pb.RANK_SUCCEEDED)
    c2.rank_exited("w0", 0)  # a clean exit after completion changes nothing
    assert c2.state is RunState.RUNNING


def test_stop_sends_stop_and_ends_stopped() -> None:
    c = started()
    assert beat(c, "w0") == pb.CONTINUE
    assert c.request_stop("enough") is RunState.STOPPING
    assert beat(c, "w0") == pb.STOP and beat(c, "w1") == pb.STOP
    complete(c, "w0", pb.RANK_STOPPED)
    complete(c, "w1", pb.RANK_STOPPED)
    assert c.state is RunState.STOPPED
    assert any(e.kind == "stop_requested" and e.message == "enough" for e in c.events)


def test_stop_before_start_ends_the_run_at_once() -> None:
    c = Coordinator(RunPlan(2), run_id="r1")
    reg(c, "a")
    assert c.request_stop() is RunState.STOPPED
    with pytest.raises(Reject) as e:
        reg(c, "b")
    assert kind(e) == "failed_precondition"


def test_bad_completion_outcome_is_invalid_argument() -> None:
    c = started()
    with pytest.raises(Reject) as e:
        complete(c, "w0", pb.RANK_RUNNING)
    assert kind(e) == "invalid_argument"
    assert c.ranks[0].state is RankState.RUNNING


def test_a_death_seen_just_after_its_peers_errors_is_still_the_root_cause() -> None:
    clock = Clock()
    c = started(world=3, clock=clock)
    peer = "Traceback ...\nRuntimeError: [gloo/transport/tcp/pair.cc:537] Connection reset by peer"
    complete(c, "w0", pb.RANK_FAILED, error=peer)
    assert c.state is RunState.FAILED and c.root_cause is not None and c.root_cause.rank == 0
    clock.t += 0.3
    c.rank_exited("w2", -15, expected=True)  # torn down by the launcher: explains nothing
    assert c.root_cause.rank == 0
    c.rank_exited("w1", -11)  # the segfault that broke the collective, seen 0.3 s later
    assert c.root_cause.rank == 1 and "SIGSEGV" in c.failure
    # The event log, which had recorded the run finished with rank 0's error, says so too.
    corrections = [e for e in c.events if e.kind == "root_cause"]
    assert len(corrections) == 1 and corrections[0].rank == 1 and "SIGSEGV" in corrections[0].message
    late = started(world=2, clock=clock)
    complete(late, "w0", pb.RANK_FAILED, error=peer)
    clock.t += 5.0  # too late to be the explanation
    late.rank_exited("w1", -11)
    assert late.root_cause is not None and late.root_cause.rank == 0
    assert not [e for e in late.events if e.kind == "root_cause"]


def test_ranks_lost_together_are_named_together() -> None:
    clock = Clock()
    c = Coordinator(RunPlan(3, heartbeat_timeout=5.0), run_id="r1", clock=clock)
    for i, addr in enumerate(("10.0.0.1", "10.0.0.2", "10.0.0.2")):
        reg(c, f"w{i}", address=addr)
    for i in range(3):
        c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id=f"w{i}"))
    clock.t += 4.0
    beat(c, "w0", step=1)
    clock.t += 2.0
    c.expire()
    assert c.state is RunState.FAILED and c.root_cause is not None and c.root_cause.rank == 1
    assert "10.0.0.2" in c.failure and "lost at the same time: rank 2 (10.0.0.2)" in c.failure
    assert "stuck in the torch.distributed rendezvous" in c.failure


def test_ranks_lost_together_are_named_together_across_expiry_ticks() -> None:
    # A host's ranks fall silent at the same moment, but their last heartbeats are a fraction
    # of a heartbeat interval apart: the expiry tick that finds the first may not find the second.
    clock = Clock()
    c = Coordinator(RunPlan(4, heartbeat_timeout=3.0), run_id="r1", clock=clock)
    for i, addr in enumerate(("10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2")):
        reg(c, f"w{i}", address=addr)
    for i in range(4):
        c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id=f"w{i}"))
        beat(c, f"w{i}", step=1)
    clock.t += 1.0
    beat(c, "w1", step=2)  # host 10.0.0.2 drops off between these two beats
    clock.t += 0.1
    beat(c, "w3", step=2)
    for _ in range(14):  # the healthy host beats on; the master expires every 0.25 s
        clock.t += 0.25
        beat(c, "w0", step=3)
        beat(c, "w2", step=3)
        c.expire()
    assert c.state is RunState.FAILED and c.root_cause is not None and c.root_cause.rank == 1
    assert c.failure.endswith("lost at the same time: rank 3 (10.0.0.2)"), c.failure
    # The healthy host's ranks, aborted once the run failed, fall silent much later: not named.
    for _ in range(20):
        clock.t += 0.25
        c.expire()
    assert c.ranks[0].state is RankState.LOST and c.ranks[2].state is RankState.LOST
    assert "rank 0" not in c.failure and "rank 2" not in c.failure, c.failure


def test_memory_holds_a_bounded_tail_and_cursors_stay_valid() -> None:
    c = Coordinator(RunPlan(1, max_points_in_memory=100), run_id="r1")
    reg(c, "w0")
    c.can_start(pb.CanStartTrainingRequest(run_id="r1", worker_id="w0"))
    mirror = StateMirror()
    mirror.apply(c.snapshot())
    for chunk in range(10):  # 10 x 30 points: 300 logged, at most 100 kept
        steps = list(range(chunk * 30, chunk * 30 + 30))
        heartbeat(
            c,
            pb.HeartbeatRequest(
                run_id="r1",
                worker_id="w0",
                step=steps[-1],
                series=[pb.Series(name="loss", steps=steps, values=[1.0] * 30)],
            ),
        )
        mirror.apply(c.snapshot(mirror.cursor))
    kept, _ = c.series(0, "loss")
    assert len(kept) <= 100 and kept[-1] == 299 and c.trimmed
    # a client that kept polling saw every point exactly once
    assert mirror.series[(0, "loss")].steps.tolist() == list(range(300))


def test_bounded_metric_names_and_series_per_heartbeat() -> None:
    c = started(world=1)
    many = [pb.Series(name=f"m{i}", steps=[0], values=[0.0]) for i in range(MAX_METRICS_PER_RANK + 1)]
    with pytest.raises(Reject) as e:
        heartbeat(c, pb.HeartbeatRequest(run_id="r1", worker_id="w0", series=many))
    assert kind(e) == "invalid_argument"
    for i in range(MAX_METRICS_PER_RANK):
        beat(c, "w0", **{f"m{i}": [0.0]})
    with pytest.raises(Reject) as e:
        beat(c, "w0", one_more=[0.0])
    assert kind(e) == "invalid_argument"
    assert beat(c, "w0", m3=[1.0]) == pb.CONTINUE  # known names still go in


def test_a_long_history_comes_in_bounded_replies() -> None:
    c = started(world=1)
    for chunk in range(5):
        steps = list(range(chunk * 1000, chunk * 1000 + 1000))
        heartbeat(
            c,
            pb.HeartbeatRequest(
                run_id="r1",
                worker_id="w0",
                step=steps[-1],
                series=[pb.Series(name="loss", steps=steps, values=[0.5] * 1000)],
            ),
        )
    first = c.snapshot(max_points=1500)
    # At most the budget, ending where a beat's points (a chunk) end: 1,000 of them.
    assert first.more and sum(len(s.steps) for s in first.series) == 1000
    mirror = StateMirror()
    mirror.apply(first)
    replies = 1
    while True:
        reply = c.snapshot(mirror.cursor, max_points=1500)
        assert sum(len(s.steps) for s in reply.series) <= 1500
        mirror.apply(reply)
        replies += 1
        if not reply.more:
            break
    assert replies == 5 and mirror.series[(0, "loss")].steps.tolist() == list(range(5000))
    assert StateMirror.of(c).series[(0, "loss")].steps.tolist() == list(range(5000))
    with pytest.raises(Reject):
        c.snapshot(max_points=-1)


def test_a_stop_sets_one_step_for_every_rank_ahead_of_the_fastest() -> None:
    clock = Clock()
    c = started(2, clock)
    for t in range(11):  # 20 steps/s on both ranks, rank 1 one step behind
        clock.t = 1000.0 + t / 2
        beat(c, "w0", step=10 * t)
        beat(c, "w1", step=max(0, 10 * t - 1))
    assert c.stop_at_step == 0
    c.request_stop("user")
    assert c.stop_at_step == 100 + 40  # the furthest rank's step + 2 s at 20 steps/s
    c.request_stop("again")
    assert c.stop_at_step == 140  # a second request does not move it
    assert beat(c, "w1", step=99) == pb.STOP


def test_an_ended_runs_heartbeat_ages_stand_still_at_its_end() -> None:
    clock = Clock()
    c = started(clock=clock)
    beat(c, "w0", step=1)
    clock.t += 1.5
    beat(c, "w1", step=1)
    complete(c, "w0", pb.RANK_SUCCEEDED)
    complete(c, "w1", pb.RANK_SUCCEEDED)
    assert c.state is RunState.SUCCEEDED
    clock.t += 100.0
    ages = {r.rank: r.heartbeat_age for r in c.snapshot().ranks}
    assert ages == {0: pytest.approx(1.5), 1: pytest.approx(0.0)}


def test_a_rank_past_the_section_names_cap_is_told_once_in_the_event_log() -> None:
    c = started()
    bucket = pb.StepTiming(steps=1, step_seconds=0.1, sections={"(other sections)": 0.01, "augment": 0.01})
    for _ in range(3):
        heartbeat(c, pb.HeartbeatRequest(run_id=c.run_id, worker_id="w1", step=1, timing=bucket))
    told = [e for e in c.events if e.kind == "sections"]
    assert [(e.rank, e.message) for e in told] == [
        (1, "rank 1 marked more than 31 ctx.section names: the rest are timed together as '(other sections)'")
    ]


def test_a_master_with_many_callers_asks_for_fewer_beats_and_a_rank_obeys() -> None:
    from orch.runtime._sender import HeartbeatSender

    c = Coordinator(
        RunPlan(512, heartbeat_timeout=30.0, heartbeat_interval=0.25), run_id="big", clock=Clock()
    )
    for i in range(512):
        reg(c, f"w{i}")
    for i in range(512):
        c.can_start(pb.CanStartTrainingRequest(run_id="big", worker_id=f"w{i}"))
    c.expire()
    reply, _ = c.accept_heartbeat(pb.HeartbeatRequest(run_id="big", worker_id="w3", step=1))
    assert reply.interval == pytest.approx(2.0)  # 512 callers at 256 calls a second

    class Master:
        def SendHeartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
            return reply

    sender = HeartbeatSender(Master(), run_id="big", worker_id="w3", on_stop=lambda _: None, on_abort=print)  # type: ignore[arg-type]
    assert sender._beat() and sender.interval == pytest.approx(2.0)
    few, _ = started().accept_heartbeat(pb.HeartbeatRequest(run_id="r1", worker_id="w0", step=1))
    assert few.interval == 0.0  # two ranks: their own interval


def test_a_pruners_stop_ends_the_run_pruned() -> None:
    c = started()
    assert c.request_stop("pruned at step 3", prune=True) is RunState.STOPPING
    assert beat(c, "w0") == pb.STOP
    complete(c, "w0", pb.RANK_STOPPED)
    complete(c, "w1", pb.RANK_STOPPED)
    assert c.state is RunState.PRUNED and c.state.done
    assert any(e.kind == "pruned" and e.message == "pruned at step 3" for e in c.events)
    pending = Coordinator(RunPlan(2), run_id="r2")
    reg(pending, "a")
    assert pending.request_stop(prune=True) is RunState.PRUNED  # before it started


def test_a_sweeps_rungs_hold_the_ranks_until_it_decides() -> None:
    c = started()
    c.hold_at([3, 9, 27])

    def hold() -> int:
        reply, _ = c.accept_heartbeat(pb.HeartbeatRequest(run_id=c.run_id, worker_id="w0", step=3))
        return reply.hold_after_step

    assert hold() == 3  # ctx.steps waits after step 3
    c.pass_gate(3)
    assert hold() == 9
    c.pass_gate(27)
    assert hold() == 0  # past the last rung: no more waits
    c.hold_at([3, 9], passed=3)  # a resumed trial: the rung it passed holds it no more
    assert hold() == 9
    c.request_stop("pruned", prune=True)
    assert hold() == 0  # a stop ends the wait


def test_the_straggler_judgement_of_a_run_bigger_than_one_block_of_ranks() -> None:
    # expire() reads the ranks' step times a block at a time (the lock let go between
    # blocks, for the heartbeats); the judgement is the same as over all at once.
    from orch.master.coordinator import MEANS_AT_ONCE

    world, slow = MEANS_AT_ONCE + 44, MEANS_AT_ONCE + 3  # the straggler is in the second block
    clock = Clock()
    c = started(world=world, clock=clock)
    even = pb.StepTiming(steps=10, step_seconds=0.4, collective_seconds=0.1, collectives=True)
    late = pb.StepTiming(steps=10, step_seconds=0.4, collective_seconds=0.01, collectives=True)
    for tick in range(3):
        for i in range(world):
            for k in range(4):
                heartbeat(
                    c,
                    pb.HeartbeatRequest(
                        run_id="r1",
                        worker_id=f"w{i}",
                        step=40 * tick + 10 * k + 10,
                        timing=late if i == slow else even,
                    ),
                )
        c.expire()
        clock.t += 1.0
    told = [e for e in c.snapshot().events if e.kind == "straggler"]
    assert [e.rank for e in told] == [slow]
    assert c.snapshot().straggler_rank == slow

"""orch.master.control.snapshot: a GetState reply built from a run's parts, with only what the
caller's cursor has not seen, its points planned first and copied after. The run is made of
parts of a coordinator driven by hand, without its lock or clock."""

from __future__ import annotations

import dataclasses

import pytest

from orch.master.control import snapshot as snapshot_module
from orch.master.control.judge import CauseKind
from orch.master.control.plan import RunPlan
from orch.master.control.snapshot import draft_reply
from orch.master.control.startup import StartupWatch
from orch.master.control.stragglers import Verdict
from orch.master.control.validate import parse_cursor
from orch.master.coordinator import Coordinator
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.client import StateMirror
from orch.wire.model import Beat, JobView, Points, Registration
from orch.wire.states import RankState


class Run(Coordinator):
    """A coordinator whose parts the tests drive by hand, launched at 100.0 on its clock."""

    def __init__(self, world: int = 2, *, max_points: int = 1000, rendezvous_port: int = 0) -> None:
        plan = RunPlan(world, max_points_in_memory=max_points)
        port = rendezvous_port
        super().__init__(plan, run_id="r1", rendezvous_port=port, clock=lambda: 100.0, wall=lambda: 5.0)
        self._lock.acquire()  # held throughout, as the coordinator holds it to drive its parts
        self.startup = StartupWatch(90.0)  # the launch began its start-up 10 s earlier

    def started(self) -> Run:
        for i in range(self.world_size):
            req = Registration(worker_id=f"w{i}", host=f"h{i}", address=f"10.0.0.{i}", rendezvous_port=29555)
            self.intake.register(req, self.run_id, self.state)
        self.fate.start(self.world_size, 100.0)
        for rec in self.ranks:
            rec.state, rec.last_heartbeat = RankState.RUNNING, 100.0
        return self

    def log_points(self, worker: str, first: int, n: int, now: float = 101.0) -> None:
        steps = list(range(first, first + n))
        req = Beat(run_id="r1", worker_id=worker, step=steps[-1], total_steps=50, series=[])
        req.series.append(Points(name="loss", steps=steps, values=[float(s) for s in steps]))
        self.intake.beat(req, "r1", self.attempt, now, 7.0)


def reply(run: Run, cursor: bytes = b"", *, now: float = 110.0, **kw: object) -> pb.GetStateResponse:
    """The whole reply, as the coordinator makes it (no trim can come between the halves here)."""
    draft = draft_reply(run, cursor, parse_cursor(cursor, 0), now, 9.0, **kw)  # type: ignore[arg-type]
    return draft.finish(draft.copy())


def test_the_header_says_the_runs_state() -> None:
    run = Run(3).started()
    run.log_points("w1", 0, 4)
    r = reply(run)
    assert (r.run_id, r.state, r.world_size, r.registered, r.attempt, r.max_attempts) == (
        "r1",
        pb.RUNNING,
        3,
        3,
        1,
        1,
    )
    assert r.total_steps == 50  # the ranks' own, as the run set none
    assert r.elapsed == 10.0 and r.full and not r.more
    assert r.rendezvous == "10.0.0.0:29555"
    assert (r.failure, r.root_cause_rank, r.root_cause_error, r.root_cause_exit_code) == ("", -1, "", 0)
    assert not r.HasField("job")
    assert (r.stragglers_judged, r.straggler_rank, r.straggler_note) == (
        False, -1, "not judged yet: stragglers are judged once every rank runs",
    )  # fmt: skip
    assert (r.startup_note, r.startup_seconds) == ("", 0.0)  # a rank reported a step: no note
    run.plan = dataclasses.replace(run.plan, total_steps=80)  # the run's own
    assert reply(run).total_steps == 80


def test_no_rendezvous_is_shown_before_rank_0_says_where() -> None:
    run = Run(2)
    run.intake.register(Registration(worker_id="w0", address="10.0.0.0"), "r1", run.state)
    assert reply(run).rendezvous == ""
    assert (reply(run).startup_note, reply(run).startup_seconds) == ("1/2 registered", 20.0)  # since 90
    run.rendezvous_port = 29999  # a fixed port: known at once
    assert reply(run).rendezvous == "10.0.0.0:29999"


def test_the_root_cause_the_job_and_the_verdict_are_carried() -> None:
    run = Run(2).started()
    rec = run.ranks[1]
    rec.exit_code = -9
    run.fate.end_rank(
        rec, RankState.FAILED, run.registry, 104.0, error="Traceback\nKilled", kind=CauseKind.EXITED
    )
    run.cluster_job.update(JobView("slurm", "7", "RUNNING", nodes="n1"))
    run.stragglers.verdict = Verdict(True, 0, "data", "rank 0 is the straggler")
    r = reply(run)
    assert r.state == pb.FAILED and r.failure == run.failure and "rank 1" in r.failure
    assert (r.root_cause_rank, r.root_cause_error, r.root_cause_exit_code) == (1, "Traceback\nKilled", -9)
    assert (r.job.job_id, r.job.nodes) == ("7", "n1")
    assert (r.stragglers_judged, r.straggler_rank, r.straggler_section) == (True, 0, "data")
    assert r.elapsed == 4.0  # an ended run's time stands still


def test_an_ended_runs_ages_stand_still_at_its_end() -> None:
    run = Run(1).started()
    run.log_points("w0", 0, 1, now=102.0)
    run.fate.end_rank(run.ranks[0], RankState.SUCCEEDED, run.registry, 103.0, kind=CauseKind.ERROR)
    assert [x.heartbeat_age for x in reply(run, now=500.0).ranks] == [1.0]
    live = Run(1).started()
    live.log_points("w0", 0, 1, now=102.0)
    assert [x.heartbeat_age for x in reply(live, now=500.0).ranks] == [398.0]


def test_a_cursor_brings_only_what_is_new() -> None:
    run = Run(2).started()
    run.log_points("w0", 0, 3)
    first = reply(run)
    assert (
        first.full
        and sum(len(s.steps) for s in first.series) == 3
        and [e.kind for e in first.events] == ["started"]
    )
    again = reply(run, first.cursor)
    assert not again.full and list(again.series) == [] and list(again.events) == []
    run.log_points("w0", 3, 2)
    run.log_points("w1", 0, 1)
    third = reply(run, again.cursor)
    assert sorted((s.rank, list(s.steps)) for s in third.series) == [(0, [3, 4]), (1, [0])]
    mirror = StateMirror()
    for r in (first, again, third):
        mirror.apply(r)
    assert mirror.series[(0, "loss")].steps.tolist() == [0, 1, 2, 3, 4]


def test_another_runs_cursor_or_an_older_epoch_starts_over() -> None:
    run = Run(1).started()
    run.log_points("w0", 0, 3)
    cursor = reply(run).cursor
    other = pb.StateCursor.FromString(cursor)
    other.run_id = "r0"
    assert reply(run, other.SerializeToString()).full
    run.intake.points.epoch += 1  # a restart rewound a series: the offsets count other points
    assert reply(run, cursor).full


def test_points_come_in_bounded_replies_up_to_the_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(1).started()
    run.log_points("w0", 0, 10)
    first = reply(run, max_points=4)
    assert first.more and [list(s.steps) for s in first.series] == [[0, 1, 2, 3]]
    second = reply(run, first.cursor, max_points=4)
    assert second.more and [list(s.steps) for s in second.series] == [[4, 5, 6, 7]]
    assert not reply(run, second.cursor, max_points=4).more
    monkeypatch.setattr(snapshot_module, "MAX_POINTS_PER_REPLY", 3)
    assert [list(s.steps) for s in reply(run, max_points=100).series] == [[0, 1, 2]]  # the ceiling
    assert [list(s.steps) for s in reply(run).series] == [[0, 1, 2]]  # and the default


def test_skip_series_brings_the_state_and_events_without_points() -> None:
    run = Run(1).started()
    run.log_points("w0", 0, 10)
    r = reply(run, skip_series=True)
    assert list(r.series) == [] and [e.kind for e in r.events] == ["started"] and not r.more


def test_a_series_trimmed_between_the_plan_and_the_copy_is_copied_again() -> None:
    run = Run(1, max_points=8).started()
    run.log_points("w0", 0, 8)
    draft = draft_reply(run, b"", pb.StateCursor(), 110.0, 9.0)
    assert not draft.trimmed_meanwhile()
    run.log_points("w0", 8, 4)  # 12 points: the oldest 6 leave memory
    assert run.intake.points.get(0, "loss").base == 6
    assert draft.trimmed_meanwhile()
    built = draft.copy()
    draft.recopy(built)  # under the lock, in the coordinator
    r = draft.finish(built)
    assert [list(s.steps) for s in r.series] == [[6, 7]]  # what the plan named and is still held
    assert list(pb.StateCursor.FromString(r.cursor).offsets) == [8]


def test_the_serialized_reply_carries_the_same_points_in_pieces() -> None:
    # The gRPC master's path: each series' chunks (its beats' own bytes) joined outside the
    # lock, points outside whole chunks encoded in pieces of PIECE_POINTS, the pieces appended
    # to the reply's own fields. A reader gets the same run, in order.
    from orch.master.control.series import PIECE_POINTS, Chunks

    run = Run(2, max_points=10 * PIECE_POINTS).started()
    n = 2 * PIECE_POINTS + 17
    run.log_points("w0", 0, n)
    run.log_points("w1", 0, 5)
    draft = draft_reply(run, b"", parse_cursor(b"", 0), 110.0, 9.0)
    run.points.get(0, "loss").chunks = Chunks(n)  # as after a rewind: no chunk holds these
    encoded = draft.encode()
    assert [len(pieces) for pieces in encoded] == [3, 1]  # rank 0's loss in three pieces
    parsed = pb.GetStateResponse.FromString(draft.finish_bytes(encoded))
    assert [(s.rank, len(s.steps)) for s in parsed.series] == [
        (0, PIECE_POINTS),
        (0, PIECE_POINTS),
        (0, 17),
        (1, 5),
    ]
    assert encoded[1] == [b"".join(run.points.get(1, "loss").chunks.data)]  # its beat's chunk
    mirror, direct = StateMirror(), StateMirror()
    mirror.apply(parsed)
    direct.apply(reply(run))
    assert mirror.history() == direct.history()
    assert mirror.history()["loss"][0]["step"] == list(range(n))
    mine, theirs = pb.StateCursor.FromString(parsed.cursor), pb.StateCursor.FromString(direct.cursor)
    assert (mine.ranks_seen, theirs.ranks_seen) == (1, 2)  # the ranks' publications, in turn
    mine.ranks_seen = theirs.ranks_seen = 0
    assert mine == theirs and parsed.state == pb.RUNNING

"""A GetState reply, built from a run's parts: the run's state, ranks and verdicts, and only the
points and events after the caller's cursor.

Dashboards poll it several times a second and a late client catches up on up to a million
points, while heartbeats wait on the same lock: so a reply is built in two halves. Under the
lock, :func:`draft_reply` fills in everything but the points and *plans* which points go in
(:meth:`.series.SeriesLog.plan`); the copies, the bulk of a catch-up, are made after it
(:meth:`StateDraft.copy`), and only a series trimmed meanwhile is copied again under the lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from orch.master.control.cluster_job import JobWatch
from orch.master.control.events import EventLog
from orch.master.control.fate import Fate
from orch.master.control.intake import Intake
from orch.master.control.plan import RunPlan
from orch.master.control.progress import ProgressWatch
from orch.master.control.published import Published, framed
from orch.master.control.registry import RankRecord
from orch.master.control.series import MAX_POINTS_PER_REPLY, SeriesLog, Slice, yield_gil
from orch.master.control.startup import StartupWatch
from orch.master.control.straggler_watch import StragglerWatch
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import field_key, put_event, put_status, varint
from orch.wire.model import RunStatus
from orch.wire.states import RunState


@dataclass
class StateDraft:
    """A reply done but for its points, which ``plan`` names; ``cursor`` is the next one."""

    reply: pb.GetStateResponse
    cursor: pb.StateCursor
    plan: list[Slice]
    ranks: list[RankRecord]
    at: float  # the master's clock the ranks' ages are read at
    publisher: Published
    since: int  # the publication of the ranks the caller holds (0: it holds none)

    rank_infos: list[bytes] | None = None  # the ranks' serialized RankInfos, once published

    def publish(self, pause: Callable[[], None] = yield_gil) -> None:
        """The ranks, as clients see them (call it without the lock: a thousand ranks take
        milliseconds, which heartbeats need not wait for; ``pause`` as for :meth:`encode`); once."""
        if self.rank_infos is None:
            seq, changed_only, self.rank_infos = self.publisher.ranks(self.ranks, self.at, self.since, pause)
            self.cursor.ranks_seen = seq
            self.reply.ranks_changed_only = changed_only
            self.reply.clock = self.at

    def copy(self) -> list[pb.Series]:
        """The planned points (call it without the lock)."""
        return SeriesLog.copy(self.plan)

    def trimmed_meanwhile(self) -> bool:
        """True when a planned series lost points to the budget since the plan: take the lock
        and :meth:`recopy` it."""
        return any(sl.series.base != sl.base for sl in self.plan)

    def recopy(self, built: list[pb.Series]) -> None:
        """Copy again the series trimmed meanwhile (call it under the lock)."""
        SeriesLog.recopy_trimmed(self.plan, built)

    def encode(self, pause: Callable[[], None] = yield_gil) -> list[list[bytes]]:
        """The planned points, serialized in pieces (call it without the lock), calling
        ``pause`` after each turn of building (see :meth:`.series.SeriesLog.encode`)."""
        return SeriesLog.encode(self.plan, pause)

    def reencode_trimmed(self, encoded: list[list[bytes]]) -> None:
        """Under the lock: encode again the series trimmed while they were encoded."""
        for i, sl in enumerate(self.plan):
            if sl.series.base != sl.base:
                fresh = Slice(
                    sl.rank, sl.name, sl.series, sl.series.base, max(sl.first, sl.series.base), sl.last
                )
                encoded[i] = SeriesLog.encode([fresh])[0]

    def finish_bytes(self, encoded: list[list[bytes]]) -> bytes:
        """The reply, serialized: its fields, then each series piece as one more ``series``
        entry (a repeated field's entries may follow the others in any order)."""
        self.publish()
        self.reply.cursor = self.cursor.SerializeToString()
        parts = [self.reply.SerializeToString(), framed(self.rank_infos or [])]
        for pieces in encoded:
            for piece in pieces:
                parts.append(SERIES_TAG + varint(len(piece)))
                parts.append(piece)
        return b"".join(parts)

    def finish(self, built: list[pb.Series]) -> pb.GetStateResponse:
        self.publish()
        self.reply.MergeFromString(framed(self.rank_infos or []))
        self.reply.series.extend(p for p in built if p.steps)
        self.reply.cursor = self.cursor.SerializeToString()
        return self.reply


class Run(Protocol):
    """What a reply is drafted from: a run's settings and its parts, as the coordinator owns them."""

    run_id: str
    world_size: int
    plan: RunPlan
    intake: Intake
    event_log: EventLog
    published: Published
    fate: Fate
    cluster_job: JobWatch
    stragglers: StragglerWatch
    progress: ProgressWatch
    startup: StartupWatch

    def active_rendezvous_port(self) -> int: ...


def draft_reply(
    run: Run,
    cursor: bytes,
    prev: pb.StateCursor,
    now: float,
    wall: float,
    *,
    skip_series: bool = False,
    max_points: int = 0,
    changed_ranks: bool = False,
) -> StateDraft:
    """The reply to a caller whose last cursor was ``cursor`` (``prev``, as ``parse_cursor``
    read it). At most ``max_points`` points (default and ceiling :data:`MAX_POINTS_PER_REPLY`);
    ``more`` then says to ask again. ``skip_series``: no points. ``changed_ranks``: only the
    ranks whose records changed since the cursor (see :mod:`.published`). Call it under the run's lock;
    ``now`` is the master's clock (ages, elapsed), ``wall`` the time of day (events)."""
    budget = min(max_points or MAX_POINTS_PER_REPLY, MAX_POINTS_PER_REPLY)
    # A full reply (the caller starts over) without a cursor, with another run's, or with one
    # from before a restart rewound a series (another epoch): its offsets count other points.
    full = not cursor or prev.run_id != run.run_id or prev.epoch != run.intake.points.epoch
    sent = {} if full else dict(zip(prev.keys, prev.offsets, strict=True))
    reply = pb.GetStateResponse(full=full)
    put_status(status_of(run, now), reply)
    lifecycle, ranks = run.fate.lifecycle, run.intake.registry.ranks
    # An ended run's ages stand still at its end (a finished rank beats no more). The ranks'
    # records are turned into the reply's after the lock (see StateDraft.publish).
    at = lifecycle.ended_at if lifecycle.ended_at is not None else now
    nxt = pb.StateCursor(run_id=run.run_id, epoch=run.intake.points.epoch)
    plan, more = ([], False) if skip_series else run.intake.points.plan(sent, budget, nxt)
    events, nxt.events, more_events = run.event_log.since(0 if full else max(0, prev.events), wall)
    for event in events:
        put_event(event, reply)
    reply.more = more or more_events
    since = prev.ranks_seen if changed_ranks and not full else 0
    return StateDraft(reply, nxt, plan, list(ranks), at, run.published, since)


def status_of(run: Run, now: float) -> RunStatus:
    """What the run's parts say of it, at ``now`` on the master's clock (its elapsed time, the
    stall, the start-up)."""
    fate, ranks = run.fate, run.intake.registry.ranks
    cause = fate.judge.cause
    root = cause.record if cause is not None else None
    lifecycle = fate.lifecycle
    port = run.active_rendezvous_port()
    rank0 = run.intake.registry.rank0
    v = run.stragglers.verdict
    live = lifecycle.state in (RunState.RUNNING, RunState.STOPPING)
    # A run that ended while its ranks stood still keeps the stall as evidence (how long, which
    # ranks, and, in its stacks, the odd one out), beside how it ended.
    stall_at = now if live or lifecycle.ended_at is None else lifecycle.ended_at
    stalled = run.progress.stalled_for(stall_at) if live or lifecycle.state.done else 0.0
    note = run.progress.note(stall_at) if stalled else ""
    if note and not live:
        note += ", when the run ended"
    # The stacks as last told (a stall's, once every rank answered or the wait was over; or
    # the last ones asked for): never a half-answered picture while the ranks' answers come.
    grouped = run.progress.stacks
    startup_note, startup_seconds = run.startup.note(lifecycle.state, ranks, run.world_size, now)
    return RunStatus(
        run_id=run.run_id,
        state=lifecycle.state,
        world_size=run.world_size,
        registered=len(ranks),
        total_steps=run.plan.total_steps or max((r.total_steps for r in ranks), default=0),
        elapsed=lifecycle.elapsed(now),
        failure=fate.failure,
        root_cause_rank=root.rank if root is not None else -1,
        root_cause_error=cause.error if cause is not None else "",
        root_cause_exit_code=root.exit_code if root is not None else 0,
        attempt=lifecycle.attempt,
        max_attempts=lifecycle.max_attempts,
        rendezvous=f"{rank0.address}:{port}" if rank0 is not None and port else "",
        job=run.cluster_job.job,
        stragglers_judged=v.judged,
        straggler_rank=v.rank,
        straggler_section=v.section,
        straggler_note=v.shown(lifecycle.state.done),  # an ended run not judged says so, not "yet"
        stalled_for=stalled,
        progress_note="; ".join(n for n in (note, fate.stop.note) if n),
        stacks=str(grouped) if grouped is not None else "",
        stacks_taken=run.progress.stacks_taken if grouped is not None else 0.0,
        startup_note=startup_note,
        startup_seconds=startup_seconds,
    )


SERIES_TAG = field_key(pb.GetStateResponse, "series")

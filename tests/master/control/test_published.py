"""orch.master.control.published: each rank's record serialized once per change, and only the
records that changed since a caller's publication sent to it, with ages read at each reply."""

from __future__ import annotations

import pytest

from orch.master.control.published import Published, framed
from orch.master.control.registry import RankRecord
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import RankState


def parsed(infos: list[bytes]) -> list[pb.RankInfo]:
    return list(pb.GetStateResponse.FromString(framed(infos)).ranks)


def running(rank: int) -> RankRecord:
    rec = RankRecord(rank=rank, worker_id=f"w{rank}", host="h", state=RankState.RUNNING)
    rec.beat(10.0, 0, 0, 0)
    rec.beat(12.0, 8, 0, 0)
    return rec


def test_a_caller_gets_only_the_ranks_that_changed_since_its_publication() -> None:
    pub = Published()
    ranks = [running(0), running(1), running(2)]
    first, changed_only, infos = pub.ranks(ranks, 15.0, 0)
    assert not changed_only and [r.rank for r in parsed(infos)] == [0, 1, 2]
    # Nothing changed: a caller that holds publication `first` gets no rank, and is told so.
    second, changed_only, infos = pub.ranks(ranks, 16.0, first)
    assert second > first and changed_only and infos == []
    # Rank 1 beats, rank 2 ends: those two, however many publications came between.
    ranks[1].beat(16.5, 12, 0, 0)
    ranks[2].state = RankState.SUCCEEDED
    pub.ranks(ranks, 17.0, 0)  # another caller's full reply sees the change first
    _, changed_only, infos = pub.ranks(ranks, 17.5, first)
    got = parsed(infos)
    assert changed_only and [(r.rank, r.step, r.state) for r in got] == [
        (1, 12, pb.RANK_RUNNING),
        (2, 8, pb.RANK_SUCCEEDED),
    ]
    assert got[1].steps_per_sec == 0.0  # an ended rank runs no steps


def test_ages_are_read_at_each_reply_over_the_kept_record() -> None:
    pub = Published()
    rec = running(3)
    _, _, (one,) = pub.ranks([rec], 15.0, 0)
    _, _, (two,) = pub.ranks([rec], 20.0, 0)
    a, b = pb.RankInfo.FromString(one), pb.RankInfo.FromString(two)
    assert (a.heartbeat_age, a.progress_age) == pytest.approx((3.0, 3.0))
    assert (b.heartbeat_age, b.progress_age) == pytest.approx((8.0, 8.0))
    assert a.steps_per_sec == b.steps_per_sec == pytest.approx(4.0)
    assert a.worker_id == "w3" and one[:-18] == two[:-18]  # the kept bytes, new ages after them
    fresh = RankRecord(rank=4, state=RankState.REGISTERED)
    (info,) = parsed(pub.ranks([fresh], 21.0, 0)[2])
    assert (info.heartbeat_age, info.progress_age) == (-1.0, -1.0)  # no beat yet, not running


def test_a_new_roster_is_sent_whole() -> None:
    pub = Published()
    old = [running(0), running(1)]
    seen, _, _ = pub.ranks(old, 15.0, 0)
    new = [running(0), running(1)]  # a restart: new records for the same ranks
    _, changed_only, infos = pub.ranks(new, 16.0, seen)
    assert not changed_only and len(infos) == 2

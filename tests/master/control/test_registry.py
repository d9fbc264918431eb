"""orch.master.control.registry: the rank records of one attempt, registration and the start barrier.

Times are plain floats (the master's clock), passed in.
"""

from __future__ import annotations

from typing import Any

import pytest

from orch.master.control.registry import RankRecord, Registry
from orch.master.control.validate import Reject
from orch.wire.model import Registration
from orch.wire.states import RankState


def req(worker_id: str, **fields: Any) -> Registration:
    values: dict[str, Any] = {"worker_id": worker_id, "host": f"host-{worker_id}", "pid": 100}
    values.update(fields)
    return Registration(**values)


def filled(world_size: int, **fields: Any) -> Registry:
    """A registry every rank of which registered (workers w0, w1, ...)."""
    reg = Registry(world_size)
    for i in range(world_size):
        reg.add(req(f"w{i}", **fields), "run-a")
    return reg


# -- RankRecord ----------------------------------------------------------------------------


def test_records_compare_by_identity() -> None:
    a, b = RankRecord(rank=0, worker_id="w"), RankRecord(rank=0, worker_id="w")
    assert a == a
    assert a != b
    assert a in [a] and b not in [a]
    assert len({a, b}) == 2
    assert {a: 1}[a] == 1


def test_beat_records_progress_and_the_time() -> None:
    rec = RankRecord(rank=0, state=RankState.RUNNING)
    rec.beat(10.0, step=5, total_steps=100, dropped_points=2)
    assert (rec.last_heartbeat, rec.beats, rec.dropped_points) == (10.0, 1, 2)
    assert (rec.step, rec.total_steps) == (5, 100)
    rec.beat(11.0, step=3, total_steps=0, dropped_points=4)  # a late, older step; unknown total
    assert rec.step == 5  # progress never goes back
    assert rec.total_steps == 100  # 0 means unknown: the known total stays
    assert (rec.last_heartbeat, rec.beats, rec.dropped_points) == (11.0, 2, 4)


def test_an_ended_ranks_late_points_count_as_steps_done_but_not_towards_its_rate() -> None:
    """A failed rank delivers the points it logged before it failed after its report: the
    steps they carry were done (the panel's table agrees with its curves)."""
    rec = RankRecord(rank=0, state=RankState.FAILED, step=7, total_steps=7)
    rec.beat(20.0, step=9, total_steps=50, dropped_points=1)
    assert (rec.step, rec.total_steps) == (9, 7)
    rec.beat(21.0, step=8, total_steps=50, dropped_points=1)
    assert rec.step == 9  # never back
    assert len(rec.progress) == 0
    assert (rec.last_heartbeat, rec.beats, rec.dropped_points) == (21.0, 2, 1)


def test_steps_per_second_over_the_recent_beats() -> None:
    rec = RankRecord(rank=0, state=RankState.RUNNING)
    assert rec.steps_per_second() == 0.0
    rec.beat(10.0, 0, 0, 0)
    assert rec.steps_per_second() == 0.0  # one point is no rate
    rec.beat(12.0, 10, 0, 0)
    rec.beat(14.0, 30, 0, 0)
    assert rec.steps_per_second() == pytest.approx(30 / 4)


# -- registration --------------------------------------------------------------------------


def test_ranks_follow_registration_order() -> None:
    reg = Registry(3)
    for i, worker in enumerate(["b", "c", "a"]):
        rec, new = reg.add(req(worker), "run-a")
        assert new and rec.rank == i and rec.worker_id == worker
    assert [r.worker_id for r in reg.ranks] == ["b", "c", "a"]
    assert reg.full
    assert reg.get("c") is reg.ranks[1]
    assert reg.get("z") is None


def test_a_record_holds_what_the_worker_sent() -> None:
    reg = Registry(2)
    rec, _ = reg.add(req("w0", pid=42, address="10.0.0.1", rendezvous_port=29500, backend="nccl"), "run-a")
    assert (rec.host, rec.pid, rec.address) == ("host-w0", 42, "10.0.0.1")
    assert (rec.rendezvous_port, rec.backend, rec.state) == (29500, "nccl", RankState.REGISTERED)
    other, _ = reg.add(req("w1"), "run-a")
    assert other.address == "host-w1"  # no address: the host is where the others reach it


def test_a_retried_register_gets_the_same_record_and_its_new_port() -> None:
    reg = Registry(2)
    first, new = reg.add(req("w0"), "run-a")
    assert new and first.rendezvous_port == 0
    again, new = reg.add(req("w0", rendezvous_port=29501), "run-a")
    assert again is first and not new
    assert first.rendezvous_port == 29501
    again, new = reg.add(req("w0"), "run-a")  # a retry without a port keeps the known one
    assert again is first and not new and first.rendezvous_port == 29501
    assert len(reg.ranks) == 1


def test_a_full_registry_refuses_a_new_worker_but_not_a_retry() -> None:
    reg = filled(2)
    with pytest.raises(Reject) as info:
        reg.add(req("w2"), "run-a")
    assert info.value.kind == "resource_exhausted"
    assert "run run-a already has all 2 ranks registered" in str(info.value)
    assert len(reg.ranks) == 2 and reg.get("w2") is None
    rec, new = reg.add(req("w1"), "run-a")
    assert rec is reg.ranks[1] and not new


def test_known_names_the_unknown_worker() -> None:
    reg = filled(1)
    assert reg.known("w0", "run-a") is reg.ranks[0]
    with pytest.raises(Reject) as info:
        reg.known("ghost", "run-a")
    assert info.value.kind == "not_found"
    assert "no worker 'ghost' is registered in run run-a" in str(info.value)


def test_rendezvous_port_fixed_or_rank_zeros() -> None:
    reg = Registry(2)
    assert reg.rendezvous_port(0) == 0  # nobody registered
    reg.add(req("w0"), "run-a")
    assert reg.rendezvous_port(0) == 0  # rank 0 has not bound its store yet
    assert reg.rendezvous_port(29400) == 29400
    reg.add(req("w1", rendezvous_port=1111), "run-a")  # only rank 0's port counts
    assert reg.rendezvous_port(0) == 0
    reg.add(req("w0", rendezvous_port=29555), "run-a")
    assert reg.rendezvous_port(0) == 29555
    assert reg.rendezvous_port(29400) == 29400  # a fixed port wins


# -- the start barrier ---------------------------------------------------------------------


def test_barrier_is_closed_until_every_rank_registered() -> None:
    reg = Registry(2)
    rec, _ = reg.add(req("w0", rendezvous_port=29500), "run-a")
    reply = reg.barrier(rec, open_=True, fixed_port=0, backend="", now=1.0)
    assert not reply.ready
    assert (reply.registered, reply.world_size) == (1, 2)
    assert reply.master_addr == "" and reply.master_port == 0
    assert rec.state is RankState.REGISTERED and rec.last_heartbeat is None


def test_barrier_is_closed_until_the_run_opens_it() -> None:
    reg = filled(2, rendezvous_port=29500)
    rec = reg.ranks[1]
    reply = reg.barrier(rec, open_=False, fixed_port=0, backend="", now=1.0)
    assert not reply.ready and reply.registered == 2
    assert rec.state is RankState.REGISTERED and rec.last_heartbeat is None


def test_barrier_is_closed_until_a_rendezvous_port_is_known() -> None:
    reg = filled(2)
    rec = reg.ranks[1]
    assert not reg.barrier(rec, open_=True, fixed_port=0, backend="", now=1.0).ready
    assert rec.state is RankState.REGISTERED
    reg.add(req("w0", rendezvous_port=29500), "run-a")  # rank 0 says where its store listens
    reply = reg.barrier(rec, open_=True, fixed_port=0, backend="", now=2.0)
    assert reply.ready and reply.master_port == 29500


def test_open_barrier_tells_rank_zeros_address_and_the_fixed_port() -> None:
    reg = Registry(2)
    reg.add(req("w0", address="10.0.0.7", rendezvous_port=1234), "run-a")
    reg.add(req("w1", address="10.0.0.8"), "run-a")
    reply = reg.barrier(reg.ranks[1], open_=True, fixed_port=29400, backend="", now=3.0)
    assert reply.ready
    assert (reply.master_addr, reply.master_port) == ("10.0.0.7", 29400)
    assert (reply.registered, reply.world_size) == (2, 2)


def test_open_barrier_marks_a_registered_rank_running_now() -> None:
    reg = filled(2, rendezvous_port=29500)
    rec = reg.ranks[1]
    reg.barrier(rec, open_=True, fixed_port=0, backend="", now=7.5)
    assert rec.state is RankState.RUNNING and rec.last_heartbeat == 7.5
    assert reg.ranks[0].state is RankState.REGISTERED  # only the rank that asked
    rec.beat(9.0, 1, 0, 0)
    reg.barrier(rec, open_=True, fixed_port=0, backend="", now=12.0)  # asking again changes nothing
    assert rec.state is RankState.RUNNING and rec.last_heartbeat == 9.0


def test_open_barrier_leaves_an_ended_rank_ended() -> None:
    reg = filled(1, rendezvous_port=29500)
    rec = reg.ranks[0]
    rec.state = RankState.FAILED
    assert reg.barrier(rec, open_=True, fixed_port=0, backend="", now=1.0).ready
    assert rec.state is RankState.FAILED and rec.last_heartbeat is None


@pytest.mark.parametrize(
    ("backends", "chosen"),
    [
        (["nccl", "nccl", "nccl"], "nccl"),
        (["nccl", "gloo", "nccl"], "gloo"),
        (["nccl", "", "nccl"], "gloo"),
        (["", "", ""], "gloo"),
    ],
)
def test_backend_is_nccl_only_when_every_rank_can_run_it(backends: list[str], chosen: str) -> None:
    reg = Registry(len(backends))
    for i, backend in enumerate(backends):
        reg.add(req(f"w{i}", backend=backend, rendezvous_port=29500), "run-a")
    assert reg.barrier(reg.ranks[0], open_=True, fixed_port=0, backend="", now=0.0).backend == chosen


def test_a_configured_backend_wins() -> None:
    reg = filled(2, backend="nccl", rendezvous_port=29500)
    assert reg.barrier(reg.ranks[0], open_=True, fixed_port=0, backend="gloo", now=0.0).backend == "gloo"


# -- silence and reports -------------------------------------------------------------------


def test_silent_picks_running_ranks_past_the_timeout_only() -> None:
    reg = filled(5)
    fresh, old, exactly, ended, waiting = reg.ranks
    for rec, beat in [(fresh, 95.0), (old, 80.0), (exactly, 90.0), (ended, 50.0)]:
        rec.state, rec.last_heartbeat = RankState.RUNNING, beat
    ended.state = RankState.FAILED
    waiting.state = RankState.RUNNING  # through the barrier, never a heartbeat time: cannot tell
    assert reg.silent(100.0, timeout=10.0) == [old]
    assert reg.silent(100.0, timeout=19.0) == [old]
    assert reg.silent(100.0, timeout=20.0) == []
    assert reg.silent(100.1, timeout=10.0) == [old, exactly]
    assert reg.silent(1000.0, timeout=10.0) == [fresh, old, exactly]


def test_registered_ranks_are_never_silent() -> None:
    reg = filled(2)
    reg.ranks[0].last_heartbeat = 0.0  # still REGISTERED
    assert reg.silent(1e6, timeout=1.0) == []


@pytest.mark.parametrize(
    ("state", "reported"),
    [
        (RankState.REGISTERED, False),
        (RankState.RUNNING, False),
        (RankState.SUCCEEDED, True),
        (RankState.FAILED, True),
        (RankState.STOPPED, True),
        (RankState.LOST, False),
    ],
)
def test_reported_means_ended_and_not_lost(state: RankState, reported: bool) -> None:
    reg = filled(1)
    reg.ranks[0].state = state
    assert reg.reported("w0") is reported


def test_an_unknown_worker_reported_nothing() -> None:
    assert not filled(1).reported("ghost")


# -- host agents' blocks --------------------------------------------------------------------


def test_a_host_agents_ranks_are_one_block_whatever_the_order_they_register_in() -> None:
    order = [("b", 1), ("a", 0), ("c", 2), ("b", 0), ("a", 2), ("c", 0), ("a", 1), ("b", 2), ("c", 1)]
    reg = Registry(9)
    ranks = {}
    for group, local in order:
        rec, _ = reg.add(req(f"{group}{local}", group=group, local_world_size=3, local_rank=local), "run-a")
        ranks[(group, local)] = rec.rank
    for group in "abc":
        block = [ranks[(group, local)] for local in range(3)]
        start = block[0]
        assert start % 3 == 0 and block == [start, start + 1, start + 2], (group, block)  # RANK = G*3 + L
    assert sorted(ranks.values()) == list(range(9))


def test_a_worker_without_a_group_takes_a_rank_no_block_holds() -> None:
    reg = Registry(4)
    reg.add(req("a0", group="a", local_world_size=2, local_rank=0), "run-a")  # holds ranks 0-1
    lone, _ = reg.add(req("lone"), "run-a")
    assert lone.rank == 2
    a1, _ = reg.add(req("a1", group="a", local_world_size=2, local_rank=1), "run-a")
    assert a1.rank == 1

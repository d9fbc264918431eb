"""orch.master.control.host_sync: what the host agents are told, and where a restart across hosts
stands (elastic too). No coordinator: the run's state and attempt are passed in, times are plain
floats, the failed attempt's ranks are bare :class:`RankRecord` objects."""

from __future__ import annotations

import pytest

from orch.master.control.host_sync import WAIT, HostSync, Settled
from orch.master.control.hosts import HostRecord
from orch.master.control.judge import CauseKind
from orch.master.control.registry import RankRecord
from orch.master.control.validate import Reject
from orch.wire.limits import MAX_ERROR_LEN
from orch.wire.model import HostAction, HostReport
from orch.wire.states import RunState

S = RunState
TIMEOUT = 5.0


def call(
    sync: HostSync, host: str, attempt: int, running: bool, *workers: str, now: float = 0.0
) -> HostRecord:
    """Host ``host``'s agent calls a run of 4 ranks at attempt 1."""
    return sync.join(
        HostReport(host=host, attempt=attempt, running=running, worker_ids=tuple(workers)), 1, 4, now
    )


def two_hosts(min_world_size: int | None = None) -> tuple[HostSync, list[RankRecord]]:
    """Hosts a and b each started two ranks of attempt 1, which have ended (not running)."""
    sync = HostSync(True, min_world_size)
    call(sync, "a:1", 1, False, "a0", "a1")
    call(sync, "b:2", 1, False, "b0", "b1")
    recs = [RankRecord(rank=i, worker_id=w, host=w[0]) for i, w in enumerate(("a0", "a1", "b0", "b1"))]
    return sync, recs


def settle(sync: HostSync, recs: list[RankRecord], now: float = 1.0, *, stopping: bool = False) -> Settled:
    return sync.settle(S.RESTARTING, 1, recs, now, TIMEOUT, stopping=stopping)


# -- join, failure, action -------------------------------------------------------------------


def test_a_call_is_kept_by_host_and_a_late_one_changes_nothing() -> None:
    sync = HostSync()
    rec = call(sync, "a:1", 1, True, "a0", now=3.0)
    assert (rec.host, rec.name, rec.attempt, rec.running, rec.last_seen) == ("a:1", "a", 1, True, 3.0)
    assert rec.worker_ids == {"a0"} and sync.hosts.hosts == {"a:1": rec}
    call(sync, "a:1", 0, False, now=4.0)  # delayed: about the attempt before
    assert (rec.attempt, rec.running, rec.worker_ids, rec.last_seen) == (1, True, {"a0"}, 4.0)


def test_a_call_about_an_attempt_ahead_of_the_run_is_refused() -> None:
    with pytest.raises(Reject) as e:
        HostSync().join(HostReport(host="a:1", attempt=3), 2, 4, 0.0)
    assert e.value.kind == "failed_precondition"
    assert str(e.value) == "host a:1 speaks of attempt 3; the run is at 2"


def test_no_more_hosts_than_ranks_but_a_known_host_may_call_again() -> None:
    sync = HostSync()
    for h in ("a:1", "b:2"):
        sync.join(HostReport(host=h), 1, 2, 0.0)
    with pytest.raises(Reject) as e:
        sync.join(HostReport(host="c:3"), 1, 2, 0.0)
    assert e.value.kind == "resource_exhausted" and str(e.value) == "2 hosts already joined a run of 2 ranks"
    assert sync.join(HostReport(host="a:1", attempt=1), 1, 2, 1.0).attempt == 1


def test_a_hosts_failure_fails_only_the_live_attempt() -> None:
    sync = HostSync()
    req = HostReport(host="b:2", attempt=2, failure="worker b0 died\n" + "x" * (2 * MAX_ERROR_LEN))
    rec = sync.join(req, 2, 4, 0.0)
    cause = sync.failure(req, rec, S.RUNNING, 2)
    assert cause is not None and cause.kind is CauseKind.OUTSIDE and cause.record is None
    assert (
        cause.message.startswith("host b: worker b0 died\n")
        and len(cause.message) == len("host b: ") + MAX_ERROR_LEN
    )
    assert sync.failure(req, rec, S.RUNNING, 3) is None  # about an older attempt
    for state in (S.RESTARTING, S.FAILED, S.STOPPED):  # already failing, or ended
        assert sync.failure(req, rec, state, 2) is None
    assert sync.failure(HostReport(host="b:2", attempt=2), rec, S.RUNNING, 2) is None


def test_what_each_host_is_told_to_do() -> None:
    sync, _ = two_hosts()
    a = sync.hosts.hosts["a:1"]
    assert sync.action("a:1", a, S.RUNNING, 1) == HostAction.CONTINUE
    assert sync.action("a:1", a, S.PENDING, 2) == HostAction.START  # its ranks ended, attempt 2 opened
    a.running = True
    assert sync.action("a:1", a, S.PENDING, 2) == HostAction.CONTINUE  # still tearing the old ones down
    assert sync.action("a:1", a, S.RESTARTING, 1) == HostAction.WAIT
    for done in (S.SUCCEEDED, S.FAILED, S.STOPPED):
        assert sync.action("a:1", a, done, 1) == HostAction.EXIT
    sync.hosts.drop([a])
    assert sync.action("a:1", a, S.RUNNING, 1) == HostAction.EXIT  # left out of the run


# -- settle ----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [S.PENDING, S.RUNNING, S.STOPPING, S.FAILED])
def test_only_a_restarting_run_is_settled(state: RunState) -> None:
    sync, recs = two_hosts()
    assert sync.settle(state, 1, recs, 1.0, TIMEOUT, stopping=False) is WAIT


def test_without_host_restarts_the_launcher_decides() -> None:
    sync, recs = two_hosts()
    sync.restart_through_hosts = False
    assert settle(sync, recs) is WAIT


def test_once_every_hosts_ranks_ended_the_next_attempt_may_open() -> None:
    sync, recs = two_hosts()
    sync.hosts.hosts["a:1"].running = True
    assert settle(sync, recs) == Settled("wait")  # a's ranks are still being torn down
    sync.hosts.hosts["a:1"].running = False
    assert settle(sync, recs) == Settled("restart")


def test_a_silent_host_ends_the_restart_naming_it() -> None:
    sync, recs = two_hosts()
    call(sync, "a:1", 1, False, "a0", "a1", now=6.0)
    assert settle(sync, recs, 6.0) == Settled(
        "give_up",
        "host b fell silent, no word from its agent for more than 5s: the group cannot restart without it",
    )


def test_elastic_a_silent_host_is_left_out_while_enough_ranks_remain() -> None:
    sync, recs = two_hosts(min_world_size=2)
    call(sync, "a:1", 1, False, "a0", "a1", now=6.0)
    settled = settle(sync, recs, 6.0)
    assert settled == Settled(
        "restart",
        resized="host b fell silent, no word from its agent for more than 5s: "
        "the next attempt runs on the 2 ranks left",
        world_size=2,
    )
    assert sync.hosts.dropped("b:2") and set(sync.hosts.hosts) == {"a:1"}
    assert sync.hosts.gone_workers == {"b0", "b1"}  # their ranks are no orphans
    assert settle(sync, recs, 6.5) == Settled("restart")  # a second look resizes nothing again


def test_elastic_a_resize_while_another_host_is_busy_waits_after_it() -> None:
    sync, recs = two_hosts(min_world_size=2)
    call(sync, "c:3", 1, True, now=6.0)  # a third host still tearing down (no ranks named)
    call(sync, "a:1", 1, False, "a0", "a1", now=6.0)
    settled = settle(sync, recs, 6.0)
    assert settled.then == "wait" and settled.world_size == 2 and "host b fell silent" in settled.resized


def test_elastic_gives_up_below_the_floor() -> None:
    sync, recs = two_hosts(min_world_size=3)
    call(sync, "a:1", 1, False, "a0", "a1", now=6.0)
    settled = settle(sync, recs, 6.0)
    assert settled.then == "give_up" and settled.reason.endswith(
        "the group cannot restart without it (the 2 ranks left are fewer than min_world_size 3)"
    )
    assert not sync.hosts.dropped("b:2")


def test_a_rank_no_agent_started_cannot_be_restarted() -> None:
    sync, recs = two_hosts()
    one = [*recs, RankRecord(rank=4, worker_id="x0", host="x")]
    assert settle(sync, one) == Settled(
        "give_up",
        "rank 4 (worker x0 on x) was not started by a host agent (orch worker --nproc-per-node): "
        "nothing would start it again",
    )
    many = [RankRecord(rank=i, worker_id=f"x{i}", host="x") for i in range(6)]
    reason = settle(sync, many).reason
    assert (
        reason.startswith("rank 0 (worker x0 on x), rank 1 (worker x1 on x), rank 2") and " were " in reason
    )
    assert "rank 4" not in reason  # four named at most


def test_a_stop_while_restarting_waits_only_for_hosts_that_answer() -> None:
    sync, recs = two_hosts()
    sync.hosts.hosts["a:1"].running = sync.hosts.hosts["b:2"].running = True
    assert settle(sync, recs, 1.0, stopping=True) is WAIT
    call(sync, "a:1", 1, False, "a0", "a1", now=6.0)  # a ended its ranks; b went silent running
    stop = settle(sync, recs, 6.0, stopping=True)
    assert stop == Settled("stop", "stopped while restarting: the next attempt was not started")

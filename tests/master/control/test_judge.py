"""orch.master.control.judge: which failure is the root cause of a failed run, and how it is described.

Times are plain floats passed in; the ranks are bare :class:`RankRecord` objects.
"""

from __future__ import annotations

import pytest

from orch.master.control.judge import (
    LOST_TOGETHER,
    SETTLE_SECONDS,
    CauseKind,
    FailureJudge,
    RootCause,
    reported_kind,
)
from orch.master.control.registry import RankRecord
from orch.wire.states import RankState


def rank(n: int, *, beat: float | None = None, address: str = "") -> RankRecord:
    return RankRecord(
        rank=n,
        worker_id=f"w{n}",
        host=f"host-{n}",
        address=address,
        state=RankState.LOST,
        last_heartbeat=beat,
        error=f"error of rank {n}",
        exit_code=n + 1,
    )


def cause(kind: CauseKind, n: int = 0, *, beat: float | None = None) -> RootCause:
    return RootCause(kind, f"rank {n} {kind.value}", rank(n, beat=beat))


# -- kinds ---------------------------------------------------------------------------------


def test_weights_rank_the_explanations() -> None:
    assert {k: k.weight for k in CauseKind} == {
        CauseKind.ERROR: 0,
        CauseKind.EXITED: 0,
        CauseKind.LOST: 0,
        CauseKind.HUNG: 0,
        CauseKind.OUTSIDE: 0,
        CauseKind.PEER: 1,
        CauseKind.TORN_DOWN: 2,
    }


@pytest.mark.parametrize(
    "error",
    [
        "RuntimeError: Connection reset by peer",
        "connection closed by peer",
        "BrokenPipeError: [Errno 32] Broken pipe",
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error",
        "torch.distributed.DistBackendError: NCCL error in: ...",
        "torch.distributed.DistNetworkError: failed to recv",
        "ncclInternalError: NCCL communicator was aborted",
        "RuntimeError: ProcessGroupNCCL watchdog: operation timed out",
        "ProcessGroupGloo reduce: abort requested",
    ],
)
def test_a_broken_collective_is_a_peer_failure(error: str) -> None:
    assert reported_kind(f"Traceback (most recent call last):\n  ...\n{error}\n") is CauseKind.PEER


@pytest.mark.parametrize(
    "error", ["", "ValueError: bad config", "CUDA out of memory", "ProcessGroup created", "peer review"]
)
def test_any_other_error_is_the_ranks_own(error: str) -> None:
    assert reported_kind(error) is CauseKind.ERROR


# -- the root cause ------------------------------------------------------------------------


def test_root_cause_reads_its_rank() -> None:
    c = cause(CauseKind.ERROR, 3)
    assert (c.rank, c.exit_code, c.error) == (3, 4, "error of rank 3")
    outside = RootCause(CauseKind.OUTSIDE, "the launch failed")
    assert (outside.rank, outside.exit_code, outside.error) == (None, None, "")


def test_the_first_failure_stands_against_an_equal_or_worse_one() -> None:
    judge = FailureJudge()
    first = cause(CauseKind.ERROR, 0)
    judge.first_failure(first, 10.0)
    for kind in CauseKind:
        assert not judge.later_failure(cause(kind, 1), 10.5)
        assert judge.cause is first


@pytest.mark.parametrize(
    ("first", "better"),
    [
        (CauseKind.TORN_DOWN, CauseKind.PEER),
        (CauseKind.TORN_DOWN, CauseKind.ERROR),
        (CauseKind.PEER, CauseKind.ERROR),
        (CauseKind.PEER, CauseKind.EXITED),
        (CauseKind.PEER, CauseKind.LOST),
    ],
)
def test_a_better_explanation_within_the_settle_time_replaces_the_first(
    first: CauseKind, better: CauseKind
) -> None:
    judge = FailureJudge()
    judge.first_failure(cause(first, 0), 10.0)
    replacement = cause(better, 1)
    assert judge.later_failure(replacement, 10.0 + SETTLE_SECONDS)
    assert judge.cause is replacement


def test_a_better_explanation_after_the_settle_time_comes_too_late() -> None:
    judge = FailureJudge()
    first = cause(CauseKind.TORN_DOWN, 0)
    judge.first_failure(first, 10.0)
    assert not judge.later_failure(cause(CauseKind.ERROR, 1), 10.0 + SETTLE_SECONDS + 0.01)
    assert judge.cause is first


def test_the_settle_time_counts_from_the_first_failure() -> None:
    judge = FailureJudge()
    judge.first_failure(cause(CauseKind.TORN_DOWN, 0), 10.0)
    peer = cause(CauseKind.PEER, 1)
    assert judge.later_failure(peer, 11.5)
    assert not judge.later_failure(cause(CauseKind.ERROR, 2), 10.0 + SETTLE_SECONDS + 0.5)
    assert judge.cause is peer


def test_a_cause_from_outside_is_never_replaced() -> None:
    judge = FailureJudge()
    judge.outside("the launcher gave up")
    outside = judge.cause
    assert outside is not None
    assert (outside.kind, outside.message) == (CauseKind.OUTSIDE, "the launcher gave up")
    assert outside.record is None
    assert not judge.later_failure(cause(CauseKind.ERROR, 0), 0.0)
    assert judge.cause is outside


@pytest.mark.parametrize("kind", list(CauseKind))
def test_a_cause_of_no_rank_is_never_replaced_whatever_its_kind(kind: CauseKind) -> None:
    judge = FailureJudge()
    first = RootCause(kind, "the group was torn down from outside")  # no rank's record
    judge.first_failure(first, 10.0)
    assert not judge.later_failure(cause(CauseKind.ERROR, 0), 10.0)
    assert judge.cause is first


def test_a_later_failure_without_a_first_is_ignored() -> None:
    judge = FailureJudge()
    assert not judge.later_failure(cause(CauseKind.ERROR, 0), 0.0)
    assert judge.cause is None


# -- ranks lost together -------------------------------------------------------------------


def lost_root(beat: float = 100.0) -> tuple[FailureJudge, RankRecord]:
    judge = FailureJudge()
    root = rank(0, beat=beat)
    judge.first_failure(RootCause(CauseKind.LOST, "rank 0 was lost", root), 130.0)
    return judge, root


def together(judge: FailureJudge) -> list[int]:
    assert judge.cause is not None
    return [r.rank for r in judge.cause.together]


def test_ranks_silent_within_the_window_of_the_root_are_named() -> None:
    judge, _ = lost_root(100.0)
    close, edge, late, early = (rank(n, beat=b) for n, b in [(1, 103.0), (2, 105.0), (3, 110.0), (4, 96.0)])
    judge.lost_together([close, edge, late, early], window=5.0)  # 3 fell silent 10s after the root
    assert together(judge) == [1, 2, 4]


def test_ranks_lost_in_the_roots_own_batch_are_named_whatever_their_time() -> None:
    judge, root = lost_root(100.0)
    judge.lost_together([root, rank(1, beat=100.5), rank(2, beat=180.0)], window=5.0)
    assert together(judge) == [1, 2]  # never the root itself


def test_a_rank_without_a_heartbeat_time_is_not_named() -> None:
    judge, root = lost_root(100.0)
    judge.lost_together([root, rank(1)], window=5.0)
    assert together(judge) == []


def test_a_rank_is_named_once() -> None:
    judge, _ = lost_root(100.0)
    r1 = rank(1, beat=101.0)
    judge.lost_together([r1], window=5.0)
    judge.lost_together([r1, rank(2, beat=102.0)], window=5.0)
    assert together(judge) == [1, 2]


@pytest.mark.parametrize("kind", [k for k in CauseKind if k is not CauseKind.LOST])
def test_only_a_lost_root_has_ranks_lost_with_it(kind: CauseKind) -> None:
    judge = FailureJudge()
    root = rank(0, beat=100.0)
    judge.first_failure(RootCause(kind, "m", root), 130.0)
    judge.lost_together([root, rank(1, beat=100.0)], window=5.0)
    assert together(judge) == []


def test_a_root_without_a_heartbeat_time_has_no_ranks_lost_with_it() -> None:
    judge = FailureJudge()
    root = rank(0)
    judge.first_failure(RootCause(CauseKind.LOST, "m", root), 130.0)
    judge.lost_together([root, rank(1, beat=100.0)], window=5.0)
    assert together(judge) == []


def test_lost_together_without_a_cause_does_nothing() -> None:
    judge = FailureJudge()
    judge.lost_together([rank(1, beat=1.0)], window=5.0)
    assert judge.cause is None
    judge.outside("closed")
    judge.lost_together([rank(1, beat=1.0)], window=5.0)
    assert together(judge) == []


# -- description ---------------------------------------------------------------------------


def test_describe_is_the_message_alone() -> None:
    assert cause(CauseKind.ERROR, 2).describe() == "rank 2 error"


def test_describe_names_the_ranks_lost_together_by_address_or_host() -> None:
    c = RootCause(CauseKind.LOST, "rank 0 was lost", rank(0, beat=1.0))
    c.together = [rank(1, address="10.0.0.2"), rank(2)]
    assert c.describe() == "rank 0 was lost; lost at the same time: rank 1 (10.0.0.2), rank 2 (host-2)"
    assert LOST_TOGETHER == "; lost at the same time: "


@pytest.mark.parametrize(
    ("attempts", "reason", "tail"),
    [
        (1, "", ""),
        (1, "no progress", " (no progress)"),
        (3, "", " (after 3 attempts)"),
        (2, "no restarts left", " (after 2 attempts; no restarts left)"),
    ],
)
def test_describe_adds_attempts_and_reason(attempts: int, reason: str, tail: str) -> None:
    c = RootCause(CauseKind.ERROR, "rank 1 failed: boom", rank(1), attempts=attempts, reason=reason)
    assert c.describe() == "rank 1 failed: boom" + tail


def test_describe_puts_the_lost_ranks_before_the_notes() -> None:
    c = RootCause(CauseKind.LOST, "rank 0 was lost", rank(0), [rank(3, address="a3")], 2, "gave up")
    assert c.describe() == "rank 0 was lost; lost at the same time: rank 3 (a3) (after 2 attempts; gave up)"


# -- attempts ------------------------------------------------------------------------------


def test_the_first_attempts_cause_stands_at_the_end() -> None:
    judge = FailureJudge()
    first = cause(CauseKind.ERROR, 1)
    judge.first_failure(first, 1.0)
    judge.new_attempt()
    assert judge.cause is None and judge.first is first
    judge.first_failure(cause(CauseKind.EXITED, 0), 50.0)
    judge.new_attempt()
    assert judge.first is first  # the first attempt's, not the second's
    judge.first_failure(cause(CauseKind.LOST, 2), 90.0)
    judge.final(3, "no restarts left")
    final = judge.cause
    assert final is not None
    assert (final.kind, final.record, final.attempts, final.reason) == (
        CauseKind.ERROR,
        first.record,
        3,
        "no restarts left",
    )
    assert final.describe() == "rank 1 error (after 3 attempts; no restarts left)"
    assert (first.attempts, first.reason) == (1, "")  # the kept record itself is unchanged


def test_final_keeps_the_first_causes_lost_ranks() -> None:
    judge, _ = lost_root(100.0)
    judge.lost_together([rank(1, beat=100.0)], window=5.0)
    judge.new_attempt()
    judge.first_failure(cause(CauseKind.ERROR, 1), 200.0)
    judge.final(2, "")
    assert judge.cause is not None
    text = judge.cause.describe()
    assert text == "rank 0 was lost; lost at the same time: rank 1 (host-1) (after 2 attempts)"


def test_final_without_a_restart_adds_the_reason_only() -> None:
    judge = FailureJudge()
    only = cause(CauseKind.ERROR, 0)
    judge.first_failure(only, 1.0)
    judge.final(1, "")
    assert judge.cause is only and judge.cause.describe() == "rank 0 error"
    judge.final(1, "no progress was made")
    assert judge.cause is only
    assert only.describe() == "rank 0 error (no progress was made)"


def test_final_without_any_cause_leaves_none() -> None:
    judge = FailureJudge()
    judge.final(1, "whatever")
    assert judge.cause is None

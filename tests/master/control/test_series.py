"""orch.master.control.series: the metric points of a run, read through cursors, under one memory budget.

Covers :class:`Series` (appends, the rewind of a restarted attempt, trims and copies by absolute
index), :func:`water_level`, and :class:`SeriesLog` (the metric limit, the budget, the epoch, and
the plan/copy of one GetState reply).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from orch.master.control.series import Series, SeriesLog, Slice, water_level
from orch.master.control.validate import Reject
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import encode
from orch.wire.limits import MAX_METRICS_PER_RANK
from orch.wire.model import Points


def points(name: str, steps: Sequence[int], times: Sequence[float] = ()) -> Points:
    """A series whose value at step ``s`` is ``s / 10`` (so values follow their steps)."""
    return Points(name=name, steps=list(steps), values=[s / 10 for s in steps], times=list(times))


def series(steps: Sequence[int], attempt: int = 1) -> Series:
    s = Series()
    s.add(list(steps), [x / 10 for x in steps], [float(x) for x in steps], attempt)
    return s


def held(s: Series) -> list[int]:
    return list(s.steps)


# -- Series --------------------------------------------------------------------------------


def test_add_appends_in_compact_columns() -> None:
    s = Series()
    assert not s.add([1, 2], [0.5, 0.25], [10.0, 11.0], attempt=1)
    assert not s.add([3], [0.125], [12.0], attempt=1)
    assert (held(s), list(s.values), list(s.times)) == ([1, 2, 3], [0.5, 0.25, 0.125], [10.0, 11.0, 12.0])
    assert (len(s), s.base, s.end, s.attempts.attempt) == (3, 0, 3, 1)


def test_a_newer_attempt_replaying_steps_rewinds_the_series() -> None:
    s = series(range(1, 11))
    assert s.add([6, 7], [60.0, 70.0], [600.0, 700.0], attempt=2)
    assert held(s) == [1, 2, 3, 4, 5, 6, 7]
    assert list(s.values)[-3:] == [0.5, 60.0, 70.0]
    assert list(s.times)[-3:] == [5.0, 600.0, 700.0]
    assert s.attempts.attempt == 2
    assert not s.add([8], [80.0], [800.0], attempt=2)  # the same attempt goes on: no rewind
    assert held(s) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_rewind_to_before_every_held_point_replaces_them_all() -> None:
    s = series([5, 6, 7])
    assert s.add([1], [1.0], [1.0], attempt=3)
    assert held(s) == [1] and s.attempts.attempt == 3


def test_a_newer_attempt_after_the_last_step_appends() -> None:
    s = series([1, 2, 3])
    assert not s.add([4, 5], [0.4, 0.5], [4.0, 5.0], attempt=2)
    assert held(s) == [1, 2, 3, 4, 5] and s.attempts.attempt == 2


def test_the_same_attempt_never_rewinds() -> None:
    s = series([1, 2, 3])
    assert not s.add([2], [9.0], [9.0], attempt=1)
    assert held(s) == [1, 2, 3, 2]


def test_a_newer_attempt_rewinds_even_when_its_first_batch_was_empty() -> None:
    """The new attempt's first points replace the old attempt's from their step on, however
    the new attempt's points were batched: a heartbeat carrying an empty series must not
    use up the rewind."""
    s = series(range(1, 11))
    s.add([], [], [], attempt=2)  # a series whose points were all dropped on the way
    s.add([6, 7], [60.0, 70.0], [600.0, 700.0], attempt=2)
    assert held(s) == [1, 2, 3, 4, 5, 6, 7]


def test_trim_lets_the_oldest_points_go_and_keeps_absolute_indexes() -> None:
    s = series(range(10))
    s.trim(4)
    assert held(s) == [4, 5, 6, 7, 8, 9]
    assert list(s.values) == [0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert (s.base, s.end, len(s)) == (4, 10, 6)


def test_copy_reads_absolute_indexes() -> None:
    s = series(range(10))
    s.trim(3)
    out = s.copy(rank=2, name="loss", base=3, first=5, last=8)
    assert (out.rank, out.name) == (2, "loss")
    assert list(out.steps) == [5, 6, 7]
    assert (list(out.values), list(out.times)) == ([0.5, 0.6, 0.7], [5.0, 6.0, 7.0])
    assert list(s.copy(0, "loss", base=3, first=8, last=8).steps) == []
    assert list(s.copy(0, "loss", base=3, first=8, last=5).steps) == []  # never a negative slice


# -- water_level ---------------------------------------------------------------------------


def freed(lengths: list[int], level: int) -> int:
    return sum(max(0, n - level) for n in lengths)


@pytest.mark.parametrize(
    ("lengths", "excess", "level"),
    [
        ([10, 1], 3, 7),  # only the biggest series is cut
        ([5, 5], 1, 4),  # equal series are cut together
        ([100, 50, 10], 60, 45),  # both big series down to one level: 55 + 5
        ([100, 50, 10], 160, 0),  # everything must go
        ([4], 4, 0),
        ([], 5, 0),
    ],
)
def test_water_level_examples(lengths: list[int], excess: int, level: int) -> None:
    assert water_level(lengths, excess) == level


def test_water_level_is_the_highest_level_that_frees_enough() -> None:
    rng = random.Random(1234)
    for _ in range(2000):
        lengths = [rng.randint(0, 40) for _ in range(rng.randint(1, 6))]
        excess = rng.randint(1, sum(lengths) + 5)
        level = water_level(lengths, excess)
        best = max((lv for lv in range(max(lengths) + 1) if freed(lengths, lv) >= excess), default=0)
        assert level == best, (lengths, excess)


def test_water_level_cuts_nothing_when_nothing_must_go() -> None:
    assert water_level([7, 3], 0) >= 7


# -- SeriesLog: adding points --------------------------------------------------------------


def test_add_returns_the_last_loss_and_stamps_missing_times() -> None:
    log = SeriesLog()
    loss = log.add(0, [points("loss", [1, 2]), points("acc", [1, 2, 3], times=[7.0, 8.0, 9.0])], 1, 50.0)
    assert loss == 0.2
    assert list(log.get(0, "loss").times) == [50.0, 50.0]  # no times sent: the master's wall clock
    assert list(log.get(0, "acc").times) == [7.0, 8.0, 9.0]
    assert log.add(0, [points("acc", [4])], 1, 51.0) is None  # no loss in this heartbeat
    assert log.points_in_memory == 6
    assert sorted(log) == [(0, "acc"), (0, "loss")]


def test_get_of_an_unknown_series_is_empty() -> None:
    log = SeriesLog()
    assert len(log.get(3, "nothing")) == 0
    assert list(log) == []


def test_check_names_limits_the_metrics_of_one_rank() -> None:
    log = SeriesLog()
    names = [points(f"m{i}", [1]) for i in range(MAX_METRICS_PER_RANK)]
    log.check_names(0, names)
    log.add(0, names, 1, 0.0)
    log.check_names(0, names)  # the known names again
    log.check_names(0, [points("m0", [2]), points("m0", [3])])
    with pytest.raises(Reject) as info:
        log.check_names(0, [points("one-more", [1])])
    assert info.value.kind == "invalid_argument"
    assert f"rank 0 would log more than {MAX_METRICS_PER_RANK} different metrics" in str(info.value)
    log.check_names(1, [points("one-more", [1])])  # every rank has its own limit


def test_check_names_counts_a_heartbeats_new_names_together() -> None:
    log = SeriesLog()
    log.add(0, [points(f"m{i}", [1]) for i in range(MAX_METRICS_PER_RANK - 1)], 1, 0.0)
    log.check_names(0, [points("new", [1]), points("new", [2])])  # one new name, twice
    with pytest.raises(Reject):
        log.check_names(0, [points("new-a", [1]), points("new-b", [1])])


def test_the_budget_cuts_the_biggest_series_first() -> None:
    log = SeriesLog(max_points_in_memory=100)
    log.add(0, [points("small", range(20))], 1, 0.0)
    assert not log.trimmed
    log.add(1, [points("big", range(90))], 1, 0.0)  # 110 > 100: down to 75
    assert log.points_in_memory == 75
    assert len(log.get(0, "small")) == 20  # the small series stays whole
    big = log.get(1, "big")
    assert (len(big), big.base, big.end) == (55, 35, 90)
    assert held(big)[0] == 35  # the oldest points left
    assert log.trimmed


def test_the_budget_holds_over_many_heartbeats() -> None:
    rng = random.Random(7)
    budget = 500
    log = SeriesLog(max_points_in_memory=budget)
    sent: dict[tuple[int, str], int] = {}
    for _ in range(300):
        rank, name = rng.randint(0, 3), rng.choice(["loss", "acc", "lr"])
        start = sent.get((rank, name), 0)
        n = rng.randint(0, 60)
        log.add(rank, [points(name, range(start, start + n))], 1, 0.0)
        sent[(rank, name)] = start + n
        lengths = [len(log.get(r, nm)) for r, nm in log]
        assert log.points_in_memory == sum(lengths)
        assert log.points_in_memory <= budget
        for key, total in sent.items():
            s = log.get(*key)
            assert s.end == total  # absolute indexes count every point ever added
            if len(s):
                assert s.steps[0] == s.base  # the held points are the newest ones
    assert log.trimmed


def test_no_budget_keeps_every_point() -> None:
    log = SeriesLog(max_points_in_memory=0)
    log.add(0, [points("loss", range(5000))], 1, 0.0)
    assert log.points_in_memory == 5000 and not log.trimmed


def test_a_rewind_bumps_the_epoch_and_frees_the_replaced_points() -> None:
    log = SeriesLog()
    log.add(0, [points("loss", range(10)), points("acc", range(10))], 1, 0.0)
    assert log.epoch == 0
    log.add(0, [points("loss", [10, 11])], 1, 0.0)  # the same attempt goes on
    assert log.epoch == 0 and log.points_in_memory == 22
    log.add(0, [points("loss", [4, 5])], 2, 0.0)  # attempt 2 replays from step 4
    assert log.epoch == 1
    assert held(log.get(0, "loss")) == [0, 1, 2, 3, 4, 5]
    assert log.points_in_memory == 16
    log.add(0, [points("acc", [3])], 2, 0.0)
    assert log.epoch == 2 and log.points_in_memory == 10


# -- SeriesLog: one reply's points ---------------------------------------------------------


def sent_by(cursor: pb.StateCursor) -> dict[str, int]:
    return dict(zip(cursor.keys, cursor.offsets, strict=True))


def read_all(log: SeriesLog, budget: int) -> tuple[dict[str, list[int]], int]:
    """Every point, by key, as a client paging through replies gets them; and the reply count."""
    got: dict[str, list[int]] = {}
    sent: dict[str, int] = {}
    for replies in range(1, 100):
        cursor = pb.StateCursor()
        plan, more = log.plan(sent, budget, cursor)
        out = SeriesLog.copy(plan)
        assert sum(len(p.steps) for p in out) <= budget
        for p in out:
            got.setdefault(f"{p.rank}/{p.name}", []).extend(p.steps)
        sent = sent_by(cursor)
        if not more:
            return got, replies
    raise AssertionError("the replies never ended")


def test_plan_orders_series_by_rank_then_name() -> None:
    log = SeriesLog()
    log.add(10, [points("loss", [1])], 1, 0.0)
    log.add(2, [points("loss", [1]), points("acc", [1])], 1, 0.0)
    cursor = pb.StateCursor()
    plan, more = log.plan({}, 100, cursor)
    assert list(cursor.keys) == ["2/acc", "2/loss", "10/loss"]
    assert [(sl.rank, sl.name) for sl in plan] == [(2, "acc"), (2, "loss"), (10, "loss")]
    assert list(cursor.offsets) == [1, 1, 1] and not more


def test_plan_resumes_where_the_last_reply_stopped() -> None:
    log = SeriesLog()
    log.add(0, [points("a", range(5)), points("b", range(3))], 1, 0.0)
    log.add(1, [points("a", range(4))], 1, 0.0)

    first = pb.StateCursor()
    plan, more = log.plan({}, 5, first)
    assert more
    assert [(sl.name, sl.rank, sl.first, sl.last) for sl in plan] == [("a", 0, 0, 5)]
    assert sent_by(first) == {"0/a": 5, "0/b": 0, "1/a": 0}

    second = pb.StateCursor()
    plan, more = log.plan(sent_by(first), 5, second)
    assert more
    assert [(sl.rank, sl.name, sl.first, sl.last) for sl in plan] == [(0, "b", 0, 3), (1, "a", 0, 2)]
    assert sent_by(second) == {"0/a": 5, "0/b": 3, "1/a": 2}

    third = pb.StateCursor()
    plan, more = log.plan(sent_by(second), 5, third)
    assert not more
    assert [(sl.rank, sl.name, sl.first, sl.last) for sl in plan] == [(1, "a", 2, 4)]

    log.add(0, [points("b", [3, 4])], 1, 0.0)  # new points: only they go in the next reply
    fourth = pb.StateCursor()
    plan, more = log.plan(sent_by(third), 5, fourth)
    assert not more
    assert [(sl.rank, sl.name, sl.first, sl.last) for sl in plan] == [(0, "b", 3, 5)]
    assert list(SeriesLog.copy(plan)[0].steps) == [3, 4]


def test_paging_through_replies_delivers_every_point_once() -> None:
    log = SeriesLog()
    for rank in range(3):
        log.add(rank, [points("loss", range(rank * 7 + 3)), points("acc", range(11))], 1, 0.0)
    got, replies = read_all(log, budget=8)
    total = sum(rank * 7 + 3 + 11 for rank in range(3))
    assert replies == -(-total // 8)
    for rank in range(3):
        assert got[f"{rank}/loss"] == list(range(rank * 7 + 3))
        assert got[f"{rank}/acc"] == list(range(11))


def test_plan_with_nothing_new_is_empty() -> None:
    log = SeriesLog()
    log.add(0, [points("loss", range(3))], 1, 0.0)
    cursor = pb.StateCursor()
    plan, more = log.plan({"0/loss": 3}, 10, cursor)
    assert plan == [] and not more
    assert sent_by(cursor) == {"0/loss": 3}


def test_plan_skips_points_that_left_memory() -> None:
    log = SeriesLog(max_points_in_memory=8)
    log.add(0, [points("loss", range(10))], 1, 0.0)  # 10 > 8: down to 6, from index 4
    cursor = pb.StateCursor()
    plan, _ = log.plan({"0/loss": 1}, 100, cursor)
    assert [(sl.base, sl.first, sl.last) for sl in plan] == [(4, 4, 10)]
    assert list(SeriesLog.copy(plan)[0].steps) == [4, 5, 6, 7, 8, 9]


def test_recopy_trimmed_copies_a_series_trimmed_after_the_plan_again() -> None:
    log = SeriesLog()
    log.add(0, [points("loss", range(10))], 1, 0.0)
    log.add(0, [points("acc", range(10))], 1, 0.0)
    plan, _ = log.plan({}, 100, pb.StateCursor())
    plan = [Slice(sl.rank, sl.name, sl.series, sl.base, 2, 8) for sl in plan]  # points 2..7 of each
    log.get(0, "loss").trim(5)  # a heartbeat trimmed this one meanwhile
    built = SeriesLog.copy(plan)
    SeriesLog.recopy_trimmed(plan, built)
    by_name = {p.name: list(p.steps) for p in built}
    assert by_name["acc"] == [2, 3, 4, 5, 6, 7]  # untouched: copied once
    assert by_name["loss"] == [5, 6, 7]  # what is left of points 2..7


def test_recopy_trimmed_past_the_plan_is_empty() -> None:
    log = SeriesLog()
    log.add(0, [points("loss", range(10))], 1, 0.0)
    plan, _ = log.plan({"0/loss": 2}, 3, pb.StateCursor())  # points 2..4
    log.get(0, "loss").trim(9)
    built = SeriesLog.copy(plan)
    SeriesLog.recopy_trimmed(plan, built)
    assert list(built[0].steps) == []


def test_a_slice_encoded_from_the_arrays_bytes_is_the_message_protobuf_would_write() -> None:
    from orch.master.control.series import Series

    s = Series()
    s.add([0, 1, 2, 300, 2**40], [0.5, -1.0, float("nan"), 1e300, 3.0], [1.7e9, 1.7e9 + 1, 0.0, 5.0, 6.0], 1)
    s.trim(1)  # the oldest point left memory: absolute indexes go on
    for first, last in ((1, 5), (2, 4), (3, 3)):
        mine = pb.Series.FromString(s.encode(4, "loss", s.base, first, last))
        want = s.copy(4, "loss", s.base, first, last)
        assert mine.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
        assert list(mine.steps) == list(want.steps)


def _read(
    log: SeriesLog, sent: dict[str, int] | None = None, budget: int = 10**6
) -> dict[tuple[int, str], pb.Series]:
    """What one serialized reply carries after ``sent``: each series' pieces parsed as one."""
    plan, _ = log.plan(sent or {}, budget, pb.StateCursor())
    got: dict[tuple[int, str], pb.Series] = {}
    for sl, pieces in zip(plan, SeriesLog.encode(plan), strict=True):
        whole = pb.Series.FromString(b"".join(pieces))
        got[(sl.rank, sl.name)] = whole
        assert [pb.Series.FromString(p).rank for p in pieces] == [sl.rank] * len(pieces)
    return got


def test_a_beats_points_are_encoded_once_and_a_catch_up_joins_them() -> None:
    log = SeriesLog()
    for beat in range(5):
        log.add(3, [points("loss", range(beat * 4, beat * 4 + 4), [1.0] * 4)], 1, 9.0)
    s = log.get(3, "loss")
    assert list(s.chunks.ends) == [4, 8, 12, 16, 20]
    # From the start, and from a cursor at a chunk's start: the chunks' own bytes, joined.
    plan, _ = log.plan({}, 100, pb.StateCursor())
    ((piece,),) = SeriesLog.encode(plan)
    assert piece == b"".join(s.chunks.data)
    full = _read(log)[(3, "loss")]
    assert list(full.steps) == list(range(20)) and list(full.values) == [x / 10 for x in range(20)]
    assert list(full.times) == [1.0] * 20 and full.rank == 3 and full.name == "loss"
    plan, _ = log.plan({"3/loss": 8}, 100, pb.StateCursor())
    ((piece,),) = SeriesLog.encode(plan)
    assert piece == b"".join(s.chunks.data[2:])
    # A cursor inside a chunk: its head is encoded from the arrays, the whole chunks after it
    # joined; a reply its budget cuts short ends where a chunk does (12, not 6 + 9)...
    mid = _read(log, {"3/loss": 6}, budget=9)[(3, "loss")]
    assert list(mid.steps) == list(range(6, 12))
    assert list(mid.values) == [x / 10 for x in range(6, 12)] and list(mid.times) == [1.0] * 6
    # ... unless no chunk ends within its budget: then inside one, encoded from the arrays.
    assert list(_read(log, {"3/loss": 6}, budget=1)[(3, "loss")].steps) == [6]


def test_a_backlogs_beat_is_cut_into_chunks_of_at_most_chunk_points() -> None:
    from orch.master.control.series import CHUNK_POINTS

    log = SeriesLog()
    n = 2 * CHUNK_POINTS + 5
    log.add(0, [points("loss", range(n), [2.0] * n)], 1, 9.0)
    s = log.get(0, "loss")
    assert list(s.chunks.ends) == [CHUNK_POINTS, 2 * CHUNK_POINTS, n]
    got = _read(log)[(0, "loss")]
    assert list(got.steps) == list(range(n)) and list(got.times) == [2.0] * n


def test_a_chunk_carries_the_beats_rank_and_the_arrival_time_where_the_sender_gave_none() -> None:
    log = SeriesLog()
    log.add(5, [Points(rank=99, name="acc", steps=[1, 2], values=[0.5, 0.25])], 1, 42.0)
    got = _read(log)[(5, "acc")]
    assert got.rank == 5  # not the 99 the sender wrote
    assert list(got.times) == [42.0, 42.0] and list(got.values) == [0.5, 0.25]


@pytest.mark.parametrize("times", [[], [7.0, 8.0]], ids=["no times", "times"])
def test_a_beats_own_bytes_become_its_chunk_as_its_points_would(times: list[float]) -> None:
    sent = Points(rank=99, name="acc", steps=[1, 2], values=[0.5, 0.25], times=times)
    wire = encode(sent).SerializeToString()
    from_wire, from_arrays = SeriesLog(), SeriesLog()
    from_wire.add(5, [sent], 1, 42.0, wire=[wire])
    from_arrays.add(5, [sent], 1, 42.0)
    assert from_wire.get(5, "acc").chunks.data[0].startswith(wire)  # the beat's bytes, not encoded again
    assert _read(from_wire) == _read(from_arrays)
    assert list(_read(from_wire)[(5, "acc")].times) == (times or [42.0, 42.0])


def test_loose_chunks_are_merged_and_trims_and_rewinds_drop_the_chunks_they_outdate() -> None:
    from orch.master.control.series import MERGE_CHUNKS

    log = SeriesLog(max_points_in_memory=0)
    for beat in range(MERGE_CHUNKS + 3):
        log.add(0, [points("loss", [beat * 2, beat * 2 + 1], [float(beat)] * 2)], 1, 1.0)
    s = log.get(0, "loss")
    # The first MERGE_CHUNKS beats' chunks are one, encoded afresh; the 3 after stay apart.
    assert list(s.chunks.ends) == [
        2 * MERGE_CHUNKS,
        2 * MERGE_CHUNKS + 2,
        2 * MERGE_CHUNKS + 4,
        2 * MERGE_CHUNKS + 6,
    ]
    n = 2 * (MERGE_CHUNKS + 3)
    assert list(_read(log)[(0, "loss")].steps) == list(range(n))
    # The budget lets the oldest points go: chunks that held only those go with them; the
    # one they cut into stays, and a catch-up from the new base starts inside it.
    s.trim(2 * MERGE_CHUNKS + 1)
    assert s.chunks.first == 2 * MERGE_CHUNKS and list(s.chunks.ends) == [
        2 * MERGE_CHUNKS + 2,
        2 * MERGE_CHUNKS + 4,
        2 * MERGE_CHUNKS + 6,
    ]
    assert list(_read(log)[(0, "loss")].steps) == list(range(2 * MERGE_CHUNKS + 1, n))
    # A restarted attempt replays the last two steps: the chunks restart at the cut, and a
    # catch-up reads the replayed points, not the old ones.
    log.add(0, [points("loss", [n - 2, n - 1], [9.0, 9.0])], 2, 1.0)
    assert s.chunks.first == n - 2 and list(s.chunks.ends) == [n]
    got = _read(log)[(0, "loss")]
    assert list(got.steps) == list(range(2 * MERGE_CHUNKS + 1, n))
    assert list(got.times)[-3:] == [float(MERGE_CHUNKS + 1), 9.0, 9.0]

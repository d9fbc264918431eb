"""The straggler judgement on per-step means (no processes): who is slow, in what, and when
it cannot be told."""

from __future__ import annotations

import pytest

from orch.master.control.stragglers import WINDOW, Means, TimingWindow, judge, scores
from orch.wire.model import StepTiming


def means(step: float, wait: float, data: float = 0.0, other: float = 0.0, **sections: float) -> Means:
    return Means(
        steps=10, step=step, data=data, collective=wait, other=other, sections=sections, collectives=True
    )


EVEN = means(0.040, 0.010)


def test_a_rank_that_computes_longest_and_waits_least_is_the_straggler() -> None:
    v = judge({0: EVEN, 1: EVEN, 2: means(0.040, 0.001), 3: EVEN}, 4)
    # rank 2: compute 39 ms against the others' 30 ms; waits 1 ms, the others 10 ms
    assert (v.judged, v.rank, v.section) == (True, 2, "compute")
    assert v.note == (
        "rank 2 is the straggler, slow in compute: 39.0 ms per step against 30.0 ms on the others; "
        "it waits 1.0 ms in collectives, the others 10.0 ms (timed by ctx.steps)"
    )


def test_slow_data_is_named_data() -> None:
    slow = means(0.040, 0.001, data=0.012)
    v = judge({0: EVEN, 1: slow, 2: EVEN, 3: EVEN}, 4)
    assert (v.rank, v.section) == (1, "data")


def test_a_marked_section_that_holds_the_excess_names_it() -> None:
    others = means(0.040, 0.020, augment=0.001)
    slow = means(0.040, 0.001, augment=0.020)
    v = judge({0: others, 1: others, 2: slow}, 3)
    assert (v.rank, v.section) == (2, "augment")


def test_an_even_run_has_no_straggler_and_says_so() -> None:
    v = judge({r: means(0.040 + r * 0.0005, 0.010) for r in range(4)}, 4)
    assert (v.judged, v.rank) == (True, -1) and v.note.startswith("no straggler")


def test_a_rank_slower_but_waiting_as_long_as_the_others_is_not_marked() -> None:
    # Longer compute but no shorter wait: the others are not waiting for it (noise, or a
    # collective-bound step), so no mark.
    v = judge({0: EVEN, 1: EVEN, 2: means(0.060, 0.010)}, 3)
    assert v.rank == -1


def test_of_two_ranks_slow_in_compute_the_larger_excess_is_named() -> None:
    # Under DDP every rank's step lasts as long (54 ms): four even ranks compute 30 ms and wait
    # 24 ms for the slowest; rank 4 computes 12 ms longer (waits 12), rank 5 24 ms longer
    # (waits 0). Both are candidates; the others wait longest for rank 5: it is the straggler,
    # whichever order the candidates come in.
    ranks: dict[int, Means | None] = {r: means(0.054, 0.024) for r in range(4)}
    ranks[4] = means(0.054, 0.012)  # compute 42 ms: 12 ms over the others' median
    ranks[5] = means(0.054, 0.0)  # compute 54 ms: 24 ms over
    v = judge(ranks, 6)
    assert (v.rank, v.section) == (5, "compute"), v.note
    assert v.note.startswith("rank 5 is the straggler, slow in compute: 54.0 ms per step against 30.0 ms")
    ranks[4], ranks[5] = ranks[5], ranks[4]
    assert judge(ranks, 6).rank == 4


def test_a_rank_slow_in_data_and_in_compute_is_named_by_its_larger_excess() -> None:
    # 60 ms steps; the even ranks compute 30 ms and wait 30. Rank 2 waits 20 ms for its data
    # and computes 8 ms longer (it waits 2 ms): both parts pass the threshold, and the data
    # holds more of what the others wait for.
    ranks: dict[int, Means | None] = {r: means(0.060, 0.030) for r in range(5)}
    ranks[2] = means(0.060, 0.002, data=0.020)  # data 20 ms (the others 0), compute 38 ms (30)
    v = judge(ranks, 5)
    assert (v.rank, v.section) == (2, "data"), v.note
    assert v.note.startswith("rank 2 is the straggler, slow in data: 20.0 ms per step against 0.0 ms")
    # and the other way round: 8 ms more in data, 20 ms more in compute names compute
    ranks[2] = means(0.060, 0.002, data=0.008)
    v = judge(ranks, 5)
    assert (v.rank, v.section) == (2, "compute"), v.note


@pytest.mark.parametrize(
    ("ranks", "says", "ended"),
    [
        (
            {0: None, 1: None},
            "not judged yet: too few steps (no rank has sent step times yet)",
            "not judged: the run ended after too few steps (no rank had sent step times)",
        ),
        (
            {0: EVEN, 1: None},
            "not judged yet: too few steps (no step times yet from rank 1)",
            "not judged: the run ended after too few steps (no step times from rank 1)",
        ),
        (
            {0: EVEN},
            "not judged yet: 1 of 2 ranks running (stragglers are judged once all run)",
            "not judged: the run ended with 1 of 2 ranks running",
        ),
    ],
)
def test_what_is_not_judged_yet_says_so_never_a_false_no_straggler_nor_cannot(
    ranks: dict[int, Means | None], says: str, ended: str
) -> None:
    v = judge(ranks, 2)
    assert (v.judged, v.rank, v.note) == (False, -1, says)
    assert "cannot" not in v.note and "ctx.steps" not in v.note
    assert (v.shown(run_ended=False), v.shown(run_ended=True)) == (says, ended)


def test_timing_turned_off_is_the_reason_it_cannot_be_judged() -> None:
    v = judge({0: None, 1: None, 2: None}, 3, off=[0, 1, 2])
    assert not v.judged and v.note == (
        "stragglers cannot be judged: step timing is off (ORCH_STEP_TIMING=0) on rank 0, 1, 2"
    )
    assert v.shown(run_ended=True) == v.note  # a reason that stays: the record says it too


def test_the_window_learns_what_marks_the_steps_even_from_a_beat_without_steps() -> None:
    w = TimingWindow()
    w.add(0.0, StepTiming(timed_by="off"))
    assert w.timed_by == "off" and w.means() is None
    w = TimingWindow()
    w.add(0.0, StepTiming(steps=5, step_seconds=0.5, collectives=True, timed_by="ctx.data"))
    m = w.means()
    assert m is not None and m.timed_by == "ctx.data"
    w = TimingWindow()
    w.add(0.0, StepTiming(steps=5, step_seconds=0.5, collectives=True))  # an older worker
    assert w.means() is not None and w.timed_by == "ctx.steps"


@pytest.mark.parametrize(
    ("timed_by", "part", "says"),
    [
        ("ctx.steps", "compute", "(timed by ctx.steps)"),
        ("ctx.data", "compute", "(each batch of ctx.data timed as a step)"),
        ("ctx.log", "own time", "(timed from one ctx.log step to the next, not split into data and compute)"),
    ],
)
def test_the_judgement_says_which_timing_it_used(timed_by: str, part: str, says: str) -> None:
    def of(step: float, wait: float) -> Means:
        return Means(
            steps=10, step=step, data=0.0, collective=wait, other=0.0, sections={}, collectives=True,
            timed_by=timed_by,
        )  # fmt: skip

    v = judge({0: of(0.040, 0.010), 1: of(0.040, 0.001), 2: of(0.040, 0.010)}, 3)
    assert (v.rank, v.section) == (1, part) and v.note.endswith(says), v.note
    assert f"slow in {part}: 39.0 ms per step against 30.0 ms" in v.note
    even = judge({r: of(0.040, 0.010) for r in range(3)}, 3)
    assert even.rank == -1 and even.note.endswith(says), even.note


def test_without_timed_collectives_it_cannot_be_judged() -> None:
    untimed = Means(steps=10, step=0.04, data=0, collective=0, other=0, sections={}, collectives=False)
    v = judge({0: untimed, 1: untimed}, 2)
    assert not v.judged and "wrap the model with ctx.ddp" in v.note


def test_one_rank_has_no_straggler() -> None:
    v = judge({0: EVEN}, 1)
    assert v.judged and v.rank == -1 and "one rank" in v.note


def test_the_window_keeps_the_last_seconds_and_the_best_compute() -> None:
    w = TimingWindow()
    slow = StepTiming(steps=10, step_seconds=0.5, collective_seconds=0.1, collectives=True)
    fast = StepTiming(steps=10, step_seconds=0.3, collective_seconds=0.1, collectives=True)
    w.add(0.0, fast)
    m = w.means()
    assert m is not None and round(m.compute, 6) == 0.02 and round(w.best_compute, 6) == 0.02
    for k in range(4):
        w.add(WINDOW + 1.0 + k / 10, slow)  # the fast beat leaves the window
    m = w.means()
    assert m is not None and round(m.compute, 6) == 0.04
    assert round(w.best_compute, 6) == 0.02  # the best stays
    w.add(WINDOW + 1.5, StepTiming(steps=0))  # a beat with no step adds nothing
    assert w.means() == m
    (relative, individual) = scores({0: m, 1: means(0.02, 0.01)}, {0: w})[0]
    assert (round(relative, 2), round(individual, 2)) == (4.0, 2.0)


def test_steps_longer_than_the_window_keep_their_last_beats() -> None:
    w = TimingWindow()
    for k in range(3):  # one 10 s step per beat
        w.add(10.0 * k, StepTiming(steps=1, step_seconds=10.0, collective_seconds=1.0, collectives=True))
    m = w.means()
    assert m is not None and m.steps == 3 and m.step == 10.0


def test_the_median_of_the_others_at_many_ranks() -> None:
    # 1,023 even ranks and one straggler: found, with the others' medians read off sorted lists.
    ranks: dict[int, Means | None] = {r: means(0.040 + (r % 7) * 0.0001, 0.010) for r in range(1024)}
    ranks[517] = means(0.040, 0.001)
    v = judge(ranks, 1024)
    assert (v.rank, v.section) == (517, "compute"), v.note


def test_30_ms_more_on_a_long_step_is_still_found() -> None:
    # 200 ms of compute each; one rank takes 30 ms more, and the others wait those 30 ms.
    others = means(0.240, 0.035)
    slow = means(0.240, 0.005)
    v = judge({0: others, 1: slow, 2: others, 3: others}, 4)
    assert (v.rank, v.section) == (1, "compute"), v.note


def test_sections_beyond_the_masters_limit_are_summed_not_refused() -> None:
    from orch.master.control.validate import check_timing
    from orch.runtime._timing import MAX_SECTIONS, MORE_SECTIONS, StepTimes

    times = StepTimes()
    times.step(1.0, 0.0)
    for i in range(48):  # ctx.section(f"block{i}"): more names than a heartbeat may carry
        times.section(f"block{i}", 0.01)
    taken = times.take()
    assert taken is not None and len(taken.sections) == MAX_SECTIONS
    assert round(taken.sections[MORE_SECTIONS], 6) == round(0.01 * (48 - MAX_SECTIONS + 1), 6)
    check_timing(taken)  # the master takes it


def test_a_name_per_step_is_capped_for_the_whole_run_not_only_per_heartbeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from orch.runtime._timing import StepTimes
    from orch.wire.limits import MAX_SECTIONS, MORE_SECTIONS

    times = StepTimes()
    names: set[str] = set()
    for step in range(200):  # ctx.section(f"batch {step}"): a new name every step
        times.step(0.01, 0.0)
        times.section(f"batch {step}", 0.001)
        if step % 4 == 3:  # a heartbeat every 4 steps
            taken = times.take()
            assert taken is not None
            names |= set(taken.sections)
    assert len(names) == MAX_SECTIONS and MORE_SECTIONS in names  # 31 names, then the bucket
    said = [r.getMessage() for r in caplog.records if "section names" in r.getMessage()]
    assert len(said) == 1 and "'batch 31'" in said[0] and "name sections by what they do" in said[0]


def test_the_judgement_reads_sections_only_of_the_ranks_it_suspects() -> None:
    # Every rank marks 31 names of its own; one rank is slow in one of them: found, and the
    # judgement did not build a sorted list for each of the 31 x 64 names.
    ranks: dict[int, Means | None] = {
        r: means(0.040, 0.010, **{f"r{r}-part{k}": 0.0001 for k in range(31)}) for r in range(64)
    }
    ranks[9] = means(0.040, 0.001, **{"r9-part0": 0.0095, **{f"r9-part{k}": 0.0001 for k in range(1, 31)}})
    v = judge(ranks, 64)
    assert (v.rank, v.section) == (9, "r9-part0"), v.note


@pytest.mark.parametrize("name", ["data", "compute", "", "x" * 65, "bad\nname", "\ud800"])
def test_a_section_name_that_cannot_be_shown_or_sent_is_refused_at_once(name: str) -> None:
    import torch

    from orch.runtime.context import Context

    ctx = Context(
        rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), config={}, run_id="r", sender=None
    )
    with pytest.raises((ValueError, UnicodeEncodeError)), ctx.section(name):
        pass

"""What marks a rank's steps for its timing (orch.runtime._timing), in one process, no master:
ctx.steps, else each batch of ctx.data, else each new step given to ctx.log; never two at once."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from orch.master.control.validate import check_timing
from orch.runtime import _timing
from orch.runtime._timing import OFF, READ_EVERY_S, CollectiveWait
from orch.runtime.context import Context

pytestmark = pytest.mark.unit


def context() -> Context:
    return Context(
        rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), config={}, run_id="r", sender=None
    )


class Slow:
    """An iterable whose batches each take ``wait`` seconds to come."""

    def __init__(self, n: int, wait: float) -> None:
        self.n, self.wait = n, wait

    def __iter__(self) -> Any:
        for i in range(self.n):
            time.sleep(self.wait)
            yield i


def test_ctx_data_alone_times_each_batch_as_a_step_with_its_wait_across_epochs() -> None:
    ctx = context()
    assert ctx.times is not None
    for _epoch in range(3):
        for _i, _x in enumerate(ctx.data(Slow(5, 0.004))):
            time.sleep(0.006)  # the body: compute
    t = ctx.times.take()
    assert t is not None and t.timed_by == "ctx.data"
    assert t.steps == 15  # each batch of each epoch is a step, the last one's too
    assert t.data_seconds >= 15 * 0.004  # the wait for every batch
    assert t.step_seconds >= 15 * 0.010  # wait and body
    assert t.data_seconds < t.step_seconds and t.other_seconds == 0.0
    check_timing(t)  # the master takes it


def test_a_loop_that_only_logs_is_timed_from_one_logged_step_to_the_next() -> None:
    ctx = context()
    assert ctx.times is not None
    for step in range(0, 40):
        time.sleep(0.003)
        if step % 10 == 9:  # logs every 10 steps: each call closes 10
            ctx.log(step, loss=1.0)
            ctx.log(step, acc=0.5)  # the same step again: no new step
    t = ctx.times.take()
    assert t is not None and t.timed_by == "ctx.log"
    assert t.steps == 30  # from step 9 to 39: the first call only starts the clock
    assert t.step_seconds >= 30 * 0.003
    assert t.data_seconds == 0.0 and not t.sections  # nothing split: compute is all of it


def test_a_loop_logging_every_step_is_counted_in_ctx_log_and_handed_over_in_bunches() -> None:
    ctx = context()
    assert ctx.times is not None
    start = time.perf_counter()
    for step in range(100):
        time.sleep(0.001)
        ctx.log(step, loss=1.0)
    took = time.perf_counter() - start
    t = ctx.times.take()
    assert t is not None and t.timed_by == "ctx.log"
    # handed over every 16 steps after the first: the last few wait for the next bunch
    assert 99 - 16 < t.steps <= 99, t.steps
    assert t.steps * 0.001 <= t.step_seconds <= took
    for step in range(100, 116):  # the next bunch
        ctx.log(step, loss=1.0)
    more = ctx.times.take()
    assert more is not None and t.steps + more.steps > 99


def test_ctx_steps_marks_the_steps_and_ctx_data_and_ctx_log_inside_it_add_none() -> None:
    ctx = context()
    assert ctx.times is not None
    batches = ctx.data(Slow(1000, 0.002))
    for step in ctx.steps(10):
        next(batches)
        ctx.log(step, loss=1.0)
    t = ctx.times.take()
    assert t is not None and t.timed_by == "ctx.steps"
    assert t.steps == 9  # ctx.steps times a step from its start to the next one's
    assert t.data_seconds >= 10 * 0.002  # ctx.data still times the wait


def test_ctx_data_takes_over_from_ctx_log_and_never_gives_back() -> None:
    ctx = context()
    assert ctx.times is not None
    for step in range(5):
        ctx.log(step, loss=1.0)
    for i, _x in enumerate(ctx.data(Slow(4, 0.001))):
        ctx.log(5 + i, loss=1.0)  # a step of ctx.data's: ctx.log counts no step of its own
    t = ctx.times.take()
    assert t is not None and t.timed_by == "ctx.data"
    assert t.steps == 4 + 4  # ctx.log's 4 steps before, then the 4 batches


def test_a_rank_with_timing_off_tells_the_master_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_STEP_TIMING", "0")

    class Sender:
        timing: Any = None
        total_steps = 0

    sender = Sender()
    ctx = Context(
        rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), config={}, run_id="r",
        sender=sender,  # type: ignore[arg-type]
    )  # fmt: skip
    assert ctx.times is None and sender.timing() == OFF and OFF.timed_by == "off" and OFF.steps == 0
    check_timing(OFF)


class Reducer:
    """DDP's logging data as a model of ctx.ddp's gives it: one iteration per backward."""

    iteration = 0

    def _get_ddp_logging_data(self) -> dict[str, int]:
        return {"iteration": self.iteration, "backward_comm_time": 3_000_000}  # 3 ms, no overlap


def test_ctx_log_every_k_steps_counts_the_last_collective_wait_for_each_of_the_k(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_timing, "READ_EVERY_S", 0.0)  # DDP's timers read at each logged step
    ctx = context()
    assert ctx.times is not None
    model = Reducer()
    ctx._ddp_models.append(model)  # type: ignore[arg-type]
    for step in range(0, 31):
        model.iteration += 1
        if step % 10 == 0:
            ctx.log(step, loss=1.0)
    t = ctx.times.take()
    assert t is not None and t.timed_by == "ctx.log" and t.collectives
    # steps 0 to 30: three times 10 steps, each read once, its last wait standing for all 10
    assert t.steps == 30 and abs(t.collective_seconds - 30 * 0.003) < 1e-9


def test_slow_steps_logged_every_step_are_handed_over_without_waiting_for_a_bunch() -> None:
    """A big model's loop (a second or more a step) that only logs: its steps reach the rank's
    timing as they end, not 16 steps later (a 15-step run once ended "too few steps")."""
    ctx = context()
    assert ctx.times is not None
    for step in range(7):
        time.sleep(0.15)  # a slow step (over HANDOVER_S)
        ctx.log(step, loss=1.0)
    t = ctx.times.take()
    assert t is not None and t.timed_by == "ctx.log"
    assert t.steps >= 5, t.steps  # steps 1..6 closed; the bunch of 16 was never reached
    assert t.step_seconds >= t.steps * 0.15


def test_ddp_timers_are_read_at_the_first_step_then_once_a_read_interval_of_steps_went_by() -> None:
    model = Reducer()
    waits = CollectiveWait([model])
    step_s = READ_EVERY_S / 10 * 1.001  # 10 steps a little over the interval
    model.iteration += 1
    assert waits.after(1, step_s) == pytest.approx(0.003)  # the first step: read at once
    read = []
    for _ in range(25):
        model.iteration += 1
        read.append(waits.after(1, step_s))
    # the 10th step after the first reading completes READ_EVERY_S of steps, the 20th another
    assert [i for i, w in enumerate(read) if w is not None] == [9, 19]
    # each reading's last wait stands for the 10 steps since the one before
    assert read[9] == read[19] == pytest.approx(10 * 0.003)

"""The stop of a library's loop on two real gloo ranks: each hears of the stop at its own step
(its heartbeat's reply), and both leave after the same step."""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from orch.runtime._stop_vote import MAX_SPACING


def _leave_as_a_rank_does() -> None:
    """End the process through ``os._exit``, as orch's ranks leave (the forkserver's children):
    an interpreter's own teardown of gloo's and DDP's threads can abort a process on a busy
    machine ("terminate called without an active exception", exit -6) after its work is done."""
    os._exit(0)


def _rank(rank: int, store_path: str, heard_at: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from orch.runtime.context import Context

    store = dist.FileStore(store_path, 2)
    timeout = datetime.timedelta(seconds=20)  # a rank left alone in a collective fails the test
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    ctx = Context(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"), config={},
                  run_id="r", sender=None)  # fmt: skip
    left = None
    for step in range(20_000):  # ends at the stop, a vote or two after the first rank heard of it
        grad = torch.ones(1)
        dist.all_reduce(grad)  # the library's own collective of the step (DDP's bucket)
        if step == heard_at:
            ctx.request_stop(at_step=3)  # the master's stop step, already behind rank 1 here
        if ctx.stop_due(step):
            left = step
            break
    ctx.settle_stop_vote()
    with open(out, "w") as f:
        json.dump({"left": left, "stopped": ctx.stopped}, f)
    dist.destroy_process_group()
    _leave_as_a_rank_does()


@pytest.mark.parametrize("heard", [(1, 9), (9, 1), (5, 5)])
def test_ranks_that_hear_of_a_stop_at_different_steps_leave_after_the_same_one(
    tmp_path: Path, heard: tuple[int, int]
) -> None:
    spawn = mp.get_context("spawn")
    procs = [
        spawn.Process(target=_rank, args=(r, str(tmp_path / "store"), heard[r], str(tmp_path / f"r{r}.json")))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    seen = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    # The stop is the first vote after either rank heard of it, read at the next vote: the votes
    # are spaced out to a tenth of a second of steps, at most MAX_SPACING steps.
    assert seen[0] == seen[1] and seen[0]["stopped"], seen
    assert min(heard) < seen[0]["left"] <= min(heard) + 2 * MAX_SPACING + 1, seen


class _RungSender:
    """A unit test's stand-in for a rank's heartbeat sender in a pruned trial: it hears of the
    rung at step ``heard_at`` of the loop (0: before the first step), and at the rung it is
    told to stop (``pruned``) or not told anything before its wait ends (a late word)."""

    def __init__(self, ctx: object, rung: int, heard_at: int, pruned: bool) -> None:
        self.ctx, self.rung, self.heard_at, self.pruned = ctx, rung, heard_at, pruned
        self.step = self.total_steps = 0
        self.last_hold = 0
        self.answered = True
        self.timing = None

    def hear(self) -> None:
        if self.heard_at == 0:
            self.last_hold = self.rung

    def wait_gate(self, step: int, timeout: float) -> bool:
        if self.pruned:
            self.ctx.request_stop()  # type: ignore[attr-defined]
        return self.pruned

    def log(self, step: int, values: dict[str, float]) -> None:
        if step + 1 >= self.heard_at:
            self.last_hold = max(self.last_hold, self.rung)


def _pruned_rank(rank: int, store_path: str, heard_at: int, pruned: bool, out: str) -> None:
    import torch
    import torch.distributed as dist

    from orch.runtime.context import Context

    store = dist.FileStore(store_path, 2)
    timeout = datetime.timedelta(seconds=20)  # a rank left alone in a collective fails the test
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    control = dist.new_group(backend="gloo")
    ctx = Context(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"), config={},
                  run_id="r", sender=None, control_group=control)  # fmt: skip
    ctx._sender = ctx._log.sender = _RungSender(ctx, rung=6, heard_at=heard_at, pruned=pruned)  # type: ignore[assignment]
    model = ctx.ddp(torch.nn.Linear(4, 1))
    last = -1
    for step in ctx.steps(40):
        model(torch.ones(2, 4)).sum().backward()  # DDP's all-reduce: a peer left alone would hang
        ctx.log(step, loss=1.0)
        last = step
    with open(out, "w") as f:
        json.dump({"last": last, "stopped": ctx.stopped}, f)
    dist.destroy_process_group()
    _leave_as_a_rank_does()


@pytest.mark.parametrize("late", [(0, 3), (3, 0), (0, 0)], ids=["rank1-late", "rank0-late", "both-early"])
def test_a_pruned_trial_stops_at_its_rung_on_every_rank_though_one_heard_of_it_late(
    tmp_path: Path, late: tuple[int, int]
) -> None:
    """Rank 0 is told "pruned" at the rung (step 6); rank 1 heard of the rung only later, or
    was told nothing: both hold at the rung, take rank 0's answer, and leave after step 6."""
    spawn = mp.get_context("spawn")
    procs = [
        spawn.Process(
            target=_pruned_rank,
            args=(r, str(tmp_path / "store"), late[r], r == 0, str(tmp_path / f"r{r}.json")),
        )
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    seen = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    assert seen[0] == seen[1] == {"last": 6, "stopped": True}, seen


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sharded", [True, False], ids=["DistributedSampler", "plain loader"])
def test_stop_ends_a_ctx_data_loop_in_step_within_a_batch_of_hearing(tmp_path: Path, sharded: bool) -> None:
    """An epoch loop over a DataLoader through ctx.data, DDP, 2 ranks, 0.1 s a batch. With a
    DistributedSampler every rank goes through it batch for batch; with a plain loader its
    batches hold DDP's all-reduce, so every rank does too. Either way the ranks vote: both
    leave a batch after the first heard of the Stop, before the master's stop step (about 2 s
    of steps ahead), where ctx.log would end it. (A loader only one rank goes through holds no
    collective of every rank: it never votes; see test_data_loop_stop.py.)"""
    import orch
    from conftest import until
    from orch.wire.states import RunState

    with orch.launch(
        "jobs:epoch_data_loop", world_size=2, run_root=str(tmp_path),
        config={"sharded": sharded, "sleep": 0.1, "epochs": 100},
    ) as run:  # fmt: skip
        until(lambda: min((r.step for r in run.state().ranks), default=0) >= 5, 120)
        run.stop()
        result = run.wait(timeout=120)
        stop_at = run.coordinator.stop_at_step
    assert result.state is RunState.STOPPED, result
    record = json.loads((run.run_dir / "result.json").read_text())
    ends = {r["step"] for r in record["ranks"]}
    assert len(ends) == 1 and {r["state"] for r in record["ranks"]} == {"STOPPED"}, record["ranks"]
    done = ends.pop()
    assert done < stop_at, (done, stop_at)  # the vote ended it, ahead of the master's step

"""The stop of a library's loop on two real gloo ranks: each hears of the stop at its own step
(its heartbeat's reply), and both leave after the same step."""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
from pathlib import Path

import pytest


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
    for step in range(40):
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
    # The stop is the vote of the first step either rank heard it at, read one step later.
    assert seen[0] == seen[1] == {"left": min(heard) + 1, "stopped": True}, seen

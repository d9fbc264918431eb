"""A loop over ``ctx.data(loader)`` alone (no ctx.steps, no ctx.log) on two real ranks: its
batches are its steps, and Stop ends it within about a second on every rank, none terminated,
with a plain loader or a DistributedSampler's, with or without a DDP model (Context.data). A
loader only one rank goes through never makes its peers wait."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import orch
from conftest import until
from orch.runtime.context import Context
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve()


def data_loop(ctx: Any) -> None:
    """An epoch loop over a DataLoader through ctx.data alone; ``sharded``: a DistributedSampler's,
    ``ddp``: each batch trains a DDP model (its gradient all-reduce keeps the ranks in step)."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = TensorDataset(torch.randn(256, 4))
    shard = DistributedSampler(data, ctx.world_size, ctx.rank) if ctx.config["sharded"] else None
    loader = DataLoader(data, batch_size=8, sampler=shard)
    model = ctx.ddp(torch.nn.Linear(4, 1)) if ctx.config["ddp"] else None
    for _epoch in range(10_000):
        for (xb,) in ctx.data(loader):
            if model is not None:
                model(xb).pow(2).mean().backward()
            time.sleep(0.01)


@pytest.mark.parametrize(
    ("sharded", "ddp"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["plain", "plain-ddp", "DistributedSampler", "DistributedSampler-ddp"],
)
def test_a_ctx_data_loop_shows_its_steps_and_stops_within_a_second(
    tmp_path: Path, sharded: bool, ddp: bool
) -> None:
    run = orch.launch(
        f"{HERE}:data_loop", world_size=2, run_root=str(tmp_path), config={"sharded": sharded, "ddp": ddp}
    )
    try:
        until(lambda: run.state().state is RunState.RUNNING, 120)
        until(lambda: min((r.step for r in run.state().ranks), default=0) >= 5, 5)
        asked = time.monotonic()
        run.stop()
        result = run.wait(timeout=60)
        took = time.monotonic() - asked
    finally:
        run.close()
    assert result.state is RunState.STOPPED and took < 1.5, (result.state, took)
    record = json.loads((run.run_dir / "result.json").read_text())
    ranks = record["ranks"]
    assert [(r["state"], r["exit_code"]) for r in ranks] == [("STOPPED", 0), ("STOPPED", 0)], ranks
    assert "terminated" not in json.dumps(record), record  # neither a rank nor the run's note
    assert min(r["step"] for r in ranks) >= 5, ranks
    if ddp:  # in step: the ranks left before the same batch
        assert ranks[0]["step"] == ranks[1]["step"], ranks


def rank0_evaluates_alone(ctx: Any) -> None:
    """Epochs of training through ctx.data on every rank (DDP: its loop votes on a stop), then
    an evaluation through ctx.data on rank 0 alone while rank 1 waits at a barrier."""
    from torch.utils.data import DataLoader, TensorDataset

    train = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
    val = DataLoader(TensorDataset(torch.randn(48, 4)), batch_size=8)
    model = ctx.ddp(torch.nn.Linear(4, 1))
    for _epoch in range(int(ctx.config["epochs"])):
        for (xb,) in ctx.data(train):
            model(xb).pow(2).mean().backward()
        if ctx.rank == 0:
            with torch.no_grad():
                for (xb,) in ctx.data(val):
                    model.module(xb)
        dist.barrier()


def test_a_loader_only_one_rank_goes_through_never_makes_its_peers_wait(tmp_path: Path) -> None:
    """Its loop holds no collective, so it never votes: no vote of rank 0's waits for rank 1,
    nor pairs with one of rank 1's training loop."""
    run = orch.launch(
        f"{HERE}:rank0_evaluates_alone", world_size=2, run_root=str(tmp_path), config={"epochs": 20}
    )
    try:
        result = run.wait(timeout=120)
    finally:
        run.close()
    assert result.state is RunState.SUCCEEDED
    # Rank 0's steps are its batches, its evaluation's too: 20 x (8 + 6); rank 1's 20 x 8.
    assert [r.step for r in run.state().ranks] == [280, 160]


class _Sender:
    """What ctx.data tells the heartbeat sender: the rank's step."""

    def __init__(self) -> None:
        self.step = self.total_steps = 0
        self.counts_steps = False
        self.timing = None


def test_each_batch_is_a_step_across_epochs_and_a_stop_ends_a_lone_rank_at_once() -> None:
    ctx = Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), config={},
                  run_id="r", sender=None)  # fmt: skip
    sender = _Sender()
    ctx._sender = ctx._log.sender = sender  # type: ignore[assignment]
    seen = []
    for _epoch in range(2):
        for x in ctx.data(range(5)):
            seen.append(sender.step)
            assert x == sender.step % 5
    assert seen == list(range(10)) and sender.step == 10 and sender.counts_steps
    ctx.request_stop()
    with pytest.raises(orch.errors.StopTraining):
        for _x in ctx.data(range(5)):
            pass
    assert ctx.stopped and sender.step == 10

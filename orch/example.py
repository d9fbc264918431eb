"""The built-in example job: a small MLP learning handwritten digits.

The data is scikit-learn's copy of the UCI "optical recognition of handwritten digits"
set (1,797 8x8 images), which ships inside the installed package: nothing is downloaded.
Each rank trains on its own shard through a DistributedSampler; the loss falls visibly
within a few hundred steps on two CPU cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

DEFAULTS: dict[str, Any] = {
    "steps": 300,
    "lr": 0.05,
    "batch_size": 32,
    "hidden": 64,
    "seed": 0,
    "eval_every": 50,
}


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    return x, y


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _batches(loader: DataLoader[Any], sampler: DistributedSampler[Any]) -> Iterator[Any]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        yield from loader
        epoch += 1


def train(ctx: Any) -> None:
    cfg = {**DEFAULTS, **ctx.config}
    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank
    x, y = load_digits_tensors()
    n_train = 1500
    train_set = TensorDataset(x[:n_train], y[:n_train])
    x_test, y_test = x[n_train:].to(ctx.device), y[n_train:].to(ctx.device)
    sampler: DistributedSampler[Any] = DistributedSampler(
        train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=cfg["seed"]
    )
    loader = DataLoader(train_set, batch_size=cfg["batch_size"], sampler=sampler, drop_last=True)
    model = ctx.ddp(make_model(cfg["hidden"]))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    batches = _batches(loader, sampler)
    for step in ctx.steps(cfg["steps"]):
        xb, yb = next(batches)
        xb, yb = xb.to(ctx.device), yb.to(ctx.device)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        scalars: dict[str, float] = {}
        if step % cfg["eval_every"] == 0 or step == cfg["steps"] - 1:
            with torch.no_grad():
                scalars["accuracy"] = (model(x_test).argmax(1) == y_test).float().mean().item()
        ctx.log(step, loss=loss.item(), **scalars)

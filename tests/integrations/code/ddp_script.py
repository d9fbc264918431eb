"""A training script written for torchrun, nothing of orch in it (as pytorch/examples'
ddp-tutorial-series/multinode.py: argparse, DistributedSampler, init_process_group("gloo"),
destroy_process_group), on the CPU. Each rank saves its parameters to --out/params-rank<R>.pt
and writes its loss through a TensorBoard SummaryWriter."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.tensorboard import SummaryWriter


def main() -> None:
    parser = argparse.ArgumentParser(description="a small DDP job")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    writer = SummaryWriter(os.path.join(args.out, "tb", f"rank{rank}"))
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            writer.add_scalar("train/loss", loss.item(), step)
            writer.add_scalars("lr", {"group0": opt.param_groups[0]["lr"]}, step)
            step += 1
    writer.close()
    torch.save(model.module.state_dict(), os.path.join(args.out, f"params-rank{rank}.pt"))
    with open(os.path.join(args.out, f"env-rank{rank}.txt"), "w") as f:
        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")
        f.write(" ".join(f"{n}={os.environ.get(n)}" for n in names))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

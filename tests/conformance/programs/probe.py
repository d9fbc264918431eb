"""What a rank observes, written to OUT/rank<R>.json: run the same way under torchrun and orch.

    probe.py OUT [--mesh | --fsdp] [--seed S]

As a script it makes its process group as torchrun code does: ``init_process_group()`` with
no backend, or ``init_device_mesh`` (``--mesh``), or FSDP2's ``fully_shard`` on a mesh
(``--fsdp``); ``--seed S`` seeds torch, numpy and random with S + RANK first, as a user's
code does. It records the torchrun environment, its random draws, its threads, where it runs,
its group's backend and every TCP socket it listens on, trains a small model a few steps and
saves it. :func:`of_ctx` and :func:`without_ctx` are the same as functions of a run.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
)  # fmt: skip


def listening() -> list[str]:
    """This process's listening TCP sockets, as ``hex address:port``, from the kernel's tables."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    address, port = fields[1].split(":")
                    found.append(f"{address}:{int(port, 16)}")
    return sorted(found)


def seen_at_start() -> dict[str, Any]:
    """What the code finds before it does anything: its world, random state and place."""
    main = sys.modules["__main__"]
    return {
        "env": {name: os.environ.get(name) for name in VARIABLES},
        "initial_seed": torch.initial_seed(),
        "torch_draw": torch.rand(4).tolist(),
        "numpy_draw": np.random.rand(4).tolist(),
        "random_draw": random.random(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cwd": os.getcwd(),
        "argv": sys.argv[1:],
        "argv0": os.path.basename(sys.argv[0]),
        "path0": sys.path[0],
        "name": __name__,
        "main_file": os.path.basename(getattr(main, "__file__", "") or ""),
    }


def train(out: Path, seen: dict[str, Any], how: str = "init") -> None:
    """Make the group (unless made), train 5 steps of a small model, save it and ``seen``."""
    device_mesh = None
    if how in ("mesh", "fsdp"):
        from torch.distributed.device_mesh import init_device_mesh

        device_mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    elif not dist.is_initialized():
        dist.init_process_group()
    rank = dist.get_rank()
    seen["backend"] = str(dist.get_backend())
    seen["rank"], seen["world_size"] = rank, dist.get_world_size()
    seen["listening"] = listening()
    torch.manual_seed(0)  # the model the same on every rank and under every launcher
    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)]
    model: torch.nn.Module = torch.nn.Sequential(*layers)
    if how == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=device_mesh)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1 + rank)
    for _ in range(5):
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 2, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in model.state_dict().items()
    }
    seen["listening_after"] = listening()
    out.mkdir(parents=True, exist_ok=True)
    torch.save(state, out / f"params-rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(seen, indent=1))


def of_ctx(ctx: Any) -> None:
    """The probe as a function of a run (its group made by orch)."""
    train(Path(ctx.config["out"]), seen_at_start())


def without_ctx(out: str) -> None:
    """The probe as accelerate.notebook_launcher's kind of function: ``fn(out)``."""
    train(Path(out), seen_at_start())


def in_gang(ctx: Any, out: str) -> None:
    """The probe as a gang's call: ``gang.run(in_gang, out)``."""
    train(Path(out), seen_at_start())


def main() -> None:
    if "--seed" in sys.argv:
        s = int(sys.argv[sys.argv.index("--seed") + 1]) + int(os.environ["RANK"])
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)
    seen = seen_at_start()
    how = "mesh" if "--mesh" in sys.argv else "fsdp" if "--fsdp" in sys.argv else "init"
    train(Path(sys.argv[1]), seen, how)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

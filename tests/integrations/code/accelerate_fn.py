"""Training code built on Accelerate, nothing of orch in it but an optional tracker. `train`
runs under orch.launch (in each rank) or under accelerate.notebook_launcher (this file's
__main__); each process saves its parameters and what Accelerate saw to OUT/."""

import json
import os
import sys

import torch


def train(ctx=None):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    out = os.environ["ORCH_TEST_OUT"]
    trackers = []
    if os.environ.get("ORCH_TEST_TRACKER"):
        from orch.integrations.accelerate import OrchTracker

        trackers = [OrchTracker()]
    accelerator = Accelerator(cpu=os.environ.get("ORCH_TEST_CPU", "1") == "1", log_with=trackers or None)
    if trackers:
        accelerator.init_trackers("accelerate-test")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 8, generator=g)
    loader = DataLoader(
        TensorDataset(x, x.sum(1, keepdim=True)),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(2),
    )
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for step, (xb, yb) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        accelerator.log({"loss": loss.item()}, step=step)
    i = accelerator.process_index
    torch.save(accelerator.unwrap_model(model).state_dict(), os.path.join(out, f"params-rank{i}.pt"))
    seen = {
        "num_processes": accelerator.num_processes,
        "process_index": i,
        "distributed_type": str(accelerator.distributed_type),
        "wrapped": type(model).__name__,
        "batches": step + 1,
    }
    with open(os.path.join(out, f"seen-rank{i}.json"), "w") as f:
        json.dump(seen, f)
    accelerator.end_training()


if __name__ == "__main__":
    from accelerate import notebook_launcher

    # The reference run's store on a port the test picked free (accelerate's default, 29500,
    # may be another run's on a shared machine).
    notebook_launcher(
        train, (), num_processes=int(sys.argv[1]), use_port=os.environ.get("ORCH_TEST_PORT", "29500")
    )

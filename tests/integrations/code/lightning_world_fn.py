"""A Lightning Trainer and a Fabric as a rank's code might build them, nothing of orch in it.
ORCH_TEST_SETUP=alone: the defaults (``Trainer()``, ``Fabric()``), one device on CPU, each
rank training alone; =right: what orch's warning says to pass, as under torchrun."""

import json
import os

import torch


def train(ctx=None):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    right = os.environ["ORCH_TEST_SETUP"] == "right"
    sizes = {}
    if right:
        sizes = dict(
            strategy="ddp",
            devices=int(os.environ["LOCAL_WORLD_SIZE"]),
            num_nodes=int(os.environ["GROUP_WORLD_SIZE"]),
        )
    fabric = L.Fabric(accelerator="cpu", **sizes)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    trainer = L.Trainer(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **sizes,
    )
    trainer.fit(Regression(), loader)
    out = os.path.join(os.environ["ORCH_TEST_OUT"], f"seen-rank{os.environ['RANK']}.json")
    with open(out, "w") as f:
        seen = {"trainer": trainer.world_size, "fabric": fabric.world_size, "steps": trainer.global_step}
        json.dump(seen, f)

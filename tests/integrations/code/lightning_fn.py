"""Training code built on Lightning (Trainer with strategy="ddp", devices=2), nothing of orch
in it but an optional logger and callback. `train` runs in each rank of orch.launch, or, run
as a script, under Lightning's own launcher (which starts the second process itself)."""

import json
import os
import time

import torch


def train(ctx=None):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    out = os.environ["ORCH_TEST_OUT"]

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            time.sleep(float(os.environ.get("ORCH_TEST_STEP_SLEEP", "0")))
            if str(self.global_rank) == os.environ.get("ORCH_TEST_SLOW_RANK"):
                time.sleep(0.04)  # a straggler, slow in its own compute
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    loggers, callbacks = [], []
    if os.environ.get("ORCH_TEST_LOGGER"):
        from orch.integrations.lightning import OrchCallback, OrchLogger

        loggers, callbacks = [OrchLogger()], [OrchCallback()]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 8, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    model = Regression()
    epochs = int(os.environ.get("ORCH_TEST_EPOCHS", "2"))
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=epochs,
        logger=loggers or False,
        callbacks=callbacks,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    rank = trainer.global_rank
    torch.save(model.net.state_dict(), os.path.join(out, f"params-rank{rank}.pt"))
    with open(os.path.join(out, f"seen-rank{rank}.json"), "w") as f:
        json.dump({"global_rank": rank, "world_size": trainer.world_size, "pid": os.getpid()}, f)


if __name__ == "__main__":
    train()

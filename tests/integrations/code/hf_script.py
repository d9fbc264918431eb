"""The HF Trainer on a tiny GPT-2 built from a config (nothing is downloaded), as a torchrun
script; with ORCH_TEST_CALLBACK set it adds orch's callback. Each rank saves its parameters."""

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


def main() -> None:
    out = os.environ["ORCH_TEST_OUT"]
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(
        output_dir=os.path.join(out, "trainer"),
        use_cpu=True,
        per_device_train_batch_size=4,
        max_steps=6,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    callbacks = []
    if os.environ.get("ORCH_TEST_CALLBACK"):
        from orch.integrations.hf import OrchCallback

        callbacks = [OrchCallback()]
    Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
    torch.save(model.state_dict(), os.path.join(out, f"params-rank{args.process_index}.pt"))
    with open(os.path.join(out, f"seen-rank{args.process_index}.txt"), "w") as f:
        f.write(f"{args.world_size} {args.process_index}")


if __name__ == "__main__":
    main()

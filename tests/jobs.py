"""Tiny training functions the tests run in real worker processes (importable as jobs:NAME)."""

from __future__ import annotations

import math
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def allreduce_steps(ctx: Any) -> None:
    """A few steps of a real all-reduce; logs a loss that falls."""
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(ctx.rank)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    for step in ctx.steps(int(ctx.config.get("steps", 30))):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item(), rank_seen=float(ctx.rank))
        time.sleep(float(ctx.config.get("sleep", 0.0)))


def raise_on_rank1(ctx: Any) -> None:
    model = ctx.ddp(torch.nn.Linear(2, 1))
    for step in ctx.steps(1000):
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        ctx.log(step, loss=loss.item())
        if ctx.rank == 1 and step == 3:
            raise RuntimeError("boom on rank 1")
        time.sleep(0.01)


def exit3_on_rank1(ctx: Any) -> None:
    for step in ctx.steps(1000):
        dist.barrier()
        if ctx.rank == 1 and step == 3:
            sys.exit(3)
        time.sleep(0.01)


def sigkill_self_on_rank1(ctx: Any) -> None:
    for step in ctx.steps(1000):
        dist.barrier()
        if ctx.rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)


def nan_loss(ctx: Any) -> None:
    for step in ctx.steps(5):
        ctx.log(step, loss=float("nan") if step >= 2 else 1.0, other=float("inf"))


def segfault_on_rank1(ctx: Any) -> None:
    import ctypes

    for step in ctx.steps(1000):
        dist.barrier()
        if ctx.rank == 1 and step == 3:
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        time.sleep(0.01)


def skips_an_all_reduce_on_rank1(ctx: Any) -> None:
    """DDP steps that all-reduce the loss, but rank 1 skips that once, at step 3: its next
    collective (DDP's gradient bucket, 5 floats) meets rank 0's all-reduce of 1 float."""
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 4)
    for step in ctx.steps(int(ctx.config.get("steps", 50))):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        if not (ctx.rank == 1 and step == 3):
            dist.all_reduce(total)  # the skipped collective
        ctx.log(step, loss=total.item())


def ignores_sigterm_and_abort(ctx: Any) -> None:
    """A rank deaf to every polite end: SIGTERM is ignored and the master's ABORT is not obeyed.
    Only the launcher's SIGKILL at the end of its grace ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ctx._sender._on_abort = lambda reason: None
    for step in ctx.steps(1_000_000):
        ctx.log(step, loss=1.0)
        time.sleep(0.02)


def long_barriers(ctx: Any) -> None:
    """Runs until stopped or killed: a real collective every step."""
    for step in ctx.steps(int(ctx.config.get("steps", 1_000_000))):
        dist.barrier()
        ctx.log(step, loss=1.0 / (step + 1))
        time.sleep(float(ctx.config.get("sleep", 0.02)))


def checkpointed(ctx: Any) -> None:
    """Trains with a checkpoint every 10 steps; rank 1 dies at step ``die_at`` on the attempts listed."""
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = ctx.load_checkpoint()
    inner = getattr(model, "module", model)
    if state is not None:
        inner.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    torch.manual_seed(ctx.rank)
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)
    die_at = int(ctx.config.get("die_at", 25))
    die_on = set(ctx.config.get("die_on_attempts", [1]))

    def snapshot() -> dict[str, Any]:
        return {"model": inner.state_dict(), "opt": opt.state_dict()}

    for step in ctx.steps(int(ctx.config.get("steps", 40)), checkpoint=snapshot, every=10):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item(), attempt=float(ctx.attempt))
        if ctx.rank == 0 and step == ctx.config.get("corrupt_at") and ctx.attempt == 1:
            # The newest checkpoint loses its second half, as on a disk that lost the write.
            newest = ctx.checkpoint_dir / (ctx.checkpoint_dir / "latest").read_text()
            newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
        if ctx.rank == 1 and step == die_at and ctx.attempt in die_on:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(float(ctx.config.get("sleep", 0.01)))


# ctx.steps' checkpoints (every 2 steps: at steps 1, 3, ..., 11) carry "val", the mean over the
# two ranks of what each logged last: these means, rank 0 logging 0.5 less and rank 1 0.5 more.
MERIT_MEANS = [5.0, 1.0, 4.0, 2.0, 3.0, 6.0]


def checkpoints_by_merit(ctx: Any) -> None:
    """12 steps, a checkpoint every 2 carrying the mean of "val" (:data:`MERIT_MEANS`), keep=2."""
    mode = ctx.config.get("mode", "min")
    snapshot = lambda: {"w": torch.full((4,), float(ctx.rank))}  # noqa: E731
    for step in ctx.steps(12, checkpoint=snapshot, every=2, keep=2, metric="val", mode=mode):
        mean = MERIT_MEANS[step // 2]
        ctx.log(step, loss=1.0 / (step + 1), val=mean + (0.5 if ctx.rank else -0.5))
        dist.barrier()


def fails_at_startup(ctx: Any) -> None:
    raise ImportError("no module named 'missing_dependency'")


def logs_a_string(ctx: Any) -> None:
    """A user's slip: a string logged beside the loss."""
    for step in ctx.steps(20):
        ctx.log(step, loss=1.0 / (step + 1), opt="sgd")


def dataloader_loop(ctx: Any) -> None:
    """The usual epoch-and-DataLoader loop: ctx.log with a step counter, never ctx.steps."""
    from torch.utils.data import DataLoader, TensorDataset

    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(256, 4)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    ctx.total_steps = int(ctx.config.get("epochs", 2)) * len(loader)
    for epoch in range(int(ctx.config.get("epochs", 2))):
        for i, (xb, yb) in enumerate(loader):
            loss = ((model(xb) - yb) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ctx.log(epoch * len(loader) + i, loss=loss, epoch=epoch)  # a tensor loss, an int
            time.sleep(float(ctx.config.get("sleep", 0.02)))


def checkpointed_slow_teardown(ctx: Any) -> None:
    """``checkpointed``, whose ranks ignore SIGTERM: a tear-down takes the launcher's whole grace."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    checkpointed(ctx)


def raise_on_rank1_then_linger(ctx: Any) -> None:
    """Rank 1 raises at step 3, then is slow to leave: delivering its last points takes 60 s."""
    if ctx.rank == 1:
        ctx._sender.close = lambda *_, **__: time.sleep(60)
    for step in ctx.steps(10_000):
        dist.barrier()
        ctx.log(step, loss=1.0)
        if ctx.rank == 1 and step == 3:
            raise ValueError("bad batch on rank 1")
        time.sleep(0.02)


def logs_a_string_at_step_30(ctx: Any) -> None:
    """Rank 1 logs a string by mistake at step 30, after 30 good steps."""
    for step in ctx.steps(1000):
        dist.barrier()
        ctx.log(step, loss=1.0 / (step + 1))
        if ctx.rank == 1 and step == 30:
            ctx.log(step, loss="oops")
        time.sleep(0.01)


def lr_job(ctx: Any) -> None:
    """A sweep's job: a real DDP fit whose loss depends on ``lr``; ``fail: true`` raises at step 3.
    ``nan_at: k`` makes it diverge as training does: its weights blow up at step k - 1 (a loss
    near 1e34) and are NaN from step k on, so its loss is NaN from step k."""
    torch.manual_seed(0)
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=float(ctx.config["lr"]))
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    nan_at = int(ctx.config.get("nan_at", -10))
    for step in ctx.steps(int(ctx.config.get("steps", 20))):
        if step in (nan_at - 1, nan_at):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1e17) if step == nan_at - 1 else p.fill_(float("nan"))
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item(), acc=1.0 / (1.0 + loss.item()))
        if ctx.config.get("fail") and step == 3:
            raise ValueError(f"config lr={ctx.config['lr']} was told to fail")
        time.sleep(float(ctx.config.get("sleep", 0.0)))


def launcher_ranks(ctx: Any) -> None:
    """``allreduce_steps``, logging what the launcher said beside orch's rank: RANK (torchrun)
    or SLURM_PROCID (srun), -1 when unset, and ctx.local_rank beside LOCAL_RANK / SLURM_LOCALID."""

    def env(*names: str) -> float:
        return float(next((os.environ[n] for n in names if n in os.environ), -1))

    initial_seed = torch.initial_seed()  # the rank's own; seed= + rank with a seed
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(ctx.rank)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    seen = {
        "initial_seed": float(initial_seed % 2**52),
        "orch_rank": float(ctx.rank),
        "env_rank": env("RANK", "SLURM_PROCID"),
        "orch_local_rank": float(ctx.local_rank),
        "env_local_rank": env("LOCAL_RANK", "SLURM_LOCALID"),
        "env_world": env("WORLD_SIZE", "SLURM_NTASKS"),
    }
    for step in ctx.steps(int(ctx.config.get("steps", 30))):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item(), **seen)


def straggler(ctx: Any) -> None:
    """DDP on a small model, every rank sleeping ``base`` s per step; rank ``slow_rank`` sleeps
    ``delay`` s more, in its compute, in its wait for data (``where="data"``, through ctx.data)
    or in a marked section (``where="augment"``)."""
    model = ctx.ddp(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    slow = int(ctx.config.get("slow_rank", -1))
    where = str(ctx.config.get("where", "compute"))
    delay = float(ctx.config.get("delay", 0.03)) if ctx.rank == slow else 0.0
    base = float(ctx.config.get("base", 0.01))

    def batches() -> Any:
        while True:
            if where == "data":
                time.sleep(delay)
            yield torch.randn(32, 16)

    data = ctx.data(batches())
    for step in ctx.steps(int(ctx.config.get("steps", 1_000_000))):
        x = next(data)
        time.sleep(base)
        if where == "compute":
            time.sleep(delay)
        elif where == "augment":
            with ctx.section("augment"):
                time.sleep(delay)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())


def epoch_data_loop(ctx: Any) -> None:
    """The usual epoch loop over a DataLoader through ``ctx.data`` alone (no ctx.steps), DDP;
    rank ``slow_rank`` sleeps ``delay`` s more per step in its compute. With ``sharded``, the
    loader's sampler is a DistributedSampler (each rank its own shard); ``sleep``: per batch."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    model = ctx.ddp(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 16)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    shard = DistributedSampler(data, ctx.world_size, ctx.rank) if ctx.config.get("sharded") else None
    loader = DataLoader(data, batch_size=8, sampler=shard)
    delay = float(ctx.config.get("delay", 0.03)) if ctx.rank == int(ctx.config.get("slow_rank", -1)) else 0.0
    for epoch in range(int(ctx.config.get("epochs", 1000))):
        for i, (xb, yb) in enumerate(ctx.data(loader)):
            time.sleep(float(ctx.config.get("sleep", 0.01)) + delay)
            loss = ((model(xb) - yb) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ctx.log(epoch * len(loader) + i, loss=loss.item())


def log_only_loop(ctx: Any) -> None:
    """A plain loop (no ctx.steps, no ctx.data) that logs every step, DDP; rank ``slow_rank``
    sleeps ``delay`` s more per step."""
    model = ctx.ddp(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    delay = float(ctx.config.get("delay", 0.03)) if ctx.rank == int(ctx.config.get("slow_rank", -1)) else 0.0
    for step in range(int(ctx.config.get("steps", 1_000_000))):
        time.sleep(0.01 + delay)
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())


def fails_at_step_10(ctx: Any) -> None:
    """``for step in ctx.steps(100)``, DDP; rank 1 raises at step 10 (an allocation error)."""
    model = ctx.ddp(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in ctx.steps(100):
        if ctx.rank == 1 and step == 10:
            raise MemoryError("could not allocate the activations of step 10")
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())


def untimed_loop(ctx: Any) -> None:
    """A loop without ctx.steps or ctx.ddp (it logs, and all-reduces by hand)."""
    for step in range(int(ctx.config.get("steps", 1_000_000))):
        t = torch.ones(1)
        dist.all_reduce(t)
        ctx.log(step, loss=1.0 / (step + 1))
        time.sleep(0.01)


def own_comm_hook(ctx: Any) -> None:
    """A model from ctx.ddp given a communication hook of the user's (fp16 compression, counting
    its calls): it must run, and the step timing must still see the collectives."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = ctx.ddp(torch.nn.Linear(16, 1))
    calls = [0]

    def count() -> None:
        calls[0] += 1

    # A lambda: DDP checks a hook's annotations, and this module's are strings.
    model.register_comm_hook(
        None, lambda state, bucket: (count(), default_hooks.fp16_compress_hook(state, bucket))[1]
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(ctx.rank)
    for step in ctx.steps(int(ctx.config.get("steps", 30))):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item(), hook_calls=float(calls[0]))
        time.sleep(0.01)


def slow_flush_checkpoints(ctx: Any) -> None:
    """Checkpoints every 5 steps; rank 1 takes 1.5 s to hand its points to the master each time
    and notes when it has (``config["out"]``/rank1-flushed, one time a line)."""
    if ctx.rank == 1:
        flush = ctx._sender.flush
        out = Path(ctx.config["out"]) / "rank1-flushed"

        def slow(*args: Any, **kwargs: Any) -> bool:
            time.sleep(1.5)
            done = flush(*args, **kwargs)
            with open(out, "a") as f:
                f.write(f"{time.time()!r}\n")
            return bool(done)

        ctx._sender.flush = slow
    for step in ctx.steps(10, checkpoint=lambda: {"step": ctx.rank}, every=5):
        ctx.log(step, loss=1.0 / (step + 1))
        time.sleep(0.01)


def hang_rank1(ctx: Any) -> None:
    """DDP steps; at step ``config["at"]`` rank 1 blocks in its own code (``config["how"]``:
    "sleep" in time.sleep, "ignore_term" the same with SIGTERM ignored) while the others wait
    for it in the gradient all-reduce."""
    model = ctx.ddp(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)
    at = int(ctx.config.get("at", 10))
    for step in ctx.steps(int(ctx.config.get("steps", 10**6))):
        if ctx.rank == 1 and step == at:
            if ctx.config.get("how") == "ignore_term":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(10**6)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())
        time.sleep(0.02)


def leaks_on_rank1(ctx: Any) -> None:
    """Rank 1 keeps 20 MB more every step (tensors put in a list never emptied); rank 0 holds.
    A real collective every step, until stopped (or ``steps``)."""
    kept = []
    for step in ctx.steps(int(ctx.config.get("steps", 1_000_000))):
        dist.barrier()
        if ctx.rank == 1:
            kept.append(torch.ones(5_000_000))  # 20 MB, every page written
        ctx.log(step, loss=1.0 / (step + 1))
        time.sleep(float(ctx.config.get("sleep", 0.25)))


def healthy_training(ctx: Any) -> None:
    """An ordinary run: a small MLP under DDP with Adam (its state is made at the first step),
    fresh batches every step, so that its memory grows at first and then goes up and down."""
    nn = torch.nn
    model = ctx.ddp(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in ctx.steps(int(ctx.config.get("steps", 1_000_000))):
        x = torch.randn(int(ctx.config.get("batch", 2048)), 512)
        loss = ((model(x) - x[:, :1]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())
        time.sleep(float(ctx.config.get("sleep", 0.1)))


def freeze_rank1(ctx: Any) -> None:
    """Steps with a real all-reduce; at step 5 rank 1 freezes its whole process (SIGSTOP), its
    heartbeat thread with it, inside a function of its own."""

    def stuck_in_here() -> None:
        os.kill(os.getpid(), signal.SIGSTOP)

    for step in ctx.steps(10**6):
        if ctx.rank == 1 and step == 5:
            stuck_in_here()
        t = torch.ones(1)
        dist.all_reduce(t)
        ctx.log(step, loss=1.0)
        time.sleep(0.02)


def per_layer_norms(ctx: Any) -> None:
    """A loss and 150 gradient norms ("grad_norm/layer000" ...) each step, for config seconds."""
    end = time.monotonic() + float(ctx.config.get("seconds", 3.0))
    step = 0
    while time.monotonic() < end:
        ctx.log(
            step, loss=1.0 / (step + 1), **{f"grad_norm/layer{i:03d}": i + step / 1000 for i in range(150)}
        )
        step += 1
        time.sleep(0.02)


def long_metric_name(ctx: Any) -> None:
    ctx.log(0, loss=1.0)
    ctx.log(1, **{"m" * 300: 1.0})


def huge_error_message_on_rank1(ctx: Any) -> None:
    """Rank 1 raises with a message of 100 MB (as the repr of a big tensor or dataframe)."""
    ctx.log(0, loss=1.0)
    if ctx.rank == 1:
        raise ValueError("0.123456 " * 11_650_000 + "(end of the message)")
    time.sleep(60)


def backlog_of_12_metrics(ctx: Any) -> None:
    """100,000 points of 12 metrics logged while no heartbeat could go (its lock held, as a
    master that did not answer for a while): a 21 MiB backlog, then sent."""
    with ctx._sender._beat_lock:
        for step in range(100_000):
            ctx.log(step, **{f"m{i:02d}": step + i / 100 for i in range(12)})


def a_beat_the_master_refuses(ctx: Any) -> None:
    """A point whose name the master refuses (given to the heartbeat thread directly, as a
    master with other caps than this worker would), then points for config seconds."""
    ctx.log(0, loss=1.0)
    ctx._sender.flush()
    ctx._sender.log(1, {"x" * 300: 1.0})
    ctx._sender.flush()
    end = time.monotonic() + float(ctx.config.get("seconds", 3.0))
    step = 1
    while time.monotonic() < end:
        ctx.log(step, loss=1.0 / (step + 1))
        step += 1
        time.sleep(0.02)


def landscape_loss(config: dict[str, Any], step: int) -> float:
    """The seeded synthetic landscape of the sweep tests and benchmark: config ``x`` (0..26)
    ends at ``final``, and every curve falls the same way from a start a little above it, so
    the best config leads from its first steps (its ``final`` is the least, by a margin)."""
    x = int(config["x"])
    rng = random.Random(f"landscape:{config.get('seed', 0)}:{x}")
    a, b, c = x // 9, (x // 3) % 3, x % 3
    final = 0.05 + 0.04 * ((a - 1) ** 2 + 0.7 * (b - 2) ** 2 + 0.4 * c**2) + 0.01 * rng.random()
    if "valley" in config:  # a valley at x = valley: in x's order each config beats those before it
        final = 0.05 + 0.02 * abs(x - int(config["valley"])) + 0.001 * rng.random()
    return final + (1.0 + 0.01 * rng.random()) * math.exp(-step / 20.0)


def landscape_job(ctx: Any) -> None:
    """A trial of the synthetic landscape: ``steps`` steps of ``sleep`` seconds, its loss from
    :func:`landscape_loss` (rank r logs it shifted by (r - (n-1)/2) / 1000: the mean is the loss),
    an all-reduce each step (a real DDP group), a checkpoint every ``every`` steps, and with
    ``trace``, rank 0 appends ``<x> <step>`` to that file for each step it ran."""
    model = ctx.ddp(torch.nn.Linear(2, 1))
    state = {"w": torch.zeros(1)}
    saved = ctx.load_checkpoint()
    if saved is not None:
        state = saved
    every = int(ctx.config.get("every", 0))
    trace = ctx.config.get("trace")
    shift = (ctx.rank - (ctx.world_size - 1) / 2) / 1000.0
    steps = int(ctx.config.get("steps", 81))
    keep = None if ctx.config.get("checkpoint") is False else (lambda: state)  # False: a run starts at 0
    loop: Any = ctx.steps(steps, checkpoint=keep, every=every)
    if ctx.config.get("loop"):  # a loop without ctx.steps: range's, or a DataLoader's through ctx.data
        loop = ctx.data(range(steps)) if ctx.config["loop"] == "data" else range(steps)
    for step in loop:
        loss = model(torch.ones(1, 2)).sum() * 0.0
        loss.backward()
        state["w"] += 1
        ctx.log(step, loss=landscape_loss(ctx.config, step) + shift)
        if trace and ctx.rank == 0:
            with open(trace, "a") as f:
                f.write(f"{ctx.config['x']} {step}\n")
        time.sleep(float(ctx.config.get("sleep", 0.0)))


TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT")


def torchrun_contract(ctx: Any) -> None:
    """Log torchrun's variables beside ctx's rank and local rank (one point, step 0)."""
    seen = {f"env/{n}": float(os.environ.get(n, -1)) for n in TORCHRUN_VARIABLES}
    ctx.log(0, ctx_rank=float(ctx.rank), ctx_local_rank=float(ctx.local_rank), **seen)


def spawns_its_own_job(ctx: Any) -> None:
    """What Lightning's ddp_spawn does: torch.multiprocessing.spawn of the training itself."""
    import torch.multiprocessing as tmp

    tmp.spawn(allreduce_steps, nprocs=2)


def launches_a_run_inside(ctx: Any) -> None:
    import orch

    orch.launch(allreduce_steps, world_size=2)


def starts_processes_and_returns(ctx: Any) -> None:
    """A child, and a grandchild whose parent exits at once (an orphan): none may outlive the run."""
    import subprocess

    subprocess.Popen(["sleep", "600"])
    subprocess.run(["sh", "-c", "sleep 600 &"], check=True)
    ctx.log(0, loss=1.0)


def reexecutes_orch_run(ctx: Any) -> None:
    """What a library that re-executes the program does when the program is `orch run`."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "orch", "run", "--workers", "2", "--fn", "jobs:allreduce_steps"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    print(f"child exited {proc.returncode}: {proc.stderr.strip()}", flush=True)
    ctx.log(0, child_exit=float(proc.returncode))


def returns_a_value(ctx: Any) -> Any:
    """Trains a DDP model a few steps and returns what config["kind"] asks for: its
    state_dict, a tensor, a dict of floats, the DDP-wrapped model, a model of a class defined
    here (cloudpickled by value), something that does not pickle, or a large tensor."""
    torch.manual_seed(0)
    model = ctx.ddp(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 4)
    for step in ctx.steps(int(ctx.config.get("steps", 5))):
        loss = (model(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())
    kind = ctx.config.get("kind", "state_dict")
    if kind == "state_dict":
        return model.module.state_dict()
    if kind == "tensor":
        return torch.full((3,), float(ctx.rank))
    if kind == "floats":
        return {"rank": float(ctx.rank), "loss": round(loss.item(), 6)}
    if kind == "ddp":
        return model
    if kind == "own_class":

        class Head(torch.nn.Module):
            def __init__(self, scale: float) -> None:
                super().__init__()
                self.scale = torch.nn.Parameter(torch.tensor([scale]))

            def forward(self, t: torch.Tensor) -> torch.Tensor:
                return t * self.scale

        return Head(2.0 + ctx.rank)
    if kind == "lock":
        import threading

        return threading.Lock() if ctx.rank == 1 else "fine"
    if kind == "big":
        return torch.zeros(int(ctx.config["numel"]))
    if kind == "none":
        return None
    raise ValueError(kind)


# -- a gang's calls (orch.gang): build once, train in several calls ---------------------------
def gang_build(ctx: Any, lr: float = 0.1) -> None:
    torch.manual_seed(0)
    ctx.state.model = ctx.ddp(torch.nn.Linear(4, 1))
    ctx.state.opt = torch.optim.SGD(ctx.state.model.parameters(), lr=lr)
    torch.manual_seed(1 + ctx.rank)
    ctx.state.x = torch.randn(16, 4)
    ctx.state.y = ctx.state.x.sum(1, keepdim=True)


def gang_train(ctx: Any, steps: int, pause: float = 0.0) -> dict[str, Any]:
    s = ctx.state
    for step in ctx.steps(steps):
        loss = ((s.model(s.x) - s.y) ** 2).mean()
        s.opt.zero_grad()
        loss.backward()
        s.opt.step()
        ctx.log(step, loss=loss.item())
        time.sleep(pause)
    return s.model.module.state_dict()


def gang_train_rank1_fails(ctx: Any) -> None:
    """A training call whose rank 1 raises at the start of step 0, while rank 0 waits for it in
    the gradient all-reduce of its backward: the model is left as it was (no optimizer step)."""
    s = ctx.state
    for _step in ctx.steps(5):
        if ctx.rank == 1:
            time.sleep(0.3)  # rank 0 is in the all-reduce by now
            raise ValueError("bad batch on rank 1")
        loss = ((s.model(s.x) - s.y) ** 2).mean()
        s.opt.zero_grad()
        loss.backward()
        s.opt.step()


def gang_keep(ctx: Any, value: Any) -> None:
    ctx.state.kept = value


def gang_name_error(ctx: Any) -> None:
    """Every rank raises NameError at the top of the call (a name its cell never made)."""
    return undefined_name + 1  # type: ignore[name-defined]  # noqa: F821


def gang_all_reduce_rank1_raises(ctx: Any) -> None:
    """Rank 1 raises; rank 0 waits in an all_reduce that will never finish."""
    if ctx.rank == 1:
        time.sleep(0.3)
        raise ValueError("boom on rank 1")
    x = torch.ones(1)
    dist.all_reduce(x)


def gang_sleep_rank1_raises(ctx: Any) -> None:
    """Rank 1 raises once rank 0 set its state; rank 0 sleeps in its own code, in no collective."""
    import torch.distributed as dist

    if ctx.rank == 0:
        ctx.state.slept = False
    dist.barrier()  # rank 0's state is set before rank 1 fails, however loaded the machine
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    time.sleep(600)
    ctx.state.slept = True


def gang_native_rank1_raises(ctx: Any) -> None:
    """Rank 1 raises; rank 0 is in one C call that holds the GIL for minutes (its heartbeat
    thread cannot run: nothing can free it)."""
    if ctx.rank == 1:
        time.sleep(0.5)
        raise ValueError("boom on rank 1")
    sum(range(10**11))


def gang_rank1_never_steps(ctx: Any) -> None:
    """Rank 0 steps into an all_reduce; rank 1 sleeps in its own code, never at a step boundary."""
    for _step in ctx.steps(10):
        if ctx.rank == 1:
            time.sleep(600)
        dist.all_reduce(torch.ones(1))


def gang_all_reduce(ctx: Any) -> dict[str, Any]:
    """An all_reduce across the gang, with where it ran and what the rank kept."""
    x = torch.ones(1) * (ctx.rank + 1)
    dist.all_reduce(x)
    return {"sum": x.item(), "pid": os.getpid(), "kept": getattr(ctx.state, "kept", None)}


def gang_where(ctx: Any) -> dict[str, Any]:
    """Where this rank of a gang runs: its host, its process, its rank."""
    import socket

    return {"host": socket.gethostname(), "pid": os.getpid(), "rank": ctx.rank}


def gang_in_one_run(ctx: Any) -> dict[str, Any]:
    """The same steps as gang_build then gang_train three times, in one run."""
    gang_build(ctx)
    for _ in range(3):
        trained = gang_train(ctx, int(ctx.config["steps"]))
    return trained


def gang_slow(ctx: Any) -> None:
    for step in ctx.steps(1_000_000):
        time.sleep(0.01)
        ctx.log(step, loss=1.0)


def gang_slow_marked(ctx: Any) -> None:
    """A long ctx.steps loop that records whether it was interrupted and whether the code after
    the loop ran (it does not, when a stop raises KeyboardInterrupt at a step boundary)."""
    ctx.state.interrupted = False
    try:
        for step in ctx.steps(1_000_000):
            time.sleep(0.01)
            ctx.log(step, loss=1.0)
        ctx.state.after_loop = True
    except KeyboardInterrupt:
        ctx.state.interrupted = True
        raise

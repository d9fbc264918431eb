"""The jobs the benchmarks run, under orch (``_jobs:NAME`` functions taking ``ctx``) and torchrun.

Run as a script it is the torchrun worker: ``python -m torch.distributed.run --standalone
--nproc-per-node N benchmarks/_jobs.py MODE --out DIR [...]`` with MODE one of ``ddp``
(the DDP loop of step_overhead), ``first-step`` (launch_latency), ``barriers``
(teardown) or ``sweep`` (one config of the sweep benchmark). Both sides run the same
model, data and loop; only the launcher differs, and orch's side logs every step with
``ctx.log`` as a user would.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

DEFAULTS = {"steps": 400, "warmup": 40, "hidden": 512, "inputs": 128, "batch": 64}


def _model(cfg: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)
    h = int(cfg["hidden"])
    return nn.Sequential(
        nn.Linear(int(cfg["inputs"]), h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10)
    )


def _data(cfg: dict[str, Any], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(int(cfg["batch"]), int(cfg["inputs"]), generator=g)
    y = torch.randint(0, 10, (int(cfg["batch"]),), generator=g)
    return x, y


def _write(out_dir: str, name: str, value: Any) -> None:
    path = Path(out_dir) / name
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _step_times(marks: list[float], warmup: int) -> list[float]:
    """Wall time of each step after the warm-up: from one step's start to the next's."""
    return [b - a for a, b in zip(marks[warmup:], marks[warmup + 1 :], strict=False)]


def _write_steps(cfg: dict[str, Any], rank: int, marks: list[float], cpu: list[float]) -> None:
    """Per step: wall time, and CPU time of the whole process (every thread, orch's too)."""
    w = int(cfg["warmup"])
    _write(cfg["out"], f"rank{rank}.json", {"wall": _step_times(marks, w), "cpu": _step_times(cpu, w)})


# -- under orch ------------------------------------------------------------------------------------
def ddp_loop(ctx: Any) -> None:
    """step_overhead: the DDP loop, ``ctx.log(step, loss=..., lr=...)`` on every step."""
    cfg = {**DEFAULTS, **ctx.config}
    torch.set_num_threads(1)
    model = ctx.ddp(_model(cfg))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x, y = _data(cfg, ctx.rank)
    lr = opt.param_groups[0]["lr"]
    steps = int(cfg["steps"]) + 1
    loop = ctx.steps(steps) if cfg.get("loop", "steps") == "steps" else range(steps)
    marks: list[float] = []
    cpu: list[float] = []
    for step in loop:
        marks.append(time.perf_counter())
        cpu.append(time.process_time())
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item(), lr=lr)
    _write_steps(cfg, ctx.rank, marks, cpu)


def first_step(ctx: Any) -> None:
    """launch_latency: the wall-clock time this rank reaches its first step."""
    cfg = {**DEFAULTS, **ctx.config}
    model = ctx.ddp(_model(cfg))
    x, _ = _data(cfg, ctx.rank)
    for step in ctx.steps(1):
        _write(cfg["out"], f"rank{ctx.rank}.json", time.time())
        ctx.log(step, loss=float(model(x).sum().item()))


def barrier_loop(ctx: Any) -> None:
    """teardown: a real collective every step until stopped or killed."""
    for step in ctx.steps(int(ctx.config.get("steps", 10**9))):
        dist.barrier()
        ctx.log(step, loss=1.0 / (step + 1))
        time.sleep(float(ctx.config.get("sleep", 0.01)))


def stop_loop(ctx: Any) -> None:
    """ends, in a kernel: a 2-rank DDP fit at ``sleep`` s a step in the loop ``config["loop"]``
    names: "steps" (ctx.steps), "data" (an epoch loop over a DataLoader sharded by a
    DistributedSampler, through ctx.data), "log" (a plain range, ctx.log alone)."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    model = ctx.ddp(nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 16)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, ctx.world_size, ctx.rank))
    sleep, kind = float(ctx.config.get("sleep", 0.01)), ctx.config["loop"]

    def step(i: int, xb: Any, yb: Any) -> None:
        loss = ((model(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(i, loss=loss.item())
        time.sleep(sleep)

    if kind == "data":
        for epoch in range(10**6):
            for i, (xb, yb) in enumerate(ctx.data(loader)):
                step(epoch * len(loader) + i, xb, yb)
    else:
        xb, yb = x[:8], x[:8].sum(1, keepdim=True)
        for i in ctx.steps(10**9) if kind == "steps" else range(10**9):
            step(i, xb, yb)


def _sweep_steps(cfg: dict[str, Any], rank: int, model: nn.Module, loop: Any, log: Any) -> None:
    """sweep: ``cfg["steps"]`` DDP steps at ``cfg["lr"]``; writes the steps done and the last loss."""
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]), momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x, y = _data(cfg, rank)
    done, last = 0, float("nan")
    for step in loop:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        last = loss.item()
        log(step, last)
        done += 1
    _write(cfg["out"], f"rank{rank}.json", {"steps": done, "loss": last})


def sweep_train(ctx: Any) -> None:
    """sweep: one config of ``orch.sweep``, ``ctx.log(step, loss=...)`` on every step."""
    cfg = {**DEFAULTS, **ctx.config}
    torch.set_num_threads(1)
    model = ctx.ddp(_model(cfg))
    _sweep_steps(cfg, ctx.rank, model, ctx.steps(int(cfg["steps"])), lambda s, v: ctx.log(s, loss=v))


def sweep_and_time(out_dir: str, run_root: str, sweeps: list[dict[str, Any]], import_s: float) -> None:
    """sweep's orch side, run in a fresh ``python -c`` process (a notebook kernel).

    Each of ``sweeps`` (``{"parallel": P, "configs": [...]}``, in order; the first finds
    the forkserver cold) is one ``orch.sweep`` timed from just before the call until
    ``wait()`` returned and ``close()`` did; its results go to ``out_dir/orch.json``.
    """
    import orch

    result: dict[str, Any] = {"import_orch_s": import_s, "sweeps": []}
    for i, s in enumerate(sweeps):
        t0 = time.time()
        sw = orch.sweep(
            "_jobs:sweep_train",
            s["configs"],
            world_size=int(s["world_size"]),
            parallel=int(s["parallel"]),
            run_root=f"{run_root}/sweep{i}",
            name=f"bench{i}",
            threads=1,
        )
        try:
            res = sw.wait(timeout=600)
        finally:
            sw.close()
        wall = time.time() - t0
        rows = [
            {k: r[k] for k in ("index", "state", "reused", "steps", "total", "duration", "failure")}
            for r in res
        ]
        result["sweeps"].append({"parallel": sw.parallel, "wall_s": wall, "rows": rows})
    _write(out_dir, "orch.json", result)


def launch_and_time(
    out_dir: str, world_size: int, run_root: str, launches: int, import_s: float, apart: bool = False
) -> None:
    """launch_latency's orch side, run in a fresh ``python -c`` process (a notebook kernel).

    For each launch: the time just before ``orch.launch`` and the ranks' first-step
    times, written to ``out_dir/launch{i}/``; launch 0 is the cold one. ``apart``: the
    master lives in a process of its own, as a notebook kernel's launch puts it.
    """
    import orch

    result: dict[str, Any] = {"import_orch_s": import_s, "launches": []}
    for i in range(launches):
        d = Path(out_dir) / f"launch{i}"
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        run = orch.launch(
            "_jobs:first_step",
            world_size=world_size,
            config={"out": str(d)},
            run_root=run_root,
            threads=1,
            master_port=0,  # any free port: other runs may share this machine
            apart=apart,
        )
        returned = time.time() - t0
        try:
            run.wait(timeout=120)
        finally:
            run.close()
        firsts = [json.loads((d / f"rank{r}.json").read_text()) for r in range(world_size)]
        result["launches"].append(
            {
                "t0": t0,
                "returned_s": returned,
                "first_step": firsts,
                "latency_s": max(firsts) - t0,
                "phases": _phases(run.log_files().values(), t0),
            }
        )
    _write(out_dir, "orch.json", result)


_PHASES = {"registered as rank": "registered", "process group up": "process_group_up"}


def _phases(logs: Any, t0: float) -> dict[str, float]:
    """Seconds from ``t0`` to the last rank's "registered" and "process group up" log lines."""
    import datetime

    out: dict[str, float] = {}
    for path in logs:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            for marker, phase in _PHASES.items():
                if marker in line:
                    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    out[phase] = max(out.get(phase, 0.0), stamp - t0)
    return out


# -- under torchrun --------------------------------------------------------------------------------
def _torchrun_main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["ddp", "first-step", "barriers", "sweep"])
    p.add_argument("--out", required=True)
    p.add_argument("--config", default="{}")
    args = p.parse_args()
    cfg = {**DEFAULTS, **json.loads(args.config)}
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)  # as orch's workers do
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.mode == "barriers":
        _write(args.out, f"pid{rank}.json", os.getpid())
        while True:
            dist.barrier()
            time.sleep(0.01)
    model = nn.parallel.DistributedDataParallel(_model(cfg))
    if args.mode == "sweep":
        _sweep_steps({**cfg, "out": args.out}, rank, model, range(int(cfg["steps"])), lambda s, v: None)
        dist.destroy_process_group()
        return
    x, y = _data(cfg, rank)
    if args.mode == "first-step":
        for _step in range(1):
            _write(args.out, f"rank{rank}.json", time.time())
            float(model(x).sum().item())
        dist.destroy_process_group()
        return
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    marks: list[float] = []
    cpu: list[float] = []
    for step in range(int(cfg["steps"]) + 1):
        if step == 0:
            _write(args.out, f"first{rank}.json", time.time())  # script_run: launch to first step
        marks.append(time.perf_counter())
        cpu.append(time.process_time())
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
    _write_steps({**cfg, "out": args.out}, rank, marks, cpu)
    dist.destroy_process_group()


if __name__ == "__main__":
    _torchrun_main()
    # Leave as orch's workers do (os._exit after flushing): an interpreter shutdown with gloo's
    # threads still up aborts now and then ("terminate called without an active exception"),
    # after the results are written, which would fail the torchrun side for nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def landscape_value(x: int, step: int, seed: int = 0, valley: bool = False) -> float:
    """The sweep benchmark's seeded synthetic landscape: 27 configs (x = 0..26), each a curve
    ``final + start * exp(-step / tau)`` with its own start and pace; the finals are a seeded
    shuffle of 0.05, 0.07, ... (one best), so the grid's order says nothing of the best. With
    ``valley``, the finals fall with x to the best at x = 13 and rise after it, as a grid of
    learning rates written in order does: in x's order each config up to 13 beats every one before it."""
    order = list(range(27))
    if valley:
        order.sort(key=lambda v: (abs(v - 13), v))
    else:
        random.Random(f"landscape:{seed}").shuffle(order)
    final = 0.05 + 0.02 * order.index(x)
    rng = random.Random(f"landscape:{seed}:{x}")
    start, tau = 1.0 + 0.05 * rng.random(), 18.0 + 6.0 * rng.random()
    return final + start * math.exp(-step / tau)


def landscape_train(ctx: Any) -> None:
    """A trial of the landscape: ``steps`` steps of ``sleep`` seconds with an all-reduce each
    (a real DDP group); rank r logs the value shifted by (r - (n-1)/2) / 1000 (the mean is the value)."""
    model = ctx.ddp(torch.nn.Linear(2, 1))
    shift = (ctx.rank - (ctx.world_size - 1) / 2) / 1000.0
    x, seed, valley = int(ctx.config["x"]), int(ctx.config.get("seed", 0)), bool(ctx.config.get("valley"))
    for step in ctx.steps(int(ctx.config["steps"])):
        model(torch.ones(1, 2)).sum().backward()
        ctx.log(step, loss=landscape_value(x, step, seed, valley) + shift)
        time.sleep(float(ctx.config["sleep"]))


def asha_and_time(out_dir: str, run_root: str, n: int, steps: int, sleep: float, seeds: list[int]) -> None:
    """sweep --case asha's orch side, in a fresh process: a warm-up run, the full grid of the
    landscape (seed ``seeds[0]``), then per seed an ASHA sweep (grace 3, reduction 3) of the
    shuffled landscape and one of the valley (the grid in the order a user writes it), each
    with ``seed=seed`` (the order a pruned grid runs in), and once the valley in its given
    order; then per seed an ``orch.SHA`` sweep (grace 3, reduction 3) of the valley in its given
    order and one of the shuffled landscape. Each sweep is timed from the call until ``wait()``
    and ``close()`` returned; its trials' steps, states and the slot-reuse gaps (a prune to the
    next trial's first logged step) go to ``out_dir/asha.json``."""
    import orch

    def configs(seed: int, valley: bool) -> list[dict[str, Any]]:
        return [{"x": x, "seed": seed, "steps": steps, "sleep": sleep, "valley": valley} for x in range(n)]

    def one(name: str, seed: int, prune: Any, valley: bool = False, order: Any = None) -> dict[str, Any]:
        t0 = time.time()
        sw = orch.sweep("_jobs:landscape_train", configs(seed, valley), world_size=2, run_root=run_root,
                        name=name, threads=1, prune=prune, seed=seed, order=order)  # fmt: skip
        try:
            res = sw.wait(timeout=1800)
        finally:
            sw.close()
        wall = time.time() - t0
        gaps = []
        trials = sorted(sw.trials, key=lambda t: t.started)
        for t in trials:
            if t.state != "PRUNED":
                continue
            after = [u for u in trials if u.started >= t.pruned_time and u.run is not None]
            if after:
                first = after[0].run.coordinator.points.get(0, "loss")
                if len(first):
                    gaps.append(first.times[0] - t.pruned_time)
        return {
            "wall_s": wall,
            "states": [r["state"] for r in res],
            # a trial's every run: SHA runs a trial that paused at a rung again if it goes on
            "steps": [r["steps"] + r["earlier_steps"] for r in res],
            "runs": [1 + len(r["earlier_runs"]) for r in res],
            "pruned_at": [r["pruned_at"] for r in res],
            "best": sw.best().config["x"],
            "known_best": min(range(n), key=lambda x: landscape_value(x, steps - 1, seed, valley)),
            "order": sw.order,
            "gaps": gaps,
        }

    warm = orch.sweep("_jobs:landscape_train", [{"x": 0, "steps": 3, "sleep": 0.0}], run_root=run_root,
                      name="warm-up", threads=1)  # fmt: skip
    warm.wait(timeout=300)
    warm.close()
    result: dict[str, Any] = {"grid": one("grid", seeds[0], None), "asha": {}, "valley": {}}
    for seed in seeds:
        result["asha"][str(seed)] = one(f"asha{seed}", seed, orch.ASHA(grace=3, reduction=3, max_steps=steps))
        result["valley"][str(seed)] = one(
            f"valley{seed}", seed, orch.ASHA(grace=3, reduction=3, max_steps=steps), valley=True
        )
    result["given"] = one("given", seeds[0], orch.ASHA(grace=3, reduction=3, max_steps=steps), True, "given")
    result["sha_valley"], result["sha"] = {}, {}
    for seed in seeds:
        sha = orch.SHA(grace=3, reduction=3, max_steps=steps)
        result["sha_valley"][str(seed)] = one(f"sha-valley{seed}", seed, sha, valley=True, order="given")
        result["sha"][str(seed)] = one(f"sha{seed}", seed, orch.SHA(grace=3, reduction=3, max_steps=steps))
    _write(out_dir, "asha.json", result)


def timed_first_step(ctx: Any) -> float:
    """gang: one step of the launch_latency model; returns the wall-clock time this rank reached
    it. In a gang the model is built by the first call and kept in ctx.state; a run builds it."""
    cfg = {**DEFAULTS, **ctx.config}
    s = ctx.state
    if not hasattr(s, "model"):
        s.model = ctx.ddp(_model(cfg))
        s.x, _ = _data(cfg, ctx.rank)
    reached = 0.0
    for step in ctx.steps(1):
        reached = time.time()
        ctx.log(step, loss=float(s.model(s.x).sum().item()))
    return reached


def gang_fails_everywhere(ctx: Any) -> None:
    """gang: every rank raises NameError at the top of the call (a name its cell never made): no
    collective is left half done, so the gang keeps its ranks, their ctx.state and their group."""
    return never_defined + 1  # type: ignore[name-defined]  # noqa: F821


def gang_fails_in_all_reduce(ctx: Any, delay: float = 0.1) -> None:
    """gang: rank 1 raises ``delay`` s into the call while every other rank waits for it in an
    all_reduce that never finishes (a broken collective, which the next call's group remakes).
    Its message holds the ``time.time()`` it raised at, as ``raised at t=SECONDS``."""
    if ctx.rank == 1:
        time.sleep(delay)  # the others are in the all_reduce by then
        raise ValueError(f"rank 1 fails while its peers wait in all_reduce (raised at t={time.time():.6f})")
    dist.all_reduce(torch.ones(1))

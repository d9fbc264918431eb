"""Per-step overhead of orch against torchrun on the same DDP loop.

The same small MLP (128 -> 512 -> 512 -> 10, batch 64, SGD), world size 2, gloo, one
thread per worker (OMP_NUM_THREADS=1, torch.set_num_threads(1)) runs under
``python -m torch.distributed.run --standalone --nproc-per-node 2`` and under
``orch.launch(fn, world_size=2, threads=1)`` with ``ctx.log(step, loss=..., lr=...)`` on
every step of every rank. Each rank times each step (from one step's start to the next's,
after the warm-up steps) and writes them to a JSON file; per run the benchmark takes the
median per rank, then the median over ranks. Runs are interleaved (torchrun, orch,
orch-range, torchrun, ...); the ratio is orch / torchrun of the medians over repeats.
"orch-range" is the same orch job iterating ``range(n)`` instead of ``ctx.steps(n)``:
it separates the cost of ctx.steps' per-step stop all-reduce from the rest of orch.
"orch" times each step's parts (ctx.steps, and DDP's own timers read once per step: the
straggler judgement's input, on by default); "orch-untimed" is the same with
``ORCH_STEP_TIMING=0``, so orch / orch-untimed is what the timing costs.

    .venv/bin/python benchmarks/step_overhead.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/step_overhead.py --quick    # tiny, prints only
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common as c

NAME = "step_overhead"
TARGET = 1.02


def _collect(out: Path, world: int) -> tuple[float, float]:
    """(wall, cpu) seconds per step: the median per rank, then the median over ranks."""
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return c.median(c.median(r["wall"]) for r in ranks), c.median(c.median(r["cpu"]) for r in ranks)


def run_torchrun(tmp: Path, cfg: dict[str, Any], world: int, tag: str, attempt: int) -> tuple[float, float]:
    out = tmp / f"{tag}-try{attempt}"
    out.mkdir()
    c.torchrun(
        world, str(c.HERE / "_jobs.py"), "ddp", "--out", str(out), "--config", json.dumps(cfg), timeout=300
    )
    return _collect(out, world)


def run_orch(
    tmp: Path, cfg: dict[str, Any], world: int, tag: str, loop: str, timing: bool = True
) -> tuple[float, float]:
    import os

    import orch

    out = tmp / tag
    out.mkdir()
    before = os.environ.get("ORCH_STEP_TIMING")
    os.environ["ORCH_STEP_TIMING"] = "1" if timing else "0"  # the workers get this environment
    run = orch.launch(
        "_jobs:ddp_loop",
        world_size=world,
        threads=1,
        config={**cfg, "out": str(out), "loop": loop},
        run_root=str(tmp / "runs"),
        master_port=0,  # any free port: other runs may share this machine
    )
    try:
        run.wait(timeout=300)
    finally:
        run.close()
        if before is None:
            os.environ.pop("ORCH_STEP_TIMING", None)
        else:
            os.environ["ORCH_STEP_TIMING"] = before
    return _collect(out, world)


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--repeats", type=int, default=6, help="runs of each launcher, interleaved")
    p.add_argument("--steps", type=int, default=300, help="timed steps per run (after the warm-up)")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--hidden", type=int, default=512, help="hidden width of the MLP")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--no-range", action="store_true", help="skip the orch-range variant")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 30, 5
    started = c.start()
    c.setup_path()
    world = 2
    cfg = {
        "steps": args.steps + args.warmup,
        "warmup": args.warmup,
        "hidden": args.hidden,
        "batch": args.batch,
    }
    variants = ["torchrun", "orch", "orch-untimed"] + ([] if args.no_range or args.quick else ["orch-range"])
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    torchrun_retries = 0
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-step-") as d:
            tmp = Path(d)
            for rep in range(args.repeats):
                for v in variants:
                    tag = f"{v}-{rep}"
                    if v == "torchrun":
                        (w, u), retried = c.retry_torchrun(
                            NAME, functools.partial(run_torchrun, tmp, cfg, world, tag), retry=args.quick
                        )
                        torchrun_retries += retried
                    else:
                        loop = "range" if v == "orch-range" else "steps"
                        w, u = run_orch(tmp, cfg, world, tag, loop, timing=v != "orch-untimed")
                    wall[v].append(w)
                    cpu[v].append(u)
                    print(
                        f"  repeat {rep} {v:10s} step: wall {w * 1e3:.3f} ms, process CPU {u * 1e3:.3f} ms",
                        flush=True,
                    )
    finally:
        c.kill_all_children()
    med = {v: c.median(ts) for v, ts in wall.items()}
    med_cpu = {v: c.median(ts) for v, ts in cpu.items()}
    ratio = med["orch"] / med["torchrun"]
    paired = c.median(o / t for o, t in zip(wall["orch"], wall["torchrun"], strict=True))
    best = min(wall["orch"]) / min(wall["torchrun"])
    cpu_ratio = med_cpu["orch"] / med_cpu["torchrun"]
    overhead_us = (med["orch"] - med["torchrun"]) * 1e6
    cpu_overhead_us = (med_cpu["orch"] - med_cpu["torchrun"]) * 1e6
    met = ratio <= TARGET
    c.emit(
        NAME, "torchrun_step_ms", f"{med['torchrun'] * 1e3:.3f}", cpu_ms=f"{med_cpu['torchrun'] * 1e3:.3f}"
    )
    c.emit(NAME, "orch_step_ms", f"{med['orch'] * 1e3:.3f}", cpu_ms=f"{med_cpu['orch'] * 1e3:.3f}")
    if "orch-range" in med:
        c.emit(
            NAME,
            "orch_range_step_ms",
            f"{med['orch-range'] * 1e3:.3f}",
            cpu_ms=f"{med_cpu['orch-range'] * 1e3:.3f}",
        )
    c.emit(
        NAME,
        "ratio",
        f"{ratio:.4f}",
        paired_median=f"{paired:.4f}",
        best_of=f"{best:.4f}",
        cpu_ratio=f"{cpu_ratio:.4f}",
        target=f"<={TARGET}",
        met=met,
    )
    c.emit(NAME, "torchrun_retries", torchrun_retries)
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    rows = [
        c.Row(
            "step wall time ratio orch / torchrun (median of runs)",
            f"<= {TARGET}",
            f"{ratio:.3f} ({overhead_us:+.0f} µs/step; paired {paired:.3f}, best-of {best:.3f})",
            met,
        ),
        c.Row(
            "  step process-CPU ratio orch / torchrun",
            "-",
            f"{cpu_ratio:.3f} ({cpu_overhead_us:+.0f} µs CPU/step)",
            None,
        ),
    ]
    untimed = med["orch-untimed"] / med["torchrun"]
    cost = med["orch"] / med["orch-untimed"]
    c.emit(NAME, "timing_cost", f"{cost:.4f}", untimed_ratio=f"{untimed:.4f}")
    rows.append(
        c.Row(
            "  step timing off (ORCH_STEP_TIMING=0) / torchrun; timing on / off",
            "-",
            f"{untimed:.3f}; {cost:.3f} ({(med['orch'] - med['orch-untimed']) * 1e6:+.0f} µs/step)",
            None,  # informational: this benchmark's runs spread by more than the timing costs
        )
    )
    if "orch-range" in med:
        r2 = med["orch-range"] / med["torchrun"]
        c2 = med_cpu["orch-range"] / med_cpu["torchrun"]
        rows.append(
            c.Row(
                "  same, orch job looping over range() instead of ctx.steps()",
                "-",
                f"wall {r2:.3f}, CPU {c2:.3f}",
                None,
            )
        )
    detail_rows = []
    for v in variants:
        detail_rows.append(
            (
                v,
                " ".join(f"{t * 1e3:.2f}" for t in wall[v]),
                f"{med[v] * 1e3:.3f}",
                f"{med[v] / med['torchrun']:.3f}",
                " ".join(f"{t * 1e3:.2f}" for t in cpu[v]),
                f"{med_cpu[v] * 1e3:.3f}",
                f"{med_cpu[v] / med_cpu['torchrun']:.3f}",
            )
        )
    body = "\n".join(
        [
            f"Config: MLP 128->{args.hidden}->{args.hidden}->10, batch {args.batch}, SGD(momentum), "
            f"world size {world}, gloo, 1 thread per worker; {args.steps} timed steps after "
            f"{args.warmup} warm-up steps; {args.repeats} interleaved repeats. "
            "Per run: median step per rank, median over ranks. "
            "Wall: time from one step's start to the next's. CPU: the worker process's CPU time over the "
            "same interval (all its threads: gloo's, orch's heartbeat thread), less sensitive to the other "
            "load on this shared machine.",
            "",
            c.table(
                [
                    "launcher",
                    "wall per run (ms)",
                    "median wall (ms)",
                    "/ torchrun",
                    "CPU per run (ms)",
                    "median CPU (ms)",
                    "/ torchrun",
                ],
                detail_rows,
            ),
            "",
            f"Ratio of medians orch / torchrun: **{ratio:.4f}**; median of the paired per-repeat ratios "
            f"{paired:.4f}; ratio of the fastest runs {best:.4f}; absolute overhead "
            f"{overhead_us:+.1f} µs wall, {cpu_overhead_us:+.1f} µs CPU per step.",
            "",
            "orch's extra per-step work: `ctx.log` (a deque append), the asynchronous 1-element stop "
            "all-reduce that `ctx.steps()` launches every step on a separate gloo group (waited for one "
            "step later), and the heartbeat thread that wakes every 0.25 s and then reads the process's "
            "memory and CPU (/proc and its memory cgroup, about 0.2 ms per beat); the master runs in the "
            "benchmark process, sharing the 2 cores. `orch-range` drops the ctx.steps() all-reduce and "
            "keeps the rest.",
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

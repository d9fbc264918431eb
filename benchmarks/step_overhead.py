"""Per-step overhead of orch against torchrun on the same DDP loop.

A small MLP (128 -> 64 -> 64 -> 10, batch 32, SGD), world size 2, gloo, one thread per
worker (OMP_NUM_THREADS=1, torch.set_num_threads(1)) runs under
``python -m torch.distributed.run --standalone --nproc-per-node 2`` and under
``orch.launch(fn, world_size=2, threads=1)`` looping over ``ctx.steps(n)`` with
``ctx.log(step, loss=..., lr=...)`` on every step of every rank, the step timing on (the
straggler judgement's input, on by default). The model is this small so that the step is as
short as DDP's gradient all-reduce lets it be on this machine (about 1.8-2 ms on 2 shared
cores: the gloo round trip between two processes is most of it; a smaller model is not
faster), where orch's own per-step work weighs the most.

Each rank measures the wall time and its process's CPU time (every thread: gloo's, orch's
heartbeat thread and its memory readings, gRPC's) from the first step after the warm-up to
the last one, divided by the steps: all of orch's work in the rank, beats included, not only
a typical step's. Per run, the mean over the two ranks. Runs are interleaved in pairs
(torchrun and orch, the order alternating from one repeat to the next, with
``ORCH_STEP_TIMING=0`` as a third, informational run); the figures are the medians of the
per-pair differences (CPU µs per step, orch - torchrun) and ratios (wall, orch / torchrun),
and every pair is listed.

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
WALL_TARGET = 1.02  # orch / torchrun, median of the pairs
CPU_TARGET_US = 50.0  # µs of process CPU per step, orch - torchrun, median of the pairs


def _collect(out: Path, world: int) -> tuple[float, float]:
    """(wall, cpu) seconds per step over the timed steps, the mean over ranks."""
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    wall = [sum(r["wall"]) / len(r["wall"]) for r in ranks]
    cpu = [sum(r["cpu"]) / len(r["cpu"]) for r in ranks]
    return sum(wall) / world, sum(cpu) / world


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
    p.add_argument("--repeats", type=int, default=8, help="interleaved pairs of runs")
    p.add_argument("--steps", type=int, default=2000, help="timed steps per run (after the warm-up)")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--hidden", type=int, default=64, help="hidden width of the MLP")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--range", action="store_true", help="add orch-range: range(n) instead of ctx.steps(n)")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 60, 10
    started = c.start()
    c.setup_path()
    world = 2
    cfg = {
        "steps": args.steps + args.warmup,
        "warmup": args.warmup,
        "hidden": args.hidden,
        "batch": args.batch,
    }
    variants = ["torchrun", "orch", "orch-untimed"] + (["orch-range"] if args.range else [])
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    torchrun_retries = 0
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-step-") as d:
            tmp = Path(d)
            for rep in range(args.repeats):
                # torchrun first in one repeat, orch first in the next: neither always runs
                # after the other (a machine that drifts favours neither)
                order = variants if rep % 2 == 0 else [variants[1], variants[0], *variants[2:]]
                for v in order:
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
                        f"  repeat {rep} {v:12s} step: wall {w * 1e3:.3f} ms, process CPU {u * 1e3:.3f} ms",
                        flush=True,
                    )
    finally:
        c.kill_all_children()
    med = {v: c.median(ts) for v, ts in wall.items()}
    med_cpu = {v: c.median(ts) for v, ts in cpu.items()}
    base_w, base_c = wall["torchrun"], cpu["torchrun"]

    def ratios(v: str) -> list[float]:
        return [o / t for o, t in zip(wall[v], base_w, strict=True)]

    def extra_us(v: str) -> list[float]:
        return [(o - t) * 1e6 for o, t in zip(cpu[v], base_c, strict=True)]

    ratio, cpu_us = c.median(ratios("orch")), c.median(extra_us("orch"))
    wall_met, cpu_met = ratio <= WALL_TARGET, cpu_us <= CPU_TARGET_US
    c.emit(
        NAME, "torchrun_step_ms", f"{med['torchrun'] * 1e3:.3f}", cpu_ms=f"{med_cpu['torchrun'] * 1e3:.3f}"
    )
    c.emit(NAME, "orch_step_ms", f"{med['orch'] * 1e3:.3f}", cpu_ms=f"{med_cpu['orch'] * 1e3:.3f}")
    c.emit(NAME, "ratio", f"{ratio:.4f}", target=f"<={WALL_TARGET}", met=wall_met)
    c.emit(NAME, "cpu_us_per_step", f"{cpu_us:+.1f}", target=f"<={CPU_TARGET_US:.0f}", met=cpu_met)
    c.emit(NAME, "torchrun_retries", torchrun_retries)
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    pairs = len(base_w)

    def listed(xs: list[float], fmt: str) -> str:
        return " ".join(format(x, fmt) for x in xs)

    rows = [
        c.Row(
            f"process CPU per step, orch - torchrun (median of {pairs} interleaved pairs; each pair)",
            f"<= {CPU_TARGET_US:.0f} µs",
            f"{cpu_us:+.0f} µs ({listed(extra_us('orch'), '+.0f')})",
            cpu_met,
        ),
        c.Row(
            f"step wall time, orch / torchrun (median of {pairs} interleaved pairs; each pair)",
            f"<= {WALL_TARGET}",
            f"{ratio:.3f} ({listed(ratios('orch'), '.3f')})",
            wall_met,
        ),
        c.Row(
            "  same with the step timing off (ORCH_STEP_TIMING=0): CPU, wall",
            "-",
            f"{c.median(extra_us('orch-untimed')):+.0f} µs, {c.median(ratios('orch-untimed')):.3f}",
            None,
        ),
    ]
    if "orch-range" in wall:
        rows.append(
            c.Row(
                "  same, orch job looping over range() instead of ctx.steps(): CPU, wall",
                "-",
                f"{c.median(extra_us('orch-range')):+.0f} µs, {c.median(ratios('orch-range')):.3f}",
                None,
            )
        )
    header = ["repeat", "torchrun wall / CPU (ms)"]
    for v in variants[1:]:
        header += [f"{v} wall / CPU (ms)", f"{v} wall ratio", f"{v} CPU - torchrun (µs)"]

    def cells(wall_s: float, cpu_s: float, ratio: float, extra: float) -> list[str]:
        return [f"{wall_s * 1e3:.3f} / {cpu_s * 1e3:.3f}", f"{ratio:.3f}", f"{extra:+.0f}"]

    detail = []
    for i in range(pairs):
        row = [str(i), f"{base_w[i] * 1e3:.3f} / {base_c[i] * 1e3:.3f}"]
        for v in variants[1:]:
            row += cells(wall[v][i], cpu[v][i], ratios(v)[i], extra_us(v)[i])
        detail.append(row)
    medians = ["median", f"{med['torchrun'] * 1e3:.3f} / {med_cpu['torchrun'] * 1e3:.3f}"]
    for v in variants[1:]:
        medians += cells(med[v], med_cpu[v], c.median(ratios(v)), c.median(extra_us(v)))
    detail.append(medians)
    body = "\n".join(
        [
            f"Config: MLP 128->{args.hidden}->{args.hidden}->10, batch {args.batch}, SGD(momentum), "
            f"world size {world}, gloo, 1 thread per worker; {args.steps} timed steps after "
            f"{args.warmup} warm-up steps; {args.repeats} interleaved pairs (torchrun first in even "
            "repeats, orch first in odd ones; orch-untimed after both). Per run: wall and process CPU "
            "(every thread of the rank's process) from the first timed step to the last, per step, "
            "the mean of the two ranks: orch's heartbeats, memory readings and stop votes included.",
            "",
            c.table(header, detail),
            "",
            f"Median of the pairs: **{cpu_us:+.1f} µs** of process CPU per step (goal <= "
            f"{CPU_TARGET_US:.0f}), wall ratio **{ratio:.4f}** (goal <= {WALL_TARGET}).",
            "",
            "orch's per-step work in the rank: `ctx.steps` (the stop vote, an asynchronous all-reduce on "
            "orch's own gloo group, cast about every 0.1 s of steps; the step's times summed, DDP's "
            "timers read at most every 20 ms of steps) and `ctx.log` (a deque append); the heartbeat "
            "thread every 0.25 s (the points, the step times, the process's memory, one gRPC call). The "
            "master runs in the benchmark process, sharing the 2 cores.",
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

"""A torchrun script under ``orch run`` against ``torchrun``: the same script, unmodified.

``benchmarks/_jobs.py ddp`` is a torchrun script: argparse, ``init_process_group("gloo")``,
DDP over the step_overhead MLP (128 -> 512 -> 512 -> 10, batch 64, SGD), one thread per
rank, ``destroy_process_group()`` and ``os._exit(0)``. It runs as a fresh command each time,
interleaved:

- ``python -m torch.distributed.run --standalone --nproc-per-node 2 _jobs.py ddp ...``;
- ``python -m orch run --workers 2 --output none _jobs.py ddp ...``.

Each rank times its steps (from one step's start to the next's, after the warm-up) and writes
the wall-clock time of its first step; per run the benchmark takes the median step per rank,
then the median over ranks, and the launch latency: the last rank's first step less the
time just before the command started (both commands start a fresh Python: the launcher's
imports count on both sides). The script logs nothing to orch, so orch's cost here is its
master, its heartbeat thread and its launch.

    .venv/bin/python benchmarks/script_run.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/script_run.py --quick    # tiny, prints only
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c

NAME = "script_run"
TARGET_STEP = 1.02
TARGET_LAUNCH = 1.0
WORLD = 2


def _collect(out: Path, t0: float) -> dict[str, float]:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    firsts = [json.loads((out / f"first{r}.json").read_text()) for r in range(WORLD)]
    return {
        "step_s": c.median(c.median(r["wall"]) for r in ranks),
        "launch_s": max(firsts) - t0,
    }


def _script_args(out: Path, cfg: dict[str, Any]) -> list[str]:
    return [str(c.HERE / "_jobs.py"), "ddp", "--out", str(out), "--config", json.dumps(cfg)]


def run_torchrun(tmp: Path, cfg: dict[str, Any], tag: str, attempt: int) -> dict[str, float]:
    out = tmp / f"{tag}-try{attempt}"
    out.mkdir()
    t0 = time.time()
    c.torchrun(WORLD, *_script_args(out, cfg), timeout=300)
    return _collect(out, t0)


def run_orch(tmp: Path, cfg: dict[str, Any], tag: str) -> dict[str, float]:
    out = tmp / tag
    out.mkdir()
    argv = [
        c.PYTHON, "-m", "orch", "run", "--workers", str(WORLD), "--output", "none",
        "--master-port", "0", "--run-root", str(tmp / "runs"), "--refresh", "1",
        *_script_args(out, cfg),
    ]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(argv, env=c.bench_env(), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        tail = proc.stdout[-3000:] + proc.stderr[-3000:]
        raise RuntimeError(f"orch run failed ({proc.returncode}):\n{tail}")
    return _collect(out, t0)


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--repeats", type=int, default=6, help="runs of each launcher, interleaved")
    p.add_argument("--steps", type=int, default=300, help="timed steps per run (after the warm-up)")
    p.add_argument("--warmup", type=int, default=40)
    args = p.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 30, 5
    started = c.start()
    cfg = {"steps": args.steps + args.warmup, "warmup": args.warmup}
    runs: dict[str, list[dict[str, float]]] = {"torchrun": [], "orch run": []}
    torchrun_retries = 0
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-script-") as d:
            tmp = Path(d)
            for rep in range(args.repeats):
                for launcher in runs:
                    tag = f"{launcher.replace(' ', '-')}-{rep}"
                    if launcher == "torchrun":
                        got, retried = c.retry_torchrun(
                            NAME, functools.partial(run_torchrun, tmp, cfg, tag), retry=args.quick
                        )
                        torchrun_retries += retried
                    else:
                        got = run_orch(tmp, cfg, tag)
                    runs[launcher].append(got)
                    print(
                        f"  repeat {rep} {launcher:9s} step {got['step_s'] * 1e3:.3f} ms, "
                        f"first step after {got['launch_s']:.2f} s",
                        flush=True,
                    )
    finally:
        c.kill_all_children()
    med = {k: {m: c.median(r[m] for r in rs) for m in ("step_s", "launch_s")} for k, rs in runs.items()}
    step_ratio = med["orch run"]["step_s"] / med["torchrun"]["step_s"]
    launch_ratio = med["orch run"]["launch_s"] / med["torchrun"]["launch_s"]
    paired = c.median(
        o["step_s"] / t["step_s"] for o, t in zip(runs["orch run"], runs["torchrun"], strict=True)
    )
    c.emit(NAME, "torchrun_step_ms", f"{med['torchrun']['step_s'] * 1e3:.3f}")
    c.emit(NAME, "orch_step_ms", f"{med['orch run']['step_s'] * 1e3:.3f}")
    c.emit(NAME, "step_ratio", f"{step_ratio:.4f}", paired_median=f"{paired:.4f}", target=f"<={TARGET_STEP}")
    c.emit(NAME, "torchrun_launch_s", f"{med['torchrun']['launch_s']:.3f}")
    c.emit(NAME, "orch_launch_s", f"{med['orch run']['launch_s']:.3f}")
    c.emit(NAME, "launch_ratio", f"{launch_ratio:.4f}", target=f"<={TARGET_LAUNCH}")
    c.emit(NAME, "torchrun_retries", torchrun_retries)
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    ms = {k: v["step_s"] * 1e3 for k, v in med.items()}
    launch = {k: v["launch_s"] for k, v in med.items()}
    rows = [
        c.Row(
            "step wall time, orch run / torchrun (median of runs)",
            f"<= {TARGET_STEP}",
            f"{step_ratio:.3f} ({ms['orch run']:.3f} vs {ms['torchrun']:.3f} ms; paired {paired:.3f})",
            step_ratio <= TARGET_STEP,
        ),
        c.Row(
            "command start → every rank at its first step, orch run / torchrun",
            f"<= {TARGET_LAUNCH}",
            f"{launch_ratio:.2f} ({launch['orch run']:.2f} s vs {launch['torchrun']:.2f} s)",
            launch_ratio <= TARGET_LAUNCH,
        ),
    ]
    detail = [
        (
            k,
            " ".join(f"{r['step_s'] * 1e3:.2f}" for r in rs),
            f"{ms[k]:.3f}",
            " ".join(f"{r['launch_s']:.2f}" for r in rs),
            f"{launch[k]:.2f}",
        )
        for k, rs in runs.items()
    ]
    body = "\n".join(
        [
            f"Config: the step_overhead MLP, batch 64, world size {WORLD}, gloo, 1 thread per rank; "
            f"{args.steps} timed steps after {args.warmup} warm-up steps; {args.repeats} interleaved "
            "repeats, each launcher a fresh command. The script is the same file under both.",
            "",
            c.table(
                ["launcher", "step per run (ms)", "median step (ms)", "first step per run (s)", "median (s)"],
                detail,
            ),
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

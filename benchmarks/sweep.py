"""A sweep: 8 configs x 60 steps, world size 2, ``orch.sweep`` against 8 torchrun invocations.

The same small MLP (128 -> 512 -> 512 -> 10, batch 64, SGD with momentum; config i has
its own learning rate), world size 2, gloo, one thread per worker, 60 steps per config:

- torchrun: ``python -m torch.distributed.run --standalone --nproc-per-node 2
  benchmarks/_jobs.py sweep --config {...}`` once per config, one after the other, timed
  from just before the first starts until the last exited (each must exit 0);
- orch: a fresh ``python -c`` process (like a new notebook kernel) imports orch, then
  ``orch.sweep("_jobs:sweep_train", configs, world_size=2, parallel=P, threads=1)``,
  timed from just before that call until ``wait()`` returned and ``close()`` did (each
  run must be SUCCEEDED with every step done). The first sweep of the process finds the
  workers' forkserver cold (it starts and imports torch inside the timed call; the
  ``import orch`` before the call is reported beside); the next sweeps, in the same process,
  find it warm. Process A runs parallel=1 (cold), parallel=1 again, then parallel=2;
  process B runs parallel=2 cold.

Each rank of every run writes its steps done and its last loss; the benchmark checks the
counts and compares the losses of the two launchers config by config. Repeats interleave
the three cases (rotating their order); medians over repeats; ratios orch / torchrun.

    .venv/bin/python benchmarks/sweep.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/sweep.py --quick    # tiny, prints only

``--case asha`` (its own section, sweep_asha): a seeded synthetic landscape of 27 configs x
81 steps at world size 2 (``_jobs.landscape_value``: each config a falling curve with its own
start and pace, the finals a seeded shuffle, one best), run as the full grid and as an ASHA
sweep (``orch.ASHA(grace=3, reduction=3)``, parallel=1) in one fresh process after a warm-up
run. ASHA must find the config the grid finds best while running at most 20% of the grid's
steps (each trial's steps are its slowest rank's, as its record has them: a pruned trial's
count its steps past the rung until every rank stopped). Also measured: wall time against the
grid's, and the slot-reuse gap, from a prune to the next trial's first logged step (goal <= 1 s,
warm). The ASHA sweep runs for seeds 0 to 3 (other landscapes, other orders) to show the
spread, on the shuffled landscape and on a valley whose grid is sorted (the best in the
middle, each config up to it better than those before it), each in the seeded random order
a pruned grid runs in; and once on the valley in its given order.

    .venv/bin/python benchmarks/sweep.py --case asha
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c

NAME = "sweep"
TARGET = 0.25
WORLD = 2

DRIVER = """
import sys, time
sys.path[:0] = {paths!r}
t = time.perf_counter()
import orch
imported = time.perf_counter() - t
import _jobs
_jobs.sweep_and_time({out!r}, {root!r}, {sweeps!r}, imported)
"""


def configs(n: int, steps: int, out: Path) -> list[dict[str, Any]]:
    """Config i: its own learning rate and output dir."""
    return [{"lr": round(0.002 * (i + 1), 4), "steps": steps, "out": str(out / f"c{i}")} for i in range(n)]


def _mkdirs(cfgs: list[dict[str, Any]]) -> None:
    for cfg in cfgs:
        Path(cfg["out"]).mkdir(parents=True)


def _check_ranks(cfgs: list[dict[str, Any]], who: str) -> list[float]:
    """Every rank of every config did all its steps; returns rank 0's last loss per config."""
    losses = []
    for i, cfg in enumerate(cfgs):
        for r in range(WORLD):
            path = Path(cfg["out"]) / f"rank{r}.json"
            if not path.is_file():
                raise RuntimeError(f"{who}: config {i} rank {r} wrote no result ({path})")
            res = json.loads(path.read_text())
            if res["steps"] != cfg["steps"] or not math.isfinite(res["loss"]):
                raise RuntimeError(f"{who}: config {i} rank {r}: {res} (expected {cfg['steps']} steps)")
            if r == 0:
                losses.append(float(res["loss"]))
    return losses


def torchrun_sweep(tmp: Path, n: int, steps: int, tag: str, attempt: int) -> dict[str, Any]:
    """The configs as torchrun invocations one after the other; each must exit 0."""
    cfgs = configs(n, steps, tmp / f"{tag}-try{attempt}")
    _mkdirs(cfgs)
    each = []
    t0 = time.time()
    for cfg in cfgs:
        t = time.time()
        c.torchrun(
            WORLD, str(c.HERE / "_jobs.py"), "sweep", "--out", cfg["out"], "--config", json.dumps(cfg),
            timeout=300,
        )  # fmt: skip
        each.append(time.time() - t)
    wall = time.time() - t0
    return {"wall_s": wall, "each_s": each, "losses": _check_ranks(cfgs, "torchrun")}


def orch_process(tmp: Path, n: int, steps: int, tag: str, parallels: list[int]) -> dict[str, Any]:
    """A fresh process running one orch.sweep per entry of ``parallels``, in order."""
    out = tmp / tag
    out.mkdir()
    sweeps = []
    for k, p in enumerate(parallels):
        cfgs = configs(n, steps, out / f"sweep{k}")
        _mkdirs(cfgs)
        sweeps.append({"parallel": p, "world_size": WORLD, "configs": cfgs})
    code = DRIVER.format(
        paths=[str(c.HERE), str(c.ROOT)], out=str(out), root=str(out / "runs"), sweeps=sweeps
    )
    proc = subprocess.Popen(
        [c.PYTHON, "-c", code], env=c.bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _, err = proc.communicate(timeout=900)
    finally:
        c.kill_tree(proc.pid)
        proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"orch driver failed ({proc.returncode}): {err.decode()[-3000:]}")
    result: dict[str, Any] = json.loads((out / "orch.json").read_text())
    for k, (s, spec) in enumerate(zip(result["sweeps"], sweeps, strict=True)):
        if s["parallel"] != spec["parallel"]:
            raise RuntimeError(f"{tag} sweep {k}: ran {s['parallel']} at a time, not {spec['parallel']}")
        bad = [
            r for r in s["rows"]
            if r["state"] != "SUCCEEDED" or r["reused"] or r["steps"] != steps or r["total"] != steps
        ]  # fmt: skip
        if len(s["rows"]) != n or bad:
            raise RuntimeError(f"{tag} sweep {k}: {len(s['rows'])} runs, not all SUCCEEDED: {bad}")
        s["losses"] = _check_ranks(spec["configs"], f"{tag} sweep {k}")
    return result


ASHA_DRIVER = """
import sys
sys.path[:0] = {paths!r}
import _jobs
_jobs.asha_and_time({out!r}, {root!r}, {n!r}, {steps!r}, {sleep!r}, {seeds!r})
"""
ASHA_SHARE = 0.20
ASHA_GAP = 1.0


def asha_case(args: Any) -> None:
    """--case asha: the full grid of the landscape against an ASHA sweep of it."""
    name = "sweep_asha"
    n, steps, sleep, seeds = 27, 81, 0.1, [0, 1, 2, 3]
    if args.quick:
        n, steps, sleep, seeds = 6, 10, 0.02, [0]
    started = c.start()
    with tempfile.TemporaryDirectory(prefix="orch-bench-asha-") as d:
        out = Path(d)
        code = ASHA_DRIVER.format(
            paths=[str(c.HERE), str(c.ROOT)], out=str(out), root=str(out / "runs"), n=n, steps=steps,
            sleep=sleep, seeds=seeds,
        )  # fmt: skip
        proc = subprocess.Popen(
            [c.PYTHON, "-c", code], env=c.bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            _, err = proc.communicate(timeout=3600)
        finally:
            c.kill_tree(proc.pid)
            proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"asha driver failed ({proc.returncode}): {err.decode()[-3000:]}")
        res: dict[str, Any] = json.loads((out / "asha.json").read_text())
    c.check_no_leftovers(name)
    grid = res["grid"]
    if set(grid["states"]) != {"SUCCEEDED"} or sum(grid["steps"]) != n * steps:
        raise RuntimeError(f"the grid did not run every step: {grid['states']} {grid['steps']}")
    grid_steps = n * steps
    # Every sweep with ASHA's default order: the shuffled landscape and the valley (a grid in
    # the order a user writes it), each seed; "given": the valley in the list's order.
    cases = [(f"shuffled, seed {k}", v) for k, v in res["asha"].items()]
    cases += [(f"valley (sorted grid), seed {k}", v) for k, v in res["valley"].items()]

    def share_of(s: dict[str, Any]) -> float:
        return float(sum(s["steps"])) / grid_steps

    shares = [share_of(s) for _, s in cases]
    found = [s["best"] == s["known_best"] for _, s in cases]
    worst = max(shares)
    given = res["given"]
    met = worst <= ASHA_SHARE and all(found)
    gaps = [g for _, s in cases for g in s["gaps"]] + given["gaps"]
    gap_med, gap_max = c.median(gaps), max(gaps, default=float("nan"))
    c.emit(name, "asha_share_worst", f"{worst:.3f}", target=f"<={ASHA_SHARE}", met=met,
           found=f"{sum(found)}/{len(found)}")  # fmt: skip
    given_found = given["best"] == given["known_best"]
    c.emit(name, "asha_share_given_order", f"{share_of(given):.3f}", found=given_found)
    sha_cases = [
        (f"SHA, valley (sorted grid) in its given order, seed {k}", v) for k, v in res["sha_valley"].items()
    ]
    sha_cases += [(f"SHA, shuffled, seed {k}", v) for k, v in res["sha"].items()]
    sha_shares = [share_of(s) for _, s in sha_cases]
    sha_found = [s["best"] == s["known_best"] for _, s in sha_cases]
    sha_worst = max(sha_shares)
    sha_met = sha_worst <= ASHA_SHARE and all(sha_found)
    c.emit(name, "sha_share_worst", f"{sha_worst:.3f}", target=f"<={ASHA_SHARE}", met=sha_met,
           found=f"{sum(sha_found)}/{len(sha_found)}")  # fmt: skip
    first = res["asha"][str(seeds[0])]
    c.emit(name, "wall_ratio", f"{first['wall_s'] / grid['wall_s']:.3f}",
           asha_s=f"{first['wall_s']:.2f}", grid_s=f"{grid['wall_s']:.2f}")  # fmt: skip
    c.emit(name, "slot_gap_median_s", f"{gap_med:.3f}", max=f"{gap_max:.3f}", n=len(gaps))
    if args.quick:
        return
    per_case = []
    for label, s in [*cases, ("valley (sorted grid), order='given', seed 0", given), *sha_cases]:
        pruned = sum(st == "PRUNED" for st in s["states"])
        ends = zip(s["steps"], s["pruned_at"], s["states"], strict=True)
        over = [k - p - 1 for k, p, st in ends if st == "PRUNED"]  # 0: it ended right after its rung
        missed = "" if s["best"] == s["known_best"] else " **missed**"
        over_goal = "" if share_of(s) <= ASHA_SHARE else " **over**"
        per_case.append(
            (
                label if label.startswith("SHA") else f"ASHA, {label}",
                f"{sum(s['steps'])} / {grid_steps} ({share_of(s):.1%}){over_goal}",
                f"{s['best']} (best {s['known_best']}){missed}",
                f"{pruned} of {n}",
                f"{c.median(over):.1f}" if over else "-",
                f"{s['wall_s']:.1f}",
                f"{sum(s['runs'])}",
            )
        )
    rows = [
        c.Row(
            f"ASHA (grace 3, reduction 3), the worst of {len(cases)} sweeps (the shuffled landscape and the "
            f"sorted valley, seeds {seeds[0]}-{seeds[-1]}, each in its seeded random order): steps run / the "
            "full grid's, and the best config found",
            f"<= {ASHA_SHARE:.0%}, the grid's best, every sweep",
            f"{worst:.1%} (median {c.median(shares):.1%}); best found in {sum(found)} of {len(found)}",
            met,
        ),
        c.Row(
            f"SHA (orch.SHA, grace 3, reduction 3), the worst of {len(sha_cases)} sweeps (the sorted valley "
            f"in its given order and the shuffled landscape, seeds {seeds[0]}-{seeds[-1]}): steps run / the "
            "full grid's, every run of a trial counted, and the best config found",
            f"<= {ASHA_SHARE:.0%}, the grid's best, every sweep",
            f"{sha_worst:.1%} (median {c.median(sha_shares):.1%}); best found in {sum(sha_found)} of "
            f"{len(sha_found)}",
            sha_met,
        ),
        c.Row(
            "  ASHA on the sorted valley in its given order (order='given', the old default)",
            "-",
            f"{share_of(given):.1%}; best found: {given_found}",
            None,
        ),
        c.Row(
            "  wall time, ASHA / the full grid (shuffled, seed 0)",
            "-",
            f"{first['wall_s'] / grid['wall_s']:.3f} ({first['wall_s']:.1f} s vs {grid['wall_s']:.1f} s)",
            None,
        ),
        c.Row(
            "  slot-reuse gap: a prune to the next trial's first step (warm), median / max",
            f"<= {ASHA_GAP:.0f} s",
            f"{gap_med:.2f} s / {gap_max:.2f} s over {len(gaps)} prunes",
            gap_max <= ASHA_GAP,
        ),
    ]
    body = "\n".join(
        [
            f"{n} configs x {steps} steps of {sleep * 1000:.0f} ms (sleep) with one all-reduce each, world "
            f"size 2, parallel=1, in one fresh process after a warm-up run; the full grid once (seed "
            f"{seeds[0]}), ASHA per seed on two landscapes: the shuffled one (its finals a seeded "
            "shuffle) and the valley (the finals fall with x to the best at x = 13, then rise: a grid "
            "written in order). "
            "A grid swept with a pruner runs in a random order seeded by the sweep's seed; the last row "
            "runs the valley in the list's order. Steps are each trial's slowest rank's, from its record; "
            "a pruned trial counts the steps it ran past its rung until every rank stopped (the overrun "
            "column: steps run after the rung's step, median; 0: every rank ended right after it).",
            "",
            c.table(
                ["sweep", "steps run / grid", "best found", "pruned", "overrun (steps)", "wall (s)", "runs"],
                per_case,
            ),
            "",
            f"Full grid: {grid['wall_s']:.1f} s, best config {grid['best']}. Asynchronous successive "
            "halving promotes the first trials to reach a rung while there are too few to compare, so "
            "its share depends on the order the configs come in; the seeds show the spread. "
            "Synchronous halving (orch.SHA) decides each rung once every trial reached it: a trial "
            "waiting at a rung gives its slot up and, if it goes on, runs again (this job saves no "
            "checkpoint, so from step 0: every run's steps are counted; 'runs' counts them), so its "
            "share is at most 27*4 + 9*10 + 3*28 + 81 = 363 of 2,187 steps (16.6%) in any order (a rung "
            "at step 3 is 4 steps: 0 to 3). Where a curve that leads at the last rung is not the one that "
            "ends best, any halving keeps the wrong one: the valley's seed 1 (ASHA and SHA alike).",
        ]
    )
    c.write_section(args.out, name, body, rows, started)


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", type=int, default=8)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument(
        "--case",
        choices=["torchrun", "asha"],
        default="torchrun",
        help="torchrun: orch.sweep against torchruns (default); asha: ASHA against the full grid",
    )
    args = p.parse_args()
    if args.case == "asha":
        asha_case(args)
        return
    if args.quick:
        args.repeats, args.configs, args.steps = 1, 2, 10
    n, steps = args.configs, args.steps
    started = c.start()
    cases = ["torchrun", "A", "B"] if not args.quick else ["torchrun", "A"]
    series: dict[str, list[float]] = {k: [] for k in ("torchrun", "p1_cold", "p1_warm", "p2_warm", "p2_cold")}
    imports: list[float] = []
    torchrun_each: list[float] = []
    run_durations: list[float] = []
    loss_diff = 0.0
    torchrun_retries = 0
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-sweep-") as d:
            tmp = Path(d)
            for rep in range(args.repeats):
                ref: list[float] = []
                orch_losses: list[list[float]] = []
                for case in cases[rep % len(cases) :] + cases[: rep % len(cases)]:
                    if case == "torchrun":
                        tr, retried = c.retry_torchrun(
                            NAME,
                            functools.partial(torchrun_sweep, tmp, n, steps, f"torchrun-{rep}"),
                            retry=args.quick,
                        )
                        torchrun_retries += retried
                        series["torchrun"].append(tr["wall_s"])
                        torchrun_each += tr["each_s"]
                        ref = tr["losses"]
                    elif case == "A":
                        res = orch_process(tmp, n, steps, f"orch-A-{rep}", [1, 1, 2])
                        for key, s in zip(("p1_cold", "p1_warm", "p2_warm"), res["sweeps"], strict=True):
                            series[key].append(s["wall_s"])
                        imports.append(res["import_orch_s"])
                        run_durations += [r["duration"] for r in res["sweeps"][1]["rows"]]
                        orch_losses += [s["losses"] for s in res["sweeps"]]
                    else:
                        res = orch_process(tmp, n, steps, f"orch-B-{rep}", [2])
                        series["p2_cold"].append(res["sweeps"][0]["wall_s"])
                        orch_losses += [s["losses"] for s in res["sweeps"]]
                for losses in orch_losses:
                    loss_diff = max(loss_diff, *(abs(a - b) for a, b in zip(losses, ref, strict=True)))
                done = ", ".join(f"{k} {v[-1]:.2f} s" for k, v in series.items() if len(v) > rep)
                print(f"  repeat {rep}: {done}", flush=True)
    finally:
        c.kill_all_children()
    med = {k: c.median(v) for k, v in series.items()}
    m_t = med["torchrun"]
    ratio = {k: med[k] / m_t for k in med}
    c.emit(NAME, "torchrun_s", f"{m_t:.3f}", per_invocation_s=f"{c.median(torchrun_each):.3f}")
    c.emit(NAME, "orch_p1_cold_s", f"{med['p1_cold']:.3f}", ratio=f"{ratio['p1_cold']:.3f}",
           target=f"<={TARGET}", met=ratio["p1_cold"] <= TARGET)  # fmt: skip
    c.emit(NAME, "orch_p1_warm_s", f"{med['p1_warm']:.3f}", ratio=f"{ratio['p1_warm']:.3f}",
           target=f"<={TARGET}", met=ratio["p1_warm"] <= TARGET)  # fmt: skip
    c.emit(NAME, "orch_p2_warm_s", f"{med['p2_warm']:.3f}", ratio=f"{ratio['p2_warm']:.3f}")
    if not args.quick:
        c.emit(NAME, "orch_p2_cold_s", f"{med['p2_cold']:.3f}", ratio=f"{ratio['p2_cold']:.3f}")
    c.emit(NAME, "import_orch_s", f"{c.median(imports):.3f}")
    c.emit(NAME, "max_loss_diff", f"{loss_diff:.3g}")
    c.emit(NAME, "torchrun_retries", torchrun_retries)
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    met_cold, met_warm = ratio["p1_cold"] <= TARGET, ratio["p1_warm"] <= TARGET
    cold_imp = (med["p1_cold"] + c.median(imports)) / m_t

    def vs(k: str) -> str:
        return f"{ratio[k]:.3f} ({med[k]:.2f} s vs {m_t:.2f} s)"

    rows = [
        c.Row(
            f"sweep wall time, orch parallel=1 first sweep (forkserver cold) / {n} torchruns",
            f"<= {TARGET}",
            vs("p1_cold"),
            met_cold,
        ),
        c.Row(
            f"sweep wall time, orch parallel=1 second sweep (warm) / {n} torchruns",
            f"<= {TARGET}",
            vs("p1_warm"),
            met_warm,
        ),
        c.Row(
            "  same, parallel=2, warm / cold",
            "-",
            f"{ratio['p2_warm']:.3f} / {ratio['p2_cold']:.3f}",
            None,
        ),
    ]

    def fmt(xs: list[float]) -> str:
        return " ".join(f"{x:.2f}" for x in xs)

    labels = {
        "torchrun": f"torchrun x {n}, one after the other",
        "p1_cold": "orch.sweep parallel=1, first sweep of a fresh process (forkserver cold)",
        "p1_warm": "orch.sweep parallel=1, second sweep, same process (warm)",
        "p2_warm": "orch.sweep parallel=2, third sweep, same process (warm)",
        "p2_cold": "orch.sweep parallel=2, first sweep of a fresh process (forkserver cold)",
    }
    body = "\n".join(
        [
            f"{n} configs x {steps} steps, world size {WORLD}, gloo, 1 thread per worker (the machine "
            f"has {c.machine_info_cache['cpu_count'] if c.machine_info_cache else '?'} cores); "
            f"{args.repeats} interleaved repeats. Wall time of the whole sweep: torchrun from just "
            "before the first invocation to the last one's exit; orch from just before the "
            "`orch.sweep` call to `wait()` and `close()` returned (every run SUCCEEDED with all its "
            "steps, every torchrun exited 0, every rank wrote its step count).",
            "",
            c.table(
                ["case", "per repeat (s)", "median (s)", "/ torchrun"],
                [(labels[k], fmt(series[k]), f"{med[k]:.2f}", f"{ratio[k]:.3f}") for k in labels],
            ),
            "",
            f"The cold figures start after `import orch` in the fresh process ({c.median(imports):.2f} s "
            f"median): counting it, parallel=1 cold is {cold_imp:.3f} of torchrun. "
            f"One torchrun invocation takes {c.median(torchrun_each):.2f} s (median); one warm orch "
            f"run of the parallel=1 sweep {c.median(run_durations):.2f} s from its start to its "
            f"record. The two launchers' last losses agree config by config (max |diff| {loss_diff:.2g}).",
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

"""Launch latency: from the launch call to every rank at its first step, 4 workers.

Three cases, interleaved, each ``--repeats`` times:

- torchrun: ``python -m torch.distributed.run --standalone --nproc-per-node 4
  benchmarks/_jobs.py first-step`` as a subprocess, timed from just before it starts;
- orch cold: a fresh ``python -c`` process (like a new notebook kernel) imports orch,
  then calls ``orch.launch("_jobs:first_step", world_size=4, threads=1)``, timed from
  just before that call (the ``import orch`` time is reported beside it);
- orch second launch: the same process launches the same job again after the first run
  ended (the notebook re-running a cell);
- the same two with the master apart (``apart=True``, what a notebook kernel's launch does):
  the first launch also starts the process that hosts the kernel's runs, the second finds it
  and its worker pool warm.

Every rank initialises its process group, wraps the same MLP in DDP and records
``time.time()`` at its first step to a file; latency = max over ranks of that time minus
the time before the launch. Medians over repeats; ratios against torchrun's median.

    .venv/bin/python benchmarks/launch_latency.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/launch_latency.py --quick    # tiny, prints only
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

NAME = "launch_latency"
TARGET_COLD = 1.0
TARGET_SECOND = 0.1  # the warm pool: a rank reseeded, as a fresh process, costs it nothing

DRIVER = """
import sys, time
sys.path[:0] = {paths!r}
t = time.perf_counter()
import orch
imported = time.perf_counter() - t
import _jobs
_jobs.launch_and_time({out!r}, {world}, {root!r}, {launches}, imported, apart={apart!r})
"""


def torchrun_once(tmp: Path, world: int, tag: str, attempt: int) -> dict[str, float]:
    out = tmp / f"{tag}-try{attempt}"
    out.mkdir()
    t0 = time.time()
    c.torchrun(world, str(c.HERE / "_jobs.py"), "first-step", "--out", str(out), timeout=180)
    ended = time.time() - t0
    firsts = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return {"latency_s": max(firsts) - t0, "exited_s": ended}


def orch_process(tmp: Path, world: int, tag: str, launches: int, apart: bool = False) -> dict[str, Any]:
    out = tmp / tag
    out.mkdir()
    code = DRIVER.format(
        paths=[str(c.HERE), str(c.ROOT)],
        out=str(out),
        world=world,
        root=str(tmp / "runs"),
        launches=launches,
        apart=apart,
    )
    proc = subprocess.Popen(
        [c.PYTHON, "-c", code], env=c.bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        c.kill_tree(proc.pid)
        proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"orch driver failed ({proc.returncode}): {err.decode()[-3000:]}")
    result: dict[str, Any] = json.loads((out / "orch.json").read_text())
    return result


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--world-size", type=int, default=4)
    args = p.parse_args()
    world = args.world_size
    launches = 2
    if args.quick:
        args.repeats = 1
        world = 2
    started = c.start()
    torchrun: list[float] = []
    torchrun_exit: list[float] = []
    cold: list[float] = []
    second: list[float] = []
    apart_cold: list[float] = []
    apart_second: list[float] = []
    returned: list[float] = []
    apart_returned: list[float] = []
    imports: list[float] = []
    torchrun_retries = 0
    phases: dict[str, dict[str, list[float]]] = {"cold": {}, "second": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-launch-") as d:
            tmp = Path(d)
            for rep in range(args.repeats):
                tr, retried = c.retry_torchrun(
                    NAME, functools.partial(torchrun_once, tmp, world, f"torchrun-{rep}"), retry=args.quick
                )
                torchrun_retries += retried
                torchrun.append(tr["latency_s"])
                torchrun_exit.append(tr["exited_s"])
                res = orch_process(tmp, world, f"orch-{rep}", launches)
                cold.append(res["launches"][0]["latency_s"])
                second.append(res["launches"][1]["latency_s"])
                returned.append(res["launches"][0]["returned_s"])
                imports.append(res["import_orch_s"])
                for key, launch in zip(("cold", "second"), res["launches"], strict=False):
                    for phase, t in launch.get("phases", {}).items():
                        phases[key].setdefault(phase, []).append(t)
                res = orch_process(tmp, world, f"apart-{rep}", launches, apart=True)
                apart_cold.append(res["launches"][0]["latency_s"])
                apart_second.append(res["launches"][1]["latency_s"])
                apart_returned.append(res["launches"][0]["returned_s"])
                for key, launch in zip(("apart cold", "apart second"), res["launches"], strict=False):
                    for phase, t in launch.get("phases", {}).items():
                        phases.setdefault(key, {}).setdefault(phase, []).append(t)
                print(
                    f"  repeat {rep}: torchrun {torchrun[-1]:.2f} s, orch cold {cold[-1]:.2f} s, "
                    f"orch second {second[-1]:.2f} s (import orch {imports[-1]:.2f} s); master apart: "
                    f"cold {apart_cold[-1]:.2f} s, second {apart_second[-1]:.2f} s",
                    flush=True,
                )
    finally:
        c.kill_all_children()
    m_t, m_c, m_s = c.median(torchrun), c.median(cold), c.median(second)
    r_cold, r_second = m_c / m_t, m_s / m_t
    m_ac, m_as = c.median(apart_cold), c.median(apart_second)
    r_acold, r_asecond = m_ac / m_t, m_as / m_t
    c.emit(NAME, "torchrun_s", f"{m_t:.3f}")
    c.emit(
        NAME,
        "orch_cold_s",
        f"{m_c:.3f}",
        ratio=f"{r_cold:.3f}",
        target=f"<={TARGET_COLD}",
        met=r_cold <= TARGET_COLD,
    )
    c.emit(
        NAME,
        "orch_second_s",
        f"{m_s:.3f}",
        ratio=f"{r_second:.3f}",
        target=f"<={TARGET_SECOND}",
        met=r_second <= TARGET_SECOND,
    )
    c.emit(
        NAME,
        "apart_cold_s",
        f"{m_ac:.3f}",
        ratio=f"{r_acold:.3f}",
        target=f"<={TARGET_COLD}",
        met=r_acold <= TARGET_COLD,
    )
    c.emit(
        NAME,
        "apart_second_s",
        f"{m_as:.3f}",
        ratio=f"{r_asecond:.3f}",
        target=f"<={TARGET_SECOND}",
        met=r_asecond <= TARGET_SECOND,
    )
    c.emit(NAME, "torchrun_retries", torchrun_retries)
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    rows = [
        c.Row(
            "launch latency, orch cold / torchrun",
            f"<= {TARGET_COLD}",
            f"{r_cold:.2f} ({m_c:.2f} s vs {m_t:.2f} s)",
            r_cold <= TARGET_COLD,
        ),
        c.Row(
            "launch latency, orch second launch / torchrun",
            f"<= {TARGET_SECOND}",
            f"{r_second:.2f} ({m_s:.2f} s vs {m_t:.2f} s)",
            r_second <= TARGET_SECOND,
        ),
        c.Row(
            "launch latency, master apart (a notebook kernel's launch), cold / torchrun",
            f"<= {TARGET_COLD}",
            f"{r_acold:.2f} ({m_ac:.2f} s vs {m_t:.2f} s)",
            r_acold <= TARGET_COLD,
        ),
        c.Row(
            "launch latency, master apart, second launch / torchrun",
            f"<= {TARGET_SECOND}",
            f"{r_asecond:.2f} ({m_as:.2f} s vs {m_t:.2f} s)",
            r_asecond <= TARGET_SECOND,
        ),
    ]

    def series(xs: list[float]) -> str:
        return " ".join(f"{x:.2f}" for x in xs)

    body = "\n".join(
        [
            f"{world} workers, {args.repeats} interleaved repeats (a fresh Python process for every cold "
            "orch launch). Latency: from just before the launch call (torchrun: just before the "
            "subprocess starts) to the last rank's first step.",
            "",
            c.table(
                ["case", "per repeat (s)", "median (s)", "/ torchrun"],
                [
                    ("torchrun", series(torchrun), f"{m_t:.2f}", "1.00"),
                    ("orch cold", series(cold), f"{m_c:.2f}", f"{r_cold:.2f}"),
                    ("orch second launch, same process", series(second), f"{m_s:.2f}", f"{r_second:.2f}"),
                    ("orch cold, master apart", series(apart_cold), f"{m_ac:.2f}", f"{r_acold:.2f}"),
                    (
                        "orch second launch, master apart",
                        series(apart_second),
                        f"{m_as:.2f}",
                        f"{r_asecond:.2f}",
                    ),
                ],
            ),
            "",
            "Where an orch launch's time goes (medians, seconds from the launch call until the last "
            "rank got there, from the workers' log lines; the rest is the DDP wrap and first step):",
            "",
            c.table(
                ["orch launch", "all registered (process start + imports)", "process group up", "first step"],
                [
                    (
                        key,
                        f"{c.median(phases[key].get('registered', [])):.2f}",
                        f"{c.median(phases[key].get('process_group_up', [])):.2f}",
                        f"{m:.2f}",
                    )
                    for key, m in (
                        ("cold", m_c),
                        ("second", m_s),
                        ("apart cold", m_ac),
                        ("apart second", m_as),
                    )
                ],
            ),
            "",
            f"Also measured: `import orch` in the fresh process {c.median(imports):.2f} s (before the "
            f"timed call; it imports torch); `orch.launch` returns after {c.median(returned) * 1e3:.0f} ms "
            f"({c.median(apart_returned) * 1e3:.0f} ms with the master apart, its host started first); "
            f"torchrun's process exits {c.median(torchrun_exit):.2f} s after it started.",
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

"""A gang's next call: from ``gang.run(fn)`` to every rank at the call's first step.

A gang of 4 ranks (``orch.gang(world_size=4, threads=1)``) is started and its first call
builds the launch_latency model (kept in ``ctx.state``); then, interleaved ``--repeats``
times:

- gang call: ``gang.run(_jobs.timed_first_step)``, timed from just before the call to the
  last rank's first step (each rank returns the ``time.time()`` it reached it: its value);
- warm launch: ``orch.launch("_jobs:timed_first_step", world_size=4, threads=1)`` in the same
  process, its forkserver up from a launch before, the model built in the run as a launch
  must (what a gang saves);
- gang round trip: ``gang.run(fn).wait()``, the call's whole time from the cell's view.

Goal: a gang call reaches its first step within 0.1 s on this machine.

    .venv/bin/python benchmarks/gang.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/gang.py --quick    # tiny, prints only
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import _common as c

NAME = "gang"
TARGET = 0.1  # seconds from gang.run to every rank's first step


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--repeats", type=int, default=10, help="calls and launches of each kind")
    p.add_argument("--world", type=int, default=4, help="ranks")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.world = 2, 2
    started = c.start()
    c.setup_path()
    import _jobs

    import orch

    calls: list[float] = []
    launches: list[float] = []
    trips: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-gang-") as d:
            root = str(Path(d) / "runs")
            first = orch.launch("_jobs:timed_first_step", world_size=args.world, threads=1, run_root=root)
            with first:
                first.wait(timeout=300)  # the forkserver up: every later launch is a warm one
            with orch.gang(world_size=args.world, threads=1, run_root=root) as gang:
                gang.run(_jobs.timed_first_step).wait(timeout=300)  # builds the model, kept
                for rep in range(args.repeats):
                    t0 = time.time()
                    values = gang.run(_jobs.timed_first_step).wait(timeout=300).values
                    trips.append(time.time() - t0)
                    calls.append(max(values) - t0)
                    t0 = time.time()
                    with orch.launch(
                        "_jobs:timed_first_step", world_size=args.world, threads=1, run_root=root
                    ) as run:
                        values = run.wait(timeout=300).values
                    launches.append(max(values) - t0)
                    print(
                        f"  repeat {rep}: gang call {calls[-1] * 1e3:.0f} ms to the first step "
                        f"({trips[-1] * 1e3:.0f} ms round trip), warm launch {launches[-1] * 1e3:.0f} ms",
                        flush=True,
                    )
    finally:
        c.kill_all_children()
    m_call, m_launch, m_trip = c.median(calls), c.median(launches), c.median(trips)
    c.emit(NAME, "gang_call_s", f"{m_call:.3f}", target=f"<={TARGET}", met=m_call <= TARGET)
    c.emit(NAME, "warm_launch_s", f"{m_launch:.3f}")
    c.emit(NAME, "gang_round_trip_s", f"{m_trip:.3f}")
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    rows = [
        c.Row(
            f"`gang.run` → every rank at the call's first step, {args.world} ranks (median of {len(calls)})",
            f"<= {TARGET} s",
            f"{m_call:.3f} s (max {max(calls):.3f} s)",
            m_call <= TARGET,
        ),
        c.Row(
            "  warm `orch.launch` → every rank at its first step (median)",
            "-",
            f"{m_launch:.3f} s; the gang call takes {m_call / m_launch:.2f} of it",
            None,
        ),
        c.Row("  `gang.run(fn).wait()`, the call's round trip (median)", "-", f"{m_trip:.3f} s", None),
    ]

    def series(xs: list[float]) -> str:
        return " ".join(f"{x * 1e3:.0f}" for x in xs)

    body = "\n".join(
        [
            f"{args.world} ranks, one thread each, {args.repeats} interleaved repeats in one process. "
            "Each rank returns the `time.time()` it reached the first step (the call's value); latency "
            "is the last rank's minus the time just before the call.",
            "",
            c.table(
                ["case", "per repeat (ms)", "median (ms)"],
                [
                    ("gang call (model kept in ctx.state)", series(calls), f"{m_call * 1e3:.0f}"),
                    ("warm orch.launch (model built in the run)", series(launches), f"{m_launch * 1e3:.0f}"),
                    ("gang call round trip, gang.run(fn).wait()", series(trips), f"{m_trip * 1e3:.0f}"),
                ],
            ),
            "",
            "A gang's call is a run of its own (a master, a run dir, the barrier) on ranks that are up "
            "with their process group: it skips the fork, the imports, the rendezvous, the process "
            "group and the DDP wrap a launch pays.",
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

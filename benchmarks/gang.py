"""A gang's next call: from ``gang.run(fn)`` to every rank at the call's first step.

A gang of 4 ranks (``orch.gang(world_size=4, threads=1)``) is started and its first call
builds the launch_latency model (kept in ``ctx.state``); then, interleaved ``--repeats``
times:

- gang call: ``gang.run(_jobs.timed_first_step)``, timed from just before the call to the
  last rank's first step (each rank returns the ``time.time()`` it reached it: its value);
- warm launch: ``orch.launch("_jobs:timed_first_step", world_size=4, threads=1)`` in the same
  process, its forkserver up from a launch before, the model built in the run as a launch
  must (what a gang saves);
- gang round trip: ``gang.run(fn).wait()``, the call's whole time from the cell's view;
- a failed call, then the next: ``gang.run(failing).wait()`` raises ``orch.RunFailed``, then
  ``gang.run(_jobs.timed_first_step)``; timed from just before the failed call to the last
  rank's first step in the next call, for two failures, their order alternating by repeat:

  - no broken collective (``_jobs.gang_fails_everywhere``): every rank raises NameError at
    the top of the call; the gang keeps its ranks, their ctx.state and their process group;
  - a broken collective (``_jobs.gang_fails_in_all_reduce``): rank 1 raises 0.1 s into the
    call while the other ranks wait for it in ``dist.all_reduce``; they are freed by orch
    shutting down the group's connections, and the next call makes the group again in the
    same processes (``gang.remakes`` goes up by one; the ctx.ddp model is rewrapped).

  Every failed call must leave the same processes (``gang.pids``), ``gang.restarts`` at 0 and
  ``gang.remakes`` up by one for a broken collective alone, or the benchmark fails.

Goal: a gang call reaches its first step within 0.1 s on this machine. The failed calls are
measured, against the gang call of the same run, with no goal.

    .venv/bin/python benchmarks/gang.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/gang.py --quick    # tiny, prints only
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as c

NAME = "gang"
TARGET = 0.1  # seconds from gang.run to every rank's first step
DELAY = 0.1  # seconds into the broken call that rank 1 raises (its peers in all_reduce by then)

# failure kind -> (the job, what the RunFailed must say, by how much gang.remakes goes up)
KINDS: dict[str, tuple[str, str, int]] = {
    "kept": ("gang_fails_everywhere", "kept its ranks and their ctx.state, and their process group", 0),
    "remade": ("gang_fails_in_all_reduce", "makes their process group again in the same processes", 1),
}


@dataclass
class Recovery:
    """One failure kind's repeats, in seconds."""

    failed: list[float] = field(default_factory=list)  # gang.run(failing) → RunFailed raised
    next_call: list[float] = field(default_factory=list)  # the next gang.run → its last first step
    total: list[float] = field(default_factory=list)  # gang.run(failing) → the next call's first step
    from_raise: list[float] = field(default_factory=list)  # rank 1 raised → the next first step


class GangChanged(SystemExit):
    pass


def fail_then_call(gang: Any, jobs: Any, kind: str, pids: list[int], rec: Recovery) -> None:
    """A failed call of ``kind``, then the next call to its first step; checks the gang kept its
    processes (and remade its group for a broken collective alone)."""
    import orch

    job, said, remade = KINDS[kind]
    fn = getattr(jobs, job)
    args = (DELAY,) if kind == "remade" else ()
    remakes = gang.remakes
    t0 = time.time()
    try:
        gang.run(fn, *args).wait(timeout=300)
    except orch.RunFailed as e:
        failed_at, failure = time.time(), e
    else:
        raise GangChanged(f"{NAME}: ERROR the {kind} failing call ({job}) did not fail")
    if said not in str(failure):
        raise GangChanged(f"{NAME}: ERROR the {kind} failed call does not say {said!r}: {failure}")
    if not gang.up or gang.pids != pids:
        raise GangChanged(f"{NAME}: ERROR the {kind} failed call ended the gang's ranks: {failure}")
    t1 = time.time()
    values = gang.run(jobs.timed_first_step).wait(timeout=300).values
    first = max(values)
    if gang.pids != pids or gang.restarts != 0 or gang.remakes != remakes + remade:
        raise GangChanged(
            f"{NAME}: ERROR after a {kind} failed call the gang has pids {gang.pids} (were {pids}), "
            f"restarts {gang.restarts} (want 0), remakes {gang.remakes} (want {remakes + remade})"
        )
    rec.failed.append(failed_at - t0)
    rec.next_call.append(first - t1)
    rec.total.append(first - t0)
    m = re.search(r"raised at t=([0-9.]+)", str(failure))
    if m:
        rec.from_raise.append(first - float(m.group(1)))


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
    recs = {kind: Recovery() for kind in KINDS}
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-gang-") as d:
            root = str(Path(d) / "runs")
            first = orch.launch("_jobs:timed_first_step", world_size=args.world, threads=1, run_root=root)
            with first:
                first.wait(timeout=300)  # the forkserver up: every later launch is a warm one
            with orch.gang(world_size=args.world, threads=1, run_root=root) as gang:
                gang.run(_jobs.timed_first_step).wait(timeout=300)  # builds the model, kept
                pids = gang.pids
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
                    kinds = list(KINDS) if rep % 2 == 0 else list(reversed(KINDS))
                    for kind in kinds:
                        fail_then_call(gang, _jobs, kind, pids, recs[kind])
                    kept, remade = recs["kept"], recs["remade"]
                    print(
                        f"  repeat {rep}: gang call {calls[-1] * 1e3:.0f} ms to the first step "
                        f"({trips[-1] * 1e3:.0f} ms round trip), warm launch {launches[-1] * 1e3:.0f} ms; "
                        f"failed call → next first step: group kept {kept.total[-1] * 1e3:.0f} ms "
                        f"(failed in {kept.failed[-1] * 1e3:.0f}, next {kept.next_call[-1] * 1e3:.0f}), "
                        f"group remade {remade.total[-1] * 1e3:.0f} ms "
                        f"(failed in {remade.failed[-1] * 1e3:.0f}, next {remade.next_call[-1] * 1e3:.0f})",
                        flush=True,
                    )
                if gang.pids != pids or gang.restarts != 0 or gang.remakes != args.repeats:
                    raise GangChanged(
                        f"{NAME}: ERROR at the end the gang has pids {gang.pids} (were {pids}), restarts "
                        f"{gang.restarts}, remakes {gang.remakes} (want {args.repeats})"
                    )
    finally:
        c.kill_all_children()
    m_call, m_launch, m_trip = c.median(calls), c.median(launches), c.median(trips)
    med = {
        kind: {k: c.median(getattr(r, k)) for k in ("failed", "next_call", "total", "from_raise")}
        for kind, r in recs.items()
    }
    c.emit(NAME, "gang_call_s", f"{m_call:.3f}", target=f"<={TARGET}", met=m_call <= TARGET)
    c.emit(NAME, "warm_launch_s", f"{m_launch:.3f}")
    c.emit(NAME, "gang_round_trip_s", f"{m_trip:.3f}")
    for kind in KINDS:
        c.emit(NAME, f"failed_{kind}_to_next_first_step_s", f"{med[kind]['total']:.3f}")
        c.emit(NAME, f"failed_{kind}_call_s", f"{med[kind]['failed']:.3f}")
        c.emit(NAME, f"after_failed_{kind}_first_step_s", f"{med[kind]['next_call']:.3f}")
    c.emit(NAME, "failed_remade_raise_to_next_first_step_s", f"{med['remade']['from_raise']:.3f}")
    c.check_no_leftovers(NAME)
    if args.quick:
        return

    def recovery_row(kind: str, label: str) -> c.Row:
        m = med[kind]
        return c.Row(
            f"  a failed call ({label}) → every rank at the next call's first step (median of "
            f"{len(recs[kind].total)})",
            "-",
            f"{m['total']:.3f} s, {m['total'] / m_call:.1f}x a gang call: the failed call "
            f"{m['failed']:.3f} s, the next call to its first step {m['next_call']:.3f} s",
            None,
        )

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
        recovery_row("kept", "every rank raised; its process group kept"),
        recovery_row("remade", "rank 1 raised while its peers waited in all_reduce; the group made again"),
    ]

    def series(xs: list[float]) -> str:
        return " ".join(f"{x * 1e3:.0f}" for x in xs)

    def ms(x: float) -> str:
        return f"{x * 1e3:.0f}"

    recovery_lines = []
    for kind, label, parts in (
        ("kept", "group kept", ("total", "failed", "next_call")),
        ("remade", "group remade", ("total", "failed", "next_call", "from_raise")),
    ):
        for part in parts:
            what = {
                "total": f"{label}: failed call → next call's first step",
                "failed": "  the failed call, to RunFailed raised",
                "next_call": "  the next call"
                + (" (group made again)" if kind == "remade" else "")
                + ", to its first step",
                "from_raise": "  from rank 1's raise to the next call's first step",
            }[part]
            m = med[kind][part]
            recovery_lines.append((what, series(getattr(recs[kind], part)), ms(m), f"{m / m_call:.1f}x"))
    body = "\n".join(
        [
            f"{args.world} ranks, one thread each, {args.repeats} interleaved repeats in one process. "
            "Each rank returns the `time.time()` it reached the first step (the call's value); latency "
            "is the last rank's minus the time just before the call.",
            "",
            c.table(
                ["case", "per repeat (ms)", "median (ms)"],
                [
                    ("gang call (model kept in ctx.state)", series(calls), ms(m_call)),
                    ("warm orch.launch (model built in the run)", series(launches), ms(m_launch)),
                    ("gang call round trip, gang.run(fn).wait()", series(trips), ms(m_trip)),
                ],
            ),
            "",
            "A gang's call is a run of its own (a master, a run dir, the barrier) on ranks that are up "
            "with their process group: it skips the fork, the imports, the rendezvous, the process "
            "group and the DDP wrap a launch pays.",
            "",
            "### A failed call, then the next call's first step",
            "",
            "Each repeat, after the calls above, fails the gang twice, the order of the two kinds "
            "alternating by repeat, each failure followed by a `gang.run(_jobs.timed_first_step)`: "
            "*group kept*, every rank raises NameError at the top of the call "
            "(`_jobs.gang_fails_everywhere`), so no collective is left half done and the gang keeps "
            "its ranks, their ctx.state and their process group; *group remade*, rank 1 raises "
            f"{DELAY:g} s into the call while the other ranks wait for it in `dist.all_reduce` "
            "(`_jobs.gang_fails_in_all_reduce`): they are freed by orch shutting down the group's "
            "connections, and the next call makes the process group again in the same processes and "
            "rewraps the ctx.ddp model. Checked on every repeat: the same pids, `gang.restarts` 0, "
            "`gang.remakes` up by one for a broken collective alone, and what `orch.RunFailed` says. "
            "Failed call: from just before `gang.run(failing)` to `.wait()` raising `orch.RunFailed`; "
            "next call: from just before the next `gang.run` to its last rank's first step; total: "
            "the two, from just before the failed call.",
            "",
            c.table(["case", "per repeat (ms)", "median (ms)", "/ gang call"], recovery_lines),
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

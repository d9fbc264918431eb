"""Failure to tear-down: a crashed or hung rank under orch and under torchrun.

2 workers run a ``dist.barrier()`` loop (gloo, 10 ms sleep per step). Once they are
well into it, rank 1's process is hit from outside:

- orch crash: SIGKILL of rank 1 under ``orch.launch(..., heartbeat_timeout=3)``; time
  from the kill to the run FAILED, and to every worker process gone;
- orch hang: SIGSTOP of rank 1 (its heartbeats stop; the peer blocks in the barrier);
  the same two times (detection waits for the heartbeat timeout);
- torchrun crash: SIGKILL of one worker of ``python -m torch.distributed.run
  --standalone --nproc-per-node 2`` (found with psutil among torchrun's children); time
  until the torchrun process exits (bounded at ``--bound`` s), and until every worker is gone;
- torchrun hang: SIGSTOP of one worker; does torchrun notice (exit) within ``--bound`` s?
  (torchrun only watches exit codes; the peer waits in the collective for its timeout,
  30 minutes by default.)

Everything started is killed at the end of each case (process trees, via psutil), also on
errors; the script checks that nothing is left.

    .venv/bin/python benchmarks/teardown.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/teardown.py --quick    # tiny, prints only
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _common as c
import psutil

NAME = "teardown"
POLL = 0.005


@dataclass
class Outcome:
    case: str
    failed_s: float | None = None  # orch: run FAILED; torchrun: the torchrun process exited
    gone_s: float | None = None  # every worker process gone
    note: str = ""
    root_cause_ok: bool | None = None  # orch: the run's root cause names the rank that was hit


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def _until(pred: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def orch_case(tmp: Path, sig: int, heartbeat_timeout: float, bound: float, tag: str) -> Outcome:
    import orch
    from orch.wire.states import RunState

    out = Outcome(f"orch {'SIGKILL' if sig == signal.SIGKILL else 'SIGSTOP'} rank 1")
    run = orch.launch(
        "_jobs:barrier_loop",
        world_size=2,
        threads=1,
        heartbeat_timeout=heartbeat_timeout,
        config={"sleep": 0.01},
        run_root=str(tmp / f"runs-{tag}"),
        master_port=0,  # any free port: other runs may share this machine
    )
    pids: list[int] = []
    victim = -1
    try:
        coord = run.coordinator
        ok = _until(lambda: len(coord.ranks) == 2 and min(r.step for r in coord.ranks) >= 20, 120)
        if not ok:
            raise RuntimeError(f"the run did not get going: {coord.state} {[r.step for r in coord.ranks]}")
        pids = [p.pid for p in run.procs if p.pid is not None]  # launch() starts them in the background
        victim = coord.ranks[1].pid
        assert victim in pids, (victim, pids)
        t0 = time.monotonic()
        os.kill(victim, sig)
        end = t0 + bound
        while time.monotonic() < end and (out.failed_s is None or out.gone_s is None):
            now = time.monotonic()
            if out.failed_s is None and coord.state is RunState.FAILED:
                out.failed_s = now - t0
            if out.gone_s is None and _gone(pids):
                out.gone_s = now - t0
            time.sleep(POLL)
        # Let the launcher finish on its own (collect the exits, settle the root cause) before
        # closing: closing at once would skip its last look at the exit codes.
        _until(lambda: run.done, 10.0)
    finally:
        run.close()
        for pid in pids:
            c.kill_tree(pid)
    out.note = run.coordinator.failure[:200]  # the root cause, once it settled
    root = run.coordinator.root_cause
    out.root_cause_ok = root is not None and root.pid == victim
    return out


def _torchrun(tmp: Path, tag: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    """torchrun with 2 workers in the barrier loop; TorchrunFailed if it ends before they are up."""
    d = tmp / tag
    d.mkdir()
    cmd = c.torchrun_argv(2, str(c.HERE / "_jobs.py"), "barriers", "--out", str(d))
    with open(d / "torchrun.err", "wb") as err:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, env=c.bench_env(), stdout=subprocess.DEVNULL, stderr=err)
    files = [d / "pid0.json", d / "pid1.json"]
    started = _until(lambda: all(f.exists() for f in files) or proc.poll() is not None, 120)
    if not started or proc.poll() is not None:
        c.kill_tree(proc.pid)
        proc.wait()
        stderr = (d / "torchrun.err").read_text(errors="replace")
        if not started:
            raise RuntimeError(f"torchrun's workers did not start within 120 s: {stderr[-2000:]}")
        raise c.TorchrunFailed(proc.returncode, stderr)
    pids = [int(json.loads(f.read_text())) for f in files]
    children = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    assert set(pids) <= children, (pids, children)
    return proc, pids


def torchrun_case(tmp: Path, sig: int, bound: float, tag: str, attempt: int = 0) -> Outcome:
    name = "SIGKILL" if sig == signal.SIGKILL else "SIGSTOP"
    out = Outcome(f"torchrun {name} one worker")
    proc, pids = _torchrun(tmp, f"{tag}-try{attempt}")
    try:
        time.sleep(1.0)  # well into the barrier loop
        victim = pids[1]
        t0 = time.monotonic()
        os.kill(victim, sig)
        end = t0 + bound
        while time.monotonic() < end and (out.failed_s is None or out.gone_s is None):
            now = time.monotonic()
            if out.failed_s is None and proc.poll() is not None:
                out.failed_s = now - t0
            if out.gone_s is None and _gone(pids):
                out.gone_s = now - t0
            time.sleep(POLL)
        if out.failed_s is None:
            out.note = f"torchrun still running after {bound:g} s; killed"
        else:
            out.note = f"torchrun exit code {proc.returncode}"
    finally:
        c.kill_tree(proc.pid)
        for pid in pids:
            c.kill_tree(pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    return out


def _fmt(x: float | None, bound: float) -> str:
    return f"> {bound:g} s" if x is None else f"{x:.2f} s"


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--repeats", type=int, default=3, help="repeats of each crash case and of the orch hang")
    p.add_argument("--bound", type=float, default=60.0, help="give up waiting after this many seconds")
    p.add_argument("--heartbeat-timeout", type=float, default=3.0)
    args = p.parse_args()
    hb = args.heartbeat_timeout
    if args.quick:
        args.repeats, args.bound, hb = 1, 20.0, 1.0
    started = c.start()
    c.setup_path()
    results: dict[str, list[Outcome]] = {}
    torchrun_retries = 0
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-teardown-") as d:
            tmp = Path(d)
            for rep in range(args.repeats):
                for case in ("orch-kill", "torchrun-kill", "orch-stop"):
                    tag = f"{case}-{rep}"
                    if case == "orch-kill":
                        o = orch_case(tmp, signal.SIGKILL, hb, args.bound, tag)
                    elif case == "orch-stop":
                        o = orch_case(tmp, signal.SIGSTOP, hb, args.bound, tag)
                    else:
                        o, retried = c.retry_torchrun(
                            NAME,
                            functools.partial(torchrun_case, tmp, signal.SIGKILL, args.bound, tag),
                            retry=args.quick,
                        )
                        torchrun_retries += retried
                    results.setdefault(case, []).append(o)
                    print(
                        f"  {o.case}: failed/exited {_fmt(o.failed_s, args.bound)}, workers gone "
                        f"{_fmt(o.gone_s, args.bound)}"
                        + (
                            ""
                            if o.root_cause_ok is None
                            else f", root cause names the victim: {o.root_cause_ok}"
                        )
                        + f"  ({o.note})",
                        flush=True,
                    )
            if not args.quick:
                o = torchrun_case(tmp, signal.SIGSTOP, args.bound, "torchrun-stop")
                results["torchrun-stop"] = [o]
                print(
                    f"  {o.case}: exited {_fmt(o.failed_s, args.bound)}, workers gone "
                    f"{_fmt(o.gone_s, args.bound)}  ({o.note})",
                    flush=True,
                )
    finally:
        c.kill_all_children()

    def med(case: str, attr: str) -> float | None:
        xs = [getattr(o, attr) for o in results.get(case, [])]
        if not xs or any(x is None for x in xs):
            return None
        return c.median(xs)

    summary = {}
    for case in results:
        f, g = med(case, "failed_s"), med(case, "gone_s")
        summary[case] = (f, g)
        extra = {}
        if case.startswith("orch"):
            extra["root_cause_ok"] = (
                f"{sum(bool(o.root_cause_ok) for o in results[case])}/{len(results[case])}"
            )
        c.emit(
            NAME,
            f"{case.replace('-', '_')}_failed_s",
            _fmt(f, args.bound).replace(" ", ""),
            gone_s=_fmt(g, args.bound).replace(" ", ""),
            **extra,
        )
    c.emit(NAME, "torchrun_retries", torchrun_retries)
    c.check_no_leftovers(NAME)
    if args.quick:
        return
    b = args.bound
    rows = [
        c.Row(
            "orch, SIGKILL of a rank → run FAILED / all workers gone",
            "- (faster than torchrun)",
            f"{_fmt(summary['orch-kill'][0], b)} / {_fmt(summary['orch-kill'][1], b)}",
            None,
        ),
        c.Row(
            "torchrun, SIGKILL of a worker → torchrun exits / all workers gone",
            "-",
            f"{_fmt(summary['torchrun-kill'][0], b)} / {_fmt(summary['torchrun-kill'][1], b)}",
            None,
        ),
        c.Row(
            f"orch, SIGSTOP of a rank → run FAILED / all workers gone (heartbeat timeout {hb:g} s)",
            f"- (≈ heartbeat timeout {hb:g} s)",
            f"{_fmt(summary['orch-stop'][0], b)} / {_fmt(summary['orch-stop'][1], b)}",
            None,
        ),
        c.Row(
            "torchrun, SIGSTOP of a worker → torchrun notices",
            "-",
            "not within " + f"{b:g} s"
            if summary["torchrun-stop"][0] is None
            else _fmt(summary["torchrun-stop"][0], b),
            None,
        ),
    ]
    detail = []
    for outs in results.values():
        detail.append(
            (
                outs[0].case,
                len(outs),
                " ".join(_fmt(o.failed_s, b) for o in outs),
                " ".join(_fmt(o.gone_s, b) for o in outs),
                "-"
                if outs[0].root_cause_ok is None
                else f"{sum(bool(o.root_cause_ok) for o in outs)}/{len(outs)}",
                outs[-1].note.replace("|", "/"),
            )
        )
    body = "\n".join(
        [
            f"2 workers in a `dist.barrier()` loop; orch with heartbeat_timeout={hb:g} s (launcher polls "
            f"exit codes every 0.1 s; tear-down grace 1.5 s); torchrun with its defaults (monitor interval "
            f"0.1 s); {args.repeats} repeats of each case but the torchrun hang (once, {b:g} s bound). "
            "Times from the signal; 'failed' is the orch run's FAILED state, or torchrun's process exit.",
            "",
            c.table(
                [
                    "case",
                    "runs",
                    "failed / exited",
                    "all workers gone",
                    "root cause = the rank hit",
                    "last note",
                ],
                detail,
            ),
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

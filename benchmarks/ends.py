"""How runs end: the launcher killed alone, and a graceful stop.

2 workers run ``_jobs:barrier_loop`` (a ``dist.barrier()`` every step, gloo, 10 ms sleep per
step, one thread each, ``heartbeat_timeout=120``) until they are past step 20; then:

- owner death, ``orch.launch``: a fresh ``python -c`` process (a notebook kernel) that called
  ``orch.launch(...)`` and waits is SIGKILLed alone (its pid only, never its process group, as
  the OOM killer does it). Time from the kill until every process it had started (the
  workers, the forkserver, multiprocessing's resource tracker) is gone, and until the two
  workers are. The heartbeat timeout is far out of reach, so only the workers' own watch
  of their launcher (a pidfd) can end them in time. Goal: 2 s, the design's promise;
- owner death, ``orch run``: the same with ``orch run --workers 2 --fn _jobs:barrier_loop``
  killed alone (the process tree found with psutil: the command's descendants once the run
  is past step 20, read from its plain dashboard lines);
- stop: a run launched in this process; a thread blocks in ``run.wait()`` (a notebook cell
  waiting) while ``run.stop()`` is called. Time from the call until ``run.state().state``
  is STOPPED, until every worker process has exited, and until ``wait()`` returned (its
  RunResult STOPPED). Goal: 2 s for each ("within a second or two", docs/notebook.md);
- Stop in a kernel, per loop: a real IPython kernel (jupyter_client) launches
  ``_jobs:stop_loop`` (2 ranks, 10 ms a step) with its panel, and a cell blocks in
  ``run.wait()``; the panel's Stop is clicked (its comm message on the main shell, as a page
  without subshells sends it). Time from the click until the waiting cell's reply, for a
  ``ctx.steps`` loop, an epoch loop over a DistributedSampler's DataLoader through ``ctx.data``,
  and a plain ``range`` that only calls ``ctx.log``. Goal: 1 s each.

The cases are interleaved, ``--repeats`` times each; medians and maxima, each against its
goal. Everything started is killed at the end of each case (the processes recorded before
the kill, and process trees via psutil), also on errors; the script checks that nothing
is left.

    .venv/bin/python benchmarks/ends.py            # full run, writes RESULTS.md
    .venv/bin/python benchmarks/ends.py --quick    # tiny, prints only
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import _common as c
import psutil

NAME = "ends"
GOAL = 2.0  # seconds, every figure
HEARTBEAT_TIMEOUT = 120.0
POLL = 0.005
READY_STEP = 20
START_TIMEOUT = 180.0
JOB = "_jobs:barrier_loop"
ORCH = str(Path(c.PYTHON).parent / "orch")

DRIVER = """
import json, sys, time
sys.path[:0] = {paths!r}
import orch
run = orch.launch({job!r}, world_size=2, threads=1, heartbeat_timeout={hb!r},
                  config={{"sleep": 0.01}}, run_root={root!r}, master_port=0)
coord = run.coordinator
deadline = time.monotonic() + {timeout!r}
while not (len(coord.ranks) == 2 and min(r.step for r in coord.ranks) >= {ready!r}):
    if run.done or time.monotonic() > deadline:
        raise SystemExit(f"the run did not get going: {{coord.state}} {{[r.step for r in coord.ranks]}}")
    time.sleep(0.05)
print("READY " + json.dumps([p.pid for p in run.procs]), flush=True)
while True:  # a kernel between cells
    time.sleep(3600)
"""


@dataclass
class OwnerDeath:
    case: str
    started: int = 0  # processes the launcher had started (its descendants at the kill)
    workers_s: float | None = None  # the two workers gone
    gone_s: float | None = None  # every descendant gone
    left: list[str] = field(default_factory=list)  # killed by us after the bound


@dataclass
class Stop:
    stopped_s: float | None = None  # run.state().state is STOPPED
    exited_s: float | None = None  # every worker process exited
    wait_s: float | None = None  # run.wait() returned
    wait_state: str = ""  # the RunResult's state (or the error wait() raised)


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _until(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False


def _describe(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return f"{p.pid} (gone)"
    kind = (
        "resource tracker" if "resource_tracker" in cmd else "forkserver" if "forkserver" in cmd else cmd[:80]
    )
    return f"{p.pid} {kind}"


# -- owner death -----------------------------------------------------------------------------------
def _start_owner(tmp: Path, case: str, tag: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    d = tmp / tag
    d.mkdir()
    out, err = d / "stdout", d / "stderr"
    if case == "launch":
        code = DRIVER.format(
            paths=[str(c.HERE), str(c.ROOT)], job=JOB, hb=HEARTBEAT_TIMEOUT, root=str(d / "runs"),
            timeout=START_TIMEOUT, ready=READY_STEP,
        )  # fmt: skip
        argv = [c.PYTHON, "-c", code]
    else:
        argv = [
            ORCH, "run", "--workers", "2", "--fn", JOB, "--config", json.dumps({"sleep": 0.01}),
            "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT), "--run-root", str(d / "runs"),
            "--master-port", "0", "--refresh", "0.5",
        ]  # fmt: skip
    with open(out, "wb") as o, open(err, "wb") as e:  # the child keeps its own descriptors
        proc = subprocess.Popen(argv, env=c.bench_env(), stdout=o, stderr=e, cwd=d)
    return proc, out, err


def _ready(case: str, out: Path) -> list[int] | None:
    """The worker pids (launch) or [] (orch run) once the run is past READY_STEP, else None."""
    text = out.read_text(errors="replace") if out.exists() else ""
    if case == "launch":
        m = re.search(r"^READY (.*)$", text, re.M)
        return json.loads(m.group(1)) if m else None
    # orch run's plain dashboard: "[   3.8s] RUNNING step 201/1000000000 loss per rank: ..."
    steps = [int(s) for s in re.findall(r"\] RUNNING step (\d+)", text)]
    return [] if steps and max(steps) >= READY_STEP else None


def owner_death(tmp: Path, case: str, bound: float, tag: str) -> OwnerDeath:
    label = "`orch.launch` in a python process" if case == "launch" else "`orch run`"
    res = OwnerDeath(label)
    proc, out, err = _start_owner(tmp, case, tag)
    procs: list[psutil.Process] = []
    try:
        ready: list[int] | None = None

        def check() -> bool:
            nonlocal ready
            ready = _ready(case, out)
            return ready is not None or proc.poll() is not None

        if not _until(check, START_TIMEOUT) or ready is None:
            raise RuntimeError(
                f"{label}: the run did not get going (exit {proc.poll()}): "
                f"{err.read_text(errors='replace')[-3000:]}"
            )
        procs = psutil.Process(proc.pid).children(recursive=True)
        pids = {p.pid for p in procs}
        forkservers = [p.pid for p in procs if "forkserver" in " ".join(p.cmdline())]
        workers = ready or [p.pid for p in procs if p.ppid() in forkservers]
        assert len(workers) == 2 and set(workers) <= pids, (workers, [_describe(p) for p in procs])
        assert forkservers and any("resource_tracker" in " ".join(p.cmdline()) for p in procs), [
            _describe(p) for p in procs
        ]
        res.started = len(procs)
        worker_procs = [p for p in procs if p.pid in workers]
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)  # that one pid alone, never its group
        alive = list(procs)
        while alive and time.monotonic() - t0 < bound:
            now = time.monotonic()
            alive = [p for p in alive if _running(p)]
            if res.workers_s is None and not any(p in alive for p in worker_procs):
                res.workers_s = now - t0
            if not alive:
                res.gone_s = now - t0
                break
            time.sleep(POLL)
        res.left = [_describe(p) for p in procs if _running(p)]
    finally:
        for p in procs:  # orphans now: no longer this process's descendants
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if _running(p):
                    p.kill()
        c.kill_tree(proc.pid)
        proc.wait()
    return res


# -- stop ------------------------------------------------------------------------------------------
def stop_case(tmp: Path, bound: float, tag: str) -> Stop:
    import orch
    from orch.wire.states import RunState

    res = Stop()
    run = orch.launch(
        JOB,
        world_size=2,
        threads=1,
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
        config={"sleep": 0.01},
        run_root=str(tmp / f"runs-{tag}"),
        master_port=0,  # any free port: other runs may share this machine
    )
    pids: list[int] = []
    waiter: threading.Thread | None = None
    try:
        coord = run.coordinator
        ok = _until(
            lambda: run.done or (len(coord.ranks) == 2 and min(r.step for r in coord.ranks) >= READY_STEP),
            START_TIMEOUT,
        )
        if not ok or run.done:
            raise RuntimeError(f"the run did not get going: {coord.state} {[r.step for r in coord.ranks]}")
        pids = [p.pid for p in run.procs if p.pid is not None]
        procs = [psutil.Process(pid) for pid in pids]
        t0 = 0.0
        waiting = threading.Event()

        def wait() -> None:  # a notebook cell blocked in run.wait() while Stop is pressed
            waiting.set()
            try:
                result = run.wait(timeout=bound + 30)
                res.wait_state = result.state.value
            except Exception as e:  # reported as the outcome
                res.wait_state = f"{type(e).__name__}: {e}"[:200]
            res.wait_s = time.monotonic() - t0

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiting.wait(10)
        time.sleep(0.2)  # in wait() by now
        t0 = time.monotonic()
        run.stop()
        while time.monotonic() - t0 < bound and (
            res.stopped_s is None or res.exited_s is None or waiter.is_alive()
        ):
            now = time.monotonic()
            if res.stopped_s is None and run.state().state is RunState.STOPPED:
                res.stopped_s = now - t0
            if res.exited_s is None and not any(_running(p) for p in procs):
                res.exited_s = now - t0
            time.sleep(POLL)
    finally:
        run.close()
        for pid in pids:
            c.kill_tree(pid)
        if waiter is not None:
            waiter.join(10)
    return res


# -- Stop in a kernel ------------------------------------------------------------------------------
KERNEL_GOAL = 1.0  # seconds from the click to the waiting cell's reply
LOOPS = ("steps", "data", "log")

KERNEL_LAUNCH = """
import sys, time
sys.path[:0] = {paths!r}
import orch
run = orch.launch("_jobs:stop_loop", world_size=2, threads=1, config={{"loop": {loop!r}, "sleep": 0.01}},
                  run_root={root!r}, master_port=0)
panel = run.panel(interval=0.5)
deadline = time.monotonic() + {timeout!r}
ranks = lambda: run.state().ranks  # the kernel's run: its master lives apart, read as any client does
while not (len(ranks()) == 2 and min(r.step for r in ranks()) >= {ready!r}):
    assert not run.done and time.monotonic() < deadline, run.state()
    time.sleep(0.05)
print("STOP", panel.stop_button.comm.comm_id)
"""


def kernel_stop(tmp: Path, loop: str, bound: float, tag: str) -> float | None:
    """Seconds from a click on the panel's Stop, sent to a kernel whose cell waits in
    ``run.wait()``, to that cell's reply (None: not within ``bound``)."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp), env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST")})
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        out: list[str] = []
        code = KERNEL_LAUNCH.format(paths=[str(c.HERE), str(c.ROOT)], loop=loop,
                                    root=str(tmp / f"runs-{tag}"), timeout=START_TIMEOUT,
                                    ready=READY_STEP)  # fmt: skip
        reply = kc.execute_interactive(
            code, timeout=START_TIMEOUT + 30, output_hook=lambda m: out.append(m["content"].get("text", ""))
        )
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the {loop} run did not get going: {reply['content']} {''.join(out)[-500:]}")
        comm_id = "".join(out).split("STOP")[-1].split()[0]
        waiting = kc.execute('print("WAITING", flush=True)\nrun.wait(timeout=120)')
        seen = ""
        while "WAITING" not in seen:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == waiting and msg["msg_type"] == "stream":
                seen += msg["content"]["text"]
        time.sleep(0.5)  # in wait() now
        t0 = time.monotonic()
        click = {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}}
        kc.shell_channel.send(kc.session.msg("comm_msg", click))
        while time.monotonic() - t0 < bound:
            msg = kc.get_shell_msg(timeout=bound)
            if msg["parent_header"].get("msg_id") == waiting:
                return time.monotonic() - t0 if msg["content"]["status"] == "ok" else None
        return None
    finally:
        with contextlib.suppress(Exception):
            kc.execute_interactive("run.close()", timeout=60)
        kc.stop_channels()
        km.shutdown_kernel(now=True)


# -- report ----------------------------------------------------------------------------------------
def _fmt(x: float | None, bound: float) -> str:
    return f"> {bound:g} s" if x is None else f"{x:.2f} s"


def _stats(xs: list[float | None], bound: float) -> tuple[float | None, float | None]:
    """(median, max); a case that did not end within the bound counts as the bound, and an
    unended max is None."""
    if not xs:
        return None, None
    vals = [bound if x is None else x for x in xs]
    med = c.median(vals)
    return (None if med >= bound else med), (None if any(x is None for x in xs) else max(vals))


def _met(x: float | None) -> bool:
    return x is not None and x <= GOAL


def main() -> None:
    p = c.parser(NAME, __doc__)
    p.add_argument("--repeats", type=int, default=5, help="repeats of each case")
    p.add_argument("--bound", type=float, default=30.0, help="give up waiting after this many seconds")
    args = p.parse_args()
    if args.quick:
        args.repeats = 1
    b = args.bound
    started = c.start()
    c.setup_path()
    launch: list[OwnerDeath] = []
    cli: list[OwnerDeath] = []
    stops: list[Stop] = []
    in_kernel: dict[str, list[float | None]] = {loop: [] for loop in LOOPS}
    try:
        with tempfile.TemporaryDirectory(prefix="orch-bench-ends-") as d:
            tmp = Path(d)
            for rep in range(args.repeats):
                for o, into in (
                    (owner_death(tmp, "launch", b, f"launch-{rep}"), launch),
                    (owner_death(tmp, "cli", b, f"cli-{rep}"), cli),
                ):
                    into.append(o)
                    print(
                        f"  repeat {rep}: {o.case} killed alone: its {o.started} processes gone "
                        f"{_fmt(o.gone_s, b)} later (workers {_fmt(o.workers_s, b)})"
                        + (f"; LEFT {o.left}, killed" if o.left else ""),
                        flush=True,
                    )
                for loop in LOOPS:
                    took = kernel_stop(tmp, loop, b, f"kernel-{loop}-{rep}")
                    in_kernel[loop].append(took)
                    print(f"  repeat {rep}: Stop clicked in a kernel, {loop} loop: the cell returned "
                          f"{_fmt(took, b)} later", flush=True)  # fmt: skip
                s = stop_case(tmp, b, f"stop-{rep}")
                stops.append(s)
                print(
                    f"  repeat {rep}: run.stop() → STOPPED {_fmt(s.stopped_s, b)}, workers exited "
                    f"{_fmt(s.exited_s, b)}, wait() returned {_fmt(s.wait_s, b)} ({s.wait_state})",
                    flush=True,
                )
    finally:
        c.kill_all_children()

    figures = [
        # key, metric, series
        ("owner_launch_gone_s", "`orch.launch`'s process SIGKILLed alone → every process it started gone",
         [o.gone_s for o in launch]),
        ("owner_cli_gone_s", "`orch run` SIGKILLed alone → every process it started gone",
         [o.gone_s for o in cli]),
        ("stop_stopped_s", "`run.stop()` → `run.state().state` STOPPED", [s.stopped_s for s in stops]),
        ("stop_exited_s", "`run.stop()` → every worker process exited", [s.exited_s for s in stops]),
        ("stop_wait_s", "`run.stop()` → a blocked `run.wait()` returns STOPPED",
         [s.wait_s if s.wait_state == "STOPPED" else None for s in stops]),
    ]  # fmt: skip
    rows: list[c.Row] = []
    for key, metric, xs in figures:
        med, mx = _stats(xs, b)
        c.emit(
            NAME,
            key,
            _fmt(med, b).replace(" ", ""),
            max=_fmt(mx, b).replace(" ", ""),
            target=f"<={GOAL:g}s",
            met=_met(med) and _met(mx),
        )
        rows.append(c.Row(f"{metric} (median of {len(xs)})", f"<= {GOAL:g} s", _fmt(med, b), _met(med)))
        rows.append(c.Row(f"  same, max of {len(xs)}", f"<= {GOAL:g} s", _fmt(mx, b), _met(mx)))
    words = {
        "steps": "a `ctx.steps` loop",
        "data": "an epoch loop over a DistributedSampler's DataLoader through `ctx.data`",
        "log": "a plain `range` loop that only calls `ctx.log`",
    }
    for loop in LOOPS:
        xs = in_kernel[loop]
        med, mx = _stats(xs, b)
        good = [x is not None and x <= KERNEL_GOAL for x in (med, mx)]
        c.emit(NAME, f"kernel_stop_{loop}_s", _fmt(med, b).replace(" ", ""), max=_fmt(mx, b).replace(" ", ""),
               target=f"<={KERNEL_GOAL:g}s", met=all(good))  # fmt: skip
        rows.append(
            c.Row(
                f"Stop clicked while a cell waits in a kernel → the cell returns, {words[loop]} "
                f"(median / max of {len(xs)})",
                f"<= {KERNEL_GOAL:g} s",
                f"{_fmt(med, b)} / {_fmt(mx, b)}",
                all(good),
            )
        )
    left = [x for o in launch + cli for x in o.left]
    c.check_no_leftovers(NAME)
    if left:
        print(f"{NAME}: ERROR processes outlived their launcher by {b:g} s (killed): {left}", file=sys.stderr)
        raise SystemExit(3)
    if args.quick:
        return

    def series(xs: list[float | None]) -> str:
        return " ".join(_fmt(x, b) for x in xs)

    detail = [
        (
            "`orch.launch` in `python -c`, killed alone",
            series([o.workers_s for o in launch]),
            series([o.gone_s for o in launch]),
            " ".join(str(o.started) for o in launch),
        ),
        (
            "`orch run --workers 2`, killed alone",
            series([o.workers_s for o in cli]),
            series([o.gone_s for o in cli]),
            " ".join(str(o.started) for o in cli),
        ),
    ]
    body = "\n".join(
        [
            f"2 workers in a `dist.barrier()` loop (`{JOB}`, 10 ms sleep per step, one thread each, "
            f"heartbeat_timeout={HEARTBEAT_TIMEOUT:g} s), past step {READY_STEP} before each case; "
            f"{args.repeats} interleaved repeats of each case, given up after {b:g} s. Goal: "
            f"{GOAL:g} s for every figure (the design's promise that workers end within 2 s when "
            "the process that launched them dies alone; docs/notebook.md's `wait()` returning "
            "within a second or two of Stop). Times from the SIGKILL or the `run.stop()` call.",
            "",
            "Owner death: only the launcher's pid is killed, never its process group (as the OOM "
            "killer does it); the heartbeat timeout is far away, so the workers' own watch of their "
            "launcher (a pidfd) is what ends them, and the forkserver and resource tracker follow.",
            "",
            c.table(
                ["launcher", "workers gone, per repeat", "every process gone, per repeat", "processes"],
                detail,
            ),
            "",
            "Stop: launched in this process; a thread is blocked in `run.wait()` when `run.stop()` "
            "is called (a notebook cell waiting while the panel's Stop is pressed).",
            "",
            c.table(
                ["figure", "per repeat"],
                [
                    ("state STOPPED", series([s.stopped_s for s in stops])),
                    ("every worker exited", series([s.exited_s for s in stops])),
                    ("`wait()` returned", series([s.wait_s for s in stops])),
                    ("`wait()`'s result", " ".join(s.wait_state for s in stops)),
                ],
            ),
        ]
    )
    c.write_section(args.out, NAME, body, rows, started)


if __name__ == "__main__":
    sys.exit(main())

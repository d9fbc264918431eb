"""Shared by the benchmark scripts: arguments, the machine, RESULTS.md sections, process clean-up.

Every script writes its own section of ``benchmarks/RESULTS.md`` between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``; the intro and the summary table at the
top are rebuilt from the summary rows every section carries (a JSON comment), so the
scripts run independently and in any order. ``--quick`` runs a tiny size, prints its
result lines and writes nothing (CI runs it); there a torchrun run that fails is retried
once (:func:`retry_torchrun`), and each script that runs torchrun prints how many times as
``RESULT <name> torchrun_retries=N``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
PYTHON = sys.executable

# name -> (title, what it measures); the order of RESULTS.md.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "step_overhead": (
        "Step overhead: orch vs torchrun on the same DDP loop",
        "process CPU and wall time per training step of the same small DDP MLP (world size 2, gloo, "
        "one thread per worker) under torchrun and under `orch.launch` with `ctx.steps` and `ctx.log` "
        "every step: orch - torchrun CPU and orch / torchrun wall, medians of interleaved pairs",
    ),
    "log_cost": (
        "Cost of ctx.log in the training thread",
        "µs per `ctx.log(step, loss=x, acc=y)` call with the master healthy, slow (0.5 s per "
        "heartbeat) and gone",
    ),
    "launch_latency": (
        "Launch latency: from the call to every rank at its first step",
        "4 workers: `orch.launch` cold (fresh process) and a second launch in the same process, "
        "against `torchrun --standalone --nproc-per-node 4`",
    ),
    "master_ingest": (
        "Master under load: heartbeat ingest",
        "heartbeat latency p50/p99, the beats served within the agent's deadline, and the master's "
        "CPU and CPU wait, for 1,024 and 4,096 ranks loaded as `orch worker --nproc-per-node 8` "
        "host agents and two panels load it, and for 8 ranks during back-to-back full catch-ups",
    ),
    "panel_redraw": (
        "Panel: poll + redraw against history length",
        "time per incremental poll and per redraw of the notebook panel, and bytes per poll, at "
        "1k, 100k and 1M points per rank x 8 ranks",
    ),
    "sweep_asha": (
        "Sweep: ASHA against the full grid",
        "a seeded synthetic landscape of 27 configs x 81 steps at world size 2: the steps an ASHA "
        "sweep (grace 3, reduction 3) runs against the full grid's, the best config each finds, "
        "wall time, and the slot-reuse gap from a prune to the next trial's first step",
    ),
    "teardown": (
        "Failure to tear-down: orch vs torchrun",
        "time from a SIGKILLed or SIGSTOPped rank to the run FAILED and every worker gone, under "
        "`orch.launch` and under torchrun",
    ),
    "sweep": (
        "Sweep: orch.sweep vs sequential torchrun",
        "8 configs x 60 steps of a small DDP MLP at world size 2: total wall time of `orch.sweep` "
        "(parallel=1 and 2, forkserver cold and warm) against 8 `torchrun --nproc-per-node 2` "
        "invocations one after the other",
    ),
    "script_run": (
        "A torchrun script: orch run vs torchrun",
        "the same unmodified torchrun script (a small DDP MLP, world size 2, gloo, its own "
        "`init_process_group`) under `orch run --workers 2 script.py ARGS` and `torchrun "
        "--standalone --nproc-per-node 2 script.py ARGS`: median step time, and time from the "
        "command's start to every rank at its first step",
    ),
    "ends": (
        "How runs end",
        "time from a SIGKILL of the launching process alone (`orch.launch`'s process, `orch run`) "
        "until every process it started is gone, and from `run.stop()` to the run STOPPED, its "
        "workers exited and a blocked `run.wait()` returned",
    ),
    "connection_flood": (
        "A connection flood: the master's memory before, at the peak and after",
        "three floods in a row of one local process's connections up to the master's cap (HTTP/2 "
        "preface each), then one of connections that send nothing: the master's RSS before, at the "
        "peak and 60 s after (with its trim of freed memory and without), the memory per "
        "connection, the idle close, and how long a new connection's `GetState` was refused",
    ),
    "gang": (
        "A gang's next call against a warm launch",
        "4 ranks: from `gang.run(fn)` to every rank at the call's first step, the model built by an "
        "earlier call, against a warm `orch.launch` of the same step (the forkserver up, the model "
        "built in the run); a call's whole round trip, `gang.run(fn).wait()`; and from a failed call "
        "to the next call's first step, for a failure that broke no collective and one that did",
    ),
}


# The benchmarks that are a case of another's script.
COMMANDS = {"sweep_asha": "benchmarks/sweep.py --case asha"}


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"benchmarks/{name}.py",
        description=(doc or "").strip().splitlines()[0] if doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=doc,
    )
    p.add_argument(
        "--quick", action="store_true", help="a tiny size in a few seconds; prints results, writes nothing"
    )
    p.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    return p


def command_line() -> str:
    """The exact command that ran this benchmark, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(ROOT)
    exe = Path(PYTHON)
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(ROOT)
    return shlex.join([str(exe), str(script), *sys.argv[1:]])


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "grpcio": _version("grpcio"),
        "protobuf": _version("protobuf"),
        "loadavg_at_start": f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
    }


def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest-rank on the sorted values."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def emit(name: str, key: str, value: Any, **extra: Any) -> None:
    """One result line on stdout: ``RESULT <bench> <key>=<value> k=v ...`` (tests look for these)."""
    tail = "".join(f" {k}={v}" for k, v in extra.items())
    print(f"RESULT {name} {key}={value}{tail}", flush=True)


def fmt_s(x: float) -> str:
    if x != x:  # nan
        return "n/a"
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.1f} µs"


@dataclass
class Row:
    """One line of the summary table."""

    metric: str
    target: str
    measured: str
    met: bool | None  # None: no target, or not measurable here

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "target": self.target, "measured": self.measured, "met": self.met}


def _met(m: bool | None) -> str:
    return "n/a" if m is None else ("yes" if m else "**no**")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


_SECTION = re.compile(r"<!-- bench:(\w+) -->\n(.*?)<!-- /bench:\1 -->\n?", re.S)
_ROWS = re.compile(r"<!-- summary-rows: (.*?) -->")


def _intro() -> str:
    lines = [
        "# orch benchmarks",
        "",
        "Each script in `benchmarks/` measures one thing and rewrites its own section of this file",
        "(between `<!-- bench:NAME -->` markers), so they run independently. `--quick` runs a tiny",
        "size, prints the result lines and writes nothing (tests/test_benchmarks.py runs that);",
        "`--out FILE` writes elsewhere. Times are medians over repeats; orch and torchrun runs are",
        "interleaved and compared as ratios measured in the same run, because the machine is shared.",
        "",
        "| benchmark | measures | reproduce |",
        "| --- | --- | --- |",
    ]
    for name, (_title, what) in BENCHMARKS.items():
        command = COMMANDS.get(name, f"benchmarks/{name}.py")
        lines.append(f"| [{name}](#{name.replace('_', '-')}) | {what} | `.venv/bin/python {command}` |")
    return "\n".join(lines) + "\n"


def write_section(out: Path, name: str, body: str, rows: Sequence[Row], started: float) -> None:
    """Replace this benchmark's section of ``out`` and rebuild the intro and summary table."""
    title = BENCHMARKS[name][0]
    info = machine_info_cache or machine()
    stamp = datetime.datetime.fromtimestamp(started).astimezone().isoformat(timespec="seconds")
    head = [
        f'<a id="{name.replace("_", "-")}"></a>',
        f"## {name}: {title}",
        "",
        f"- command: `{command_line()}`",
        f"- date: {stamp} (took {time.time() - started:.0f} s)",
        "- machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
        "",
    ]
    summary = table(
        ["metric", "target", "measured", "met?"],
        [(r.metric, r.target, r.measured, _met(r.met)) for r in rows],
    )
    section = (
        "\n".join(head)
        + summary
        + "\n\n"
        + body.strip()
        + "\n\n"
        + f"<!-- summary-rows: {json.dumps([r.as_dict() for r in rows], ensure_ascii=False)} -->\n"
    )
    sections: dict[str, str] = {}
    if out.exists():
        for m in _SECTION.finditer(out.read_text()):
            sections[m.group(1)] = m.group(2)
    sections[name] = section
    order = [n for n in BENCHMARKS if n in sections] + [n for n in sections if n not in BENCHMARKS]
    all_rows: list[tuple[str, dict[str, Any]]] = []
    for n in order:
        m = _ROWS.search(sections[n])
        if m:
            all_rows += [(n, r) for r in json.loads(m.group(1))]
    summary_all = table(
        ["benchmark", "metric", "target", "measured", "met?"],
        [(n, r["metric"], r["target"], r["measured"], _met(r["met"])) for n, r in all_rows],
    )
    missing = [n for n in BENCHMARKS if n not in sections]
    note = f"\n\nNot run yet: {', '.join(missing)}." if missing else ""
    text = (
        _intro()
        + "\n## Summary\n\n"
        + summary_all
        + note
        + "\n\n"
        + "".join(f"<!-- bench:{n} -->\n{sections[n]}<!-- /bench:{n} -->\n\n" for n in order)
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    text = re.sub(r"^(- machine: .*)\n(?=\|)", r"\1\n\n", text, flags=re.M)  # a table needs a blank line
    tmp.write_text(text.rstrip() + "\n")
    os.replace(tmp, out)
    print(f"wrote section {name!r} of {out}", flush=True)


machine_info_cache: dict[str, Any] | None = None


def start() -> float:
    """Record the machine (load average included) at the start of a benchmark."""
    global machine_info_cache
    machine_info_cache = machine()
    return time.time()


# -- processes -------------------------------------------------------------------------------------
def kill_tree(pid: int, *, sig: int = signal.SIGKILL, timeout: float = 5.0) -> list[int]:
    """Kill ``pid`` and all its descendants (continued first if stopped); returns the pids hit."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.send_signal(sig)
            if sig != signal.SIGKILL:
                p.send_signal(signal.SIGCONT)
    psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in procs]


def _is_helper(p: psutil.Process) -> bool:
    """multiprocessing's resource tracker lives as long as its parent, by design."""
    try:
        return "resource_tracker" in " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return True


def leftover_children(wait: float = 5.0) -> list[psutil.Process]:
    """Live descendants of this process (zombies and the resource tracker excepted)."""
    me = psutil.Process()
    deadline = time.monotonic() + wait
    while True:
        left = []
        for p in me.children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE and not _is_helper(p):
                    left.append(p)
            except psutil.NoSuchProcess:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def check_no_leftovers(name: str) -> None:
    """Kill and report any process this benchmark left behind; exit non-zero if there was one."""
    left = leftover_children()
    if not left:
        print(f"{name}: no process left behind", flush=True)
        return
    desc = []
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            desc.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
        kill_tree(p.pid)
    print(f"{name}: ERROR processes left behind (killed now): {desc}", file=sys.stderr, flush=True)
    raise SystemExit(3)


def kill_all_children() -> None:
    """Last-resort clean-up on an error: every descendant of this process, SIGKILLed."""
    for p in psutil.Process().children(recursive=True):
        if not _is_helper(p):
            kill_tree(p.pid)


def bench_env(**extra: str) -> dict[str, str]:
    """Environment for benchmark child processes: benchmarks/ importable, one thread each."""
    env = dict(os.environ)
    paths = [str(HERE), str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def setup_path() -> None:
    """Make ``_jobs`` importable here and in spawned workers (they inherit sys.path)."""
    for p in (str(HERE), str(ROOT)):
        if p not in sys.path:
            sys.path.insert(0, p)


# -- torchrun, the reference ----------------------------------------------------------------------
T = TypeVar("T")


class TorchrunFailed(RuntimeError):
    """torchrun itself exited non-zero or was killed: the reference tool failed, not orch."""

    def __init__(self, returncode: int | None, stderr: str) -> None:
        super().__init__(f"torchrun failed ({returncode}): {stderr[-2000:]}")
        self.returncode = returncode
        self.stderr = stderr

    def summary(self) -> str:
        """One line: the exit code and torchrun's root-cause line (the last ``exitcode`` it names)."""
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        cause = [ln for ln in lines if ln.startswith("exitcode")] or lines[-1:]
        return f"exit {self.returncode}" + (f", {' '.join(cause[-1].split())}" if cause else "")


def torchrun_argv(nproc: int, *args: str) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node NPROC ARGS...``"""
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]


def torchrun(nproc: int, *args: str, timeout: float) -> None:
    """Run torchrun to its end (output dropped, stderr kept); TorchrunFailed if it fails."""
    proc = subprocess.Popen(
        torchrun_argv(nproc, *args), env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        kill_tree(proc.pid)
        proc.wait()
    if proc.returncode != 0:
        raise TorchrunFailed(proc.returncode, err.decode(errors="replace"))


def retry_torchrun(name: str, attempt: Callable[[int], T], *, retry: bool) -> tuple[T, int]:
    """``attempt(0)``; if torchrun itself failed and ``retry`` is set, ``attempt(1)`` once more.

    Returns the result and the number of retries (0 or 1). torchrun's workers sometimes abort
    as their interpreter exits, after their work is done ("terminate called without an active
    exception", SIGABRT, in torch's C++ teardown; orch's workers leave through ``os._exit``).
    That is the reference tool's flake, so ``--quick`` (CI) retries such a run once and says so
    on stdout; a second failure is raised. Only TorchrunFailed is retried: anything orch's side
    raises fails the benchmark at once. ``attempt(n)`` must use fresh paths for each ``n``.
    """
    try:
        return attempt(0), 0
    except TorchrunFailed as e:
        if not retry:
            raise
        print(f"{name}: torchrun failed ({e.summary()}); retrying it once", flush=True)
        print(f"{name}: the failed torchrun's stderr:\n{e.stderr[-2000:]}", file=sys.stderr, flush=True)
    return attempt(1), 1

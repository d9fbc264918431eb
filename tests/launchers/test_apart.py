"""A run whose master lives apart (``orch.launch(..., apart=True)``, a notebook kernel's default):
the master serves from a process the launching one owns, which keeps its forkserver warm for
the next launch, ends with its owner however the owner dies, and never stalls with the owner's
GIL. Real processes, a real gRPC master, real gloo collectives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import orch
from conftest import TESTS, orch_cli
from orch.launchers.apart.client import ApartRun, Host
from orch.launchers.attach_file import read_attach_file
from orch.runtime.owner import process_alive

pytestmark = pytest.mark.timeout(300)


def _end_host() -> None:
    """The test's host ends, with whatever it still runs."""
    host = Host.running()
    if host is not None:
        host.end()


def _returns_its_rank(ctx: orch.Context) -> int:
    for step in ctx.steps(5):
        ctx.log(step, loss=1.0 / (step + 1))
    return ctx.rank


def test_the_master_serves_from_a_process_of_its_own_kept_for_the_next_launch(tmp_path: Path) -> None:
    run = orch.launch(_returns_its_rank, world_size=2, run_root=str(tmp_path), apart=True)
    try:
        assert isinstance(run, ApartRun)
        endpoint = read_attach_file(run.run_dir)
        assert endpoint is not None
        assert endpoint.pid == run.host.pid != os.getpid()  # who serves the master: the host
        result = run.wait(timeout=120)
        assert result.state.value == "SUCCEEDED"
        assert result.values == [0, 1]
        assert sorted(run.history()["loss"]) == [0, 1]
        assert orch.load_run(run.run_id, run_root=tmp_path).state().state.value == "SUCCEEDED"
        second = orch.launch("jobs:allreduce_steps", world_size=2, run_root=str(tmp_path), apart=True)
        with second:
            assert second.host.pid == run.host.pid  # one host, its forkserver warm from the first
            assert second.wait(timeout=120).state.value == "SUCCEEDED"
    finally:
        run.close()
        _end_host()


def test_a_live_run_apart_is_closed_by_close_all_and_found_by_its_id(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    run = orch.launch(
        "jobs:allreduce_steps",
        world_size=2,
        config={"steps": 100000, "sleep": 0.05},
        run_root=str(tmp_path),
        apart=True,
    )
    try:
        assert orch.attach(run.run_id, run_root=tmp_path) is run
        shown = orch_cli("status", run.run_id, "--run-root", str(tmp_path), env=subprocess_env, timeout=60)
        assert shown.returncode == 0 and run.run_id in shown.stdout, shown.stdout + shown.stderr
        assert orch.close_all() == 1
        assert run.done
        state = orch.load_run(run.run_dir).state()
        assert state.state.value == "FAILED" and "closed" in state.failure, state.failure
    finally:
        run.close()
        _end_host()


HOLDS = """
import json, os, sys, time
sys.path.insert(0, {tests!r})
import orch
from orch.views.waiting import wait_for

def hold_gil(seconds):
    # one C call that keeps the GIL throughout, as a C extension that never lets it go does:
    # libc's sleep() called through ctypes.PyDLL, which holds the GIL, however loaded the machine
    import ctypes
    t0 = time.monotonic(); ctypes.PyDLL(None).sleep(int(seconds)); return time.monotonic() - t0

run = orch.launch("jobs:allreduce_steps", world_size=2, run_root={root!r}, apart=True,
                  config={{"steps": 100000, "sleep": 0.05}})
assert wait_for(lambda: min([r.step for r in run.state().ranks] or [0]) >= 3, 120)
held = hold_gil({hold})
state = run.state()
steps = min(r.step for r in state.ranks)
run.stop()
result = run.wait(timeout=120)
events = [e[1] for e in run.state().events]
print(json.dumps({{"held": held, "running": state.state.value, "steps": steps, "end": result.state.value,
                   "events": events, "host": run.host.pid, "me": os.getpid()}}))
run.close()
"""


def test_a_launcher_holding_the_gil_50_s_stalls_nothing_of_a_run_apart(tmp_path: Path) -> None:
    script = HOLDS.format(tests=str(TESTS), root=str(tmp_path), hold=50)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["held"] > 49, out  # past the 30 s heartbeat timeout
    assert out["host"] != out["me"]
    assert out["running"] == "RUNNING" and out["end"] == "STOPPED", out
    # the master read every beat while the launcher was held: no stall to make up for, no rank lost
    assert "master_stalled" not in out["events"] and "rank_lost" not in out["events"], out["events"]
    assert out["steps"] > 100, out  # the ranks trained through the call (about 0.06 s a step)


KILLED = """
import json, sys
sys.path.insert(0, {tests!r})
import orch
from orch.views.waiting import wait_for
run = orch.launch("jobs:allreduce_steps", world_size=2, run_root={root!r}, apart=True,
                  config={{"steps": 100000, "sleep": 0.05}})
assert wait_for(lambda: run.state().state.value == "RUNNING" and all(r.pid for r in run.state().ranks), 120)
ranks = [r.pid for r in run.state().ranks]
print(json.dumps({{"host": run.host.pid, "ranks": ranks, "run_dir": str(run.run_dir)}}), flush=True)
sys.stdin.read()
"""


def test_the_launcher_killed_alone_leaves_no_master_and_no_rank_within_2_s(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED.format(tests=str(TESTS), root=str(tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        pids = [info["host"], *info["ranks"]]
        assert proc.pid not in pids
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone, as the OOM killer ends it
        proc.wait(10)
        killed = time.monotonic()
        while any(process_alive(p) for p in pids) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        gone_after = time.monotonic() - killed
        assert not [p for p in pids if process_alive(p)], (
            f"still alive {gone_after:.1f}s after the launcher died"
        )
        assert gone_after < 2.0, gone_after
        result = json.loads((Path(info["run_dir"]) / "result.json").read_text())
        assert result["state"] == "FAILED", result
        assert f"launcher exited (pid {proc.pid})" in result["failure"], result["failure"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def _fails_on_rank_1(ctx: orch.Context) -> None:
    for step in ctx.steps(5):
        ctx.log(step, loss=1.0)
    if ctx.rank == 1:
        raise ValueError("bad batch on rank 1")


def test_a_failure_apart_names_its_rank_exit_code_and_traceback_as_in_process(tmp_path: Path) -> None:
    run = orch.launch(_fails_on_rank_1, world_size=2, run_root=str(tmp_path), apart=True)
    try:
        with pytest.raises(orch.RunFailed) as failed:
            run.wait(timeout=120)
        assert failed.value.rank == 1 and failed.value.exit_code == 1, failed.value
        assert "ValueError: bad batch on rank 1" in failed.value.traceback
        assert (
            "_fails_on_rank_1" in failed.value.traceback
        )  # the function's own frame, from the kernel's sources
        loaded = orch.load_run(run.run_dir).state()
        assert (loaded.root_cause_rank, loaded.root_cause_exit_code) == (1, 1)
    finally:
        run.close()
        _end_host()


def test_the_host_killed_fails_the_run_naming_its_master_and_the_next_launch_starts_another(
    tmp_path: Path,
) -> None:
    from orch.views.waiting import wait_for

    run = orch.launch(
        "jobs:allreduce_steps",
        world_size=2,
        config={"steps": 100000, "sleep": 0.05},
        run_root=str(tmp_path),
        apart=True,
    )
    try:
        assert wait_for(
            lambda: run.state().state.value == "RUNNING" and all(r.pid for r in run.state().ranks), 120
        )
        ranks = [r.pid for r in run.state().ranks]
        dead = run.host.pid
        os.kill(dead, signal.SIGKILL)  # the master's process, alone
        with pytest.raises(orch.RunFailed) as failed:
            run.wait(timeout=60)
        assert failed.value.rank is None, failed.value  # no rank is blamed for its master's death
        assert "master died" in str(failed.value) and "SIGKILL" in str(failed.value), failed.value
        killed = time.monotonic()
        while any(process_alive(p) for p in ranks) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        assert not [p for p in ranks if process_alive(p)], "the ranks outlived their master's process"
        with orch.launch(_returns_its_rank, world_size=2, run_root=str(tmp_path), apart=True) as second:
            assert second.host.pid != dead
            assert second.wait(timeout=120).values == [0, 1]
    finally:
        run.close()
        _end_host()


def test_a_taken_port_is_named_in_the_launching_process_as_in_process(tmp_path: Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        try:
            with pytest.raises(orch.PortInUseError) as taken:
                orch.launch(
                    "jobs:allreduce_steps", world_size=2, master_port=port, run_root=str(tmp_path), apart=True
                )
            assert taken.value.port == port and taken.value.option == "master_port", taken.value
            assert f"port {port} (orch master) is already in use" in str(taken.value)
        finally:
            _end_host()

"""A notebook cell that holds the kernel's GIL in one C call for 50 s while a run trains and
its panel is shown. The run's master lives in a process of its own (a kernel's launches put it
there), so it reads every beat meanwhile; the panel's poller, in the kernel, cannot run for those
50 s, longer than the ranks' heartbeat timeout. The run trains on, ends SUCCEEDED with no rank
blamed and no stall of the master, and the panel catches up with every point once the cell ends;
a second run's Stop, clicked while a cell waits on it, still ends it.

A real IPython kernel started by jupyter_client, real ranks and a real gRPC master; the test
is the frontend. The C call is libc's ``sleep`` through ``ctypes.PyDLL``, which keeps the GIL
for its whole length, as a C extension that never lets it go does.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import TESTS, notebook_kernel

pytestmark = pytest.mark.timeout(300)

STEPS = 1400  # at 0.05 s a step and more, the run outlasts the 50 s call
LAUNCH = """\
import json, os, sys, time
sys.path.insert(0, {tests!r})
import orch
from orch.views.waiting import wait_for
run = orch.launch("jobs:allreduce_steps", world_size=2, config={{"steps": {steps}, "sleep": 0.05}},
                  run_root={run_root!r})
panel = run.panel(interval=0.3)
assert wait_for(lambda: min([r.step for r in run.state().ranks] or [0]) >= 3, 120), run.state().state
from orch.launchers.attach_file import read_attach_file
master_pid = read_attach_file(run.run_dir).pid  # the process serving the run's master

def hold_gil(seconds):
    # one C call that keeps the GIL throughout, as a C extension that never lets it go does:
    # libc's sleep() called through ctypes.PyDLL, which holds the GIL, however loaded the machine
    import ctypes
    t0 = time.monotonic(); ctypes.PyDLL(None).sleep(int(seconds)); return time.monotonic() - t0

def panel_points():
    return {{r: len(b) for (r, name), b in panel.mirror.series.items() if name == "loss"}}
"""
HOLD = "held = hold_gil(50)\nprint('HELD', round(held, 1), run.state().state.value, flush=True)"
AFTER = """\
try:
    state, error = run.wait(timeout=240).state.value, ""
except orch.RunFailed as e:
    state, error = "FAILED", str(e)
caught_up = wait_for(lambda: panel_points() == {{0: {steps}, 1: {steps}}}, 30)
events = [e[1] for e in run.state().events]
print("AFTER", json.dumps({{"state": state, "error": error, "caught_up": caught_up, "kernel": os.getpid(),
                           "master": master_pid,
                           "points": panel_points(), "events": events, "shown": panel.header.value}}))
"""
SECOND = """\
second = orch.launch("jobs:allreduce_steps", world_size=2, config={{"steps": 100000, "sleep": 0.05}},
                     run_root={run_root!r})
second_panel = second.panel(interval=0.3)
assert wait_for(lambda: second.state().state.value == "RUNNING", 120), second.state().state
print(second_panel.stop_button.comm.comm_id)
"""


def _printed(kc: Any, parent: str, until: str, timeout: float) -> str:
    """What the cell ``parent`` printed, once it printed ``until``."""
    text, deadline = "", time.monotonic() + timeout
    while until not in text:
        left = deadline - time.monotonic()
        assert left > 0, f"no {until!r} within {timeout}s; the cell printed {text!r}"
        try:
            msg = kc.get_iopub_msg(timeout=left)
        except queue.Empty:
            continue
        if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == parent:
            text += msg["content"]["text"]
        if msg["msg_type"] == "error" and msg["parent_header"].get("msg_id") == parent:
            raise AssertionError("\n".join(msg["content"]["traceback"]))
    return text


def _run_cell(kc: Any, code: str, timeout: float = 180) -> str:
    out: list[str] = []
    reply = kc.execute_interactive(
        code, timeout=timeout, output_hook=lambda m: out.append(m["content"].get("text", ""))
    )
    assert reply["content"]["status"] == "ok", (reply["content"], "".join(out))
    return "".join(out)


def test_a_cell_holding_the_gil_50_s_does_not_fail_the_run_and_the_panel_catches_up(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    with notebook_kernel(tmp_path) as (_, kc):
        _run_cell(kc, LAUNCH.format(tests=str(TESTS), run_root=str(runs), steps=STEPS))
        try:
            held = _run_cell(kc, HOLD, timeout=200)
            seconds, state = held.split()[1:3]
            assert float(seconds) > 49, held  # longer than the 30 s heartbeat timeout
            assert state in ("RUNNING", "SUCCEEDED"), held
            after = json.loads(_run_cell(kc, AFTER.format(steps=STEPS), timeout=280).split("AFTER", 1)[1])
            assert after["state"] == "SUCCEEDED", after["error"]
            # the master lives apart from the kernel: it read every beat while the kernel was held
            assert after["master"] and after["master"] != after["kernel"], after
            assert "master_stalled" not in after["events"], after["events"]
            assert "rank_failed" not in after["events"] and "rank_lost" not in after["events"], after[
                "events"
            ]
            # the panel's poller, stopped with the kernel, read every point once the call ended
            assert after["caught_up"], after["points"]
            assert "SUCCEEDED" in after["shown"], after["shown"]

            # Stop clicked while a cell waits on a second run, from the same kernel
            comm_id = _run_cell(kc, SECOND.format(run_root=str(runs))).split()[-1]
            waiting = kc.execute(
                'print("WAITING", flush=True)\nr = second.wait()\nprint("WAITED", r.state.value)'
            )
            _printed(kc, waiting, "WAITING", 60)
            time.sleep(1.0)  # the cell is in wait() now
            kc.shell_channel.send(
                kc.session.msg(
                    "comm_msg",
                    {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}},
                )
            )
            assert "WAITED STOPPED" in _printed(kc, waiting, "WAITED STOPPED", 90)
        finally:
            kc.execute_interactive("orch.close_all()", timeout=60)

"""The launching process busy in one long C call while its run trains: a notebook cell in a
`pickle.loads` of a large object, a C extension that keeps the GIL, a long regex. The run's
master shares that process's GIL (its threads cannot run), so for the length of the call it
reads nothing. The ranks train on and keep their points (their launching process lives), and
the master, once it runs again, holds none of their silence against them. Real processes, a
real gRPC master, real gloo collectives; the C call is ``sum(range(n))``, which never lets the
GIL go."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS

pytestmark = pytest.mark.timeout(300)

BUSY = """
import json, os, sys, time
sys.path.insert(0, {tests!r})
import orch

def hold_gil(seconds):
    # sized from a tenth of a second's sum: a loaded machine makes the call longer, or shorter
    t0 = time.perf_counter(); sum(range(10**7)); per = time.perf_counter() - t0
    n = int(10**7 * seconds / max(per, 1e-6))
    t0 = time.monotonic(); sum(range(n)); return time.monotonic() - t0

run = orch.launch("jobs:allreduce_steps", world_size=2, heartbeat_timeout={timeout}, run_root={root!r},
                  config={{"steps": {steps}, "sleep": 0.05}})
deadline = time.monotonic() + 120
while min([r.step for r in run.state().ranks] or [0]) < 3:
    assert time.monotonic() < deadline, "the ranks never got going"
    time.sleep(0.05)
held = hold_gil({hold})  # one C call: no thread of this process runs meanwhile
try:
    result = run.wait(timeout=240)
    state, error = result.state.value, ""
except orch.RunFailed as e:
    state, error = "FAILED", str(e)
mirror = run.state()
points = {{r: len(v["step"]) for r, v in run.history().get("loss", {{}}).items()}}
events = [e[1] for e in mirror.events]
run.close()
print(json.dumps({{"state": state, "error": error, "held": held, "points": points, "events": events}}))
"""


@pytest.mark.parametrize(
    "steps, what",
    [(400, "the ranks still train when the call ends"), (60, "the ranks end while the call holds the GIL")],
)
def test_a_launcher_holding_the_gil_in_one_c_call_past_the_heartbeat_timeout_does_not_fail_its_run(
    tmp_path: Path, steps: int, what: str
) -> None:
    timeout, hold = 3.0, 15.0
    script = BUSY.format(tests=str(TESTS), root=str(tmp_path), timeout=timeout, steps=steps, hold=hold)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n{what}: the launcher held the GIL {out['held']:.1f}s (heartbeat timeout {timeout:g}s): {out}")
    assert out["held"] > 2 * timeout  # the stall was real: longer than the ranks' silence allows
    assert out["state"] == "SUCCEEDED", out["error"]
    assert out["points"] == {"0": steps, "1": steps} or out["points"] == {0: steps, 1: steps}, out["points"]
    assert "rank_failed" not in out["events"], out["events"]
    if steps == 400:  # the run goes on after the stall: its events say the master was stalled
        assert "master_stalled" in out["events"], out["events"]

"""Every benchmark script runs end to end with --quick: real processes, result lines, no file written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.timeout(120)

BENCHMARKS = ROOT / "benchmarks"

# script -> result keys its --quick run must print as ``RESULT <script> <key>=<value>``
EXPECTED = {
    "step_overhead": ["torchrun_step_ms", "orch_step_ms", "ratio"],
    "log_cost": ["healthy_us_per_call", "slow_us_per_call", "gone_us_per_call", "burst_us_per_call"],
    "launch_latency": ["torchrun_s", "orch_cold_s", "orch_second_s"],
    "master_ingest": ["points_per_s", "latency_64_workers_p50_ms"],
    "panel_redraw": ["redraw_ms_1000", "redraw_ms_20000"],
    "teardown": ["orch_kill_failed_s", "torchrun_kill_failed_s", "orch_stop_failed_s"],
}


def test_every_benchmark_script_is_tested() -> None:
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run_prints_its_results_and_writes_nothing(name: str, tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    found = dict(re.findall(rf"^RESULT {name} (\w+)=(\S+)", proc.stdout, re.M))
    for key in EXPECTED[name]:
        assert key in found, f"no {key} in the output:\n{proc.stdout[-3000:]}"
        assert found[key] not in ("", "nan"), f"{key}={found[key]}"
    assert "no process left behind" in proc.stdout
    assert not out.exists(), "--quick must not write the results file"

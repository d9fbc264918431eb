"""Every benchmark script runs end to end with --quick: real processes, result lines, no file written."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT

# A wall-clock bound a loaded 2-core machine keeps: the slowest --quick run takes about 20 s
# here when idle, and a failed torchrun run is retried once. The figures are the benchmarks'.
RUN_TIMEOUT = 240
pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 30)

BENCHMARKS = ROOT / "benchmarks"

# script -> result keys its --quick run must print as ``RESULT <script> <key>=<value>``
EXPECTED = {
    "step_overhead": ["torchrun_step_ms", "orch_step_ms", "ratio", "torchrun_retries"],
    "log_cost": ["healthy_us_per_call", "slow_us_per_call", "gone_us_per_call", "burst_us_per_call"],
    "launch_latency": ["torchrun_s", "orch_cold_s", "orch_second_s", "torchrun_retries"],
    "master_ingest": [
        "host_agents_p99_ms",
        "host_agents_4k_p99_ms",
        "catchup_heartbeat_p99_ms",
        "host_agents_4k_panel_p99_ms",
        "points_per_s",
        "panel_redraws_per_s",
        "catchup_slowest_beat_ms",
    ],
    "panel_redraw": ["redraw_ms_1000", "redraw_ms_20000"],
    "teardown": ["orch_kill_failed_s", "torchrun_kill_failed_s", "orch_stop_failed_s", "torchrun_retries"],
    "sweep": ["torchrun_s", "orch_p1_cold_s", "orch_p1_warm_s", "orch_p2_warm_s", "torchrun_retries"],
    "script_run": [
        "torchrun_step_ms",
        "orch_step_ms",
        "step_ratio",
        "torchrun_launch_s",
        "orch_launch_s",
        "launch_ratio",
        "torchrun_retries",
    ],
    "ends": [
        "owner_launch_gone_s",
        "owner_cli_gone_s",
        "stop_stopped_s",
        "stop_exited_s",
        "stop_wait_s",
        "kernel_stop_steps_s",
        "kernel_stop_data_s",
        "kernel_stop_log_s",
    ],
    "gang": [
        "gang_call_s",
        "warm_launch_s",
        "gang_round_trip_s",
        "failed_kept_to_next_first_step_s",
        "failed_remade_to_next_first_step_s",
    ],
    "connection_flood": [
        "rss_before_mb",
        "rss_peak_mb",
        "rss_after_mb",
        "kib_per_connection",
        "unreachable_s",
        "silent_closed_s",
    ],
}


def test_every_benchmark_script_is_tested() -> None:
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(EXPECTED)


def test_every_script_that_runs_torchrun_reports_its_retries() -> None:
    for name, keys in EXPECTED.items():
        source = (BENCHMARKS / f"{name}.py").read_text()
        runs_torchrun = bool(re.search(r"torch\.distributed\.run|\bc\.torchrun", source))
        assert runs_torchrun == ("torchrun_retries" in keys), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run_prints_its_results_and_writes_nothing(
    name: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    out = tmp_path / "RESULTS.md"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    found = dict(re.findall(rf"^RESULT {name} (\w+)=(\S+)", proc.stdout, re.M))
    for key in EXPECTED[name]:
        assert key in found, f"no {key} in the output:\n{proc.stdout[-3000:]}"
        assert found[key] not in ("", "nan"), f"{key}={found[key]}"
    assert "no process left behind" in proc.stdout
    assert not out.exists(), "--quick must not write the results file"
    if "torchrun_retries" in found:
        # torchrun's own flake is retried once and shows: a line per retry, and the count,
        # which also goes to the test report (junit XML) so that CI keeps track of it.
        retried = re.findall(rf"^{name}: torchrun failed \(.*\); retrying it once$", proc.stdout, re.M)
        assert int(found["torchrun_retries"]) == len(retried), proc.stdout[-3000:]
        record_property("torchrun_retries", len(retried))
        if retried:
            print(f"\n{retried[0]}")


# -- the retry itself, without torchrun ------------------------------------------------------------


@pytest.fixture(scope="module")
def common() -> ModuleType:
    """benchmarks/_common.py (benchmarks/ is not a package), loaded under its own name."""
    spec = importlib.util.spec_from_file_location("bench_common", BENCHMARKS / "_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ABORT = """E... failed (exitcode: -6) local_rank: 1 (pid: 8714) of binary: python
Root Cause (first observed failure):
[0]:
  exitcode  : -6 (pid: 8714)  (SIGABRT)
  traceback : Signal 6 (SIGABRT) received by PID 8714
======================================================
"""


def test_a_torchrun_failure_is_retried_once_and_said(
    common: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    tries: list[int] = []

    def flaky(n: int) -> str:
        tries.append(n)
        if n == 0:
            raise common.TorchrunFailed(1, ABORT)
        return "measured"

    assert common.retry_torchrun("bench", flaky, retry=True) == ("measured", 1)
    assert tries == [0, 1]
    out = capsys.readouterr()
    said = "bench: torchrun failed (exit 1, exitcode : -6 (pid: 8714) (SIGABRT)); retrying it once\n"
    assert out.out == said
    assert "Signal 6 (SIGABRT)" in out.err  # the failed run's stderr, for whoever reads the log
    assert common.retry_torchrun("bench", lambda n: n, retry=True) == (0, 0)
    assert capsys.readouterr().out == ""


def test_a_second_torchrun_failure_fails(common: ModuleType) -> None:
    tries: list[int] = []

    def broken(n: int) -> None:
        tries.append(n)
        raise common.TorchrunFailed(-6, ABORT)

    with pytest.raises(common.TorchrunFailed, match="SIGABRT"):
        common.retry_torchrun("bench", broken, retry=True)
    assert tries == [0, 1]
    tries.clear()
    with pytest.raises(common.TorchrunFailed):  # the full benchmark does not retry
        common.retry_torchrun("bench", broken, retry=False)
    assert tries == [0]


def test_a_failure_on_orchs_side_is_never_retried(common: ModuleType) -> None:
    tries: list[int] = []

    def orch_fails(n: int) -> None:
        tries.append(n)
        raise RuntimeError("orch driver failed (1)")

    with pytest.raises(RuntimeError, match="orch driver failed"):
        common.retry_torchrun("bench", orch_fails, retry=True)
    assert tries == [0]


def test_torchrun_failing_is_torchrun_failed(common: ModuleType, tmp_path: Path) -> None:
    """The helper the benchmarks run torchrun through raises TorchrunFailed, with torchrun's stderr."""
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit('the reference failed')\n")
    with pytest.raises(common.TorchrunFailed) as e:
        common.torchrun(1, str(script), timeout=120)
    assert e.value.returncode != 0 and "the reference failed" in e.value.stderr
    assert "exitcode" in e.value.summary()

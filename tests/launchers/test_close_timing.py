"""How long ``run.close()`` takes to end a rank that ignores SIGTERM: a timing, so this file
runs alone on the machine (marked serial in tests/conftest.py)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

import orch
from conftest import TESTS, until
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(180)
sys.path.insert(0, str(TESTS))


def test_a_rank_that_ignores_sigterm_is_gone_within_the_grace_and_a_second(tmp_path: Path) -> None:
    run = orch.launch("jobs:ignores_sigterm_and_abort", world_size=2, run_root=str(tmp_path))
    grace = run.spec.grace  # seconds a rank told to end gets before SIGKILL (1.5 s by default)
    try:
        coord = run.coordinator
        until(lambda: coord.state is RunState.RUNNING and min(r.step for r in coord.ranks) > 3, 120)
        pids = [p.pid for p in run.procs if p.pid]
        started = time.monotonic()
    finally:
        run.close()
    # close() returns once the ranks are reaped; the clock stops when the last one is gone.
    gone_at = run.all_exited_at
    assert gone_at is not None
    took = gone_at - started
    print(f"\nrank deaf to SIGTERM and ABORT: gone {took:.2f}s after run.close() (grace {grace:g}s)")
    assert took <= grace + 1.0, f"gone {took:.2f}s after close(), past the grace ({grace:g}s) plus 1 s"
    assert took >= grace - 0.1, f"gone after {took:.2f}s: the rank obeyed SIGTERM, so this tests nothing"
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert sorted(run.exit_codes.values()) == [-signal.SIGKILL, -signal.SIGKILL], run.exit_codes

"""Each rank's memory, live, in real runs (2 ranks under DDP on gloo): a leaking rank's memory
rises in ``orch status`` and earns a warning; a healthy run earns none; a rank the OOM killer
ends under a memory cgroup made for the test is reported as killed by it.

The times printed (``pytest -s``) are from the moment every rank trains to the warning.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import orch
from conftest import ORCH, orch_cli, until
from orch.experiments.run_row import read_row
from orch.record.store import read_events
from orch.runtime.memory import find_cgroup
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(240)


def training(run: orch.Run, world: int = 2) -> float:
    """Waits until every rank has stepped; the time then."""
    until(lambda: (m := run.state()).state is RunState.RUNNING and len(m.ranks) == world
          and all(r.step > 0 for r in m.ranks), 120)  # fmt: skip
    return time.monotonic()


def status(run: orch.Run, env: dict[str, str]) -> str:
    proc = orch_cli("status", "--master", run.address, env={**env, "ORCH_TOKEN": run.token}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def rank_row(text: str, rank: int) -> str:
    [row] = [ln for ln in text.splitlines() if re.match(rf"\s*{rank}\s+(RUNNING|REGISTERED)", ln)]
    return row


def mb(row: str) -> float:
    """The memory column of a rank's row of ``orch status``, in MB."""
    value, unit = re.search(r"(\d+(?:\.\d+)?) (MB|GB) \d+%", row).groups()  # type: ignore[union-attr]
    return float(value) * (1000 if unit == "GB" else 1)


def test_a_leaking_rank_rises_in_orch_status_and_is_warned(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    run = orch.launch("jobs:leaks_on_rank1", world_size=2, run_root=str(tmp_path), heartbeat_timeout=60)
    try:
        t0 = training(run)
        time.sleep(2.0)
        first = status(run, subprocess_env)
        deadline = t0 + 90
        while time.monotonic() < deadline and not run.state().ranks[1].memory_note:
            time.sleep(0.2)
        took = time.monotonic() - t0
        later = status(run, subprocess_env)
        m = run.state()
        print(f"\nleak warning {took:.1f}s after every rank trained: {m.ranks[1].memory_note}")
        print(later)
        assert m.ranks[1].memory_note.startswith("memory grows steadily: RSS "), m.ranks[1].memory_note
        assert not m.ranks[0].memory_note
        # orch status shows it: rank 1's memory rose by hundreds of MB, rank 0's did not move much.
        assert mb(rank_row(later, 1)) > mb(rank_row(first, 1)) + 200, (first, later)
        assert abs(mb(rank_row(later, 0)) - mb(rank_row(first, 0))) < 100, (first, later)
        assert "memory grows steadily" in rank_row(later, 1) and "memory grows" not in rank_row(later, 0)
        # The metric a user plots like any other.
        points = m.history()["rank/memory"]
        assert points[1]["value"][-1] > points[1]["value"][0] + 200 and points[0]["value"]
    finally:
        run.close()
    events = [e for e in read_events(tmp_path / run.run_id / "events.jsonl") if e["kind"] == "memory"]
    assert [e["rank"] for e in events] == [1] and "memory grows steadily" in events[0]["message"], events


def test_a_healthy_run_gets_no_memory_warning(tmp_path: Path) -> None:
    run = orch.launch("jobs:healthy_training", world_size=2, run_root=str(tmp_path), heartbeat_timeout=60)
    try:
        t0 = training(run)
        while time.monotonic() - t0 < 30:  # past the warm-up and twice the shortest window judged
            m = run.state()
            assert not any(r.memory_note for r in m.ranks), [r.memory_note for r in m.ranks]
            time.sleep(0.5)
        assert all(r.rss_bytes > 50_000_000 and r.cpu_percent > 0 and r.memory_limit for r in m.ranks)
        assert not [e for e in m.events if e[1] == "memory"]
    finally:
        run.close()


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A memory cgroup made for the test under this process's own (it stays within that one's
    limits), limited to :data:`CGROUP_LIMIT`; removed afterwards. Skips where none can be made."""
    own = find_cgroup("self")
    if own is None or os.geteuid() != 0:
        pytest.skip("no memory cgroup of this process to make one under, or not root")
    path = own.path / f"orch-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        (path / own.limit_file).write_text(str(CGROUP_LIMIT))
    except OSError as e:
        with contextlib.suppress(OSError):
            path.rmdir()
        pytest.skip(f"cannot make a memory cgroup with a limit under {own.path}: {e}")
    try:
        yield path
    finally:
        # The run's processes are gone (the test waited for them); anything left goes back up.
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (own.path / "cgroup.procs").write_text(pid)
        until(lambda: _removed(path), 10)


def _removed(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


CGROUP_LIMIT = 1_500_000_000  # the run's master, forkserver and two ranks take ~0.8 GB of it


def test_a_rank_the_oom_killer_ends_is_reported_as_killed_by_it(
    tmp_path: Path, subprocess_env: dict[str, str], memory_cgroup: Path
) -> None:
    """The whole run (``orch run``: its master, forkserver and ranks) in a cgroup limited to
    1.5 GB, as a container or a Slurm job would hold it; rank 1 leaks until the kernel kills it."""

    def join() -> None:  # in the child, before exec: it and all it starts are in the cgroup
        (memory_cgroup / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.run(
        [ORCH, "run", "--workers", "2", "--fn", "jobs:leaks_on_rank1", "--run-root", str(tmp_path)],
        capture_output=True, text=True, timeout=200, env=subprocess_env, cwd=tmp_path, preexec_fn=join,
    )  # fmt: skip
    own = find_cgroup("self")
    assert own is not None
    oom_control = (memory_cgroup / own.events_file).read_text()
    print(f"\n{proc.stdout[-1500:]}\n{oom_control}")
    assert re.search(r"oom_kill [1-9]", oom_control), oom_control  # the kernel killed, not something else
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = r"root cause: rank 1 .*signal SIGKILL: killed by the out-of-memory killer \(RSS "
    assert re.search(said, proc.stdout), proc.stdout
    [run_dir] = [p for p in tmp_path.iterdir() if (p / "result.json").is_file()]
    row = read_row(run_dir)
    assert row.root_cause_rank == 1 and "killed by the out-of-memory killer" in row.note, row.note
    assert "cgroup limit 1.5 GB" in row.note and "its cgroup counted the kill" in row.note, row.note

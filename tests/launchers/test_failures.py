"""Fault injection with real processes: crashes, hangs, a dying master or kernel, restarts.

Every test here ends with the conftest check that no process it started is still alive.
The measured times are printed (``pytest -s``) and asserted against the bounds users rely on.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import torch

import orch
from conftest import ORCH, TESTS, orch_cli, until
from orch.record.metrics_log import read_metrics
from orch.record.store import RunStore
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.auth import open_channel
from orch.wire.codec import metric_record
from orch.wire.states import RankState, RunState

pytestmark = pytest.mark.timeout(240)
sys.path.insert(0, str(TESTS))

# Seconds from a death (or its detection) to every worker gone: what a loaded 2-core machine
# guarantees, far below any heartbeat timeout here. The figures themselves (typically well
# under a second) are printed with -s and measured in benchmarks/teardown.py.
BOUND = 10.0


def all_gone(pids: list[int]) -> Callable[[], bool]:
    def check() -> bool:
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                continue
        return True

    return check


def running(run: orch.Run, min_step: int = 3) -> Callable[[], bool]:
    def check() -> bool:
        c = run.coordinator
        return (
            c.state is RunState.RUNNING
            and len(c.ranks) == run.spec.world_size
            and all(r.step >= min_step for r in c.ranks)
        )

    return check


@pytest.mark.parametrize(
    ("job", "exit_code", "evidence"),
    [
        ("jobs:raise_on_rank1", 1, "RuntimeError: boom on rank 1"),
        ("jobs:exit3_on_rank1", 3, "sys.exit(3)"),
        ("jobs:segfault_on_rank1", -signal.SIGSEGV, "Segmentation fault"),
    ],
)
def test_a_rank_that_dies_fails_the_run_and_takes_the_others_down(
    tmp_path: Path, job: str, exit_code: int, evidence: str
) -> None:
    run = orch.launch(job, world_size=3, run_root=str(tmp_path))
    try:
        until(lambda: run.coordinator.state is RunState.FAILED, 120)
        detected = time.monotonic()
        pids = [p.pid for p in run.procs if p.pid]
        gone = until(all_gone(pids), 10)
        print(f"\n{job}: every worker gone {gone:.2f}s after the failure was detected")
        assert gone < BOUND
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=30)
        assert e.value.rank == 1
        assert e.value.exit_code == exit_code
        assert evidence in e.value.traceback
        assert "rank 1" in str(e.value)
        if exit_code < 0:
            assert "signal SIGSEGV" in str(e.value)
            assert 'jobs.py", line' in e.value.traceback  # faulthandler's Python stack
        assert run.all_exited_at is not None and run.all_exited_at - detected < BOUND
    finally:
        run.close()
    events = (tmp_path / run.run_id / "events.jsonl").read_text()
    assert '"rank_failed"' in events and evidence.split("(")[0] in events


def test_a_collective_mismatch_names_the_library_s_words_and_the_user_s_line(tmp_path: Path) -> None:
    """gloo aborts rank 0 (SIGABRT, no Python exception): its explanation and the training
    thread's stack, read from faulthandler's dump in the log, are the root cause."""
    run = orch.launch("jobs:skips_an_all_reduce_on_rank1", world_size=2, run_root=str(tmp_path))
    try:
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=120)
    finally:
        run.close()
    message, text = str(e.value), e.value.traceback
    assert (e.value.rank, e.value.exit_code) == (0, -signal.SIGABRT), message
    # The message's one line: the signal, the op, the user's line and gloo's explanation.
    assert "signal SIGABRT: gloo::EnforceNotMet in all_reduce (" in message, message
    assert "jobs.py, line" in message and "in skips_an_all_reduce_on_rank1)" in message, message
    assert "Is there a distributed collective mismatch in your code?" in message, message
    # The traceback: the training thread only, the user's frame with its source line, then gloo's words.
    lines = text.splitlines()
    assert lines[0].startswith("Traceback of the training thread"), text
    user = next(i for i, ln in enumerate(lines) if "in skips_an_all_reduce_on_rank1" in ln)
    assert lines[user + 1].strip() == "dist.all_reduce(total)  # the skipped collective", text
    assert "_sender.py" not in text and "Extension modules" not in text, text
    assert "what():" in text and "Fatal Python error: Aborted" in text, text
    log_text = (run.run_dir / "logs" / f"{run.coordinator.ranks[0].worker_id}.log").read_text()
    assert "Extension modules:" in log_text and "_sender.py" in log_text  # the whole dump stays in the log
    assert "collective mismatch" in _result(run.run_dir)["failure"]


def test_a_kernel_restarted_mid_run_ends_it_as_its_launcher_s_exit(tmp_path: Path) -> None:
    """Kernel > Restart: the kernel's shutdown terminates its children (the forkserver, whose
    workers' exits then read 255) before its exit hook runs; no rank is blamed for that."""
    from conftest import notebook_kernel

    with notebook_kernel(tmp_path) as (km, kc):
        cell = (
            f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
            "import orch\nfrom orch.views.waiting import wait_for\n"
            f"run = orch.launch('jobs:long_barriers', world_size=2, run_root={str(tmp_path)!r})\n"
            "assert wait_for(lambda: run.state().state.value == 'RUNNING', 90)\n"
            "print(run.run_id, [r.pid for r in run.state().ranks])\n"
        )
        out: list[str] = []
        reply = kc.execute_interactive(
            cell, timeout=120, output_hook=lambda m: out.append(m["content"].get("text", ""))
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        run_id, pids = "".join(out).split(" ", 1)
        kernel_pid = km.provisioner.pid  # type: ignore[union-attr]
        km.restart_kernel(now=False)
        until(all_gone([int(p) for p in pids.strip(" []\n").split(",")]), 30)
    run_dir = tmp_path / run_id
    words = f"launcher exited (pid {kernel_pid})"
    result = _result(run_dir)
    assert result["state"] == "FAILED" and result["failure"].startswith(words), result["failure"]
    assert result["root_cause_rank"] == -1 and result["root_cause_error"] == ""
    loaded = orch.load_run(run_dir).state()
    assert loaded.failure.startswith(words) and "exit code 255" not in loaded.failure
    row = orch.runs(tmp_path)[run_id]
    assert row.state == "FAILED" and row.note.startswith(words) and row.root_cause_rank == -1


def _result(run_dir: Path) -> dict[str, Any]:
    import json

    return dict(json.loads((run_dir / "result.json").read_text()))


def test_a_rank_killed_from_outside(tmp_path: Path) -> None:
    run = orch.launch("jobs:long_barriers", world_size=3, run_root=str(tmp_path))
    try:
        until(running(run), 120)
        victim = run.coordinator.ranks[1]
        pids = [p.pid for p in run.procs if p.pid]
        os.kill(victim.pid, signal.SIGKILL)
        gone = until(all_gone(pids), 10)
        print(f"\nSIGKILL from outside: every worker gone {gone:.2f}s after the kill")
        assert gone < BOUND
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=30)
        assert (e.value.rank, e.value.exit_code) == (1, -signal.SIGKILL)
        assert "signal SIGKILL" in str(e.value)
    finally:
        run.close()


def test_a_failed_rank_slow_to_leave_keeps_its_own_exit_code(tmp_path: Path) -> None:
    """The tear-down kills a failed rank still delivering its last points at the end of the
    grace; the root cause keeps the rank's own exit code and traceback, not that SIGKILL."""
    run = orch.launch("jobs:raise_on_rank1_then_linger", world_size=3, run_root=str(tmp_path))
    try:
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=120)
        assert (e.value.rank, e.value.exit_code) == (1, 1)
        assert e.value.traceback.strip().splitlines()[-1] == "ValueError: bad batch on rank 1"
        killed = run.exit_codes[run.coordinator.ranks[1].worker_id]
        assert killed == -signal.SIGKILL, "the rank was not slow to leave: this tests nothing"
    finally:
        run.close()


def test_a_hung_rank_is_declared_lost_within_the_heartbeat_timeout(tmp_path: Path) -> None:
    timeout = 3.0
    run = orch.launch("jobs:long_barriers", world_size=3, run_root=str(tmp_path), heartbeat_timeout=timeout)
    try:
        until(running(run), 120)
        victim = run.coordinator.ranks[2]
        os.kill(victim.pid, signal.SIGSTOP)
        failed = until(lambda: run.coordinator.state is RunState.FAILED, timeout + 10)
        print(f"\nSIGSTOP: run FAILED {failed:.2f}s after the hang (heartbeat timeout {timeout}s)")
        assert timeout - 0.5 < failed < timeout + BOUND
        assert run.coordinator.ranks[2].state is RankState.LOST
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=30)
        assert e.value.rank == 2 and "no heartbeat" in str(e.value)
    finally:
        run.close()


def _start_master(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], str]:
    master = subprocess.Popen(
        [ORCH, "master", "--port", "0", "--no-dashboard", "--run-root", str(tmp_path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert master.stdout is not None
    line = master.stdout.readline()
    assert "serving on" in line, line
    return master, line.split("serving on ")[1].split(";")[0]


def test_workers_exit_when_the_master_is_killed(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    # The master is on this host: once its port refuses connections the workers end, long
    # before the heartbeat timeout (which a master on another host still needs).
    timeout = 60.0
    master, address = _start_master(
        tmp_path,
        subprocess_env,
        "--world-size",
        "2",
        "--heartbeat-timeout",
        str(timeout),
        "--fn",
        "jobs:long_barriers",
    )
    workers = [
        subprocess.Popen(
            [
                *(ORCH, "worker", "--master", address, "--trust-master"),
                *("--threads", "1", "--run-root", str(tmp_path)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=subprocess_env,
            cwd=tmp_path,
        )
        for _ in range(2)
    ]
    try:
        with orch.MasterClient(address, token=subprocess_env["ORCH_TOKEN"]) as client:
            until(
                lambda: (
                    all(r.step > 3 for r in orch.StateMirror().poll(client).ranks)
                    and len(orch.StateMirror().poll(client).ranks) == 2
                ),
                120,
                0.2,
            )
        master.kill()
        master.wait()
        gone = until(lambda: all(w.poll() is not None for w in workers), timeout)
        print(f"\nmaster SIGKILLed: workers gone {gone:.2f}s later (heartbeat timeout {timeout:g}s)")
        assert gone < BOUND
        assert all(w.returncode == 70 for w in workers)
    finally:
        for p in (master, *workers):
            if p.poll() is None:
                p.kill()
                p.wait()
        assert master.stdout is not None
        master.stdout.close()


def test_acknowledged_points_survive_a_killed_master(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    master, address = _start_master(tmp_path, subprocess_env, "--world-size", "1")
    acked: list[int] = []
    try:
        with open_channel(address, token=subprocess_env["ORCH_TOKEN"]) as channel:
            stub = pb_grpc.OrchestratorStub(channel)
            reg = stub.Register(
                pb.RegisterRequest(worker_id="w", host="h", pid=1, rendezvous_port=1), timeout=10
            )
            assert stub.CanStartTraining(
                pb.CanStartTrainingRequest(run_id=reg.run_id, worker_id="w"), timeout=10
            ).ready
            threading.Timer(1.5, master.kill).start()
            step = 0
            while True:
                steps = list(range(step, step + 200))
                req = pb.HeartbeatRequest(
                    run_id=reg.run_id,
                    worker_id="w",
                    step=steps[-1],
                    series=[pb.Series(name="loss", steps=steps, values=[0.5] * 200)],
                )
                try:
                    stub.SendHeartbeat(req, timeout=2)
                except grpc.RpcError:
                    break
                acked.extend(steps)
                step += 200
        master.wait(10)
        assert master.returncode == -signal.SIGKILL
        assert len(acked) > 1000, "the master died before the test got going"
        loaded = orch.load_run(tmp_path / reg.run_id)
        stored = loaded.history()["loss"][0]["step"]
        print(f"\nmaster SIGKILLed: {len(acked)} points acknowledged, {len(stored)} in the run dir")
        assert set(acked) <= set(stored)
        assert loaded.state().state is RunState.FAILED and "did not finish" in loaded.state().failure
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
        assert master.stdout is not None
        master.stdout.close()


def _continuous(history: dict[str, Any], steps: int, world: int) -> None:
    for rank in range(world):
        assert history["loss"][rank]["step"] == list(range(steps)), f"rank {rank}"


def test_a_restart_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:checkpointed",
        world_size=2,
        max_restarts=1,
        run_root=str(tmp_path),
        config={"steps": 40, "die_at": 25, "die_on_attempts": [1]},
    )
    try:
        result = run.wait(timeout=180)
        assert result.state is RunState.SUCCEEDED and result.steps == [40, 40]
        assert run.coordinator.attempt == 2
        history = run.history()
        _continuous(history, 40, 2)
        for rank in range(2):
            attempts = history["attempt"][rank]["value"]
            # the last checkpoint before the death at step 25 was after step 19
            assert attempts[:20] == [1.0] * 20 and attempts[20:] == [2.0] * 20
        assert any(e[1] == "restart" for e in run.state().events)
    finally:
        run.close()
    # the same continuous history read back from the run dir
    _continuous(orch.load_run(run.run_dir).history(), 40, 2)


def test_restarts_exhausted_report_the_first_root_cause(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:checkpointed",
        world_size=2,
        max_restarts=1,
        run_root=str(tmp_path),
        config={"steps": 40, "die_at": 25, "die_on_attempts": [1, 2]},
    )
    try:
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=180)
        assert (e.value.rank, e.value.exit_code) == (1, -signal.SIGKILL)
        assert "after 2 attempts" in str(e.value)
        assert run.coordinator.attempt == 2
    finally:
        run.close()


def test_a_start_up_failure_is_not_retried(tmp_path: Path) -> None:
    run = orch.launch("jobs:fails_at_startup", world_size=2, max_restarts=5, run_root=str(tmp_path))
    try:
        with pytest.raises(orch.RunFailed) as e:
            run.wait(timeout=120)
        assert "missing_dependency" in e.value.traceback
        assert "before any step: not restarted" in str(e.value)
        assert run.coordinator.attempt == 1
    finally:
        run.close()


def test_graceful_stop_checkpoints_and_exits_cleanly(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:checkpointed",
        world_size=2,
        run_root=str(tmp_path),
        config={"steps": 1_000_000, "die_on_attempts": []},
    )
    try:
        until(running(run, 15), 120)
        run.stop()
        result = run.wait(timeout=60)
        assert result.state is RunState.STOPPED
        assert set(run.exit_codes.values()) == {0}
        assert len(set(result.steps)) == 1
        latest = (run.run_dir / "checkpoints" / "latest").read_text()
        saved = torch.load(run.run_dir / "checkpoints" / latest, weights_only=False)
        assert saved["step"] + 1 == result.steps[0] and saved["step"] >= 15  # steps 0..saved done
    finally:
        run.close()


def test_cli_max_restarts(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    proc = orch_cli(
        "run",
        "--workers",
        "2",
        "--fn",
        "jobs:checkpointed",
        "--max-restarts",
        "1",
        "--config",
        '{"steps": 30, "die_at": 15}',
        "--run-root",
        str(tmp_path),
        env=subprocess_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCEEDED" in proc.stdout


def test_torn_records_are_ignored(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    for i in range(3):
        append_points(store, 0, 1, [pb.Series(name="loss", steps=[i], values=[float(i)])])
    store.close()
    log = tmp_path / "metrics.pb"
    whole = log.read_bytes()
    log.write_bytes(whole + whole[:7])  # a record cut short by a crash
    assert [r.series[0].steps[0] for r in read_metrics(log)] == [0, 1, 2]
    corrupt = bytearray(whole)
    corrupt[-1] ^= 0xFF  # the last record's payload no longer matches its checksum
    log.write_bytes(bytes(corrupt))
    assert len(list(read_metrics(log))) == 2
    assert orch.load_run(tmp_path).history()["loss"][0]["step"] == [0, 1]


def test_load_run_and_csv_export(tmp_path: Path) -> None:
    with orch.launch(
        "jobs:allreduce_steps", world_size=2, config={"steps": 12}, run_root=str(tmp_path)
    ) as run:
        run.wait(timeout=120)
    loaded = orch.load_run(run.run_dir)
    assert loaded.state().state is RunState.SUCCEEDED
    assert loaded.history() == run.history()
    out = loaded.to_csv(tmp_path / "points.csv")
    with out.open() as f:
        rows = list(csv.DictReader(f))
    logged = [r for r in rows if not r["metric"].startswith("rank/")]  # orch's own: rank/memory
    assert len(logged) == 2 * 2 * 12  # 2 ranks x 2 metrics x 12 steps
    assert {r["metric"] for r in logged} == {"loss", "rank_seen"}
    assert {r["metric"] for r in rows} <= {"loss", "rank_seen", "rank/memory"}
    panel = loaded.panel()
    assert panel.wait_done(30)
    assert 'data-state="SUCCEEDED"' in panel.header.value


def append_points(store: RunStore, rank: int, attempt: int, series: list[pb.Series]) -> None:
    """A beat's points into the store's metrics log, as the master appends them."""
    store.append_metrics(metric_record(rank, attempt, series))

"""End to end with real processes: `orch run`, and `orch master` + separate `orch worker`s."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import orch
from conftest import ORCH, orch_cli

pytestmark = pytest.mark.timeout(240)


def result_of(output: str, run_root: Path) -> dict[str, Any]:
    run_id = re.search(r"run ([0-9a-f]{12})", output)
    assert run_id, output
    run_dir = run_root / run_id.group(1)
    result: dict[str, Any] = json.loads((run_dir / "result.json").read_text())
    result["history"] = {
        f"{rank}/{name}": series
        for name, ranks in orch.load_run(run_dir).history().items()
        for rank, series in ranks.items()
    }
    return result


def assert_trained(result: dict[str, Any], world: int) -> None:
    assert result["state"] == "SUCCEEDED"
    assert len(result["ranks"]) == world
    for rank in range(world):
        losses = result["history"][f"{rank}/loss"]["value"]
        assert len(losses) >= 20, f"rank {rank} reported {len(losses)} losses"
        head, tail = losses[:10], losses[-10:]
        assert sum(tail) / len(tail) < 0.5 * sum(head) / len(head), f"rank {rank}: loss did not fall"
    checksums = {r["param_checksum"] for r in result["ranks"]}
    assert len(checksums) == 1 and "" not in checksums, f"DDP parameters differ: {checksums}"


def test_orch_run_four_workers(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    proc = orch_cli(
        "run",
        "--workers",
        "4",
        "--steps",
        "120",
        "--run-root",
        str(tmp_path),
        "--refresh",
        "0.2",
        env=subprocess_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCEEDED" in proc.stdout
    result = result_of(proc.stdout, tmp_path)
    assert_trained(result, 4)
    assert {r["step"] for r in result["ranks"]} == {120}
    assert result["history"]["0/accuracy"]["value"][-1] > 0.8


def _read_until(proc: subprocess.Popen[str], pattern: str, timeout: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    seen = ""
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        m = re.search(pattern, seen)
        if m:
            return m
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"{pattern!r} not printed; got:\n{seen}")


def test_master_and_four_separate_workers(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    master = subprocess.Popen(
        [
            ORCH,
            "master",
            "--world-size",
            "4",
            "--steps",
            "100",
            "--port",
            "0",
            "--no-dashboard",
            "--linger",
            "0.5",
            "--run-root",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env,
        cwd=tmp_path,
    )
    workers: list[subprocess.Popen[str]] = []
    try:
        address = _read_until(master, r"serving on (\S+);").group(1)
        # (the bound is for a loaded 2-core machine: `orch status` alone takes seconds to start there)
        status = orch_cli("status", "--master", address, "--json", env=subprocess_env, timeout=60)
        assert status.returncode == 0, status.stderr
        before = json.loads(status.stdout)
        assert (before["state"], before["registered"], before["world_size"]) == ("PENDING", 0, 4)
        workers = [
            subprocess.Popen(
                [ORCH, "worker", "--master", address, "--threads", "1"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=subprocess_env,
                cwd=tmp_path,
            )
            for _ in range(4)
        ]
        for w in workers:
            out, _ = w.communicate(timeout=180)
            assert w.returncode == 0, out
        out, _ = master.communicate(timeout=60)
        assert master.returncode == 0, out
        assert_trained(result_of(out, tmp_path), 4)
    finally:
        for p in [master, *workers]:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_failed_rank_fails_the_run_with_its_traceback(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    proc = orch_cli(
        "run",
        "--workers",
        "2",
        "--fn",
        "jobs:raise_on_rank1",
        "--run-root",
        str(tmp_path),
        env=subprocess_env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "root cause: rank 1" in proc.stdout
    assert "RuntimeError: boom on rank 1" in proc.stdout
    assert 'jobs.py", line' in proc.stdout  # the traceback itself, not just the message


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["master", "--world-size", "1", "--port"], "--port"),
        (["run", "--workers", "1", "--master-port"], "--master-port"),
        (["run", "--workers", "1", "--rdzv-port"], "--rdzv-port"),
    ],
)
def test_taken_master_port_is_named(
    tmp_path: Path, subprocess_env: dict[str, str], command: list[str], flag: str
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = orch_cli(*command, str(port), env=subprocess_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"port {port}" in proc.stderr and "already in use" in proc.stderr
    # The hint names the flag of the command that was used: orch run has no --port.
    assert f"pass {flag}=<another port>" in proc.stderr, proc.stderr


def test_status_of_a_missing_master_says_so(subprocess_env: dict[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The connection is refused at once; a deadline a loaded machine could reach first would
    # turn UNAVAILABLE into DEADLINE_EXCEEDED.
    proc = orch_cli(
        "status", "--master", f"127.0.0.1:{port}", "--timeout", "30", env=subprocess_env, timeout=90
    )
    assert proc.returncode == 1
    assert f"127.0.0.1:{port}" in proc.stderr and "UNAVAILABLE" in proc.stderr


def test_dashboard_redraws_in_place_on_a_terminal(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: `orch run` on a pseudo-terminal
        os.chdir(tmp_path)
        os.execve(
            ORCH,
            [
                ORCH,
                "run",
                "--workers",
                "2",
                "--steps",
                "500",
                "--refresh",
                "0.1",
                "--run-root",
                str(tmp_path),
            ],
            subprocess_env,
        )
    chunks = []
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data.decode(errors="replace"))
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    screen = "".join(chunks)
    assert os.waitstatus_to_exitcode(status) == 0, screen[-2000:]
    # each frame moves the cursor back to the top of the previous one and clears below
    frames = re.findall(r"\x1b\[(\d+)F\x1b\[J", screen)
    assert len(frames) >= 3, screen[-2000:]
    assert "rank  state" in screen and "steps/s" in screen and "heartbeat" in screen
    assert "SUCCEEDED" in screen

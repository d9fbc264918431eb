"""Shared fixtures: a master on a free port, and the check that no process outlives a test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orch.coordinator import Coordinator
from orch.master import MasterServer

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
ORCH = str(Path(sys.executable).parent / "orch")


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes started under this test (they inherit ORCH_TEST_TAG)."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.environ().get("ORCH_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(autouse=True, scope="session")
def _resource_tracker() -> None:
    # multiprocessing's resource tracker and the workers' forkserver live as long as this
    # pytest process, by design; start them before any test so that they carry no test's tag.
    from multiprocessing import forkserver, resource_tracker

    from orch.launcher import worker_context

    resource_tracker.ensure_running()
    worker_context()  # sets the preload; the forkserver, too, lives as long as pytest
    forkserver.ensure_running()


@pytest.fixture(autouse=True)
def no_leftover_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every process a test starts must be gone when it ends."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv("ORCH_TEST_TAG", tag)
    yield tag
    deadline = time.monotonic() + 5.0
    left = tagged_processes(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = tagged_processes(tag)
    if left:
        desc = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left]
        for p in left:
            p.kill()
        pytest.fail(f"processes outlived the test: {desc}")


@pytest.fixture
def coordinator() -> Coordinator:
    return Coordinator(world_size=2, run_id="run-a", heartbeat_timeout=5.0)


@pytest.fixture
def master(coordinator: Coordinator) -> Iterator[MasterServer]:
    """A real gRPC master on a free loopback port, serving ``coordinator``."""
    server = MasterServer(coordinator, port=0).start()
    try:
        yield server
    finally:
        server.stop(grace=0.2)


@pytest.fixture
def subprocess_env(tmp_path: Path) -> dict[str, str]:
    """Environment for `orch` subprocesses: test jobs importable, runs under tmp_path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env["ORCH_TOKEN"] = uuid.uuid4().hex  # `orch master` and `orch worker` both read it
    return env


def orch_cli(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 200
) -> subprocess.CompletedProcess[str]:
    """Run the ``orch`` command to completion; its output is captured as text."""
    return subprocess.run([ORCH, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)

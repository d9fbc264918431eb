"""A live run addressed by its id from another process of the same user, on this machine:
`orch status RUN_ID`, `orch stacks RUN_ID`, `orch.attach(RUN_ID)` and `orch.load_run(RUN_ID)`
for a run launched from Python and one launched by `orch run`. The address and token come
from the run dir's attach.json (0600), which goes when the run's master stops. Real processes,
a real gRPC master with its token."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import orch
from conftest import ORCH, TESTS, orch_cli

pytestmark = pytest.mark.timeout(240)

ATTACH_ELSEWHERE = """
import sys
sys.path.insert(0, {tests!r})
import orch
run = orch.attach({run_id!r}, run_root={root!r})
print(type(run).__name__, run.state().state.value, len(run.state().ranks), flush=True)
run.close()  # another process's run: stopped, never its process signalled
print("closed", run.done, flush=True)
"""


def _until_stepping(run: orch.Run) -> None:
    deadline = time.monotonic() + 60
    while min([r.step for r in run.state().ranks] or [0]) < 2:
        assert time.monotonic() < deadline, "the ranks never got going"
        time.sleep(0.05)


def test_a_run_launched_from_python_is_addressed_by_its_id_from_another_process(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "ORCH_TOKEN": ""}  # nothing but the run dir gives the token
    run = orch.launch(
        "jobs:allreduce_steps", world_size=2, run_root=str(tmp_path), config={"steps": 100_000, "sleep": 0.02}
    )
    with run:
        _until_stepping(run)
        attach = tmp_path / run.run_id / "attach.json"
        assert stat.S_IMODE(attach.stat().st_mode) == 0o600
        status = orch_cli("status", run.run_id, "--run-root", str(tmp_path), "--json", env=env, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        state = json.loads(status.stdout)
        assert state["run_id"] == run.run_id and state["state"] == "RUNNING" and len(state["ranks"]) == 2
        shown = orch_cli("status", run.run_id[:6], "--run-root", str(tmp_path), env=env, timeout=60)
        assert shown.returncode == 0 and run.run_id in shown.stdout, shown.stdout + shown.stderr
        stacks = orch_cli("stacks", run.run_id, "--run-root", str(tmp_path), env=env, timeout=60)
        assert stacks.returncode == 0 and "allreduce_steps" in stacks.stdout, stacks.stdout + stacks.stderr
        show = orch_cli("show", run.run_id, "--run-root", str(tmp_path), env=env, timeout=60)
        assert f"`orch status {run.run_id}` shows them" in show.stdout, show.stdout + show.stderr
        loaded = orch.load_run(run.run_id, run_root=str(tmp_path))
        assert loaded.run_id == run.run_id
        # orch.attach from another process; its close() stops the run, and the launcher lives
        script = ATTACH_ELSEWHERE.format(tests=str(TESTS), run_id=run.run_id, root=str(tmp_path))
        other = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
        )
        assert other.returncode == 0, other.stderr[-2000:]
        assert other.stdout.splitlines()[0] == "DetachedRun RUNNING 2", other.stdout
        assert run.wait(timeout=60).state is orch.RunState.STOPPED
        assert other.stdout.splitlines()[1] == "closed True", other.stdout
    assert not attach.exists()  # the master stopped: its address and token went with it
    gone = orch_cli("status", run.run_id, "--run-root", str(tmp_path), env=env, timeout=60)
    assert gone.returncode == 0 and "STOPPED" in gone.stdout, gone.stdout + gone.stderr  # read from disk


def test_a_run_of_orch_run_is_addressed_by_its_id(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "ORCH_TOKEN": ""}
    proc = subprocess.Popen(
        [ORCH, "run", "--workers", "2", "--steps", "100000", "--run-root", str(tmp_path), "--refresh", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120
        run_id = ""
        while not run_id:
            assert time.monotonic() < deadline, "orch run never made its run dir"
            found = [p.name for p in tmp_path.iterdir() if (p / "attach.json").exists()]
            run_id = found[0] if found else ""
            time.sleep(0.1)
        status = orch_cli("status", run_id, "--run-root", str(tmp_path), "--json", env=env, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["run_id"] == run_id
        wrong = orch_cli("status", run_id, "--run-root", str(tmp_path), "--token", "x", env=env, timeout=60)
        assert wrong.returncode != 0 and "--master HOST:PORT" in wrong.stdout + wrong.stderr
        neither = orch_cli("status", env=env, timeout=60)
        assert neither.returncode != 0 and re.search(r"orch status RUN_ID", neither.stdout + neither.stderr)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert os.path.isdir(tmp_path / run_id) and not (tmp_path / run_id / "attach.json").exists()

"""``orch sweep`` and ``orch run --detach`` through the real command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import orch
from conftest import ORCH, orch_cli, until

pytestmark = pytest.mark.timeout(240)


def test_orch_sweep_runs_every_config_and_exits_by_the_worst(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    env = subprocess_env
    grid = json.dumps({"lr": [0.01, 0.2], "fail": [False, True]})
    proc = orch_cli(
        "sweep", "--fn", "jobs:lr_job", "--grid", grid, "--config", '{"steps": 12}', "--name", "cli",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr  # two configs were told to fail
    assert "orch: sweep cli: 4 configs, 1 at a time" in proc.stdout
    assert "\x1b" not in proc.stdout  # a pipe gets plain lines
    table = proc.stdout[proc.stdout.index("sweep cli\n") :]
    assert table.count("SUCCEEDED") == 2 and table.count("FAILED") == 2, table
    metas = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/run.json")]
    assert sorted((m["config"]["lr"], m["config"]["fail"], m["config"]["steps"]) for m in metas) == [
        (0.01, False, 12), (0.01, True, 12), (0.2, False, 12), (0.2, True, 12),
    ]  # fmt: skip
    # Again: only the failed configs run, and they fail again.
    again = orch_cli("sweep", "--fn", "jobs:lr_job", "--grid", grid, "--config", '{"steps": 12}',
                     "--name", "cli", env=env, cwd=tmp_path)  # fmt: skip
    assert again.returncode == 1
    assert again.stdout.count("SUCCEEDED (earlier)") == 2
    assert len(list((tmp_path / "runs").glob("*/run.json"))) == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "pass one of --grid"),
        (("--grid", "[1]"), "--grid must be a JSON object of lists"),
        (("--grid", '{"lr": 0.1}'), "grid axis 'lr' must be a non-empty list"),
        (("--configs", "{"), "--configs must be JSON"),
        (("--configs", '[{"lr": 0.1}]', "--config", "[]"), "--config: must be a JSON object"),
    ],
)
def test_orch_sweep_refuses_bad_configs_in_one_line(
    tmp_path: Path, subprocess_env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    proc = orch_cli("sweep", "--fn", "jobs:lr_job", *args, env=subprocess_env, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_ctrl_c_stops_every_run_of_a_sweep(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    env = subprocess_env
    configs = json.dumps([{"lr": lr, "steps": 100000, "sleep": 0.02} for lr in (0.01, 0.02, 0.03)])
    proc = subprocess.Popen(
        [ORCH, "sweep", "--fn", "jobs:lr_job", "--configs", configs, "--parallel", "2"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        until(lambda: len(list((tmp_path / "runs").glob("*/metrics.pb"))) == 2, 120)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, out + err
    results = [json.loads(p.read_text())["state"] for p in (tmp_path / "runs").glob("*/result.json")]
    assert sorted(results) == ["STOPPED", "STOPPED"]
    assert "CANCELLED" in out


def test_orch_run_detach_leaves_a_run_that_attach_finds(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    env = subprocess_env
    proc = orch_cli(
        "run", "--detach", "--fn", "jobs:allreduce_steps", "--workers", "2",
        "--config", '{"steps": 100000, "sleep": 0.02}', env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = (tmp_path / "runs").iterdir()
    assert f"orch.attach('{run_dir.name}')" in proc.stdout, proc.stdout
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        run = orch.attach(run_dir.name)
        until(lambda: run.state().progress()[0] > 3, 60)
        run.stop()
        assert run.wait(60).state is orch.RunState.STOPPED
    finally:
        os.chdir(old)
    assert json.loads((run_dir / "result.json").read_text())["state"] == "STOPPED"

"""Every bad input is one clear ConfigError (the CLI: one line, exit 2) before any process starts."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import orch
from conftest import ORCH, orch_cli

pytestmark = pytest.mark.timeout(240)
LOCK = threading.Lock()  # cloudpickle cannot carry a lock to the workers

MYTRAIN = """\
import torch


def main(ctx):
    model = ctx.ddp(torch.nn.Linear(2, 1))
    for step in ctx.steps(int(ctx.config.get("steps", 5))):
        ctx.log(step, loss=float(model(torch.ones(1, 2)).sum()))
"""


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"world_size": True}, "world_size must be an integer"),
        ({"world_size": 0}, "world_size must be an integer >= 1"),
        ({"world_size": "4"}, "world_size must be an integer"),
        ({"world_size": 100_000}, "does not fit this machine"),
        ({"heartbeat_timeout": math.nan}, "heartbeat_timeout must be a positive, finite"),
        ({"heartbeat_timeout": math.inf}, "heartbeat_timeout must be a positive, finite"),
        ({"heartbeat_timeout": -1}, "heartbeat_timeout must be a positive, finite"),
        ({"heartbeat_timeout": "30"}, "heartbeat_timeout must be a positive, finite"),
        ({"heartbeat_timeout": 0.3}, "well above the heartbeat interval"),
        ({"config": "abc"}, "config must be a dict"),
        ({"config": [1, 2]}, "config must be a dict"),
        ({"config": {"x": object()}}, "config must be JSON-serialisable"),
        ({"config": {"lr": math.nan}}, "config must be JSON-serialisable"),
        ({"steps": "5"}, "steps must be an integer"),
        ({"steps": 0}, "steps must be an integer >= 1"),
        ({"steps": 2.5}, "steps must be an integer"),
        ({"threads": -1}, "threads must be an integer >= 1"),
        ({"threads": 1.5}, "threads must be an integer"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0"),
        ({"max_restarts": True}, "max_restarts must be an integer"),
        ({"master_port": 70_000}, "master_port must be an integer from 0 to 65535"),
        ({"rdzv_port": -1}, "rdzv_port must be an integer from 0 to 65535"),
        ({"master_port": "50051"}, "master_port must be an integer"),
        ({"train": "nonexistent.module:fn"}, "cannot import 'nonexistent.module'"),
        ({"train": "jobs:no_such_function"}, "has no attribute 'no_such_function'"),
        ({"train": "no_colon"}, "expected the training function as package.module:function"),
        ({"train": "missing.py:main"}, "there is no file"),
        ({"train": 42}, "train must be a function"),
        ({"train": lambda ctx, lock=LOCK: None}, "cannot be sent to the worker"),
    ],
    ids=lambda v: re.sub(r" at 0x[0-9a-f]+", "", repr(v))[:40] if isinstance(v, dict) else None,
)
def test_bad_launch_arguments(tmp_path: Path, kwargs: dict[str, Any], says: str) -> None:
    args = {"train": "jobs:allreduce_steps", "world_size": 2, "run_root": str(tmp_path / "runs"), **kwargs}
    train = args.pop("train")
    with pytest.raises(orch.ConfigError, match=says.replace("(", r"\(").replace(".", r"\.")):
        orch.launch(train, **args)
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "--workers", "100000"], "does not fit this machine"),
        (["run", "--workers", "0"], "--workers/-n: must be an integer >= 1"),
        (["run", "--refresh", "-1"], "--refresh: must be a positive number"),
        (["run", "--heartbeat-timeout", "nan"], "--heartbeat-timeout: must be a positive, finite number"),
        (["run", "--max-restarts", "-1"], "--max-restarts: must be an integer >= 0"),
        (["run", "--config", "abc"], "--config: must be a JSON object"),
        (["run", "--config", "[1]"], "--config: must be a JSON object"),
        (["sweep", "--config", "[1]", "--grid", "{}"], "--config: must be a JSON object"),
        (["master", "--world-size", "0"], "--world-size/--workers: must be an integer >= 1"),
        (["run", "--fn", "nonexistent.module:fn"], "cannot import 'nonexistent.module'"),
        (["run", "--fn", "no_colon"], "expected the training function"),
        (["master", "--world-size", "2", "--linger", "-1"], "--linger: must be 0 or a positive"),
        (["master", "--world-size", "2", "--fn", "bad fn"], "expected the training function"),
        (["worker", "--master", "127.0.0.1:1", "--fn", "nonexistent.module:fn"], "cannot import"),
        (["status", "--master", "nowhere"], "expected HOST:PORT"),
    ],
)
def test_bad_cli_input_is_one_line_and_exit_2(
    tmp_path: Path, subprocess_env: dict[str, str], argv: list[str], says: str
) -> None:
    done = (
        orch_cli(*argv, "--run-root", str(tmp_path / "runs"), env=subprocess_env, cwd=tmp_path, timeout=60)
        if argv[0] in ("run", "master", "worker", "sweep")
        else orch_cli(*argv, env=subprocess_env, cwd=tmp_path, timeout=60)
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"orch {argv[0]}: error: ") and says in lines[0], lines
    assert not (tmp_path / "runs").exists()


def test_orch_run_finds_a_module_and_a_file_in_the_current_folder(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    (tmp_path / "mytrain.py").write_text(MYTRAIN)
    for fn in ("mytrain:main", "mytrain.py:main", str(tmp_path / "mytrain.py") + ":main"):
        done = orch_cli(
            "run",
            "--workers",
            "2",
            "--fn",
            fn,
            "--steps",
            "5",
            "--refresh",
            "5",
            env=subprocess_env,
            cwd=tmp_path,
        )
        assert done.returncode == 0, (fn, done.stdout[-2000:], done.stderr[-2000:])
        assert done.stdout.count("SUCCEEDED, step 5") == 2, done.stdout


def test_orch_master_names_a_module_that_workers_find_in_their_folder(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    (tmp_path / "mytrain.py").write_text(MYTRAIN)
    master = subprocess.Popen(
        [
            ORCH,
            "master",
            "--port",
            "0",
            "--no-dashboard",
            "--world-size",
            "2",
            "--fn",
            "mytrain:main",
            "--steps",
            "5",
            "--linger",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env,
        cwd=tmp_path,
    )
    try:
        assert master.stdout is not None
        address = master.stdout.readline().split("serving on ")[1].split(";")[0]
        worker = orch_cli(
            "worker",
            "--master",
            address,
            "--trust-master",
            "--nproc-per-node",
            "2",
            env=subprocess_env,
            cwd=tmp_path,
        )
        assert worker.returncode == 0, worker.stderr[-2000:]
        out, _ = master.communicate(timeout=60)
        assert master.returncode == 0 and "SUCCEEDED" in out
    finally:
        if master.poll() is None:
            master.kill()
            master.communicate()


def test_a_notebook_in_the_folder_of_its_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nbtrain.py").write_text(MYTRAIN.replace("def main", "def fit"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with orch.launch("nbtrain:fit", world_size=2, steps=5) as run:
        assert run.wait(timeout=120).steps == [5, 5]
    assert (tmp_path / "runs" / run.run_id / "result.json").exists()
